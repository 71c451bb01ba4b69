"""What the two experiment commands share: checks of the flags both take (each error names its flag), and the
closing lines on stdout.
"""

from __future__ import annotations

import time
from pathlib import Path

from humanline.errors import UserError


def first_seed(value: int) -> int:
    """`--first-seed`, checked: seeds are drawn from [0, 2**31)."""
    if not 0 <= value < 2**31:
        raise UserError(f"--first-seed: expected an integer in [0, 2**31), got {value}")
    return value


def at_least_one(flag: str, value: int) -> int:
    """An integer flag that counts something (`--seeds`, `--evals`, ...), checked to be >= 1."""
    if value < 1:
        raise UserError(f"--{flag}: expected an integer >= 1, got {value}")
    return value


def learning_rate(value: float | None) -> float | None:
    """`--lr`, checked when given: a learning rate in (0, 1]."""
    if value is not None and not (isinstance(value, float) and 0 < value <= 1):
        raise UserError(f"--lr: expected a learning rate in (0, 1], got {value}")
    return value


def print_outputs(text: str, out: Path, start: float) -> int:
    """Print the table and verdict (`text`), then where the outputs went and how long it all took; exit code 0."""
    print(text)
    print(f"\nwrote {out / 'results.json'}, {out / 'report.md'} and plots ({time.perf_counter() - start:.0f} s)")
    return 0
