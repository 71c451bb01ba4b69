"""`humanline train RECIPE [--output-dir D] [--resume | --overwrite] [--section.key=value ...]`."""

from __future__ import annotations

import argparse
import signal
import sys

from humanline.errors import UserError
from humanline.training.config_loading import load_config
from humanline.training.loop import Trainer

NOTHING_TRAINED = 4  # exit code of a run in which no step trained (humanline.cli lists the codes)
# the metrics shown on the last line of a finished run, when the run logged them
SHOWN = ("loss", "eval/loss", "eval/reward_mean", "eval/pass@1")


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a policy from a YAML recipe",
                       description="Train with a YAML recipe; override any field with --section.key=value.")
    p.add_argument("config", help="YAML recipe (see recipes/)")
    p.add_argument("--output-dir", help="run directory (overrides train.output_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="the run folder holds a run: remove its files (metrics, checkpoints, final model) and start "
                        "again")
    p.set_defaults(func=run, overrides=[])


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.output_dir is not None:
        if not args.output_dir.strip():
            raise UserError(f"--output-dir: expected a folder, got {args.output_dir!r}")
        overrides.append(f"train.output_dir={args.output_dir}")
    cfg = load_config(args.config, overrides)
    trainer = Trainer(cfg, resume=args.resume, overwrite=args.overwrite)
    last = trainer.train()
    if trainer.stopped_by is not None:
        name = signal.Signals(trainer.stopped_by).name
        print(f"[humanline] stopped by {name} at step {trainer.step} with a checkpoint; continue with: humanline "
              f"train {args.config} --output-dir {cfg.train.output_dir} --resume", file=sys.stderr)
        return 128 + int(trainer.stopped_by)  # the shell's convention: `train && eval` stops here
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items() if k in SHOWN)
    print(f"[humanline] done: {cfg.train.output_dir} {shown}; {nothing_line(trainer.counters.totals, trainer.step)}",
          file=sys.stderr)
    warning = nothing_trained(trainer.counters.totals, trainer.step)
    if warning:
        print(warning, file=sys.stderr)
        return NOTHING_TRAINED
    return 0


def nothing_trained(totals: dict, steps: int) -> str | None:
    """The warning for a run that finished without one step that trained (the model is its initial one), or None.
    Such a run exits with `NOTHING_TRAINED`, so that `train && eval` does not go on as if it had learnt."""
    if not steps or int(totals.get("skipped_steps", 0)) < steps:
        return None
    why = ("every group was dropped in every step (equal rewards within each group, or no pair above "
           "data.pair_threshold: a reward the policy cannot earn yet, such as exact_match on the random `tiny` "
           "model); use a graded reward (recipes/tiny/rewards.py:digits) or a stronger base model"
           if int(totals.get("empty_steps", 0)) >= steps else
           "every update was skipped (a non-finite loss or gradient)")
    return f"humanline: warning: NOTHING WAS TRAINED in {steps} of {steps} steps: {why} (exit code {NOTHING_TRAINED})"


def nothing_line(totals: dict, steps: int) -> str:
    """How many steps trained on nothing: every group dropped (online), or a non-finite update skipped."""
    empty, skipped = int(totals.get("empty_steps", 0)), int(totals.get("skipped_steps", 0))
    line = f"{skipped} of {steps} steps trained on nothing"
    return line + (f" (every group dropped: {empty}; non-finite, update skipped: {skipped - empty})" if skipped else "")
