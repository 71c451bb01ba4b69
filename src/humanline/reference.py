"""Where reference log-probs come from: one interface, four strategies (SPEC 3.2).

Timing convention (the method): `s` counts completed optimizer steps. At step `s` the trainer first asks the
reference for the log-probs of all of the step's micro-batches, *then* calls `sync(s)`, then runs the policy's
forward/backward and the optimizer update. A sync at step `s` therefore hands the reference the policy's
weights from *before* step `s`'s update, and they serve steps `s+1 .. s+k`. At step 0 the reference equals the
initial policy (every log-ratio is 0); with `k = 1` the loss at step `s` compares theta_s with theta_{s-1}.
Taking the reference log-probs before the sync (rather than copying after backward) is the same schedule
and stays correct where the optimizer steps inside `backward` (DeepSpeed).

Strategies:
- `FrozenReference`: a separate frozen model (plain DPO/KTO/GRPO).
- `LookaheadReference` with `sync_every=k`: no weight copy. At a sync it runs a no-grad forward of the
  current policy on the micro-batches of the next `k` steps and keeps those log-probs. Same forward count as
  a reference model, no second set of weights. Needs the future batches (offline data).
- `LookaheadReference` with `sync_every=None` ("cache"): a frozen reference computed once, by the initial
  policy, for the whole schedule before training; no reference weights in memory while training.
- `CopyReference`: a second copy of the weights, overwritten in place every `k` steps (online data, where
  future batches are unknown).
- `SamplerReference` (online/sparse GRPO without humanline): the behaviour policy, i.e. the policy's
  log-probs at the step its samples were drawn, as in standard GRPO/PPO where the ratio is taken against the
  "old" policy. At a sampling step the whole new buffer is scored before that step's update; online
  (sample every step) the ratio is therefore exactly 1 in value and the loss is the plain policy gradient.
  Its KL term is then taken against the sampling policy too (a trust region), not against the initial model.
"""

from __future__ import annotations

import copy
from typing import Callable, Protocol

import torch

from humanline.forward import batch_logps_no_grad

Logps = dict[str, torch.Tensor]  # part ("main", "kl") -> (N, L - 1) log-probs
BatchesOf = Callable[[int], list[dict]]  # step -> that step's micro-batches on this process


class Reference(Protocol):
    name: str

    def logps(self, step: int, index: int, batch: dict) -> Logps: ...

    def sync(self, step: int) -> bool: ...

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

    def sync(self, step: int) -> bool:
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
    """Humanline syncing with a weight copy: `sync(s)` copies the policy's parameters in place when s % k == 0."""

    name = "copy"

    def __init__(self, policy: torch.nn.Module, sync_every: int):
        super().__init__(policy)
        self.policy = policy
        self.sync_every = sync_every

    @torch.no_grad()
    def sync(self, step: int) -> bool:
        if step % self.sync_every:
            return False
        for ref_param, param in zip(self.model.parameters(), self.policy.parameters(), strict=True):
            ref_param.copy_(param.detach())
        for ref_buf, buf in zip(self.model.buffers(), self.policy.buffers(), strict=True):
            ref_buf.copy_(buf)
        return True

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])


