"""Sampling that overlaps training (`train.async_sampling`, stale regime): the trainer's side.

A sampler process (`sampling.process`, spawned) holds its own copy of the policy. At step `s` the trainer
writes its weights (version `s`, before the step's update) into a model in shared memory and asks for the batch of
step `s + staleness` (at step 0, or a resumed step with an empty queue: steps `s .. s + staleness`, in one call),
exactly what the synchronous stale regime samples at step `s` (`SampleBuffer.request`), with the same prompts and
seed. Then it trains step `s` on the batch drawn `staleness` versions earlier, while the sampler generates. So the
sampler is exactly `staleness` versions behind (a fixed lag): the run is deterministic and equals the synchronous
stale regime bit for bit, in every precision (the sampler computes in the trainer's, `devices.precision`), when
the trainer too runs torch on one thread (the sampler does; on a CPU a matmul's last bits depend on the thread
count, so with more trainer threads the two runs differ by rounding: said at start-up). The bound on staleness is
the lag itself: when
the batch of step `s` has not arrived, the trainer waits; `async/wait_seconds` is the time the trainer spent
blocked on the sampler at the step (shipping its weights into a slot still being read, and waiting for its batch).
Nothing is dropped: every batch asked for trains at its step.

Every result carries the steps (batch indices) it holds; each lands in the `SampleBuffer` under its step, and
the sampler's log-probs in the sampler-reference caches, so each batch trains once, at its step. Before a
checkpoint the trainer takes in every batch already asked for (`flush`): the checkpoint then holds the queue
as the synchronous regime's does, and a resumed run (with a fresh sampler process) continues bit for bit. A
sampler process that dies is a one-line error, never a hang: result reads time out and check that it is alive.

`train.async_mode: bounded` frees the lag: the trainer keeps the batches of steps `s .. s + staleness` asked for
(without a version) and offers its weights after every update, whenever the sampler has read the last ones
(never waiting for that); the sampler draws each batch with the newest weights it has, waiting for newer ones
only at the bound (a batch for step `t` is never drawn by a version before `t - staleness`). So each batch is 0 to
`staleness` versions old (logged as `staleness`): a sampler faster than the trainer runs ahead to the bound (as the
fixed lag), a slower one starts each batch with newer weights than the fixed lag would give it. The result
depends on timing: not deterministic, but still each batch trained once, at its step, across a resume too.
"""

from __future__ import annotations

import copy
import pickle
import queue
import time

import torch

from humanline.devices.weights import copy_weights_
from humanline.errors import UserError
from humanline.sampling.draw import short_lines
from humanline.sampling.process import SamplerSettings, sampler_main
from humanline.training.reference import SamplerReference

POLL_SECONDS = 0.5  # how often a waiting trainer checks that the sampler process is alive
OFFER_SECONDS = 0.02  # bounded: how often a waiting trainer offers its newest weights


def absent_device(device: str) -> str | None:
    """Why `device` (train.sampler_device) is not on this machine, or None where it is (auto, cpu, or a CUDA device
    torch sees). Asked before the sampler process starts: there it failed as "Torch not compiled with CUDA"."""
    kind, _, index = str(device).partition(":")
    if kind != "cuda":
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(index or 0) < count:
        return None
    return f"{device} but torch sees {count} CUDA device{'' if count == 1 else 's'} here"


class SamplerDied(UserError):
    """The sampler process ended while the trainer needed it (one line; the run resumes from a checkpoint)."""


