"""What each regime costs against the score it reaches: one figure per objective, for a user choosing a regime.

Each regime is one point: its cost on a log x-axis (left: completion tokens sampled; right: sampling passes, the
policy versions that sampled, each a generation call and, on an inference engine, a weight sync), its final score
with the standard error over seeds on the y-axis. Offline regimes pay the offline data once (its sampled tokens,
one pass: a user who trains one offline model pays it once); sampled regimes pay what they sample while training.
Each sample is used once, so sparse sampling every N steps samples about as many tokens as online, in N times fewer
passes. Wall-clock is not drawn: on a machine shared with other work it measures the neighbours (the tables keep
it, with the machine's load). Online and offline are marked (a star and a square, and a dashed and a dotted
line at their scores). Each point is labelled with its regime; labels are spread apart vertically and tied to
their points by a thin line, so no two overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from humanline.experiments.harness.regimes import regime_overrides
from humanline.experiments.harness.results import pyplot

MIN_GAP_PT = 11.0  # vertical room between two labels, in points (a 7.5 pt font line and a little air)


@dataclass
class CostPoint:
    label: str  # the regime
    tokens: float  # completion tokens sampled (offline: the offline data's, once)
    passes: float  # sampling passes: the policy versions that sampled (offline: 1, its data)
    score: float  # final score, mean over seeds
    se: float  # its standard error over seeds (0 with one seed)


def cost_score_figure(points: list[CostPoint], score_label: str, title: str, path: Path) -> Path | None:
    """Two panels (tokens, passes) of `points`; written to `path`. None when no point has a positive cost on
    either axis (a log axis cannot show it)."""
    usable = [p for p in points if _finite(p.score) and (p.tokens > 0 or p.passes > 0)]
    if not usable:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    xlabels = {"tokens": "completion tokens sampled (log scale; offline: its data, sampled once)",
               "passes": "sampling passes: policy versions that sampled (log scale; offline: 1, its data)"}
    for ax, axis in zip(axes, ("tokens", "passes")):
        shown = [p for p in usable if getattr(p, axis) > 0]
        if not shown:  # nothing with a cost on this axis (runs that sampled nothing and had no offline data)
            ax.set_axis_off()
            continue
        for p in shown:
            style = _style(p.label)
            ax.errorbar(getattr(p, axis), p.score, yerr=p.se if _finite(p.se) else 0, capsize=3, **style)
        for p in shown:
            if p.label in ("online", "offline"):
                ax.axhline(p.score, color=_style(p.label)["color"], lw=0.8,
                           ls="--" if p.label == "online" else ":", alpha=0.7)
        ax.set_xscale("log")
        ax.set_xlabel(xlabels[axis])
        ax.set_ylabel(score_label)
        ax.grid(alpha=0.3, which="both")
        _pad_x(ax, [getattr(p, axis) for p in shown])
        fig.canvas.draw()  # the label spreading works in display units: the axes' limits must be final
        _labels(ax, [(getattr(p, axis), p.score, p.label) for p in shown])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _style(label: str) -> dict:
    if label == "online":
        return {"marker": "*", "markersize": 13, "color": "tab:red", "ls": "none"}
    if label == "offline":
        return {"marker": "s", "markersize": 8, "color": "black", "ls": "none"}
    return {"marker": "o", "markersize": 6, "color": "tab:blue" if "humanline" in label else "tab:gray", "ls": "none"}


def _pad_x(ax, xs: list[float]) -> None:
    """Room on the right of the rightmost point for its label (a log axis: a factor, not a difference)."""
    low, high = min(xs), max(xs)
    ax.set_xlim(low / 1.6, high * (4.0 if high / low < 100 else 8.0))


def _labels(ax, points: list[tuple[float, float, str]]) -> None:
    """Each point's label to its right, moved up or down as little as needed to keep `MIN_GAP_PT` between any two
    labels' baselines (in display units), with a thin line back to its point."""
    to_display = ax.transData.transform
    gap = MIN_GAP_PT * ax.figure.dpi / 72.0
    placed = sorted((to_display((x, y))[1], i) for i, (x, y, _) in enumerate(points))
    heights = [y for y, _ in placed]
    for k in range(1, len(heights)):  # push up
        heights[k] = max(heights[k], heights[k - 1] + gap)
    top = ax.get_window_extent().y1 - gap / 2
    for k in range(len(heights) - 1, -1, -1):  # then down from the top, where the push left the axes
        heights[k] = min(heights[k], top if k == len(heights) - 1 else heights[k + 1] - gap)
    to_data = ax.transData.inverted().transform
    for (_, i), height in zip(placed, heights):
        x, y, label = points[i]
        x_display = to_display((x, y))[0] + 14
        tx, ty = to_data((x_display, height))
        ax.annotate(label, xy=(x, y), xytext=(tx, ty), fontsize=7.5, va="center",
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.5"})


def regime_point(regime: str, *, sampled_tokens: float, data_tokens: float, steps: int, sample_every: int,
                 score: float, se: float) -> CostPoint:
    """`regime`'s point: an offline regime pays the offline data's tokens (`data_tokens`, sampled once), a sampled
    one the tokens it sampled; its passes are `sampling_passes`'."""
    offline = regime_overrides(regime)["train"]["regime"] == "offline"
    return CostPoint(regime, data_tokens if offline else sampled_tokens, sampling_passes(regime, steps, sample_every),
                     score, se)


def sampling_passes(regime: str, steps: int, sample_every: int) -> int:
    """The policy versions that sample in a run of `regime` over `steps` steps: offline 1 (its data, by the base
    policy), online every step, sparse<N> and rounds<N> every N-th (plain `sparse`: every `sample_every`-th, the
    command's period), stale<eta> at the first step (its queue) and then at every step whose batch `eta` steps on
    is still in the run."""
    train = regime_overrides(regime)["train"]
    if train["regime"] == "offline":
        return 1
    if train["regime"] == "stale":
        return max(1, steps - train["staleness"])
    every = train.get("sample_every", sample_every if train["regime"] == "sparse" else 1)
    return math.ceil(steps / every)
