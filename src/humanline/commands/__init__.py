"""The subcommands of `humanline`, one module each: argument parsing and a handler that calls the library.

Every module has `add_parser(subparsers)`, which registers its subcommand and sets `args.func` to the
handler; a handler returns the process exit code. `humanline.cli` imports each module directly, so a broken
command fails at start-up instead of disappearing from the help.

The flags both experiment commands take (`demo`, `reproduce`) are declared once, here (`add_shared_flags`).
"""

from __future__ import annotations

from humanline.experiments.harness.regimes import REGIMES
from humanline.experiments.harness.workers import MAX_WORKERS


def add_shared_flags(p, *, objectives: list[str], objective_default: str | None, output_default: str | None,
                     output_help: str, lr_help: str, quick_help: str) -> None:
    """The flags both experiment commands take (`humanline demo`, `humanline reproduce`), declared once; what
    differs between them (defaults, the learning rates they name) comes in as arguments."""
    p.add_argument("--output-dir", default=output_default, help=output_help)
    p.add_argument("--objective", choices=[*objectives, "all"], default=objective_default,
                   help=f"objective(s) to compare (default grpo; all: {', '.join(objectives)})")
    p.add_argument("--regimes", nargs="+", default=None,
                   help=f"regimes to run (default: each objective's own: {', '.join(REGIMES[:3])}, ...), or any name "
                        f"of the regime grammar: offline+humanline-k16, offline+sync-only, sparse8+humanline, "
                        f"rounds8, stale4+tis (humanline.experiments.harness.regimes)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per regime (default 3; --quick: 1)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="first seed (default 0); settings are chosen on other seeds than the reported ones "
                        "(docs/results.md)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default: the objective's)")
    p.add_argument("--lr", type=float, default=None, help=lr_help)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--workers", type=int, default=None,
                   help=f"runs side by side, in processes of one thread each (default: the usable cores, at most "
                        f"{MAX_WORKERS}); the numbers do not depend on it")
