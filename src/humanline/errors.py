"""User-facing errors.

Anything the user can fix (a config field, a data record, a path, a missing optional dependency) raises
`UserError` with one line that names the file, line or field and what was expected. The command line turns
it into that line on stderr and exit code 2; `TrainingAborted` (a diverged or dead model) into one line and exit
code 3; `Stopped` (a signal that could not wait) into one line and 128 + the signal number; everything else is
a bug and keeps its traceback. (A run that finished without training, or collapsed, raises nothing: `humanline
train` ends it with a warning line and exit code 4 or 5.)
"""

from __future__ import annotations

import reprlib
from typing import Any

_SHORT = reprlib.Repr()  # attributes, not keywords: keywords need Python 3.12
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 6, 4, 40, 40, 40


def short_repr(value: Any, limit: int = 60) -> str:
    """A repr of `value` for a one-line error, at most `limit` characters: a huge, deep or self-containing value
    (a YAML alias, a reward's odd return) must neither flood nor hang the line."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class UserError(Exception):
    """An error in the user's input. `str(err)` is the one line shown to the user (at most 300 characters are
    printed: `humanline.cli`); `details`, more of the same (every problem found, say), is shown by `--debug`."""

    def __init__(self, message: str = "", details: str | None = None):
        super().__init__(message)
        self.details = details


class TrainingAborted(RuntimeError):
    """Training stopped because it cannot go on usefully: the CLI prints one line and exits with code 3."""


class NonFiniteError(TrainingAborted):
    """Training stopped because of non-finite numbers: `train.max_bad_steps` consecutive steps with a non-finite
    loss or gradient, or weights that would have been saved with NaN/inf. The CLI exits with code 3."""


class DeadModelError(TrainingAborted):
    """Training stopped because the model stopped learning: steps in a row whose gradient norm is exactly 0
    (`humanline.training.faults.DEAD_STEPS`), as after a learning rate that saturated every output. Exit code 3."""


class Stopped(KeyboardInterrupt):
    """A stop signal that could not wait for the end of a step: a second SIGTERM / SIGINT during a step, or one
    before the first step. `str(err)` says what was kept; the CLI exits with 128 + `signum`."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum


def require(module: str, extra: str) -> object:
    """Import an optional dependency or raise a `UserError` naming the extra that provides it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError(
            f"optional dependency '{module}' is not installed: pip install 'humanline[{extra}]' ({exc})"
        ) from exc


class OutOfMemory(UserError):
    """An allocation failed (CPU or accelerator) while building the run or training. A `UserError` (exit code 2):
    the fix is a smaller setting, which the one line names; no checkpoint is written of the interrupted step."""
