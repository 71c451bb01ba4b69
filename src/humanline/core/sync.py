"""When the reference takes the policy's pre-update weights (docs/method.md §3.2, §3.5): a fixed period, or a
period that follows the drift.

Both rules answer the same questions for the reference strategies, the metrics and the TRL bridge, with `s`
counting completed optimizer steps from 0 (step 0 is always a sync: the reference starts as the policy):

    at(s)           is s a sync step (its pre-update policy serves steps s+1 .. the next sync)
    next_after(s)   the first sync step after s, once s's own sync is decided (None: none)
    last_before(s)  the last sync step before s (None: none); steps_since_sync(s) = s - last_before(s)
    count_through(s) sync steps among 0..s

`SyncRule(k)` syncs at every s with s % k == 0 (the paper's k).

`DriftRule` (`humanline.sync_every: auto`) chooses the length of each window at its sync, from how far the
policy had drifted from the reference on the last trained step before it:

    D = mean |raw token log-ratio| of step s-1 (masked tokens of the objective's main part, token-weighted over
        micro-batches and processes), L = step s-1's since_sync (its steps since the sync)
    period = clamp(floor(L * target / D), sync_min, min(sync_max, 2 * the last period))    next sync = s + period

The policy moves by about one learning-rate's worth per step, so the drift per step since the sync is D / L, and the
window ends about where the drift reaches `target`. The target is a share of the trust region the loss holds each
token's log-ratio to (`humanline.core.humanline.Humanline.trust_width`): the drift a window may reach is measured
against how far a ratio may move before a clip takes its gradient. If the drift grows less than linearly with the
since_sync, the estimate is short and the next window, measured at a larger since_sync, lengthens; the fixed point is
the since_sync at
which D = target in either case. A step with no scored token, since_sync 0 (step 0, where the reference is the policy
itself), or a drift of exactly 0 (no update since the sync: every step was skipped) says nothing: the period
stays. A window is at most twice as long as the one before it: a drift measured while the policy hardly moves (a
learning-rate warm-up, a run of skipped steps) cannot open one long window at once. Why decide the whole window at
its start rather than sync when D crosses the target: the lookahead reference computes a window's reference log-
probs at its sync, from the policy it holds then, and can only do that for steps it knows are in the window. With
the window fixed at its start, every strategy (lookahead, copy, the TRL bridge) syncs at the same steps, and
lookahead keeps its advantage (no second copy of the weights, no forward wasted on steps it would not serve).

Cost: the drift sums stay on the device. A caller that reads the last step's sums back anyway (our Trainer reads
its metrics once per step) hands them over (`Humanline.end_step`, through `DriftRule.note`) and a sync reads
nothing more; otherwise the rule reads its own sums back at sync steps only (one small all-reduce), as the TRL
bridge does (its metrics window spans TRL's logging interval, not one step).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Union

import torch

ReduceSum = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over processes
Target = Union[float, Callable[[], float]]  # a number, or a function read at each sync


class SyncRule:
    """A fixed period: a sync at every step `s` with `s % every == 0`. `every=None`: never."""

    adaptive = False

    def __init__(self, every: int | None):
        self.every = every

    def at(self, step: int) -> bool:
        return self.every is not None and step % self.every == 0

    def next_after(self, step: int) -> int | None:
        """The first sync step after `step` (None: no more)."""
        return None if self.every is None else (step // self.every + 1) * self.every

    def last_before(self, step: int) -> int | None:
        """The last sync step before `step` (None: none)."""
        if self.every is None or step <= 0:
            return None
        return (step - 1) // self.every * self.every

    def count_through(self, step: int) -> int:
        """Sync steps among 0..step."""
        return 0 if self.every is None else step // self.every + 1

    def period(self, step: int) -> int | None:
        """The length of the window that holds `step` (None: no syncs)."""
        return self.every

    # a fixed rule observes nothing and plans nothing: the same interface as `DriftRule`
    def observe(self, raw: torch.Tensor, mask: torch.Tensor) -> None:
        pass

    def begin(self, step: int, reduce_sum: ReduceSum | None = None) -> bool:
        return self.at(step)

    def restart(self, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def next_period(drift: float, since_sync: int, target: float, low: int, high: int) -> int:
    """The window length after a step whose mean |log-ratio| was `drift` (> 0) at `since_sync` steps since the
    sync (module doc). Example: drift 0.01 at 1, target 0.05 -> 5; drift 0.2 at 4, target 0.05 -> 1."""
    return max(low, min(high, math.floor(since_sync * target / drift)))


class DriftRule:
    """Sync periods that follow the drift (`humanline.sync_every: auto`, module doc).

    target: the mean |token log-ratio| a window may reach, or a function giving it at each sync (`Humanline`
    passes `sync_drift` times the trust region's width); low, high: the bounds of a period (`humanline.sync_min`,
    `sync_max`). The first window (from step 0) is `low` steps long.
    """

    adaptive = True

    def __init__(self, target: Target, low: int, high: int):
        if not ((callable(target) or target > 0) and 1 <= low <= high):
            raise ValueError(f"DriftRule: expected target > 0 and 1 <= low <= high, got {target}, {low}, {high}")
        self.target, self.low, self.high = target, low, high
        self.syncs: list[int] = []  # sync steps decided so far, ascending
        self.next = 0  # the next sync step
        self._period = low  # the length of the latest window (kept when a sync brings no information)
        self._sums: torch.Tensor | None = None  # [sum |raw|, scored tokens] of the step being trained
        self.last_drift: float | None = None  # D of the step before the latest sync (None: no information)
        self._noted: tuple[int, float, float] | None = None  # (step, sum |raw|, tokens) read back by the caller

    # ------------------------------------------------------------------ the rule's questions

    def at(self, step: int) -> bool:
        return step == self.next or self._index(step) is not None

    def next_after(self, step: int) -> int | None:
        i = bisect.bisect_right(self.syncs, step)
        return self.syncs[i] if i < len(self.syncs) else (self.next if self.next > step else None)

    def last_before(self, step: int) -> int | None:
        i = bisect.bisect_left(self.syncs, step)
        return self.syncs[i - 1] if i > 0 else None

    def count_through(self, step: int) -> int:
        return bisect.bisect_right(self.syncs, step)

    def period(self, step: int) -> int | None:
        start = self.syncs[bisect.bisect_right(self.syncs, step) - 1] if self.syncs and step >= self.syncs[0] \
            else None
        if start is None:
            return None
        end = self.next_after(start)
        return None if end is None else end - start

    def _index(self, step: int) -> int | None:
        i = bisect.bisect_left(self.syncs, step)
        return i if i < len(self.syncs) and self.syncs[i] == step else None

    # ------------------------------------------------------------------ the step

    def observe(self, raw: torch.Tensor, mask: torch.Tensor) -> None:
        """Count a micro-batch's raw log-ratios `(B, T)` (`mask` `(B, T)` bool: scored tokens) in this step's drift."""
        mask = mask.bool()
        sums = torch.stack([raw.detach().double().abs().masked_fill(~mask, 0.0).sum(), mask.sum().double()])
        self._sums = sums if self._sums is None else self._sums + sums.to(self._sums.device)

    def begin(self, step: int, reduce_sum: ReduceSum | None = None) -> bool:
        """Before step `step`'s losses, every process, every step: True when `step` is a sync step; its window's
        length is then decided from the drift of step `step - 1` (reduced over processes, so that every process
        decides the same). The drift sums start again for `step`."""
        synced = step == self.next
        if synced:
            noted = self._noted if self._noted is not None and self._noted[0] == step - 1 else None
            drift = self._read(reduce_sum) if noted is None else (noted[1] / noted[2] if noted[2] > 0 else None)
            since_sync = step - 1 - (self.last_before(step - 1) or 0) if step > 0 else 0
            if drift and since_sync > 0:  # None: no token scored; 0: no update since the sync (every step skipped)
                self.last_drift = drift
                target = self.target() if callable(self.target) else self.target
                self._period = next_period(drift, since_sync, target, self.low, min(self.high, 2 * self._period))
            self.syncs.append(step)  # (no information: the period stays)
            self.next = step + self._period
        self._sums, self._noted = None, None
        return synced

    def _read(self, reduce_sum: ReduceSum | None) -> float | None:
        sums = self._sums if self._sums is not None else torch.zeros(2, dtype=torch.float64)
        if reduce_sum is not None:
            sums = reduce_sum(sums)
        total, count = sums.tolist()
        return total / count if count > 0 else None

    def note(self, step: int, abs_sum: float, count: float) -> None:
        """Step `step`'s drift sums, already reduced over processes and read back by the caller (the same sums
        `observe` gathered): the sync at `step + 1` then reads nothing from the device."""
        self._noted = (step, abs_sum, count)

    def restart(self, step: int) -> None:
        """The reference was set to the policy of `step` outside the rule (the TRL bridge resyncs at train
        begin, after a resume): a new first window starts there."""
        self.syncs = [s for s in self.syncs if s < step]
        self.next, self._sums, self._period = step, None, self.low

    # ------------------------------------------------------------------ exact resume

    def state_dict(self) -> dict:
        sums = self._sums.detach().cpu() if self._sums is not None else torch.zeros(0, dtype=torch.float64)
        return {"syncs": list(self.syncs), "next": self.next, "period": self._period, "sums": sums,
                "last_drift": self.last_drift, "noted": self._noted}

    def load_state_dict(self, state: dict) -> None:
        self.syncs, self.next = [int(s) for s in state["syncs"]], int(state["next"])
        self._period = int(state["period"])
        self.last_drift = state.get("last_drift")
        self._noted = tuple(state["noted"]) if state.get("noted") is not None else None
        sums = state["sums"]
        self._sums = sums.clone() if sums.numel() else None
