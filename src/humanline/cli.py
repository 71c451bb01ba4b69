"""Command line: `humanline <command> ...`. Parsing and dispatch only; the work lives in the library.

Exit codes (the last stderr line says which case it is):
    0    done
    1    internal error (a bug): the traceback, then `humanline: internal error: ...`
    2    user error (`UserError`: config, data, paths, missing optional dependency, a run folder that holds a
         run without --resume / --overwrite, an allocation failure naming the settings to lower): one
         `humanline: error:` line naming the file, line, field or flag; `--debug` prints the traceback above it
    3    training aborted after `train.max_bad_steps` consecutive non-finite steps (one `humanline: error:`
         line; the last checkpoint holds finite weights)
    130  Ctrl-C (SIGINT), 143 SIGTERM: during training a checkpoint is saved first, so `--resume` continues
         exactly; 128 + signal number is the shell's convention, and it keeps `train ... && eval ...` from
         going on with an unfinished run
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from humanline.errors import NonFiniteError, UserError


def _train(args: argparse.Namespace) -> int:
    import signal

    from humanline.config import load_config
    from humanline.train import Trainer

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
        return 128 + int(trainer.stopped_by)
    keys = ("loss", "eval/loss", "eval/reward_mean", "eval/pass@1")
    shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last.items() if k in keys)
    print(f"[humanline] done: {cfg.train.output_dir} {shown}; {_nothing_line(trainer)}", file=sys.stderr)
    return 0


def _nothing_line(trainer) -> str:
    """How many steps trained on nothing: every group dropped (online), or a non-finite update skipped."""
    totals = trainer.totals
    empty, skipped = int(totals.get("empty_steps", 0)), int(totals.get("skipped_steps", 0))
    line = f"{skipped} of {trainer.step} steps trained on nothing"
    return line + (f" (every group dropped: {empty}; non-finite, update skipped: {skipped - empty})" if skipped else "")


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a policy from a YAML recipe",
                       description="Train with a YAML recipe; override any field with --section.key=value.")
    p.add_argument("config", help="YAML recipe (see recipes/)")
    p.add_argument("--output-dir", help="run directory (overrides train.output_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--overwrite", action="store_true",
                   help="the run folder holds a run: remove its files (metrics, checkpoints, final model) and start "
                        "again")
    p.set_defaults(func=_train, overrides=[])


def _optional(sub, module: str, adder: str) -> None:
    """Register a subcommand whose module may be absent in a partial install."""
    import importlib

    try:
        getattr(importlib.import_module(module), adder)(sub)
    except (ImportError, AttributeError):
        pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="humanline", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _optional(sub, "humanline.evaluate", "add_eval_parser")
    _optional(sub, "humanline.data.cli", "add_data_parser")
    _optional(sub, "humanline.demo.cli", "add_demo_parser")
    _optional(sub, "humanline.report", "add_report_parser")
    _optional(sub, "humanline.inspect", "add_inspect_parser")
    return parser


def _split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """`--section.key=value` arguments are config overrides, everything else goes to argparse."""
    overrides, rest = [], []
    for arg in argv:
        head = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        (overrides if "." in head and "=" in arg else rest).append(arg)
    return overrides, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    overrides, rest = _split_overrides(argv)
    if "--debug" in rest:  # accepted anywhere, e.g. `humanline train recipe.yaml --debug`
        rest = ["--debug"] + [a for a in rest if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(rest)
    if overrides:
        if args.command != "train":
            parser.error(f"config overrides ({overrides[0]}) only apply to 'train'")
        args.overrides = overrides
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        return _fail(f"humanline: error: {exc}", 2, args.debug)
    except KeyboardInterrupt:
        return _fail("humanline: interrupted", 130, args.debug)
    except Exception as exc:
        if isinstance(exc, NonFiniteError):
            return _fail(f"humanline: error: training aborted: {exc}", 3, args.debug)
        traceback.print_exc()
        text = str(exc).strip().splitlines()
        print(f"humanline: internal error: {type(exc).__name__}{': ' + text[0] if text else ''} (a bug; please "
              f"report it with the traceback above)", file=sys.stderr)
        return 1


def _fail(line: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    sys.stderr.flush()
    print(line.replace("\n", " "), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
