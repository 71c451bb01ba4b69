"""Where reference log-probs come from: one interface, five strategies (docs/method.md §3.2).

Timing convention (the method): `s` counts completed optimizer steps. At step `s` the trainer first asks the
reference for the log-probs of all of the step's micro-batches (`logps`), *then* calls
`capture_pre_update(s)`, then runs the policy's forward/backward and the optimizer update. Whatever a strategy
takes from the policy in `capture_pre_update(s)` is therefore the policy from *before* step `s`'s update; it
serves steps `s+1 ..`. At step 0 the reference equals the initial policy (every log-ratio is 0); with `k = 1`
the loss at step `s` compares theta_s with theta_{s-1}. Taking the log-probs before the capture (rather than
copying after backward) is the same schedule and stays correct where the optimizer steps inside `backward`
(DeepSpeed).

What `capture_pre_update(s)` takes, per strategy (it returns True when the reference moved to a newer policy,
i.e. a humanline sync):
- `FrozenReference` (plain DPO/KTO/GRPO; `AdapterOffReference` for a LoRA policy): nothing.
- `CopyReference`: the policy's weights, copied in place into a second model, at the sync steps of humanline's
  rule (`humanline.core.humanline.SyncRule`: s % k == 0; online data, where future batches are unknown).
  Under FSDP2, `ShardedCopyReference`: the second model is sharded like the policy, and each process copies
  its own shards (`frozen` then also holds a sharded copy, made before the policy was sharded).
- `LookaheadReference` with a sync rule: no weight copy; at a sync step s, the log-probs of the micro-batches
  of steps s+1..(the next sync step), computed by the policy itself. Same forward count as a reference model, no second
  set of weights. Needs the future batches (offline data).
- `LookaheadReference` with `sync=None` ("cache"): at step 0, the log-probs of every later step, by the
  initial policy (a frozen reference computed once, kept in host memory; no reference weights while training).
- `SamplerReference` (online/sparse GRPO without humanline): at a step where a buffer was sampled, the log-probs
  of the buffer's later steps, by the policy that sampled them (the behaviour policy: the standard GRPO/PPO
  "old" policy). Online (sample every step) the ratio is exactly 1 in value and the loss is the plain policy
  gradient; its KL term is taken against the sampling policy too (a trust region), not the initial model.
"""

from __future__ import annotations

import copy
from typing import Callable, Protocol

import torch

from humanline.core.humanline import SyncRule
from humanline.devices.fsdp import copy_shards_, load_local_state, local_state
from humanline.devices.weights import copy_weights_
from humanline.model.forward import batch_logps_no_grad

Logps = dict[str, torch.Tensor]  # part ("main", "kl") -> (N, L - 1) log-probs
BatchesOf = Callable[[int], list[dict]]  # step -> that step's micro-batches on this process


class Reference(Protocol):
    name: str

    def logps(self, step: int, index: int, batch: dict) -> Logps: ...

    def capture_pre_update(self, step: int) -> bool: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def _snapshot(policy: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    ref.eval()
    return ref


class FrozenReference:
    """A frozen copy of the initial policy (or a separate reference model)."""

    name = "frozen"

    def __init__(self, policy: torch.nn.Module, ref_model: torch.nn.Module | None = None):
        self.model = ref_model if ref_model is not None else _snapshot(policy)

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        return batch_logps_no_grad(self.model, batch)

    def capture_pre_update(self, step: int) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}  # rebuilt from the initial weights on resume

    def load_state_dict(self, state: dict) -> None:
        pass


class AdapterOffReference(FrozenReference):
    """Frozen reference of a LoRA (peft) policy: the same model with its adapters disabled, no weight copy."""

    name = "frozen"

    def __init__(self, policy: torch.nn.Module):
        self.model = policy

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        with self.model.disable_adapter():
            return batch_logps_no_grad(self.model, batch)


