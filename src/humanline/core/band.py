"""Where the humanline clip band comes from: fixed bounds, or bounds that calibrate themselves (docs/method.md
§3.4). Both hold `low` (log eps_P < 0) and `high` (log eps_R > 0), read by the clip at every micro-batch.

The self-calibrating rule, applied at each humanline sync (`AutoBand.update`):

    q_lo, q_hi = the `p_lo` and `p_hi` quantiles of the raw token log-ratios seen since the last update
                 (masked tokens only), `[p_lo, p_hi]` = `humanline.band_quantiles` (default [0.1, 0.99])
    m    = max(MIN_BOUND, SIDE_SHARE * (q_hi - q_lo))      (the narrowest a side may get: a share of the spread)
    t_lo = min(q_lo, -m),  t_hi = max(q_hi, m)             (so that log eps_P < 0 < log eps_R)
    |low|  <- |low|^(1 - a) * |t_lo|^a,   high <- high^(1 - a) * t_hi^a   (a = `humanline.band_rate`)

so a bound moves by a factor each sync (a geometric moving average, as adaptive KL control moves its beta by
a factor towards its target) and never crosses 0. At a fixed point `p_lo` of the tokens fall below the band,
`1 - p_hi` above it and `p_hi - p_lo` inside. A window whose log-ratios are all exactly 0 (step 0, where the reference
is the policy) says nothing about the drift: the bounds stay. Why quantiles of the *raw* ratio: the clip decides which
tokens train, so the band has to follow how far the policy actually moved from the reference between syncs.

Why the floor `m` is a share of the spread (a guard): in a window where nearly every ratio
moved one way (KTO pushing all log-probs down, as its reference point clamped at 0 does on mostly undesirable
data), the other side's quantile lies on the wrong side of 0. With a fixed floor of MIN_BOUND that side shrank
to ~1e-4 within a few syncs, and stayed there: a band of width ~0 upwards takes the gradient from every token
that rises (the desirable half of KTO), so only the push-down trained and the policy fell below its start.
Keeping each side at least SIDE_SHARE of the window's spread leaves a channel of the drift's own scale.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

MIN_BOUND = 1e-4  # smallest |bound| the rule sets: a band of width 0 would stop every gradient
SIDE_SHARE = 0.1  # each side's target is at least this share of the window's spread q_hi - q_lo (module doc)
MAX_KEPT = 65_536  # raw log-ratios kept per window (an even stride beyond that): quantiles need no more


def next_bounds(low: float, high: float, q_low: float, q_high: float, rate: float) -> tuple[float, float]:
    """One step of the rule above: the bounds after a window whose quantiles are `q_low`, `q_high`.

    Example: `next_bounds(-1.0, 1.0, -0.25, 0.04, 0.5)` = `(-0.5, 0.2)`: `-(1 * 0.25)^0.5`, `(1 * 0.04)^0.5`.
    """
    floor = max(MIN_BOUND, SIDE_SHARE * (q_high - q_low))
    target_low, target_high = min(q_low, -floor), max(q_high, floor)
    new_low = -math.exp((1 - rate) * math.log(-low) + rate * math.log(-target_low))
    new_high = math.exp((1 - rate) * math.log(high) + rate * math.log(target_high))
    return new_low, new_high


class FixedBand:
    """The configured bounds, unchanged (`humanline.band: fixed`); the same interface as `AutoBand`."""

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high

    def observe(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> None:
        pass

    def update(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class AutoBand(FixedBand):
    """Bounds set at each sync from the raw token log-ratios observed since the previous one (module doc).

    low, high: the starting bounds (`humanline.low` / `high`); quantiles: `(p_lo, p_hi)`, 0 < p_lo < p_hi < 1;
    rate: a in (0, 1].
    """

    def __init__(self, low: float, high: float, *, quantiles: tuple[float, float], rate: float):
        super().__init__(low, high)
        self.quantiles_at, self.rate = tuple(quantiles), rate
        self.window: list[torch.Tensor] = []
        self.updates = 0

    def observe(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> None:
        """Keep the raw log-ratios of one micro-batch (`(B, T)` each; detached, an even subsample), NaN where
        `mask` is false: selecting the masked ones would be a data-dependent shape (a host read per micro-batch)."""
        values = log_ratio.detach().float().masked_fill(~mask.bool(), math.nan).reshape(-1)
        if values.numel() > MAX_KEPT:
            values = values[:: math.ceil(values.numel() / MAX_KEPT)]
        self.window.append(values)

    def quantiles(self) -> torch.Tensor:
        """`[q_lo, q_hi, 1]` of the window, or zeros when it holds no information (no token, or all exactly 0);
        computed on the device, nothing read back."""
        device = self.window[-1].device if self.window else torch.device("cpu")  # a restored window is on the CPU
        values = torch.cat([v.to(device) for v in self.window]) if self.window else torch.zeros(0)
        if values.numel() == 0:
            return torch.zeros(3, device=values.device)
        informative = ((values != 0) & ~values.isnan()).any()
        q = torch.nanquantile(values, torch.tensor(self.quantiles_at, device=values.device, dtype=values.dtype))
        return torch.where(informative, torch.cat([q, q.new_ones(1)]), 0.0)

    def update(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None) -> bool:
        """Move the bounds towards the window's quantiles and start a new window; True if they moved.

        reduce_sum: sums a tensor over processes, so every process sets the same bounds (the mean of the
        processes' quantiles, over those whose window holds information).
        """
        stats = self.quantiles()
        self.window = []
        if reduce_sum is not None:
            stats = reduce_sum(stats)
        q_sum_low, q_sum_high, count = stats.tolist()  # the one read back, at sync steps only
        if count == 0:
            return False
        q_low, q_high = q_sum_low / count, q_sum_high / count
        self.low, self.high = next_bounds(self.low, self.high, q_low, q_high, self.rate)
        self.updates += 1
        return True

    def state_dict(self) -> dict:
        window = torch.cat(self.window).cpu() if self.window else torch.zeros(0)
        window = window[~window.isnan()]  # the masked-out entries are not kept
        return {"low": self.low, "high": self.high, "updates": self.updates, "window": window}

    def load_state_dict(self, state: dict) -> None:
        self.low, self.high, self.updates = float(state["low"]), float(state["high"]), int(state["updates"])
        self.window = [state["window"]] if state["window"].numel() else []


def make_band(h, *, own_ratio_clip: bool = False) -> FixedBand:
    """The band of a `HumanlineConfig`: `AutoBand` for `band: auto`, else the fixed `[low, high]`.

    own_ratio_clip: the objective already bounds the same token ratio by a clip of its own (GRPO's PPO clip).
    Then `band: auto` holds its starting bounds: a band that binds there only takes away the gradient that the
    objective's clip keeps on purpose (tokens that moved against their advantage), docs/method.md §3.4.
    """
    if h.band == "auto" and not own_ratio_clip:
        return AutoBand(h.low, h.high, quantiles=tuple(h.band_quantiles), rate=h.band_rate)
    return FixedBand(h.low, h.high)
