"""Humanline as one object (docs/method.md §3): the settings, the sync rule, the transform of token log-ratios,
the band it clips to, the seeded draws of the stochastic form, and the token-weighted metrics.

Our `Trainer` and the TRL bridge (`humanline.integrations.trl`) both build a `Humanline` from the same
settings type (`HumanlineConfig`, a recipe's `humanline:` block; the bridge's `HumanlineArgs` derives from it)
and call it the same way, once per optimizer step and once per policy forward:

    synced = humanline.begin_step(s, reduce_sum)    # before step s's reference is used: True when s is a sync
                                                    # step (a drift rule then sets the window's length, an auto
                                                    # band its bounds)
    lr = humanline.apply(raw, mask, step=s, index=i) # raw (B, T) -> the log-ratio the objective sees
    sums = humanline.end_step(s, reduce_sum)        # after the update: the window's sums (read back once); a
                                                    # drift rule keeps step s's drift for the next sync
    logged = humanline.metrics(s, sums=sums)        # token-weighted over the window, across processes

`Humanline.off()` is the same interface doing nothing (identity transform, no syncs, no metrics), so no caller
tests whether humanline is on. Where the weights live and how they are copied stays with the caller (reference
strategies, the TRL adapter copy); when to copy is `humanline.rule` (`humanline.core.sync`: a fixed k, or a
period that follows the drift).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from humanline.core.band import FixedBand, make_band
from humanline.core.sync import DriftRule, SyncRule
from humanline.core.transforms import clip_log_ratio, reject_log_ratio

__all__ = ["Humanline", "HumanlineConfig", "SyncRule", "DriftRule", "settings_problems", "make_rule"]

ReduceSum = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over processes
DEFAULT_DRIFT = 0.16  # humanline.sync_drift's default: chosen on tuning seeds (docs/method.md §3.5)
TRANSFORMS = ("clip", "reject", "none")
BANDS = ("fixed", "auto")
# KTO's mismatched pairs draw from their own stream, whichever forward runs first (an XOR in the low 32 bits:
# the CPU generator's stream depends on those only)
_KL_SEED_MASK = 0x5BD1E995


@dataclass
class HumanlineConfig:
    """The `humanline:` block of a recipe; the one settings type of humanline, for our Trainer and the bridges."""

    enabled: bool = False  # humanline on: the sync schedule and the log-ratio transform below (off: the plain
    # objective, every other field here unused)
    sync_every: int | str = 1  # k: reference takes the pre-update policy weights every k optimizer steps; or
    # auto: each window's length is chosen at its sync from the drift (docs/method.md §3.5, humanline.core.sync)
    sync_drift: float = DEFAULT_DRIFT  # auto: the mean |token log-ratio| against the reference that a window may
    # reach before the next sync, as a share of the trust region's narrower side (the humanline band's, and the
    # objective's own ratio clip's where it has one: GRPO's eps_low, eps_high), docs/method.md §3.5
    sync_min: int = 1  # auto: the shortest window
    sync_max: int = 32  # auto: the longest window (sparse regimes: at most the sampling period, train.sample_every)
    transform: str = "clip"  # clip | reject (stochastic) | none (syncing only): docs/method.md §3.1, §3.3
    low: float = -1.5  # the band's lower bound: token log-ratios below it are clipped to it (log eps_P, < 0);
    # HALOs default -1.0
    high: float = 1.5  # the band's upper bound: token log-ratios above it are clipped to it (log eps_R, > 0)
    gamma_p: float = 0.5  # transform reject: a token of ratio r is kept with probability (r / max r)^gamma_p x
    # (min r / r)^gamma_r, so a larger gamma_p rejects more low-ratio tokens (paper gamma_P; Beta(gamma_p, 1) draws)
    gamma_r: float = 0.01  # transform reject: a larger gamma_r rejects more high-ratio tokens (paper gamma_R;
    # Beta(gamma_r, 1) draws)
    band: str = "fixed"  # fixed: clip to [low, high] | auto: self-calibrating (docs/method.md §3.4): at each
    # sync the bounds move towards the quantiles of the raw log-ratios seen since the last one; low and high
    # are its starting bounds; needs transform clip. The bounds in use are logged as humanline/low, humanline/high.
    # An objective that clips the ratio itself (GRPO's PPO clip) keeps [low, high] under auto
    band_quantiles: list[float] = field(default_factory=lambda: [0.1, 0.99])  # auto: where the bounds go,
    # p_lo < p_hi in (0, 1): p_lo of the tokens fall below the band, 1 - p_hi above it, p_hi - p_lo inside.
    # Clips mostly below, as the authors' gamma_p = 0.5 >> gamma_r = 0.01 do; chosen on the demo's tuning
    # seeds, not its reported ones, for all objectives at once (docs/method.md §3.4, lab/log.md)
    band_rate: float = 0.5  # auto: smoothing per sync, in (0, 1]: the bounds move this share of the way
    # (in log space) towards the window's quantiles; 1 jumps to them


def settings_problems(h: HumanlineConfig, prefix: str = "humanline.") -> list[tuple[str, str, object]]:
    """Every invalid field of `h`, as `(prefix + field, what is expected, the value)`, in field order (empty:
    valid). Our config check and `HumanlineArgs` both raise the first one."""
    q = h.band_quantiles
    auto = h.sync_every == "auto"
    checks = [
        (auto or (_integer(h.sync_every) and h.sync_every >= 1), "sync_every", "an integer >= 1, or auto",
         h.sync_every),
        (_number(h.sync_drift) and 0 < h.sync_drift <= 100, "sync_drift",
         "a share of the trust region's width in (0, 100]", h.sync_drift),
        (_integer(h.sync_min) and h.sync_min >= 1, "sync_min", "an integer >= 1", h.sync_min),
        (_integer(h.sync_max) and h.sync_max >= (h.sync_min if _integer(h.sync_min) else 1), "sync_max",
         f"an integer >= {prefix}sync_min ({h.sync_min})", h.sync_max),
        (h.transform in TRANSFORMS, "transform", "one of " + " | ".join(TRANSFORMS), h.transform),
        (_number(h.low) and h.low < 0, "low", "log eps_P < 0", h.low),
        (_number(h.high) and h.high > 0, "high", "log eps_R > 0", h.high),
        (_number(h.gamma_p) and h.gamma_p > 0, "gamma_p", "> 0", h.gamma_p),
        (_number(h.gamma_r) and h.gamma_r > 0, "gamma_r", "> 0", h.gamma_r),
        (h.band in BANDS, "band", "one of " + " | ".join(BANDS), h.band),
        (isinstance(q, (list, tuple)) and len(q) == 2 and all(map(_number, q)) and 0 < q[0] < q[1] < 1,
         "band_quantiles", "two shares 0 < p_lo < p_hi < 1", q),
        (_number(h.band_rate) and 0 < h.band_rate <= 1, "band_rate", "in (0, 1]", h.band_rate),
        (h.band != "auto" or h.transform == "clip", "band",
         f"fixed with {prefix}transform={h.transform} (the auto band sets the clip's bounds)", h.band),
    ]
    return [(prefix + name, expected, value) for ok, name, expected, value in checks if not ok]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def make_rule(h: HumanlineConfig, sample_every: int | None = None,
              trust_width: Callable[[], float] | None = None) -> SyncRule | DriftRule:
    """The sync rule of valid settings `h`: `SyncRule(k)`, or a `DriftRule` for `sync_every: auto` whose target is
    `sync_drift` times `trust_width()` (read at each sync; default: the band's narrower side) and whose longest
    window is also at most `sample_every` (a sparse regime's sampling period: a reference older than the samples'
    sampler would score fresh samples against a policy they were not drawn from, docs/method.md §3.5)."""
    if h.sync_every != "auto":
        return SyncRule(h.sync_every)
    high = h.sync_max if sample_every is None else max(1, min(h.sync_max, sample_every))
    width = trust_width or (lambda: min(-h.low, h.high))
    return DriftRule(lambda: h.sync_drift * width(), min(h.sync_min, high), high)


class TokenStats:
    """Token counts of one metrics window: `[inside, below, above, scored, sum of raw, sum of |raw|]` (float64,
    on the device of the log-ratios). Summed, not averaged, so the fractions are token-weighted over micro-batches
    and processes."""

    def __init__(self):
        self.sums: torch.Tensor | None = None
        self.steps: set[int] = set()  # the steps whose tokens the window holds

    def add(self, raw: torch.Tensor, mask: torch.Tensor, low: float, high: float, step: int) -> None:
        mask = mask.bool()
        values = raw.detach().double()
        sums = torch.stack([((values > low) & (values < high) & mask).sum(), ((values < low) & mask).sum(),
                            ((values > high) & mask).sum(), mask.sum()]).double()
        kept = values.masked_fill(~mask, 0.0)
        sums = torch.cat([sums, torch.stack([kept.sum(), kept.abs().sum()])])
        self.sums = sums if self.sums is None else self.sums + sums.to(self.sums.device)
        self.steps.add(step)

    def reduced_tensor(self, device, reduce_sum: ReduceSum | None) -> torch.Tensor:
        """The window's sums, summed over processes, still on the device (nothing read back)."""
        sums = self.sums if self.sums is not None else torch.zeros(6, dtype=torch.float64, device=device)
        return reduce_sum(sums.to(device)) if reduce_sum is not None else sums

    def reduced(self, device, reduce_sum: ReduceSum | None) -> list[float]:
        return self.reduced_tensor(device, reduce_sum).tolist()


class Humanline:
    """The humanline of a run (module doc). Build with `Humanline(settings, ...)` or `Humanline.off()`.

    settings: a `HumanlineConfig` (or `HumanlineArgs`); `enabled=False` gives the off form.
    seed: seeds the rejection draws, with the step, the micro-batch, the part and the process.
    ratio_clip: `(eps_low, eps_high)` when the objective clips the same ratio itself to `[1 - eps_low, 1 +
    eps_high]` (GRPO's PPO clip): an auto band then holds its bounds, and the clip is part of the trust region
    a drift rule measures against (`trust_width`).
    process_index, device: this process (draws differ per process) and where metric sums live.
    sample_every: a sparse regime's sampling period (`train.sample_every`), the longest window a drift rule may
    choose (None: `sync_max` alone).
    """

    def __init__(self, settings: HumanlineConfig, *, seed: int = 0, ratio_clip: tuple[float, float] | None = None,
                 process_index: int = 0, device: torch.device | str = "cpu", sample_every: int | None = None):
        self.settings, self.on = settings, bool(settings.enabled)
        self.seed, self.process_index, self.device = seed, process_index, torch.device(device)
        self.ratio_clip = ratio_clip
        own_ratio_clip = ratio_clip is not None
        self.rule = make_rule(settings, sample_every, self.trust_width) if self.on else SyncRule(None)
        self.band = make_band(settings, own_ratio_clip=own_ratio_clip) if self.on else FixedBand(-1.0, 1.0)
        self.held_band = self.on and settings.band == "auto" and own_ratio_clip
        self.windows = {"train": TokenStats(), "eval": TokenStats()}
        self._anchor: int | None = None  # a step at which the reference was reset to the policy (see `restart`)

    @classmethod
    def off(cls) -> "Humanline":
        return cls(HumanlineConfig(enabled=False))

    # ------------------------------------------------------------------ the step

    def begin_step(self, step: int, reduce_sum: ReduceSum | None = None) -> bool:
        """Before step `step`'s reference is used (every process, every step): True when `step` is a sync step,
        whose pre-update policy the reference takes. A drift rule then decides when the next sync comes, and an
        auto band moves to the window since the last sync."""
        if not self.rule.begin(step, self._on_device(reduce_sum)):
            return False
        self.band.update(reduce_sum)
        return True

    def _on_device(self, reduce_sum: ReduceSum | None) -> ReduceSum | None:
        """`reduce_sum` of a tensor moved to this process's device first (a collective runs there)."""
        return None if reduce_sum is None else (lambda t: reduce_sum(t.to(self.device)))

    def trust_width(self) -> float:
        """The narrower side of the trust region the loss holds a token's log-ratio to: the band in use (`low`,
        `high`) and the objective's own ratio clip (`log(1 - eps_low)`, `log(1 + eps_high)`), whichever binds
        first. Example: band [-1.5, 1.5] with eps 0.2 / 0.2 -> log 1.2 = 0.182."""
        sides = [-self.band.low, self.band.high]
        if self.ratio_clip is not None:
            eps_low, eps_high = self.ratio_clip
            sides += [-math.log1p(-eps_low) if eps_low < 1 else math.inf, math.log1p(eps_high)]
        return min(sides)

    def end_step(self, step: int, reduce_sum: ReduceSum | None = None, *,
                 sums: list[float] | None = None) -> list[float] | None:
        """After step `step`'s update (every process, every step): the training window's sums, reduced over
        processes and read back (`sums`: already read back by the caller with its own metrics, `window_sums`;
        then nothing is reduced or read here), for `metrics(..., sums=)`. None when humanline is off.

        A drift rule is handed step `step`'s drift from these sums when the window holds that step alone (it
        is logged every step): the sync at `step + 1` then reads nothing from the device. Without the hand-over
        (a caller that skips this step, or a window of several steps) the rule reads its own sums at the sync:
        the same drift, one more host read."""
        if not self.on:
            return None
        window = self.windows["train"]
        if sums is None:
            sums = window.reduced(self.device, reduce_sum)
        if self.rule.adaptive and window.steps <= {step}:  # a window of exactly this step (or of nothing)
            _, _, _, count, _, abs_sum = sums[:6]
            self.rule.note(step, abs_sum, count)
        return sums

    def restart(self, step: int) -> None:
        """The reference was set to the policy of `step` outside the rule (the TRL bridge resyncs at train begin,
        after a resume): the steps since the sync count from there."""
        self._anchor = step
        self.rule.restart(step)

    def steps_since_sync(self, step: int) -> int:
        """How many updates the policy at `step` is ahead of the reference its loss uses (1..k; 0 at step 0)."""
        held = [s for s in (self.rule.last_before(step), self._anchor) if s is not None and s <= step]
        return step - max(held) if held else step

    # ------------------------------------------------------------------ the transform

    def generator(self, step: int, index: int, part: str = "main") -> torch.Generator | None:
        """The seeded generator of micro-batch `index` of step `step` (`part`: "main", or KTO's "kl")."""
        if not self.on or self.settings.transform != "reject":
            return None
        gen = torch.Generator(device=self.device)
        seed = (self.seed * 1_000_003 + step * 101 + index) * 7 + self.process_index
        gen.manual_seed((seed ^ (_KL_SEED_MASK if part == "kl" else 0)) % 2**63)
        return gen

    def apply(self, raw: torch.Tensor, mask: torch.Tensor, *, step: int, index: int, part: str = "main",
              mode: str = "train") -> torch.Tensor:
        """The log-ratio the objective sees in place of `raw` (`(B, T)`, `mask` `(B, T)` bool: scored tokens).

        part: "main" (counted in the metrics; in training, observed by an auto band) or "kl" (KTO's mismatched
        pairs: transformed only). mode: "train" or "eval", the metrics window it counts in.
        """
        if not self.on:
            return raw
        if part == "main":
            if mode == "train":
                self.band.observe(raw, mask)
                self.rule.observe(raw, mask)
            self.windows[mode].add(raw, mask, self.band.low, self.band.high, step)
        transform = self.settings.transform
        if transform == "clip":
            return clip_log_ratio(raw, low=self.band.low, high=self.band.high)
        if transform == "reject":
            gen = self.generator(step, index, part)
            return reject_log_ratio(raw, mask, gamma_p=self.settings.gamma_p, gamma_r=self.settings.gamma_r,
                                    generator=gen)
        return raw

    # ------------------------------------------------------------------ metrics

    def window_sums(self, reduce_sum: ReduceSum | None = None, *, mode: str = "train") -> torch.Tensor | None:
        """The window's token sums on the device (None when humanline is off), for a caller that reads them
        back with its own metrics in one transfer and hands the floats to `end_step(..., sums=)`."""
        return self.windows[mode].reduced_tensor(self.device, reduce_sum) if self.on else None

    def metrics(self, step: int, reduce_sum: ReduceSum | None = None, *, mode: str = "train",
                reset: bool = True, sums: list[float] | None = None) -> dict[str, float]:
        """The logged humanline metrics of the window since the last reset (every process must call it).

        humanline/inside_band, below_band, above_band: shares of the scored tokens whose raw log-ratio was
        strictly inside `(low, high)`, below `low`, above `high` (token-weighted over micro-batches and
        processes; left out when no token was scored). humanline/log_ratio_mean: the mean raw log-ratio;
        humanline/drift: the mean |raw log-ratio| (what a drift rule reads). humanline/low, high: the band at
        `step`. humanline/steps_since_sync: `steps_since_sync(step)`. humanline/sync_period: the length of the
        window that holds `step`. humanline/syncs: sync steps so far, this one included. `sums`: the window's
        sums, already read back (`end_step`, or the caller's own read of `window_sums`); then nothing is reduced
        or read here. Logging only: the drift rule's hand-over is `end_step`.
        """
        if not self.on:
            return {}
        window = self.windows[mode]
        if sums is None:
            sums = window.reduced(self.device, reduce_sum)
        inside, below, above, count, raw_sum, abs_sum = sums[:6]
        if reset:
            self.windows[mode] = TokenStats()
        out = {}
        if count > 0:
            out = {"humanline/inside_band": inside / count, "humanline/below_band": below / count,
                   "humanline/above_band": above / count, "humanline/log_ratio_mean": raw_sum / count,
                   "humanline/drift": abs_sum / count}
        out.update({"humanline/low": float(self.band.low), "humanline/high": float(self.band.high),
                    "humanline/steps_since_sync": float(self.steps_since_sync(step)),
                    "humanline/sync_period": float(self.rule.period(step) or 0),
                    "humanline/syncs": float(self.rule.count_through(step))})
        return out

    def reset(self, mode: str = "train") -> None:
        self.windows[mode] = TokenStats()

    # ------------------------------------------------------------------ persistence (the band's and rule's state)

    def state_dict(self) -> dict:
        """The band's state (the keys older checkpoints hold), and a drift rule's under `sync_rule`."""
        state = self.band.state_dict()
        if self.rule.adaptive:
            state["sync_rule"] = self.rule.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        rule = state.pop("sync_rule", None)
        if self.rule.adaptive:
            if rule is None:
                raise ValueError("the checkpoint holds no state of humanline.sync_every: auto (it was saved by a "
                                 "run with a fixed sync period)")
            self.rule.load_state_dict(rule)
        self.band.load_state_dict(state)