class LookaheadReference:
    """Reference log-probs computed ahead by the policy itself (no weight copy).

    `sync_every=k`: at step s with s % k == 0 (before its update), compute steps s+1..s+k.
    `sync_every=None`: compute the whole schedule once at step 0 (a cached frozen reference).
    Step 0's own batches are computed by the initial policy, which is the initial reference.
    """

    def __init__(self, policy: torch.nn.Module, batches_of: BatchesOf, max_steps: int, sync_every: int | None):
        self.policy = policy
        self.batches_of = batches_of
        self.max_steps = max_steps
        self.sync_every = sync_every
        self.name = "lookahead" if sync_every else "cache"
        self.cache: dict[tuple[int, int], Logps] = {}

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        key = (step, index)
        if key not in self.cache:
            if step != 0:
                raise RuntimeError(f"lookahead reference: no log-probs cached for step {step}, micro-batch {index}")
            return batch_logps_no_grad(self.policy, batch)
        return self._pop(key, batch)

    def _pop(self, key: tuple[int, int], batch: dict) -> Logps:
        """A cached entry, on the batch's device: a whole-run cache lives in host memory (see `sync`), and so
        does any cache restored from a checkpoint; the loss needs it beside the policy's log-probs."""
        device = batch["input_ids"].device
        return {part: t.to(device) for part, t in self.cache.pop(key).items()}

    def sync(self, step: int) -> bool:
        if self.sync_every is None:
            horizon = range(1, self.max_steps) if step == 0 else range(0)
        elif step % self.sync_every == 0:
            horizon = range(step + 1, min(step + self.sync_every, self.max_steps - 1) + 1)
        else:
            return False
        # A whole run's reference log-probs would crowd accelerator memory: keep them on the host. The k
        # steps of a lookahead stay where they were computed.
        offload = self.sync_every is None
        for future in horizon:
            for index, batch in enumerate(self.batches_of(future)):
                self.cache[(future, index)] = {part: t.cpu() if offload else t
                                               for part, t in batch_logps_no_grad(self.policy, batch).items()}
        return bool(horizon) or self.sync_every is not None

    def state_dict(self) -> dict:
        return {"cache": {f"{s}:{i}": {p: t.cpu() for p, t in v.items()} for (s, i), v in self.cache.items()}}

    def load_state_dict(self, state: dict) -> None:
        device = torch.device("cpu") if self.sync_every is None else next(self.policy.parameters()).device
        self.cache = {}
        for key, value in state["cache"].items():
            s, i = key.split(":")
            self.cache[(int(s), int(i))] = {p: t.to(device) for p, t in value.items()}


class SamplerReference(LookaheadReference):
    """Reference log-probs = the sampling policy's, computed when a buffer is sampled (see module doc)."""

    def __init__(self, policy: torch.nn.Module, schedule):
        super().__init__(policy, schedule, max_steps=0, sync_every=None)
        self.schedule = schedule
        self.name = "sampler"

    def logps(self, step: int, index: int, batch: dict) -> Logps:
        key = (step, index)
        if key in self.cache:
            return self._pop(key, batch)
        if step != self.schedule.buffer_start:
            raise RuntimeError(f"sampler reference: no log-probs for step {step} (buffer began at "
                               f"{self.schedule.buffer_start})")
        return batch_logps_no_grad(self.policy, batch)  # the sampling step: the policy is the sampler

    def sync(self, step: int) -> bool:
        if step != self.schedule.buffer_start:
            return False
        for future in sorted(s for s in self.schedule.buffer if s > step):
            for index, batch in enumerate(self.schedule(future)):
                self.cache[(future, index)] = batch_logps_no_grad(self.policy, batch)
        return False  # not a humanline sync


def choose_reference(strategy: str, *, humanline: bool, regime: str, objective: str = "dpo") -> str:
    """Resolve `train.reference: auto`: lookahead for offline humanline, copy for online humanline,
    cache for offline without humanline; online/sparse without humanline: the sampling policy for GRPO
    (standard old-policy ratio) and a frozen reference for DPO/KTO (standard online DPO/KTO)."""
    if strategy != "auto":
        return strategy
    if humanline:
        return "lookahead" if regime == "offline" else "copy"
    if regime == "offline":
        return "cache"
    return "sampler" if objective == "grpo" else "frozen"


def build_reference(
    strategy: str, policy: torch.nn.Module, *, sync_every: int, batches_of: BatchesOf, max_steps: int
) -> Reference:
    """Construct the reference named by `strategy` (already resolved by `choose_reference`)."""
    if strategy == "frozen":
        return AdapterOffReference(policy) if hasattr(policy, "disable_adapter") else FrozenReference(policy)
    if strategy == "copy":
        return CopyReference(policy, sync_every)
    if strategy == "lookahead":
        return LookaheadReference(policy, batches_of, max_steps, sync_every)
    if strategy == "cache":
        return LookaheadReference(policy, batches_of, max_steps, None)
    if strategy == "sampler":
        return SamplerReference(policy, batches_of)
    raise ValueError(f"unknown reference strategy {strategy!r}")
