"""The synced reference of a TRL trainer (docs/method.md §3.2) and the callback that syncs it before every
k-th update.

Storage, chosen so that a TRL set-up that already holds a reference holds nothing more:

- full fine-tuning: a module of the policy's architecture whose parameters and buffers are overwritten in
  place. That is TRL's own `ref_model` when the trainer has one (its initial weights are replaced by the
  policy's at the start of training); otherwise (`precompute_ref_log_probs=True`, or GRPO with `beta=0`) a
  deep copy of the policy made here, i.e. one more copy of the weights.
- peft: a second adapter, `humanline_reference`, with the trained adapter's config but no dropout. A sync copies
  the adapter weights only; the reference forward is the policy with that adapter active (the base weights are
  shared). Prompt-learning adapters (virtual tokens) are refused when the reference is built.

Every reference forward runs in eval mode (`calling()`): no dropout, whatever the policy's training mode and
its adapters' `lora_dropout`, so two reference forwards on the same weights and inputs agree exactly.

Timing (when: the `Humanline` object's sync rule, s % k == 0): `on_step_begin` tells the object a step begins
(an auto band moves at a sync step, before that step's losses, as in our Trainer); `on_pre_optimizer_step`
runs after the last backward of step `s` (every micro-batch of the step has already taken its reference
log-probs) and before `optimizer.step()`, so a sync there hands the reference the policy's *pre-update*
weights; they serve steps `s+1 .. s+k`. TRL's `SyncRefModelCallback` instead copies at `on_step_end`, after
the update, which at k = 1 makes every ratio exactly 1.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from transformers import TrainerCallback

from humanline.core.humanline import Humanline
from humanline.devices.fsdp import copy_local_pairs_, is_sharded
from humanline.model.head import eval_mode

REFERENCE_ADAPTER = "humanline_reference"


def is_peft_model(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


class SyncedReference:
    """Where the reference's weights live and how to call it. `sync()` copies the policy into it."""

    def __init__(self, policy: torch.nn.Module, trl_ref_model: torch.nn.Module | None, unwrap, shard=None):
        self.policy = policy
        self.peft = is_peft_model(policy)
        if self.peft:
            self.model = policy
            self.adapter = _single_active_adapter(policy)
            if getattr(policy.peft_config[self.adapter], "is_prompt_learning", False):
                raise ValueError(f"humanline with peft: adapter '{self.adapter}' is a prompt-learning adapter "
                                 f"({type(policy.peft_config[self.adapter]).__name__}); its virtual tokens do not "
                                 "line up with the labels' log-probs. Use LoRA (or another weight adapter)")
            self._pairs = _adapter_pairs(policy, self.adapter)
            self.storage = f"adapter copy '{REFERENCE_ADAPTER}' of adapter '{self.adapter}'"
        else:
            if trl_ref_model is not None:
                self.model, self.storage = unwrap(trl_ref_model), "TRL's ref_model (overwritten in place)"
            else:  # made before any hook is registered on the policy, so the copy carries none of ours
                self.model, self.storage = copy.deepcopy(policy), "a copy of the policy made by humanline"
                self.model.requires_grad_(False)
                self.model.eval()
                if shard is not None:  # FSDP: sharded as the policy will be (`humanline.devices.fsdp.sharded_copy`)
                    self.model, self.storage = shard(self.model), self.storage + ", sharded"
            self._pairs = _module_pairs(self.model, policy)

    @torch.no_grad()
    def sync(self) -> None:
        """Reference <- policy, a hard copy (no mixing), in place. Under FSDP2 each process copies its own
        shards (all of them together: the whole policy); before training the policy is not sharded yet, and
        `on_train_begin` syncs once it is."""
        if is_sharded(self.model) or is_sharded(self.policy):
            if is_sharded(self.policy):
                copy_local_pairs_(self._current_pairs, self.policy, self.model)
            return
        for target, source in self._pairs:
            target.copy_(source.detach())

    def _current_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pairs as the modules hold their tensors now (sharding replaces the parameters)."""
        return _adapter_pairs(self.policy, self.adapter) if self.peft else _module_pairs(self.model, self.policy)

    @contextlib.contextmanager
    def calling(self):
        """Yields the module whose forward is the reference's (for peft: the policy, reference adapter on), in
        eval mode: no dropout, however the policy is training (every module's own mode is restored after)."""
        if not self.peft:
            with eval_mode(self.model):
                yield self.model
            return
        previous = self.model.active_adapter
        self.model.set_adapter(REFERENCE_ADAPTER)
        try:
            with eval_mode(self.model):
                yield self.model
        finally:
            # set_adapter makes the active adapter trainable and the others frozen: this restores both.
            self.model.set_adapter(previous)


def _module_pairs(reference: torch.nn.Module, policy: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(reference tensor, policy tensor) for every parameter and buffer; the architectures must agree."""
    ref_tensors = list(reference.parameters()) + list(reference.buffers())
    pol_tensors = list(policy.parameters()) + list(policy.buffers())
    if len(ref_tensors) != len(pol_tensors) or any(r.shape != p.shape for r, p in zip(ref_tensors, pol_tensors)):
        raise ValueError("humanline needs a reference with the policy's architecture (it is synced to the policy's "
                         "weights); the trainer's ref_model differs. Omit ref_model to let TRL build one.")
    return list(zip(ref_tensors, pol_tensors))


def _single_active_adapter(policy) -> str:
    active = list(policy.active_adapters)
    if len(active) != 1:
        raise ValueError(f"humanline with peft needs exactly one active adapter, found {active}")
    return active[0]


def _adapter_pairs(policy, adapter: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Add the reference adapter (`adapter`'s config without dropout) once; pair each of its weights with the
    trained one."""
    if REFERENCE_ADAPTER not in policy.peft_config:
        config = copy.deepcopy(policy.peft_config[adapter])
        if hasattr(config, "lora_dropout"):
            config.lora_dropout = 0.0  # the reference is a fixed function of its weights (eval mode says so too)
        policy.add_adapter(REFERENCE_ADAPTER, config)
    params = dict(policy.named_parameters())
    pairs = []
    for name, param in params.items():
        if f".{adapter}." in name:
            twin = params.get(name.replace(f".{adapter}.", f".{REFERENCE_ADAPTER}."))
            if twin is None:
                raise ValueError(f"humanline with peft: adapter weight {name} has no reference copy")
            twin.requires_grad_(False)  # never trained, never handed to the optimizer
            pairs.append((twin, param))
    if not pairs:
        raise ValueError(f"humanline with peft: adapter '{adapter}' has no weights to copy")
    return pairs


class SyncCallback(TrainerCallback):
    """Syncs `reference` with the policy at the start of training and before the update of every sync step of
    `humanline.rule`; tells `humanline` when each optimizer step begins."""

    def __init__(self, reference: SyncedReference, humanline: Humanline, reduce_sum=None):
        self.reference, self.humanline, self.reduce_sum = reference, humanline, reduce_sum
        self.syncs = 0  # weight copies made by the rule (not counting the one at train begin)

    def on_train_begin(self, args, state, _control, **kwargs):
        # Step 0 compares the policy with itself (docs/method.md §3.2); after a resume, with the resumed policy.
        self.reference.sync()
        self.humanline.restart(state.global_step)

    def on_step_begin(self, args, state, _control, **kwargs):
        self.humanline.begin_step(state.global_step, self.reduce_sum)  # global_step = completed updates = s

    def on_pre_optimizer_step(self, args, state, _control, **kwargs):
        if self.humanline.rule.at(state.global_step):
            self.reference.sync()
            self.syncs += 1
