"""Faults the training loop rides out or stops on: non-finite updates, a dead model, and SIGTERM / SIGINT.

Allocation failures are `humanline.devices.out_of_memory`'s.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import threading

from humanline.errors import DeadModelError, NonFiniteError, Stopped
from humanline.settings.config import Config

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A gradient norm of exactly 0 in this many updates in a row ends the run (exit code 3): no parameter moves any
# more, as when a far too high learning rate saturated every output (optim.lr=1e6 reaches it at step 2). A real
# gradient is never exactly 0.0 in float arithmetic; a step with nothing to train on takes no update and is not
# counted.
DEAD_STEPS = 3


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


def check_alive(counters, cfg: Config, step: int, grad_norm: float, signal: bool = True) -> None:
    """After an update of step `step + 1`: `DEAD_STEPS` updates in a row with a gradient norm of exactly 0 raise
    `DeadModelError` (one line naming the likely cause). `counters`: a `Counters`. `signal` False: the step could
    give no gradient by design (its loss is exactly 0, as GRPO groups whose rewards are all equal give, or
    humanline's band held every scored token outside it): such a step does not count."""
    counters.dead_streak = counters.dead_streak + 1 if grad_norm == 0.0 and signal else 0
    if counters.dead_streak >= DEAD_STEPS:
        raise DeadModelError(f"the gradient norm was exactly 0 in {counters.dead_streak} steps in a row (steps "
                             f"{step + 2 - counters.dead_streak}-{step + 1}): the model has stopped learning, as when "
                             f"a too high optim.lr (now {cfg.optim.lr:g}) saturates every output; lower optim.lr and "
                             f"start a new run (--overwrite)")


def divergence_hint(cfg: Config) -> str:
    if cfg.model.dtype == "float16":
        return "model.dtype=float16 weights overflow under AdamW: use bfloat16 or float32"
    return f"lower optim.lr (now {cfg.optim.lr:g}) or check those records"


class StopEvaluation(BaseException):
    """A stop signal during an evaluation: dropped at once (a BaseException, so that no `except Exception` on the
    way, a reward's `on_error: skip` say, can swallow it)."""


class StopSignals:
    """Inside `with`: SIGTERM or SIGINT is held in `received` (the loop then saves a checkpoint and stops), a
    second one raises `Stopped` (Ctrl-C twice: stop now; the trainer then says which checkpoint is the last).
    Inside `abortable()` (an evaluation, which holds no state a checkpoint needs) the first one raises
    `StopEvaluation` at once. The earlier handlers are restored on exit."""

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
            raise Stopped(signum)
        self.received = signum
        if self._abortable:
            raise StopEvaluation


@contextlib.contextmanager
def stop_at_once():
    """Inside the block, SIGTERM or SIGINT raises `Stopped` at once: nothing has trained yet, so there is nothing
    to save (a run being set up). The earlier handlers are restored on exit; outside the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum, f"stopped by {signal.Signals(signum).name} before the run started: nothing was "
                              f"written")

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stopped_line(signum: int, out, *, started: bool, checkpoint: int | None, during: str) -> str:
    """What a signal that could not wait left, in one line: `started` False, the folder as it was found (a new run
    that trained no step); else the newest complete checkpoint (`checkpoint`; None: none) and the command that
    continues from it. `during`: where it came (`during step 4`, `while the run was being set up`)."""
    name = signal.Signals(signum).name
    if not started:
        return (f"stopped by {name} {during}, before the first step: nothing was trained and '{out}' is left as it "
                f"was found; run the same command again to start")
    kept = f"the last checkpoint is step {checkpoint}" if checkpoint is not None else "no checkpoint was saved yet"
    start = f"step {checkpoint}" if checkpoint is not None else "step 0"
    return (f"stopped by {name} {during}: {kept}; continue from {start} with: humanline train --resume "
            f"{shlex.quote(str(out))}")
