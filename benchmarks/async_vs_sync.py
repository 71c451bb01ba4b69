"""Sampling that overlaps training against synchronous online GRPO: wall-clock per update, side by side.

    python benchmarks/async_vs_sync.py [--quick] [--model tiny|smollm2] [--rounds 3] [--per-round 6]
                                       [--max-new-tokens N] [--threads 1]

Two trainers in one process, on the model's online GRPO recipe (recipes/<model>/grpo_online.yaml, no eval, no
checkpoints):
  sync   train.regime: online: every step samples its batch from the current policy, then trains on it
  async  train.regime: stale, train.staleness: 1, train.async_sampling: true: a sampler process (one torch
         thread) draws step s + 1's batch with version s's weights while the trainer trains step s
  bounded  the same with train.async_mode: bounded: each batch drawn by the newest weights the sampler has
         (0 or 1 versions old; `staleness` column: the mean age of the batches trained)
They alternate in rounds of `--per-round` steps after one warm-up step each (the async warm-up includes
starting the sampler process). An async round's time ends once the batches it asked for have arrived, so its
last generation is timed without overlap (the ratio is pessimistic by up to one generation per round).
Reports seconds per update (median over rounds) and the median over rounds of each side's time / sync time, the
sampler's generation time and the trainer's wait per step. Writes benchmarks/results/async_vs_sync.json
(async_vs_sync_smollm2.json for --model smollm2).
On the CPU both sides share the cores: the sync trainer samples with `--threads` torch threads, the async
sampler with one while the trainer keeps `--threads`.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import common

RECIPES = {"tiny": "recipes/tiny/grpo_online.yaml", "smollm2": "recipes/smollm2/grpo_online.yaml"}
SIDES = {"sync": {"regime": "online"},
         "async": {"regime": "stale", "staleness": 1, "async_sampling": True},
         "bounded": {"regime": "stale", "staleness": 1, "async_sampling": True, "async_mode": "bounded"}}


def trainer(model: str, side: str, steps: int, max_new_tokens: int | None, workdir: Path):
    from humanline.training.config_loading import load_config
    from humanline.training.loop import Trainer

    overrides = {"train": {"max_steps": steps, "save_every": 0, "eval_every": 0,
                           "output_dir": str(workdir / side), **SIDES[side]},
                 "eval": {"prompts": None}, "logging": {"progress": False, "log_every": 0}}
    if max_new_tokens:
        overrides["rollout"] = {"max_new_tokens": max_new_tokens}
    return Trainer(load_config(common.ROOT / RECIPES[model], overrides))


def timed_round(trainer, steps: int) -> tuple[float, list[dict]]:
    """Wall seconds of `steps` steps (async: until the batches asked for have arrived) and their metrics."""
    start, rows = time.perf_counter(), []
    for _ in range(steps):
        rows.append(trainer.train_step())
    if trainer.async_sampling is not None:
        trainer.async_sampling.flush(trainer.step)
    return time.perf_counter() - start, rows


def measure(model: str, *, rounds: int, per_round: int, max_new_tokens: int | None) -> dict:
    steps = 1 + rounds * per_round
    with tempfile.TemporaryDirectory(prefix="hl-async-") as folder:
        runs = {side: trainer(model, side, steps, max_new_tokens, Path(folder)) for side in SIDES}
        try:
            for run in runs.values():
                timed_round(run, 1)  # warm-up (the async one starts its sampler process)
            totals = {side: [] for side in runs}
            metrics = {side: [] for side in runs}
            for _ in range(rounds):
                for side, run in runs.items():
                    seconds, rows = timed_round(run, per_round)
                    totals[side].append(seconds)
                    metrics[side] += rows
        finally:
            for run in runs.values():
                run.close_sampler()
    ratios = {side: [a / s for a, s in zip(totals[side], totals["sync"])] for side in SIDES}
    rows = []
    for side in SIDES:
        gen = [r["time/generation"] for r in metrics[side] if "time/generation" in r]
        rows.append({"model": model, "side": side, "s/update": common.median(totals[side]) / per_round,
                     "generation s": common.median(gen) if gen else 0.0,
                     "wait s/step": common.median([r.get("async/wait_seconds", 0.0) for r in metrics[side]]),
                     "staleness": sum(r.get("staleness", 0.0) for r in metrics[side]) / len(metrics[side]),
                     "time / sync": common.median(ratios[side])})
    return {"model": model, "rounds": rounds, "per_round": per_round, "round_seconds": totals,
            "ratios": ratios, "rows": rows}


def main() -> None:
    p = common.parser(__doc__, quick="tiny model, 3 rounds of 3 steps")
    p.add_argument("--model", default="tiny", choices=sorted(RECIPES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--per-round", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=0, help="0: the recipe's")
    args = p.parse_args()
    if args.quick:
        args.model, args.rounds, args.per_round = "tiny", 3, 3
    common.set_threads(args.threads)
    os.chdir(common.ROOT)  # the recipes' paths are relative to the repository
    result = measure(args.model, rounds=args.rounds, per_round=args.per_round,
                     max_new_tokens=args.max_new_tokens or None)
    common.print_table(result["rows"], ["model", "side", "s/update", "generation s", "wait s/step", "staleness",
                                        "time / sync"],
                       "async (fixed lag 1, bounded at 1) vs synchronous online GRPO: wall-clock per update "
                       "(medians over rounds)")
    common.finish(common.per_model("async_vs_sync", args.model), args, result)


if __name__ == "__main__":
    main()
