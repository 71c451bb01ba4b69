"""The sampler process of `train.async_sampling`: the stale regime's sampling, in a process of its own.

It runs exactly what the synchronous stale regime runs at a sampling step (`training.loop.Trainer._sample`): the
same `sampling.draw` (prompts, generation with the same per-step seed, rewards, units), and the sampler's
log-probs of each micro-batch (what a `training.reference.SamplerReference` would compute), from its own copy of
the policy, in the trainer's precision (`devices.precision`). It stands on `sampling/` and the layers below it:
the trainer sends the objective's unit and collation functions and the batch layout with the settings. The trainer
(`training.async_sampling.AsyncSampling`) ships the weights through a model in shared memory: each request names
the policy version it carries; the sampler copies it into its own model, then frees the slot (`free`) for the
next version, so the trainer never overwrites weights still being read and never waits for a generation.

With `train.async_mode: bounded` a request carries no version (`at` None): the sampler draws with the newest
weights the slot has handed it (`version` names them), waiting for newer ones only while its own are more than
`train.staleness` versions behind the step it draws for; the payload's `at` is the version it used.

Messages, all tuples: requests `(at, first, span, oldest)` (`oldest`: bounded, the oldest version the batch
may be drawn by; None: stop); results `("batch", payload)` or
`("error", kind, one line)`. The process ignores SIGINT and SIGTERM (the trainer stops it after saving a
checkpoint) and exits by itself when the trainer's process is gone.
"""

from __future__ import annotations

import copy
import multiprocessing
import queue
import signal
import time
from dataclasses import dataclass
from typing import Callable

import torch

from humanline.data.collate import BatchLayout, micro_batches
from humanline.devices.precision import autocast_for, with_precision_forward
from humanline.devices.weights import copy_weights_
from humanline.errors import UserError
from humanline.model.forward import batch_logps_no_grad
from humanline.sampling.draw import draw
from humanline.sampling.sampler import Sampler, build_rewards
from humanline.settings.config import Config

POLL_SECONDS = 1.0  # how often an idle sampler checks that its trainer is still there


class _Solo:
    """The little of an `Accelerator` a `Sampler` uses, for one process on `device`."""

    num_processes, process_index = 1, 0

    def __init__(self, device: torch.device, precision: str):
        self.device, self.precision = device, precision

    def unwrap_model(self, model):
        return model

    def autocast(self):
        return autocast_for(self.precision, self.device.type)  # as the trainer's accelerator.autocast()


@dataclass(frozen=True)
class SamplerSettings:
    """What the sampler process needs besides the queues: the run's settings, the objective's unit and collation
    functions (module-level, so they travel by name), the batch layout and the trainer's device and precision."""

    cfg: Config
    units_from_group: Callable  # (scored group, DataConfig) -> the objective's units
    collate: Callable  # (units, pad_id) -> micro-batch
    layout: BatchLayout  # one process's: `micro_batches` cuts each step's units as the trainer's buffer does
    device: str
    precision: str  # accelerate's mixed precision: no | bf16 | fp16
    logps: bool  # send each micro-batch's log-probs (a sampler reference reads them)


def sampler_main(settings: SamplerSettings, tokenizer, pool: list, shared: torch.nn.Module, requests, results, free,
                 version) -> None:
    """The process's entry point (spawned): serve requests until told to stop or the trainer is gone. Any
    failure goes back to the trainer as one line (`UserError`s keep their kind)."""
    for signum in (signal.SIGINT, signal.SIGTERM):  # a signal to the whole process group (Ctrl-C): the trainer
        signal.signal(signum, signal.SIG_IGN)  # saves a checkpoint first, which needs this process, then stops it
    torch.set_num_threads(1)  # on the CPU the two sides share the cores (docs/method.md §3.6: one trainer thread)
    try:
        worker = _Worker(settings, tokenizer, pool, shared, version.value)
        try:
            worker.serve(requests, results, free, version)
        finally:
            worker.sampler.close()  # its own engine, if it holds one
    except UserError as exc:
        results.put(("error", "user", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then the process ends
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        results.put(("error", "crash", f"{type(exc).__name__}: {first}"))


class _Worker:
    def __init__(self, settings: SamplerSettings, tokenizer, pool: list, shared: torch.nn.Module, version: int):
        self.settings, self.cfg, self.shared = settings, settings.cfg, shared
        self.device, self.layout, self.pad_id = torch.device(settings.device), settings.layout, tokenizer.pad_token_id
        self.version = version  # the trainer's step whose weights `model` holds
        # the sampler's own policy (the shared slot is refilled), computing in the trainer's precision
        self.model = with_precision_forward(copy.deepcopy(shared).to(self.device), settings.precision,
                                            self.device.type)
        reward = build_rewards(self.cfg)["rollout"]  # rebuilt here: a reward loaded from a file does not pickle
        self.sampler = Sampler(self.cfg, tokenizer, _Solo(self.device, settings.precision), reward, pool)

    def serve(self, requests, results, free, version) -> None:
        parent = multiprocessing.parent_process()
        while True:
            try:
                request = requests.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return  # the trainer was killed: nobody will read what this process makes
                continue
            if request is None:
                return
            at, first, span, oldest = request
            if at is None:  # bounded: the newest weights, at least version `oldest` (`staleness` behind `first`)
                at = self._newest(oldest, free, version, parent)
                if at is None:
                    return
                results.put(("batch", self.draw(at, first, span, seed_step=first)))
                continue
            self._load_weights()
            free.set()  # the slot may take the next version now
            results.put(("batch", self.draw(at, first, span)))

    def _newest(self, need: int, free, version, parent) -> int | None:
        """Take the slot's weights when it holds a version not yet read; wait for one while `self.version` is
        below `need`. Returns the version the model then holds (None: the trainer is gone)."""
        while True:
            if not free.is_set():  # the trainer wrote a version and waits for it to be read
                self._load_weights()
                self.version = version.value
                free.set()
            if self.version >= need:
                return self.version
            if parent is not None and not parent.is_alive():
                return None
            time.sleep(0.01)

    def _load_weights(self) -> None:
        copy_weights_(self.model, self.shared)

    def draw(self, at: int, first: int, span: int, seed_step: int | None = None) -> dict:
        """What the synchronous stale regime makes at step `at`: the units of steps `first .. first + span - 1`,
        each step's micro-batch log-probs by this policy (when a reference or correction reads them), stats.
        `seed_step` (default `at`) seeds the generation and names the step in errors."""
        seed_step = at if seed_step is None else seed_step
        drawn = draw(self.sampler, self.model, self.settings.units_from_group, self.cfg.data, at=seed_step, first=first,
                     span=span, fill=self.layout.per_step, redraws=self.cfg.rollout.redraws, version=at)
        units = drawn.units
        logps = {}
        for i, step_units in enumerate(units if self.settings.logps else []):
            batches = micro_batches(step_units, self.layout, self.settings.collate, self.pad_id, self.device)
            for index, batch in enumerate(batches):  # the trainer's micro-batch `index` of step `first + i`
                logps[(first + i, index)] = {part: t.cpu() for part, t in
                                             batch_logps_no_grad(self.model, batch).items()}
        return {"at": at, "first": first, "units": units, "logps": logps, "stats": drawn.stats, "short": drawn.short}
