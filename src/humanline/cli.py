"""Command line: `humanline <command> ...`. Parsing and dispatch only; the work lives in the library.

The subcommands are the modules of `humanline.commands`, imported directly (a broken one fails at start-up);
this module splits off config overrides, dispatches, and turns exceptions into the exit codes below.

Exit codes (the last stderr line says which case it is):
    0    done
    1    internal error (a bug): the traceback, then `humanline: internal error: ...`
    2    user error (`UserError`: config, data, paths, missing optional dependency, a run folder that holds a
         run without --resume / --overwrite, a folder that holds no humanline run, an earlier output or one that
         cannot be written, a name found nowhere while the hub cannot be reached, a flag argparse refuses, an
         allocation failure naming the settings to lower): one `humanline: error:` line of at most 300 characters
         naming the file, line, field or flag; `--debug` prints the traceback, the details and the whole line
    3    training aborted: `train.max_bad_steps` consecutive non-finite steps (the last checkpoint holds finite
         weights), or `DEAD_STEPS` (3) updates in a row with a gradient norm of exactly 0, a model that stopped
         learning (`humanline.training.faults`); one `humanline: error:` line
    4    the run finished but no step trained on anything (every group dropped in every step: a reward the
         policy never earns differently within a group); the last line is a `humanline: warning:` saying why
    5    the run finished but collapsed: its policy stopped learning (`humanline.evaluation.collapse`: the last
         steps trained on nothing, a held-out score fell to 0, a loss exploded, the weights did not move); the last
         line is a `humanline: warning:` saying why; `train.allow_collapse` keeps 0
    130  Ctrl-C (SIGINT), 143 SIGTERM: during training a checkpoint is saved first (an evaluation is dropped
         at once), so the printed `humanline train --resume RUN_DIR` continues exactly; 128 + signal number is
         the shell's convention, and it keeps `train ... && eval ...` from going on with an unfinished run. A
         second signal during a step stops at once: the line names the last checkpoint and the resume command; a
         signal before the first step leaves the run folder as it was found and says so
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback

from humanline.commands import config as config_command
from humanline.commands import data as data_command
from humanline.commands import demo as demo_command
from humanline.commands import evaluate as eval_command
from humanline.commands import inspection as inspect_command
from humanline.commands import report as report_command
from humanline.commands import reproduce as reproduce_command
from humanline.commands import train as train_command
from humanline.errors import Stopped, TrainingAborted, UserError
from humanline.version import __version__

# errors of a file that the user can fix (permissions, a full or read-only disk): one line, exit code 2
DISK_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
# in the order `humanline --help` lists them; each module's add_parser registers its subcommand
COMMANDS = (train_command, eval_command, data_command, demo_command, reproduce_command, report_command,
            inspect_command, config_command)


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line naming the command and the flag (`eval: argument --n: invalid int
    value: 'x'`), as every other error, in place of the usage text; subcommands' parsers are of this class too."""

    def error(self, message: str):
        command = self.prog.removeprefix("humanline").strip()
        raise UserError(f"{command + ': ' if command else ''}{message} (`{self.prog} --help` lists the flags)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="humanline", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    parser.add_argument("--version", action="version", version=f"humanline {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
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
    if not sys.stderr.isatty():
        _plain_lines()
    overrides, rest = _split_overrides(argv)
    if "--debug" in rest:  # accepted anywhere, e.g. `humanline train recipe.yaml --debug`
        rest = ["--debug"] + [a for a in rest if a != "--debug"]
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(rest)
        if unknown and args.command == "train":  # `--optim.lr 1e-3`, `--model=tiny`, `--steps 10`: say how
            raise UserError(train_command.unknown_argument(unknown[0], rest))
        if unknown:
            raise UserError(f"{args.command}: unrecognized arguments: {' '.join(unknown)} (`humanline {args.command} "
                            f"--help` lists the flags)")
        if overrides and args.command != "train":
            raise UserError(f"{args.command}: config overrides ({overrides[0]}) only apply to 'train'")
    except UserError as exc:
        return _fail(f"humanline: error: {exc}", 2, "--debug" in rest)
    args.overrides = overrides
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        if args.debug and exc.details:
            print(exc.details, file=sys.stderr)
        return _fail(f"humanline: error: {exc}", 2, args.debug)
    except BrokenPipeError:  # `humanline config | head`: the reader has gone, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command cut off this way
    except Stopped as exc:  # a signal that could not wait: the line says what was kept
        return _fail(f"[humanline] {exc}", 128 + exc.signum, args.debug)
    except KeyboardInterrupt:
        return _fail("humanline: interrupted", 130, args.debug)
    except Exception as exc:
        if isinstance(exc, TrainingAborted):
            return _fail(f"humanline: error: training aborted: {exc}", 3, args.debug)
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS and exc.filename:  # a file the checks could not
            # foresee (a disk that filled, a folder made read-only meanwhile): the user's to fix, in one line
            return _fail(f"humanline: error: cannot write or read '{exc.filename}' ({exc.strerror})", 2, args.debug)
        traceback.print_exc()
        text = str(exc).strip().splitlines()
        print(f"humanline: internal error: {type(exc).__name__}{': ' + text[0] if text else ''} (a bug; please "
              f"report it with the traceback above)", file=sys.stderr)
        return 1


def _plain_lines() -> None:
    """stderr is a file or a pipe (a log read line by line): no progress bars of the libraries (a bar redraws with
    carriage returns, making one long line of every update). Ours are shown on a terminal only."""
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # read when `datasets` is first imported
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()


def _fail(line: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    sys.stderr.flush()
    line = line.replace("\n", " ")
    print(line if debug else shortened(line), file=sys.stderr)
    return code


MAX_LINE = 300  # characters of an error line; --debug prints it whole
ELIDED = " [...: --debug shows all]"


def shortened(line: str, limit: int = MAX_LINE) -> str:
    """`line` cut to `limit` characters, keeping its start (what is wrong, and where) and its last clause after
    "; " (what to do), with the cut marked."""
    if len(line) <= limit:
        return line
    head, sep, fix = line.rpartition("; ")
    if not sep or len(fix) > limit // 2:
        return line[: limit - len(ELIDED)].rstrip() + ELIDED
    return line[: limit - len(ELIDED) - len(sep) - len(fix)].rstrip() + ELIDED + sep + fix


if __name__ == "__main__":
    sys.exit(main())
