"""The cost-against-score picture (`harness.cost_score`) drawn from run records, for tables whose runs were made
by several `humanline reproduce` calls (the picture `reproduce --report` draws covers one output folder).

    python scripts/experiments/cost_plot.py FOLDER [FOLDER ...] --objective dpo --regimes offline online ...
        --title "..." --out docs/images/cost_dpo_chain.png [--seeds 0 1 2] [--sample-every 8]

FOLDERs as records_table.py reads them (a run found in two keeps the first folder's). Each regime is one point: the
mean over its seeds of the final models' pass@1 ± the standard error, the mean completion tokens its runs sampled
(offline regimes: the offline data's, from the first folder holding `offline.json`) and its sampling passes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from records_table import load, mean_se, show

from humanline.experiments.harness.cost_score import cost_score_figure, regime_point


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    p.add_argument("--objective", required=True)
    p.add_argument("--regimes", nargs="+", required=True)
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="default: every seed a regime has")
    p.add_argument("--sample-every", type=int, default=8, help="plain `sparse`'s period (sparse<N> names its own)")
    p.add_argument("--title", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    runs = load(args.folders)
    offline_files = [f / "offline.json" for f in args.folders if (f / "offline.json").exists()]
    data_tokens = float(json.loads(offline_files[0].read_text())["generated_tokens"]) if offline_files else 0.0
    points = []
    for regime in args.regimes:
        mine = [r for (o, name, s), r in sorted(runs.items())
                if o == args.objective and name == regime and (args.seeds is None or s in args.seeds)]
        if not mine:
            raise SystemExit(f"cost_plot.py: no {args.objective} runs of regime {regime!r} in {args.folders}")
        score, se = mean_se([r["score"] for r in mine])
        point = regime_point(regime, sampled_tokens=mean_se([r.get("generated_tokens", 0) for r in mine])[0],
                             data_tokens=data_tokens, steps=max(r.get("steps", 0) for r in mine),
                             sample_every=args.sample_every, score=score, se=se if se == se else 0.0)
        points.append(point)
        print(f"{regime}: {show(score, se)} over {len(mine)} seeds, {point.tokens / 1000:.1f} k tokens, "
              f"{point.passes} passes")
    path = cost_score_figure(points, "held-out pass@1 of the final models", args.title, args.out)
    print(f"cost_plot.py: wrote {path}")


if __name__ == "__main__":
    main()
