"""How humanline enters TRL's losses: one forward hook on the policy, live only inside `compute_loss`.

For each policy forward TRL makes with `fused_lm_head=True` (TRL's request for per-token log-probs: `log_probs`
of shape `(B, L - 1)`, zero where `labels[:, 1:] == -100`), the hook

1. runs the synced reference on the very same arguments, without gradient: `ref` `(B, L - 1)`;
2. forms `raw = policy - ref` and hands it to the run's `Humanline` object (`humanline.core.humanline`, the
   one our Trainer uses): `lr = humanline.apply(raw)` (clip, reject or identity; counted in its metrics, seen
   by an auto band);
3. rewrites what TRL will combine, per objective:
   - DPO, KTO: the policy's `log_probs` become `ref + lr`, and TRL's reference forward, redirected to a replay
     of step 1, returns `ref`. Every `policy_logps - ref_logps` TRL then forms is `sum_t lr`: the transform
     sits upstream of the sequence sums and of whichever DPO/KTO loss TRL applies (KTO's KL reference point
     included: TRL computes it without gradient from the mismatched pairs, here also transformed). Gradient:
     `d(ref + lr) = d lr`, zero for tokens outside the band.
   - GRPO: the policy's `log_probs` stay raw; TRL's `old_per_token_logps` becomes `policy - lr` (carrying the
     gradient) and `ref_per_token_logps` becomes `ref`. TRL's ratio `exp(policy - old)` is then `exp(lr)`, and
     its KL term `exp(ref - policy) - (ref - policy) - 1` is on the raw ratio: HALOs semantics, ratio and KL
     both against the synced reference (docs/method.md §4).

After TRL's loss returns, the humanline metrics of the window since TRL last logged (token-weighted over
micro-batches and processes) replace their entries in TRL's `_metrics`, and the call is checked: the hook fired,
and TRL consumed exactly what was rewritten
(DPO/KTO: every replayed reference; GRPO: both injected tensors, read after the policy forward). Anything
else raises `HumanlineTRLError`, so a TRL whose loss is built differently cannot train silently without
humanline.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from humanline.core.humanline import Humanline
from humanline.integrations._trl_guard import internals_error
from humanline.integrations._trl_reference import SyncCallback, SyncedReference

_WINDOW_KEY = "humanline/syncs"  # always logged; its absence from TRL's `_metrics` means TRL logged and cleared


class _Scope:
    """One `compute_loss` call: what the hook rewrote, for TRL's reference replay and the checks after."""

    def __init__(self, inputs):
        self.inputs = inputs
        self.replay: list[tuple[torch.Tensor, torch.Tensor]] = []  # (input_ids, reference log-probs)
        self.calls = 0