class CopyReference(FrozenReference):
    """Humanline syncing with a weight copy: copies the policy's parameters in place at the rule's sync steps."""

    name = "copy"

    def __init__(self, policy: torch.nn.Module, sync: SyncRule):
        super().__init__(policy)
        self.policy = policy
        self.sync = sync

    def capture_pre_update(self, step: int) -> bool:
        if not self.sync.at(step):
            return False
        self.copy_policy()
        return True

    def copy_policy(self) -> None:
        """Reference <- policy, in place (parameters and buffers)."""
        copy_weights_(self.model, self.policy)

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])


class ShardedCopyReference(CopyReference):
    """`CopyReference` under FSDP: `model` is a second copy of the policy, sharded like it
    (`humanline.devices.fsdp.sharded_copy`). A sync copies every rank's local shards of the pre-update policy in place,
    so the ranks together hold the whole pre-update model, as one process would; checkpoints keep each rank's
    shards (a resumed run has the same number of processes)."""

    def __init__(self, policy: torch.nn.Module, sync: SyncRule, model: torch.nn.Module):
        self.model, self.policy, self.sync = model, policy, sync

    def copy_policy(self) -> None:
        copy_shards_(self.model, self.policy)

    def state_dict(self) -> dict:
        return {"shards": local_state(self.model)}

    def load_state_dict(self, state: dict) -> None:
        load_local_state(self.model, state["shards"])


class LookaheadReference:
    """Reference log-probs computed ahead by the policy itself (no weight copy).

    `sync` (humanline's rule): at a sync step s (before its update), compute steps s+1..(the next sync step),
    also past `max_steps` (the larger of the run's and its first segment's: a resumed run may go further), up to
    twice it.
    `sync=None`: compute the steps before `max_steps` once at step 0 (a cached frozen reference: a resumed run
    cannot go past them).
    Step 0's own batches are computed by the initial policy, which is the initial reference.
    """

    def __init__(self, policy: torch.nn.Module, batches_of: BatchesOf, max_steps: int, sync: SyncRule | None):
        self.policy = policy
        self.batches_of = batches_of
        self.max_steps = max_steps
        self.sync = sync
        self.name = "lookahead" if sync is not None else "cache"
        self.cache: dict[tuple[int, int], Logps] = {}

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        key = (step, index)
        if key not in self.cache:
            if step != 0:
                raise RuntimeError(f"lookahead reference: no log-probs cached for step {step}, micro-batch {index}")
            return batch_logps_no_grad(self.policy, batch)
        return self._pop(key, batch)

    def _pop(self, key: tuple[int, int], batch: dict) -> Logps:
        """A cached entry, on the batch's device: a whole-run cache lives in host memory (see `capture_pre_update`), and
        so does any cache restored from a checkpoint; the loss needs it beside the policy's log-probs."""
        device = batch["input_ids"].device  # without blocking: the host need not wait for the device's queue
        return {part: t.to(device, non_blocking=True) for part, t in self.cache.pop(key).items()}

    def capture_pre_update(self, step: int) -> bool:
        if self.sync is None:
            horizon = range(1, self.max_steps) if step == 0 else range(0)
        elif self.sync.at(step):
            # the whole window, also past the end (a resume that moves the end later continues exactly: at most
            # one window's extra forwards), but never past twice the run's planned length: a window longer than
            # the run (the sync period 10**9 of "clip-only") would never end
            horizon = range(step + 1, min(self.sync.next_after(step), 2 * self.max_steps - 1) + 1)
        else:
            return False
        # A whole run's reference log-probs would crowd accelerator memory: keep them on the host. The k
        # steps of a lookahead stay where they were computed.
        offload = self.sync is None
        for future in horizon:
            for index, batch in enumerate(self.batches_of(future)):
                self.cache[(future, index)] = {part: t.cpu() if offload else t
                                               for part, t in batch_logps_no_grad(self.policy, batch).items()}
        return bool(horizon) or self.sync is not None

    def state_dict(self) -> dict:
        return {"cache": {f"{s}:{i}": {p: t.cpu() for p, t in v.items()} for (s, i), v in self.cache.items()}}

    def load_state_dict(self, state: dict) -> None:
        device = torch.device("cpu") if self.sync is None else next(self.policy.parameters()).device
        self.cache = {}
        for key, value in state["cache"].items():
            s, i = key.split(":")
            self.cache[(int(s), int(i))] = {p: t.to(device) for p, t in value.items()}


