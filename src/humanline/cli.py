"""Command line: `humanline <command> ...`. Parsing and dispatch only; the work lives in the library.

User errors (`UserError`) print one line and exit with code 2; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from humanline.errors import UserError


def _train(args: argparse.Namespace) -> int:
    from humanline.config import load_config
    from humanline.train import train

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    cfg = load_config(args.config, overrides)
    last = train(cfg, resume=args.resume)
    shown = {k: v for k, v in last.items() if k in ("loss", "eval/loss", "eval/reward_mean", "eval/pass@1")}
    print(f"[humanline] done: {cfg.train.output_dir} {shown}", file=sys.stderr)
    return 0


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train a policy from a YAML recipe",
                       description="Train with a YAML recipe; override any field with --section.key=value.")
    p.add_argument("config", help="YAML recipe (see recipes/)")
    p.add_argument("--output-dir", help="run directory (overrides train.output_dir)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
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
    parser = build_parser()
    args = parser.parse_args(rest)
    if overrides:
        if args.command != "train":
            parser.error(f"config overrides ({overrides[0]}) only apply to 'train'")
        args.overrides = overrides
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"humanline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("humanline: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
