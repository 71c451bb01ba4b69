"""Faults the training loop rides out or stops on: non-finite updates, and SIGTERM / SIGINT.

Allocation failures are `humanline.devices.out_of_memory`'s.
"""

from __future__ import annotations

import contextlib
import signal

from humanline.errors import NonFiniteError
from humanline.settings.config import Config

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def skip_non_finite(counters, cfg: Config, step: int, micro_batches: list[dict], logger) -> None:
    """A step with a non-finite loss or gradient: its update is skipped (by the caller), counted and warned
    about; `train.max_bad_steps` such steps in a row raise `NonFiniteError`. `counters`: a `Counters`."""
    counters.bad_streak += 1
    counters.totals["skipped_steps"] += 1
    ids = [i for b in micro_batches for i in b.get("ids", [])][:8]
    logger.warn(f"step {step + 1}: non-finite loss or gradient, update skipped (prompt ids: {ids})")
    if counters.bad_streak >= cfg.train.max_bad_steps:
        raise NonFiniteError(
            f"{counters.bad_streak} consecutive steps with a non-finite loss or gradient (limit "
            f"train.max_bad_steps={cfg.train.max_bad_steps}); last prompt ids: {ids}; {divergence_hint(cfg)}"
        )


def divergence_hint(cfg: Config) -> str:
    if cfg.model.dtype == "float16":
        return "model.dtype=float16 weights overflow under AdamW: use bfloat16 or float32"
    return f"lower optim.lr (now {cfg.optim.lr:g}) or check those records"


class StopEvaluation(BaseException):
    """A stop signal during an evaluation: dropped at once (a BaseException, so that no `except Exception` on the
    way, a reward's `on_error: skip` say, can swallow it)."""


class StopSignals:
    """Inside `with`: SIGTERM or SIGINT is held in `received` (the loop then saves a checkpoint and stops), a
    second one raises `KeyboardInterrupt` (Ctrl-C twice: stop now). Inside `abortable()` (an evaluation, which
    holds no state a checkpoint needs) the first one raises `StopEvaluation` at once. The earlier handlers are
    restored on exit."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}
        self._abortable = False

    def __enter__(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    @contextlib.contextmanager
    def abortable(self):
        """Run the block unless a signal came already; a signal inside it raises `StopEvaluation` there."""
        if self.received is not None:
            raise StopEvaluation
        self._abortable = True
        try:
            yield
        finally:
            self._abortable = False

    def _on_signal(self, signum, frame) -> None:
        if self.received is not None:  # second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.received = signum
        if self._abortable:
            raise StopEvaluation