class SamplerReference(LookaheadReference):
    """Reference log-probs = the sampling policy's, computed when a buffer is sampled (see module doc).

    `batches_of(step)`: that step's micro-batches; `later_steps(step)`: the steps after `step` of a buffer
    sampled at `step`, or None when no buffer was sampled at `step`.
    """

    def __init__(self, policy: torch.nn.Module, batches_of: BatchesOf,
                 later_steps: Callable[[int], list[int] | None]):
        super().__init__(policy, batches_of, max_steps=0, sync=None)
        self.later_steps = later_steps
        self.name = "sampler"

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        key = (step, index)
        if key in self.cache:
            return self._pop(key, batch)
        if self.later_steps(step) is None:  # only a sampling step's own batches are scored now
            raise RuntimeError(f"sampler reference: no log-probs for step {step} and no buffer was sampled at it")
        return batch_logps_no_grad(self.policy, batch)  # a sampling step: the policy is the sampler

    def capture_pre_update(self, step: int) -> bool:
        for future in self.later_steps(step) or []:
            for index, batch in enumerate(self.batches_of(future)):
                self.cache[(future, index)] = batch_logps_no_grad(self.policy, batch)
        return False  # not a humanline sync


def choose_reference(strategy: str, *, humanline: bool, regime: str, sampler_reference: bool = False) -> str:
    """Resolve `train.reference: auto`: lookahead for offline humanline, copy for online humanline,
    cache for offline without humanline; online/sparse without humanline: the sampling policy where the
    objective's table entry asks for it (`ObjectiveSpec.sampler_reference`: GRPO's standard old-policy ratio),
    else a frozen reference (standard online DPO/KTO)."""
    if strategy != "auto":
        return strategy
    if humanline:
        return "lookahead" if regime == "offline" else "copy"
    if regime == "offline":
        return "cache"
    return "sampler" if sampler_reference else "frozen"


def needs_weight_copy(strategy: str, policy: torch.nn.Module) -> bool:
    """Whether `build_reference` keeps a second copy of the weights for `strategy` (a LoRA policy's frozen
    reference is the policy with its adapters off)."""
    return strategy == "copy" or (strategy == "frozen" and not hasattr(policy, "disable_adapter"))


def build_reference(
    strategy: str, policy: torch.nn.Module, *, sync: SyncRule, batches_of: BatchesOf, max_steps: int,
    later_steps: Callable[[int], list[int] | None] | None = None, ref_model: torch.nn.Module | None = None,
) -> Reference:
    """Construct the reference named by `strategy` (already resolved by `choose_reference`). `ref_model`: the
    copy of the weights a `copy` or `frozen` reference holds, when the caller made it (under FSDP, a sharded
    copy made before the policy was sharded); else the strategy copies the policy itself."""
    if strategy == "frozen":
        if ref_model is not None:
            return FrozenReference(policy, ref_model)
        return AdapterOffReference(policy) if hasattr(policy, "disable_adapter") else FrozenReference(policy)
    if strategy == "copy":
        return CopyReference(policy, sync) if ref_model is None else ShardedCopyReference(policy, sync, ref_model)
    if strategy == "lookahead":
        return LookaheadReference(policy, batches_of, max_steps, sync)
    if strategy == "cache":
        return LookaheadReference(policy, batches_of, max_steps, None)
    if strategy == "sampler":
        return SamplerReference(policy, batches_of, later_steps)
    raise ValueError(f"unknown reference strategy {strategy!r}")
