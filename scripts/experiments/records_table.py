"""A table from run records of `humanline reproduce`: final-model pass@1 per regime, paired by seed against chosen
regimes, with the cost and what the method did, pooled over any number of folders.

    python scripts/experiments/records_table.py FOLDER [FOLDER ...] [--objective grpo] [--against online offline]
        [--regimes R1 R2 ...] [--seeds 0 1 2]

A FOLDER holds `<run>.summary.json` and `<run>.final_eval.json` files (lab/records/<date>-<task>/), or is a
`reproduce` output folder (its `runs/<run>/summary.json` and `final_eval.json`). A run is keyed by (objective,
regime, seed); a run found in two folders keeps the first folder's. One row per regime: mean ± standard error over
seeds of the final models' pass@1 (the last evaluation's where a run has no final evaluation, marked *), the
per-seed values, each `--against` regime's paired difference (mean ± se over the seeds both have, and that in
standard errors), the mean completion tokens sampled and the run means of the mismatch, the PPO clip share,
the corrections' masked and capped shares and ESS.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def load(folders: list[Path]) -> dict[tuple[str, str, int], dict]:
    """(objective, regime, seed) -> the run's summary with `score` (final model's pass@1, or the last eval's)."""
    runs: dict[tuple[str, str, int], dict] = {}
    for folder in folders:
        pairs = [(p, p.with_name(p.name.replace(".summary.json", ".final_eval.json")))
                 for p in sorted(folder.glob("*.summary.json"))]
        pairs += [(p, p.parent / "final_eval.json") for p in sorted(folder.glob("runs/*/summary.json"))]
        for summary_path, final_path in pairs:
            summary = json.loads(summary_path.read_text())
            key = (summary["objective"], summary["regime"], summary["seed"])
            if key in runs:
                continue
            final = json.loads(final_path.read_text()) if final_path.exists() else None
            summary["score"] = final["pass@1"] if final else summary["final_pass@1"]
            summary["final"] = final is not None
            runs[key] = summary
    return runs


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.fmean(values), se


def show(mean: float, se: float, signed: bool = False) -> str:
    """`mean ± se`, or the mean alone where one value gives no standard error."""
    text = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return f"{text} ± {se:.3f}" if math.isfinite(se) else text


def paired(runs: dict, objective: str, regime: str, other: str, seeds: list[int]) -> str:
    diffs = [runs[(objective, regime, s)]["score"] - runs[(objective, other, s)]["score"] for s in seeds
             if (objective, regime, s) in runs and (objective, other, s) in runs]
    if not diffs or regime == other:
        return "—"
    mean, se = mean_se(diffs)
    sig = f", {abs(mean) / se:.1f} se" if se and math.isfinite(se) and se > 0 else ""
    return f"{show(mean, se, signed=True)} ({len(diffs)}{sig})"


def mechanism(run: dict, key: str) -> float | None:
    value = run.get(key)
    return value if isinstance(value, (int, float)) else None


def row(runs: dict, objective: str, regime: str, seeds: list[int], against: list[str]) -> str:
    mine = [runs[(objective, regime, s)] for s in seeds if (objective, regime, s) in runs]
    mean, se = mean_se([r["score"] for r in mine])
    per_seed = " / ".join(f"{r['score']:.3f}{'' if r['final'] else '*'}" for r in mine)
    cells = [regime, show(mean, se), per_seed]
    cells += [paired(runs, objective, regime, other, seeds) for other in against]
    tokens = statistics.fmean(r.get("generated_tokens", 0) for r in mine)
    cells.append(f"{tokens / 1000:.1f} k")
    for key, fmt in (("mismatch", ".1e"), ("ppo_clip_fraction", ".3f"), ("masked", ".3f"), ("capped", ".3f"),
                     ("ess", ".3f")):
        values = [v for r in mine if (v := mechanism(r, key)) is not None]
        cells.append(format(statistics.fmean(values), fmt) if values else "—")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--objective", default="grpo")
    p.add_argument("--against", nargs="*", default=["online"])
    p.add_argument("--regimes", nargs="*", default=None, help="rows, in this order (default: every regime found)")
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="default: every seed found")
    args = p.parse_args()
    runs = load(args.folders)
    seeds = args.seeds or sorted({s for (_, _, s) in runs})
    regimes = args.regimes or list(dict.fromkeys(r for (o, r, _) in runs if o == args.objective))
    head = ["regime", "pass@1 (final models)", "per seed", *[f"vs {a}" for a in args.against], "tokens sampled",
            "mismatch", "PPO clip", "masked", "capped", "ESS"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for regime in regimes:
        if any((args.objective, regime, s) in runs for s in seeds):
            print(row(runs, args.objective, regime, seeds, args.against))


if __name__ == "__main__":
    main()
