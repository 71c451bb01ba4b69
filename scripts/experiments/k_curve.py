"""The sync period's curve from demo runs: held-out reward per regime, paired by seed against one regime.

    python scripts/experiments/k_curve.py DEMO_DIR [DEMO_DIR ...] [--against offline+humanline-k1]

Each DEMO_DIR is a `humanline demo --output-dir` folder (its `results.json`); runs of several folders are pooled
(e.g. a k curve in one folder and the drift rule in another, same seeds). Prints one row per regime: mean ± std
over seeds, the per-seed values, and the mean ± standard error of (regime - AGAINST) over the seeds both have,
with that difference in standard errors; and each regime's mean drift, sync period and PPO clip share from
its run folder's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path


def stats(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def run_means(run_dir: Path) -> dict[str, float]:
    """Means over the logged steps of the drift, the sync period and the PPO clip share."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    keys = {"drift": "log_ratio/abs_mean", "period": "humanline/sync_period", "clip": "clip_fraction"}
    out = {}
    for name, key in keys.items():
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        out[name] = statistics.fmean(values) if values else math.nan
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--against", default="offline+humanline-k1")
    args = parser.parse_args()
    runs = []
    for folder in args.folders:
        results = folder / "results.json"
        if not results.is_file():
            parser.error(f"{results}: no such file; each DEMO_DIR is a `humanline demo --output-dir` folder")
        # a run's folder is named relative to its DEMO_DIR (an absolute one, from older results, stays itself)
        runs += [{**r, "run_dir": folder / r["run_dir"]} for r in json.loads(results.read_text())["runs"]]
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        by.setdefault(r["regime"], {})[r["seed"]] = r
    base = {seed: r["final_reward"] for seed, r in by.get(args.against, {}).items()}
    print(f"| regime | held-out reward | per seed | vs {args.against} (paired) | in s.e. | drift | period | clip |")
    print("|---|---|---|---|---|---|---|---|")
    for regime, seeds in by.items():
        values = [seeds[s]["final_reward"] for s in sorted(seeds)]
        mean, std = stats(values)
        diffs = [seeds[s]["final_reward"] - base[s] for s in sorted(seeds) if s in base]
        paired, z = "—", "—"
        if diffs and regime != args.against:
            d_mean, d_std = stats(diffs)
            se = d_std / math.sqrt(len(diffs))
            paired = f"{d_mean:+.3f} ± {se:.3f}"
            z = f"{d_mean / se:+.1f}" if se else ("0" if d_mean == 0 else "inf")
        means = [run_means(Path(seeds[s]["run_dir"])) for s in sorted(seeds)]
        mech = {k: statistics.fmean(m[k] for m in means) for k in means[0]}
        print(f"| {regime} | {mean:.3f} ± {std:.3f} | {' / '.join(f'{v:.3f}' for v in values)} | {paired} | {z} "
              f"| {mech['drift']:.4f} | {mech['period']:.1f} | {mech['clip']:.3f} |")


if __name__ == "__main__":
    main()
