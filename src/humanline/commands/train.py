"""`humanline train RECIPE [--output-dir D] [--resume | --overwrite] [--section.key=value ...]`, and
`humanline train --resume RUN_DIR [--section.key=value ...]` (the run's own settings, no recipe)."""

from __future__ import annotations

import argparse
import difflib
import shlex
import signal
import sys
from pathlib import Path

from humanline.errors import UserError
from humanline.settings.config import Config
from humanline.training.config_loading import load_config
from humanline.training.faults import stop_at_once
from humanline.training.loop import Trainer
from humanline.training.resume_settings import flat, settings_to_resume

NOTHING_TRAINED = 4  # exit code of a run in which no step trained (humanline.cli lists the codes)
COLLAPSED = 5  # exit code of a run whose policy stopped learning (humanline.evaluation.collapse)
# the metrics shown on the last line of a finished run, when the run logged them
SHOWN = ("loss", "eval/loss", "eval/reward_mean", "eval/pass@1")


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train a policy from a YAML recipe, or continue a run",
                       description="Train with a YAML recipe; override any field with --section.key=value. "
                                   "`humanline train --resume RUN_DIR` continues a run with its own settings.")
    p.add_argument("config", nargs="?", help="YAML recipe (see recipes/); left out with --resume RUN_DIR")
    p.add_argument("--output-dir", help="run directory (overrides train.output_dir)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR (or --output-dir, or the recipe's train.output_dir) from its "
                        "newest complete checkpoint, with the settings it was started with: only where it ends, "
                        "cadences, logging and memory settings may change (docs/usage.md)")
    p.add_argument("--overwrite", action="store_true",
                   help="the run folder holds a humanline run: remove that run's files (metrics, checkpoints, final "
                        "model; nothing else) and start again. A folder that holds no humanline run is never used")
    p.add_argument("--trust-inputs", action="store_true",
                   help="with --resume: continue a run that has no inputs.json (removed, or from an older version), "
                        "taking its inputs as they are now; they are recorded and checked from then on")
    p.set_defaults(func=run, overrides=[])


def run(args: argparse.Namespace) -> int:
    with stop_at_once():  # a signal before the run is built: nothing written, nothing to save
        cfg = _config(args)
        trainer = Trainer(cfg, resume=bool(args.resume), overwrite=args.overwrite, trust_inputs=args.trust_inputs)
    out = cfg.train.output_dir
    last = trainer.train()  # a finished run: returns at once (and releases the folder)
    if trainer.finished:
        print(f"[humanline] {out}: the run is finished (step {trainer.step} of {trainer.run.max_steps}, final model "
              f"saved and evaluated): nothing to do; to train it longer: humanline train --resume "
              f"{shlex.quote(str(out))} --train.max_steps=N (N > {trainer.step})", file=sys.stderr)
        return 0
    if trainer.stopped_by is not None:
        name = signal.Signals(trainer.stopped_by).name
        saved = ("the final model saved, its evaluation not run" if trainer.step >= trainer.run.max_steps
                 else "a checkpoint saved")
        print(f"[humanline] stopped by {name} at step {trainer.step} ({saved}); continue with: humanline train "
              f"--resume {shlex.quote(str(out))}", file=sys.stderr)
        return 128 + int(trainer.stopped_by)  # the shell's convention: `train && eval` stops here
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items() if k in SHOWN)
    print(f"[humanline] done: {out} {shown}; {nothing_line(trainer.counters.totals, trainer.step)}",
          file=sys.stderr)
    warning = nothing_trained(trainer.counters.totals, trainer.step)
    if warning:
        print(warning, file=sys.stderr)
        return NOTHING_TRAINED
    if trainer.collapse:
        print(collapse_line(trainer.collapse, trainer.step, cfg.train.allow_collapse), file=sys.stderr)
        return 0 if cfg.train.allow_collapse else COLLAPSED
    return 0


def collapse_line(reasons: list[str], step: int, allowed: bool) -> str:
    """The last line of a run whose policy stopped learning: why (the first two reasons; report.md has all), and
    the exit code, which `train.allow_collapse` keeps at 0 (sweeps)."""
    shown = "; ".join(reasons[:2]) + (f"; and {len(reasons) - 2} more (report.md)" if len(reasons) > 2 else "")
    code = ("exit code 0: train.allow_collapse" if allowed else
            f"exit code {COLLAPSED}; --train.allow_collapse=true exits 0")
    return f"humanline: warning: THE RUN COLLAPSED by step {step}: {shown} ({code})"


def unknown_argument(arg: str, argv: list[str]) -> str:
    """The one line for an argument `train` does not know (`argv`: the arguments it came with): how to write it
    as an override, `--section.key=value`, with the field it most likely means."""
    if not arg.startswith("--"):
        return (f"train: unexpected argument '{arg}' (one recipe at most); write overrides as --section.key=value "
                f"(`humanline config` lists the fields)")
    name, eq, value = arg[2:].partition("=")
    after = argv[argv.index(arg) + 1] if argv.index(arg) + 1 < len(argv) else ""
    if not eq and after and not after.startswith("-"):
        value = after  # `--optim.lr 1e-3`: the value that was meant
    shown = f"{arg} {value}" if value and not eq else arg
    guess = _field_for(name)
    fix = f"--{guess}={value or 'VALUE'}" if guess else "--section.key=value"
    return (f"train: '{shown}' is not an option; write overrides as --section.key=value: {fix} (`humanline "
            f"config` lists the fields)")


def _field_for(name: str) -> str | None:
    """The `section.key` a mistyped override most likely means: itself, a section's `name`, a unique key."""
    fields = set(flat(Config()))
    if name in fields:
        return name
    if f"{name}.name" in fields:
        return f"{name}.name"
    keys = {field.split(".", 1)[1]: field for field in sorted(fields)}
    match = difflib.get_close_matches(name.split(".")[-1], list(keys), n=1)
    return keys[match[0]] if match else None


def _config(args: argparse.Namespace):
    """The run's settings: the recipe's with the overrides, or (`--resume RUN_DIR`) the run's own."""
    recipe, folder = _recipe_and_folder(args)
    if args.trust_inputs and not args.resume:
        raise UserError("--trust-inputs: only with --resume (a new run records its inputs itself)")
    overrides = list(args.overrides)
    if recipe is None:
        if not args.resume or folder is None:
            raise UserError("train: expected a recipe (humanline train RECIPE) or a run to continue (humanline "
                            "train --resume RUN_DIR)")
        return settings_to_resume(Path(folder), overrides)
    if folder is not None:
        overrides.append(f"train.output_dir={folder}")
    return load_config(recipe, overrides)


def _recipe_and_folder(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The recipe (None: the run's own settings) and the run folder (None: the recipe's train.output_dir)."""
    recipe, folder = args.config, args.output_dir
    if folder is not None and not folder.strip():
        raise UserError(f"--output-dir: expected a folder, got {folder!r}")
    if isinstance(args.resume, str):
        if recipe is None and Path(args.resume).is_file():  # `train --resume RECIPE`: the recipe's run
            return args.resume, folder
        if folder is not None and Path(folder).resolve() != Path(args.resume).resolve():
            raise UserError(f"--resume {args.resume} and --output-dir {folder} name two run folders: give one")
        folder = args.resume
    return recipe, folder


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
