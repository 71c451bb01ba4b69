"""A `humanline reproduce` table whose seconds come partly from re-runs of the same runs.

    python scripts/experiments/merge_timing_reruns.py FIRST RERUNS OUT

FIRST and RERUNS are output folders of `humanline reproduce` with the same settings. RERUNS holds some runs again
(for example ones that shared a slowed-down host). Each re-run must have produced the same curve, clip fraction
and humanline statistics as in FIRST, or this stops. The table written to OUT (results.json, report.md, plots)
takes those runs' seconds from RERUNS and everything else from FIRST.
"""

import argparse
import json
from pathlib import Path

from humanline.experiments.reproduce.results import write_outputs


def outcome(run: dict) -> tuple:
    """What a timing re-run must reproduce exactly: the pass@1 curve, humanline statistics, clip fraction."""
    return [c["pass@1"] for c in run["curve"]], run["humanline"], run["ppo_clip_fraction"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", type=Path)
    p.add_argument("reruns", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    results = json.loads((args.first / "results.json").read_text())
    results.pop("summary", None)
    results.pop("verdict", None)
    replaced = []
    for i, run in enumerate(results["runs"]):
        again_path = args.reruns / "runs" / Path(run["run_dir"]).name / "summary.json"
        if not again_path.exists():
            continue
        again = json.loads(again_path.read_text())
        if outcome(again) != outcome(run):
            raise SystemExit(f"{again_path}: its pass@1 curve, humanline statistics or clip fraction differ from "
                             f"the first run's; not a timing re-run")
        results["runs"][i] = {**again, "timing_rerun_of": run["run_dir"]}
        replaced.append(again_path.parent.name)
    args.out.mkdir(parents=True, exist_ok=True)
    print(write_outputs(results, args.out, 0.0))
    print(f"seconds from re-runs: {', '.join(replaced) or 'none'}")


if __name__ == "__main__":
    main()
