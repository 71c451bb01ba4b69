"""The reproduction's figures, per objective: held-out pass@1 against steps and seconds (`pass1_<objective>.png`),
and what each regime costs against the score it reaches (`cost_<objective>.png`, `harness.cost_score`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from humanline.experiments.harness.cost_score import CostPoint, cost_score_figure, regime_point
from humanline.experiments.harness.results import Curve, curve_panels


def figures(rows: list[dict], base_pass: float, out: Path, data: dict | None = None,
            sample_every: int = 8) -> list[Path]:
    """Per objective: seed-mean held-out pass@1 against steps and against seconds (offline: the data's first), and
    each regime's cost against its final score (`cost_points`)."""
    paths = []
    for objective in dict.fromkeys(r["objective"] for r in rows):
        curves = [Curve(r["regime"], [0] + [p["step"] for p in r["curve"]],
                        [r["data_seconds"]] + [p["seconds"] + r["data_seconds"] for p in r["curve"]],
                        [base_pass] + [p["pass@1"] for p in r["curve"]]) for r in rows if r["objective"] == objective]
        xlabels = ("optimizer step", "wall-clock seconds on one thread (offline: the data's sampling first)")
        title = f"SmolLM2-135M-Instruct, {objective}: held-out pass@1"
        paths.append(curve_panels(curves, (12, 4.2), xlabels, "held-out pass@1 (mean over seeds)", title,
                                  out / f"pass1_{objective}.png"))
        points, label = cost_points([r for r in rows if r["objective"] == objective], data or {}, sample_every)
        cost = cost_score_figure(points, label, f"SmolLM2-135M-Instruct, {objective}: what each regime costs "
                                 f"against its score (± se over seeds)", out / f"cost_{objective}.png")
        paths += [cost] if cost else []
    return paths


def cost_points(rows: list[dict], data: dict, sample_every: int = 8) -> tuple[list[CostPoint], str]:
    """One `CostPoint` per row: completion tokens sampled (offline: the offline data's, sampled once) and sampling
    passes (`sampling_passes`), the final models' pass@1 where every run has one, else the last evaluation's. Returns
    the points and what their score is."""
    data_tokens = float((data.get("offline") or {}).get("generated_tokens", 0) or 0)
    finals = all(r.get("final_models") for r in rows)
    points = []
    for r in rows:
        sampled = [t for run in r["runs"] if isinstance(t := run.get("generated_tokens"), (int, float))
                   and math.isfinite(t)]
        stats = r["final_models"]["pass@1"] if finals else r["pass@1"]
        points.append(regime_point(r["regime"], sampled_tokens=statistics.fmean(sampled) if sampled else math.nan,
                                   data_tokens=data_tokens, steps=max(run.get("steps", 0) for run in r["runs"]),
                                   sample_every=sample_every, score=stats["mean"], se=stats["se"]))
    label = "held-out pass@1 of the final models" if finals else "held-out pass@1 at the last evaluation"
    return points, label