class HumanlineLoss:
    """Wraps a TRL trainer's `compute_loss`; subclasses say how TRL's inputs are rewritten."""

    def __init__(self, trainer, *, humanline: Humanline, reference: SyncedReference, sync: SyncCallback):
        self.trainer, self.humanline, self.reference, self.sync = trainer, humanline, reference, sync
        self.original = trainer.compute_loss  # bound method of the TRL class
        self.scope: _Scope | None = None
        self.in_reference = False
        self._micro = (-1, 0)  # (optimizer step, micro-batch index within it), seeds the rejection draws
        self.mode = "train"
        self.handle = reference.policy.register_forward_hook(self._on_forward, with_kwargs=True)

    def __call__(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        step = self.trainer.state.global_step
        self._micro = (step, self._micro[1] + 1 if self._micro[0] == step else 0)
        self.mode = "train" if self.trainer.model.training else "eval"
        if _WINDOW_KEY not in self.trainer._metrics[self.mode]:  # TRL logged since: a new metrics window
            self.humanline.reset(self.mode)
        scope = _Scope(self._wrap_inputs(inputs))
        self.scope = scope
        try:
            with self._redirect(scope):
                result = self.original(model, scope.inputs, return_outputs=return_outputs,
                                       num_items_in_batch=num_items_in_batch)
        finally:
            self.scope = None
        self._check(scope)
        self._log(scope)
        return result

    # ------------------------------------------------------------------ the hook

    def _on_forward(self, module, args, kwargs, output):
        scope = self.scope
        if scope is None or self.in_reference or not kwargs.get("fused_lm_head"):
            return None  # not a loss-time log-prob request: generation, our own reference call, plain forwards
        if kwargs.get("shift_labels") is not None:
            raise ValueError("humanline: context/sequence parallelism (pre-shifted labels) is not supported")
        labels = kwargs.get("labels")
        policy = getattr(output, "log_probs", None)
        if labels is None or policy is None:
            raise internals_error("a fused policy forward came without `labels` or returned no `log_probs`")
        mask = labels[:, 1:] != -100
        if policy.shape != mask.shape:
            raise ValueError(f"humanline: policy log-probs {tuple(policy.shape)} do not line up with the labels "
                             f"{tuple(mask.shape)} (prompt-learning adapters that add virtual tokens are unsupported)")
        ref = self._reference_logps(args, kwargs)
        step, index = self._micro
        part = "kl" if self._is_auxiliary(scope, kwargs) else "main"
        lr = self.humanline.apply(policy - ref, mask, step=step, index=index, part=part, mode=self.mode)
        scope.calls += 1
        return self._rewrite(scope, kwargs, output, ref, lr)

    def _reference_logps(self, args, kwargs) -> torch.Tensor:
        """The reference's log-probs for the policy forward's arguments: no gradient, eval mode (no dropout)."""
        self.in_reference = True  # with peft the reference is this same module: its hook must stand aside
        try:
            with torch.no_grad(), self.reference.calling() as reference:
                return reference(*args, **kwargs).log_probs.detach()
        finally:
            self.in_reference = False

    # ------------------------------------------------------------------ per objective

    def _wrap_inputs(self, inputs):
        return inputs

    @contextlib.contextmanager
    def _redirect(self, scope: _Scope):
        yield

    def _is_auxiliary(self, scope: _Scope, kwargs) -> bool:
        return False

    def _rewrite(self, scope: _Scope, kwargs, output, ref: torch.Tensor, lr: torch.Tensor):
        raise NotImplementedError

    def _check(self, scope: _Scope) -> None:
        if scope.calls == 0:
            raise internals_error(f"{type(self.trainer).__name__}'s loss made no policy forward with "
                                  "fused_lm_head=True, so no log-ratio could be transformed")

    # ------------------------------------------------------------------ metrics

    def _log(self, scope: _Scope) -> None:
        """The window's metrics so far, as one-entry lists: TRL's averaging at log time then returns them as
        they are (token-weighted over the window), not a mean of per-call fractions."""
        metrics = self.humanline.metrics(self._micro[0], self.reduce_sum, mode=self.mode, reset=False)
        for key, value in metrics.items():
            self.trainer._metrics[self.mode][key] = [value]

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        accelerator = self.trainer.accelerator  # every process calls compute_loss equally often
        if accelerator.num_processes == 1:
            return tensor
        return accelerator.reduce(tensor.to(accelerator.device), reduction="sum")


class PreferenceLoss(HumanlineLoss):
    """DPO and KTO: policy log-probs become `ref + lr`; TRL's reference forward replays `ref`."""

    @contextlib.contextmanager
    def _redirect(self, scope: _Scope):
        trainer = self.trainer
        saved = trainer.ref_model, trainer.precompute_ref_logps
        # TRL's model-reference branch, with the replay as the model: precomputed values (stale after a sync)
        # and TRL's own reference weights are not read while the loss is built.
        trainer.ref_model, trainer.precompute_ref_logps = _ReplayReference(scope), False
        try:
            yield
        finally:
            trainer.ref_model, trainer.precompute_ref_logps = saved

    def _is_auxiliary(self, scope: _Scope, kwargs) -> bool:
        return kwargs.get("input_ids") is scope.inputs.get("KL_input_ids")  # KTO's mismatched pairs

    def _rewrite(self, scope: _Scope, kwargs, output, ref, lr):
        scope.replay.append((kwargs.get("input_ids"), ref))
        output.log_probs = ref + lr
        return output

    def _check(self, scope: _Scope) -> None:
        super()._check(scope)
        if scope.replay:
            raise internals_error(f"{type(self.trainer).__name__}'s loss did not run its reference forward on "
                                  f"{len(scope.replay)} of the {scope.calls} policy forwards")


class _ReplayReference:
    """Stands in for TRL's `ref_model` inside `compute_loss`: returns the reference log-probs the hook already
    computed for the same `input_ids` (TRL runs its reference after the policy, on the same inputs)."""

    def __init__(self, scope: _Scope):
        self.scope = scope

    def __call__(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        replay = self.scope.replay
        match = next((i for i, (seen, _) in enumerate(replay) if seen is ids), None)
        if match is None and ids is not None:
            match = next((i for i, (seen, _) in enumerate(replay)
                          if seen.shape == ids.shape and torch.equal(seen, ids)), None)
        if match is None:
            raise internals_error("TRL's reference forward came before (or without) the policy forward on the "
                                  "same inputs")
        return SimpleNamespace(log_probs=replay.pop(match)[1])


_GRPO_KEYS = ("old_per_token_logps", "ref_per_token_logps")


class _GuardedInputs(dict):
    """A GRPO micro-batch whose old/reference log-probs exist only once the policy forward has made them;
    reading them earlier raises. TRL's own values (from generation time) are dropped."""

    def __init__(self, inputs: dict):
        super().__init__({k: v for k, v in inputs.items() if k not in _GRPO_KEYS})
        self.injected = False
        self.read: set[str] = set()

    def _note(self, key) -> None:
        if key in _GRPO_KEYS:
            if not self.injected:
                raise internals_error(f"GRPO's loss read {key} before the policy forward")
            self.read.add(key)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def inject(self, old: torch.Tensor, ref: torch.Tensor) -> None:
        dict.__setitem__(self, "old_per_token_logps", old)
        dict.__setitem__(self, "ref_per_token_logps", ref)
        self.injected = True


class GRPOLoss(HumanlineLoss):
    """GRPO: TRL's old log-probs become `policy - lr` (ratio `exp(lr)`), its reference log-probs `ref`."""

    def _wrap_inputs(self, inputs):
        return _GuardedInputs(inputs)

    def _rewrite(self, scope: _Scope, kwargs, output, ref, lr):
        if scope.inputs.injected:
            raise internals_error("GRPO's loss ran the policy forward more than once per micro-batch")
        width = scope.inputs["completion_ids"].size(1)  # TRL keeps the last `width` positions
        policy = output.log_probs
        scope.inputs.inject(old=(policy - lr)[:, -width:], ref=ref[:, -width:])
        return None  # the policy's own log-probs stay raw (entropy, KL)

    def _check(self, scope: _Scope) -> None:
        super()._check(scope)
        wanted = {"old_per_token_logps"} | ({"ref_per_token_logps"} if self.trainer.beta != 0.0 else set())
        if not wanted <= scope.inputs.read:
            raise internals_error(f"GRPO's loss did not read {', '.join(sorted(wanted - scope.inputs.read))}")


def skip_generation_reference(trainer) -> None:
    """TRL's GRPO computes reference log-probs at generation time (when beta != 0); humanline replaces them by
    the synced reference's at loss time, so that pass would be wasted: run generation with beta set to 0."""
    generate = trainer._generate_and_score_completions

    def generate_without_reference(*args, **kwargs):
        beta, trainer.beta = trainer.beta, 0.0
        try:
            return generate(*args, **kwargs)
        finally:
            trainer.beta = beta

    trainer._generate_and_score_completions = generate_without_reference