class AsyncSampling:
    """The trainer's end of the sampler process. `before_step(step, model)` asks for what step `step` samples
    and returns once the step's own batch is in the buffer; `flush()` before a checkpoint; `close()` at the end."""

    def __init__(self, cfg, run):
        acc = run.accelerator
        if acc.num_processes > 1 or getattr(acc, "is_fsdp2", False):
            raise UserError("config field 'train.async_sampling': one training process only (the sampler process "
                            "holds the whole policy); launch without accelerate/torchrun, or set it to false")
        missing = absent_device(cfg.train.sampler_device)
        if missing:
            raise UserError(f"config field 'train.sampler_device': {missing}; auto puts the sampler on the "
                            f"trainer's device")
        self.cfg, self.run, self.max_steps = cfg, run, run.max_steps
        self.bounded = cfg.train.async_mode == "bounded"
        self.model, self.shipped = None, -1  # the trainer's model; the version last written into the slot
        self.buffer = run.schedule
        # the sampler reference's cache, where the sampler's log-probs go (None: the reference is not the sampler)
        self.cache = run.reference if isinstance(run.reference, SamplerReference) else None
        self.pending: set[int] = set()  # steps asked for, not yet received
        if torch.get_num_threads() > 1 and run.accelerator.device.type == "cpu":
            run.logger.info(f"train.async_sampling: the sampler process computes on one thread, the trainer on "
                            f"{torch.get_num_threads()}: equal to the synchronous run up to rounding (bit for bit "
                            f"with one trainer thread, e.g. OMP_NUM_THREADS=1)")
        self.process = None

    # ------------------------------------------------------------------ the process

    def _start(self, step: int) -> None:
        ctx = torch.multiprocessing.get_context("spawn")
        self.shared = copy.deepcopy(self.run.unwrapped).to("cpu").requires_grad_(False).share_memory()
        self.requests, self.results, self.free = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.version = ctx.Value("q", step)  # the step whose weights the slot holds
        self.shipped = step
        device = self.cfg.train.sampler_device
        device = str(self.run.accelerator.device) if device == "auto" else device
        settings = SamplerSettings(self.cfg, self.run.spec.units_from_group, self.run.spec.collate, self.buffer.layout,
                                   device, str(getattr(self.run.accelerator, "mixed_precision", "no")),
                                   self.cache is not None)
        args = (settings, self.run.tokenizer, self.run.sampler.pool, self.shared, self.requests, self.results,
                self.free, self.version)
        self.process = ctx.Process(target=sampler_main, args=args, daemon=True, name="humanline-sampler")
        try:  # spawn pickles every argument here, in the trainer
            self.process.start()
        except (TypeError, AttributeError, pickle.PicklingError) as exc:
            self.process = None
            raise UserError(f"config field 'train.async_sampling': the run's settings cannot be sent to the sampler "
                            f"process ({type(exc).__name__}: {exc}); a reward given as a Python object must be "
                            f"importable by name (a module-level function), or set it to false") from exc
        self.free.set()

    def close(self) -> None:
        """Stop the sampler process (asked first; ended after a few seconds if it does not)."""
        if self.process is None:
            return
        if self.process.is_alive():
            self.requests.put(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.process = None

    # ------------------------------------------------------------------ the loop's calls

    def before_step(self, step: int, model: torch.nn.Module) -> list[dict]:
        """Ask for what the synchronous stale regime samples at `step` (shipping version `step`'s weights), then
        wait for the step's own batch. Returns the stats of every result taken in meanwhile (`async/*` set)."""
        self.model = model
        if self.process is None:
            self._start(step)
        stats = self._take_ready(step)
        start = time.perf_counter()  # from here the trainer waits on the sampler: to ship, then for its batch
        if self.bounded:
            self._offer(step)
            self._ask_bounded(step)
        else:
            request = self._request(step)
            if request is not None:
                self._ship(step, model)
                self.requests.put((step, *request, None))
                self.pending.update(range(request[0], request[0] + request[1]))
        while step not in self.buffer.buffer and step < self.max_steps:
            if step not in self.pending:
                raise RuntimeError(f"async sampling: no batch for step {step} was asked for")
            stats += self._wait(step)
        waited = time.perf_counter() - start
        return [*stats, {"async/wait_seconds": waited, "async/pending": float(len(self.pending))}]

    def flush(self, step: int) -> list[dict]:
        """Take in every batch asked for (before a checkpoint: it then holds the whole queue)."""
        stats = []
        while self.pending:
            stats += self._wait(step)
        return stats

    # ------------------------------------------------------------------ parts

    def _request(self, step: int) -> tuple[int, int] | None:
        """`(first, span)` that the synchronous stale queue samples at `step` (`SampleBuffer.request`), counting
        the steps already asked for as present; None: nothing to sample."""
        return self.buffer.request(step, self.pending)

    def _ask_bounded(self, step: int) -> None:
        """Bounded: ask (without a version) for each step the queue holds after `step`'s sampling
        (`SampleBuffer.queue`) that is neither in the buffer nor asked for, one at a time. The sampler may draw each
        with any version from `first - staleness` on (`request`'s fourth field)."""
        for first in self.buffer.queue(step):
            if first not in self.buffer.buffer and first not in self.pending:
                self.requests.put((None, first, 1, first - self.buffer.staleness))
                self.pending.add(first)

    def _wait(self, step: int) -> list[dict]:
        """One wait for a result (bounded: offering the newest weights meanwhile, which the sampler may need)."""
        if not self.bounded:
            return self._take(POLL_SECONDS, step)
        self._offer(step)
        return self._take(OFFER_SECONDS, step)

    def _ship(self, step: int, model: torch.nn.Module) -> None:
        """Write the policy into the shared slot once the sampler has copied the previous version out of it."""
        while not self.free.wait(POLL_SECONDS):
            self._check_alive(step)
        self._write(step, model)

    def _offer(self, step: int) -> None:
        """Bounded: write version `step` into the slot if it is newer than the slot's and the sampler has read
        the slot (no wait)."""
        if self.shipped < step and self.free.is_set():
            self._write(step, self.model)

    def _write(self, step: int, model: torch.nn.Module) -> None:
        copy_weights_(self.shared, self.run.accelerator.unwrap_model(model))
        self.version.value, self.shipped = step, step
        self.free.clear()  # after the weights: the sampler reads a cleared slot whole

    def _take_ready(self, step: int) -> list[dict]:
        stats = []
        while True:
            try:
                message = self.results.get_nowait()
            except queue.Empty:
                return stats
            stats.append(self._handle(message, step))

    def _take(self, timeout: float, step: int) -> list[dict]:
        try:
            message = self.results.get(timeout=timeout)
        except queue.Empty:
            self._check_alive(step)
            return []
        return [self._handle(message, step)]

    def _handle(self, message: tuple, step: int) -> dict:
        """Put a result's units into the buffer under their steps (steps before `step` are trained: dropped
        from it) and its log-probs into the caches; raise the sampler's error as one line."""
        if message[0] == "error":
            _, kind, line = message
            if kind == "user":
                raise UserError(line)
            raise SamplerDied(f"train.async_sampling: the sampler process failed: {line}")
        payload = message[1]
        first, units = payload["first"], payload["units"]
        steps = range(first, first + len(units))
        if not set(steps) <= self.pending:  # each batch is asked for once, so it arrives once, before its step
            raise RuntimeError(f"async sampling: steps {list(steps)} arrived, {sorted(self.pending)} were awaited")
        self.buffer.receive(payload["at"], first, units, now=step)
        for line in short_lines(payload.get("short", []), self.buffer.layout.per_step,
                                self.cfg.rollout.redraws):
            self.run.logger.warn(line)
        if self.cache is not None:
            self.cache.cache.update(payload["logps"])
        self.pending.difference_update(steps)
        return payload["stats"]

    def _check_alive(self, step: int) -> None:
        if self.process is not None and not self.process.is_alive():
            code = self.process.exitcode
            raise SamplerDied(f"train.async_sampling: the sampler process exited (code {code}) while step "
                              f"{step + 1} waited for it; resume the run from its last checkpoint with --resume")
