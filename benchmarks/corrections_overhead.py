"""What each stale-sample correction costs: GRPO step time with `objective.correction` against `none`, paired.

    python benchmarks/corrections_overhead.py [--quick] [--model tiny|smollm2] [--rounds 4] [--per-round 3]
                                              [--threads 1]

One trainer per correction (every rule of `humanline.objectives.corrections.CORRECTIONS`) on the model's online GRPO
recipe turned into the stale regime (train.staleness: 1, synchronous, humanline off: the reference is the sampler,
so every correction reads log-probs the step has anyway), all seeded alike and at a learning rate of 1e-9, so that
they sample the same batches. They alternate in rounds of `--per-round` steps after one warm-up step each. Per step:
the whole step's wall-clock, and its training part (the step less generation and rewards, where the corrections
run). Reports the median over rounds of each correction's time / none's time, for the whole step and for the
training part (the target: at most 1.02). Writes benchmarks/results/corrections_overhead.json
(corrections_overhead_smollm2.json for --model smollm2).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import common

RECIPES = {"tiny": "recipes/tiny/grpo_online.yaml", "smollm2": "recipes/smollm2/grpo_online.yaml"}
CORRECTIONS = ("none", "drop", "tis", "decoupled", "m2po", "vespo", "icepop", "geo_mask")  # = corrections.CORRECTIONS


def trainer(model: str, correction: str, steps: int, workdir: Path):
    import torch

    from humanline.training.config_loading import load_config
    from humanline.training.loop import Trainer

    overrides = {"train": {"max_steps": steps, "save_every": 0, "eval_every": 0, "regime": "stale", "staleness": 1,
                           "output_dir": str(workdir / correction)},
                 "objective": {"correction": correction}, "humanline": {"enabled": False},
                 "optim": {"lr": 1e-9, "warmup_ratio": 0.0},
                 "eval": {"prompts": None}, "logging": {"progress": False, "log_every": 0}}
    torch.manual_seed(0)
    return Trainer(load_config(common.ROOT / RECIPES[model], overrides))


def step(trainer) -> tuple[float, float]:
    """(whole step, training part) in wall seconds."""
    start = time.perf_counter()
    row = trainer.train_step()
    wall = time.perf_counter() - start
    return wall, wall - row.get("time/generation", 0.0) - row.get("time/reward", 0.0)


def measure(model: str, *, rounds: int, per_round: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="hl-corrections-") as folder:
        runs = {c: trainer(model, c, 1 + rounds * per_round, Path(folder)) for c in CORRECTIONS}
        for run in runs.values():
            step(run)  # warm-up
        totals = {c: [] for c in runs}  # per round: (whole, training part)
        for _ in range(rounds):
            for name, run in runs.items():
                times = [step(run) for _ in range(per_round)]
                totals[name].append((sum(w for w, _ in times), sum(t for _, t in times)))
    rows = []
    for name in CORRECTIONS:
        ratio = [common.median([a[k] / b[k] for a, b in zip(totals[name], totals["none"])]) for k in (0, 1)]
        rows.append({"model": model, "correction": name,
                     "s/step": common.median([w for w, _ in totals[name]]) / per_round,
                     "train s/step": common.median([t for _, t in totals[name]]) / per_round,
                     "ratio (step)": ratio[0], "ratio (train part)": ratio[1]})
    return {"model": model, "rounds": rounds, "per_round": per_round, "round_seconds": totals, "rows": rows}


def main() -> None:
    p = common.parser(__doc__, quick="tiny model, 3 rounds of 2 steps")
    p.add_argument("--model", default="tiny", choices=sorted(RECIPES))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--per-round", type=int, default=3)
    args = p.parse_args()
    if args.quick:
        args.model, args.rounds, args.per_round = "tiny", 3, 2
    common.set_threads(args.threads)
    os.chdir(common.ROOT)  # the recipes' paths are relative to the repository
    result = measure(args.model, rounds=args.rounds, per_round=args.per_round)
    common.print_table(result["rows"], ["model", "correction", "s/step", "train s/step", "ratio (step)",
                                        "ratio (train part)"],
                       "GRPO step time by objective.correction (stale, eta = 1; ratios: median over rounds, paired)")
    common.finish(common.per_model("corrections_overhead", args.model), args, result)


if __name__ == "__main__":
    main()
