"""The demo's work spread over processes with one thread each.

A float sum is not associative, so a PyTorch op split over 2 threads rounds differently from the same op on
1 thread, and over 1,200 SFT steps those differences grow into a different policy (measured: the default
base policy scored 0.456 on 1 thread and 0.391 on 2). Every demo computation therefore runs on one thread,
and the cores are used by running independent jobs (the two SFTs, the runs) side by side in processes: the
numbers do not depend on the number of cores or workers (tests/demo checks 1 vs 2 workers). They may still
differ on another CPU model, whose vector kernels can round differently.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from humanline.errors import UserError

MAX_WORKERS = 8  # a demo process holds ~0.6 GB; more workers than this rarely help the 12-81 runs


def default_workers() -> int:
    """The cores this process may use (its CPU affinity and, in a container, its CPU quota), at most
    `MAX_WORKERS`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota()
    return max(1, min(cores, MAX_WORKERS, quota if quota is not None else cores))


def chosen_workers(requested: int | None) -> int:
    """`--workers` as given (checked: 1..256), or `default_workers()` when it was not given."""
    if requested is not None and not 1 <= requested <= 256:
        raise UserError(f"--workers: expected an integer in [1, 256], got {requested}")
    return requested or default_workers()


def cpu_quota(root: str = "/sys/fs/cgroup") -> int | None:
    """Whole cores a cgroup CPU limit allows (v2 `cpu.max` or v1 `cpu.cfs_quota_us`), rounded down to at
    least 1; None when there is no limit or it cannot be read."""
    folder = Path(root)
    try:
        if (folder / "cpu.max").exists():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu" / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return max(1, int(quota) // int(period))
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def one_thread():
    """Run the body with PyTorch on one thread (the previous setting restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def tagged_log(tag: str) -> Callable[[str], None]:
    """An experiment's progress log: `[tag] message` lines on stderr, flushed; usable from a worker process (a
    partial of a plain function pickles, a lambda does not)."""
    return functools.partial(_print_tagged, tag)


def _print_tagged(tag: str, message: str) -> None:
    print(f"[{tag}] {message}", file=sys.stderr, flush=True)


stderr_log = tagged_log("demo")  # the demo's log line, usable from a worker process


def _start_worker() -> None:
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()


def run_jobs(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int,
             on_result: Callable[[int, Any], None] = lambda i, result: None,
             stopped_by: Callable[[Any], int | None] = lambda result: None) -> list:
    """`fn(*job)` for every job, on one thread each, in up to `workers` processes; the results in job order.

    `on_result(i, result)` is called in this process as each job finishes (in finishing order). With one
    worker (or one job) everything runs here. An error in a job stops the rest and is raised here.

    SIGTERM to this process (a `kill`, a job scheduler's stop) reaches the workers too: no new job starts, the
    running ones get SIGTERM (a `Trainer` saves a checkpoint and returns), and once they have returned this
    process exits with status 143, as SIGTERM would have ended it. Without this a killed parent left its
    workers training on, orphaned, into the run folders a restarted command then trains too. (Ctrl-C needs
    nothing: the terminal sends SIGINT to every process of the group.) With one worker the signal reaches the
    job's `Trainer` here, which saves and returns: `stopped_by(result)` names the signal a job was stopped by
    (None: it was not), and no later job starts; this process then exits with 128 + that signal.
    """
    if workers <= 1 or len(jobs) <= 1:
        return _run_here(fn, jobs, on_result, stopped_by)
    results: list = [None] * len(jobs)
    workers = min(workers, len(jobs))
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)
    waiting, running, finished, submitted = iter(enumerate(jobs)), {}, 0, []
    stop = _ForwardSigterm()

    def submit_next() -> None:  # one job per worker in flight, none queued: Ctrl-C (which every worker also
        job = None if stop.received else next(waiting, None)  # receives) stops the running jobs, and no
        if job is not None:  # queued one starts after it
            running[pool.submit(fn, *job[1])] = job[0]
            submitted.append(job[0])

    try:
        with stop:
            for _ in range(workers):
                submit_next()
            while running:
                for future in wait(running, return_when=FIRST_COMPLETED).done:
                    i = running.pop(future)
                    results[i] = future.result()
                    finished += 1
                    on_result(i, results[i])
                    submit_next()
    except BrokenProcessPool as exc:
        if stop.received:  # a worker outside a Trainer (sampling, SFT) ends on SIGTERM at once
            raise SystemExit(128 + signal.SIGTERM) from None
        raise UserError(f"a worker process of the demo stopped abruptly (killed, or out of memory?) with "
                        f"{len(jobs) - finished} of {len(jobs)} jobs unfinished: try fewer --workers "
                        f"(each holds about 0.6 GB)") from exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if stop.received:
        stderr_log(f"SIGTERM: the running jobs stopped (a run keeps its checkpoint), {len(jobs) - len(submitted)} "
                   f"of {len(jobs)} did not start; the same command continues")
        raise SystemExit(128 + signal.SIGTERM)
    return results


def _run_here(fn: Callable[..., Any], jobs: Sequence[tuple], on_result: Callable[[int, Any], None],
              stopped_by: Callable[[Any], int | None]) -> list:
    """`run_jobs` in this process, one job after another; none starts after a signal stopped one."""
    results = []
    with one_thread():
        for i, job in enumerate(jobs):
            results.append(fn(*job))
            on_result(i, results[-1])
            signum = stopped_by(results[-1])
            if signum is not None:
                stderr_log(f"signal {signum}: the running job stopped (a run keeps its checkpoint), "
                           f"{len(jobs) - i - 1} of {len(jobs)} did not start; the same command continues")
                raise SystemExit(128 + signum)
    return results


class _ForwardSigterm:
    """Within the block, SIGTERM to this process is recorded and sent on to its worker processes (set only from
    the main thread, where Python delivers signals; elsewhere the block changes nothing)."""

    def __init__(self):
        self.received = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.received = True
        for child in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)

    def __enter__(self) -> "_ForwardSigterm":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
