"""Which units each optimizer step trains on, for every data regime.

A *unit* is a tokenised training item from `humanline.data.tokenization` (a DPO pair, a KTO example, or a whole
GRPO group). A schedule maps a step to this process's micro-batches, deterministically, so that lookahead
references can look ahead and a resumed run sees exactly the batches it would have seen.

- `OfflineSchedule`: a fixed set of units, re-permuted every epoch with the run's seed.
- `SampleBuffer`: online (`sample_every = 1`) and sparse (`sample_every = N`) regimes. At every N-th step the
  trainer samples a buffer for the next N steps from the current policy, scores it and turns it into units;
  each sample is used once (docs/method.md §5). The stale regime (`staleness` > 0) is a queue: every step
  samples the batch that step + staleness trains on, so each batch is drawn by the policy `staleness` versions
  before the one that trains on it; step 0 fills the queue with the batches of steps 0..staleness, all drawn by
  the initial policy. `SampleBuffer.request` is the one rule of what a sampling draws, for the trainer and the
  asynchronous sampler alike.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from humanline.data.collate import BatchLayout, Collate, micro_batches, to_device
from humanline.data.records import Unit

FILLER = "filler"  # key of a micro-batch that only keeps processes in step (`SampleBuffer`): its loss weighs 0


class OfflineSchedule:
    """Epoch-wise permutations of a fixed unit list. Leftover units that do not fill a step are dropped
    (counted in `dropped_per_epoch`)."""

    def __init__(self, units: list[Unit], collate: Collate, pad_id: int, layout: BatchLayout, *, seed: int,
                 device: torch.device, shuffle: bool = True):
        if len(units) < layout.per_step:
            raise ValueError(
                f"{len(units)} training units are fewer than one step needs "
                f"({layout.per_step} = micro_batch_size x grad_accum x processes)"
            )
        self.units, self.collate, self.pad_id, self.layout = units, collate, pad_id, layout
        self.seed, self.device, self.shuffle = seed, device, shuffle
        self.steps_per_epoch = len(units) // layout.per_step
        self.dropped_per_epoch = len(units) - self.steps_per_epoch * layout.per_step
        self._perm_epoch, self._perm = -1, []

    def _permutation(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            order = list(range(len(self.units)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._perm_epoch, self._perm = epoch, order
        return self._perm

    def step_units(self, step: int) -> list[Unit]:
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self._permutation(epoch)
        n = self.layout.per_step
        return [self.units[i] for i in order[within * n : (within + 1) * n]]

    def __call__(self, step: int) -> list[dict]:
        return micro_batches(self.step_units(step), self.layout, self.collate, self.pad_id, self.device)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class SampleBuffer:
    """Online/sparse regimes: the units sampled for the next steps, `sample_every` steps per buffer (online 1).

    The trainer samples, scores and builds units when `due(step)`, then `fill`s the buffer; `__call__(step)`
    hands out that step's micro-batches like an `OfflineSchedule`. Each sample is used once (method §5).

    `staleness` (> 0: the stale regime): at step s > 0 the trainer samples the units of step s + staleness; at
    step 0 (or wherever a resumed run finds no units for its step) those of steps s .. s + staleness. Units wait
    in the buffer, checkpointed with it, until their step; `staleness_of(s)` is how many versions old step s's
    sampler is (min(s, staleness) from step 0). With staleness 0 it samples exactly as online.

    Several processes (`gather` set) sample and drop groups each on their own, so a step could hold more
    micro-batches on one process than on another; but their forwards and backwards meet in collective calls
    (DDP's gradient all-reduce, FSDP's all-gathers, KTO's reference point). So every process gets as many
    micro-batches per step as the process with the most: the missing ones are fillers (`FILLER` set), a unit of
    some process with every completion mask cleared, which the trainer weighs 0.
    """

    collate: Collate
    pad_id: int
    layout: BatchLayout
    sample_every: int
    device: torch.device
    buffer: dict[int, list[Unit]] = field(default_factory=dict)
    buffer_start: int = -1  # the step at which the current buffer was sampled
    gather: Callable[[object], list] | None = None  # every process's object, in process order (None: 1 process)
    counts: dict[int, int] = field(default_factory=dict)  # micro-batches per step: the most any process has
    spare: Unit | None = None  # a unit fillers are made of
    staleness: int = 0  # the stale regime's versions between a batch's sampler and its step (0: online / sparse)
    max_steps: int | None = None  # the stale regime samples no step at or past it
    sampled_at: dict[int, int] = field(default_factory=dict)  # step -> the step whose policy sampled its units
    filled: list[int] = field(default_factory=list)  # the steps the last `fill` took

    def request(self, step: int, asked: set[int] | frozenset = frozenset()) -> tuple[int, int] | None:
        """What a sampling at `step` draws: `(first, span)`, the units of steps `first .. first + span - 1`, or
        None when nothing is due. Online / sparse: a buffer every `sample_every` steps (to the next multiple), or
        where a resumed run finds none for `step`. A stale queue: the batch of step + staleness, or, where it
        starts (step 0, a resumed run with an empty queue), those of steps step .. step + staleness; never a step
        at or past `max_steps`. `asked`: steps already asked of an asynchronous sampler, counted as present."""
        present = self.buffer.keys() | asked
        if not self.staleness:
            return None if step in present else (step, self.sample_every - step % self.sample_every)
        queue = self.queue(step)
        if step not in present:
            return step, max(1, len(queue))
        last = step + self.staleness
        return (last, 1) if last in queue and last not in present else None

    def queue(self, step: int) -> range:
        """The steps a stale queue holds once the sampling at `step` is done: `step .. step + staleness`, none at or
        past `max_steps` (what `request` asks for, and what a bounded asynchronous sampler is asked for)."""
        end = step + self.staleness + 1
        return range(step, end if self.max_steps is None else min(end, self.max_steps))

    def fill(self, step: int, first: int, units_per_step: list[list[Unit]]) -> None:
        """Take the units sampled at `step` for steps `first ..` (`request`); with several processes, agree on
        each step's micro-batch count. A stale queue keeps the units of steps not yet trained."""
        new = {first + i: units for i, units in enumerate(units_per_step)}
        keep = {s: units for s, units in self.buffer.items() if s >= step} if self.staleness else {}
        self.buffer = {**keep, **new}
        self.sampled_at = {s: at for s, at in self.sampled_at.items() if s in keep} | {s: step for s in new}
        self.buffer_start, self.filled = step, sorted(new)
        if self.gather is None:
            return
        mine = [len(self.layout.local_micro_batches(units)) for units in units_per_step]
        everyone = self.gather((mine, next((u for units in units_per_step for u in units), None)))
        self.counts = {s: c for s, c in self.counts.items() if s in keep}
        self.counts.update({first + i: max(counts[i] for counts, _ in everyone) for i in range(len(units_per_step))})
        self.spare = next((spare for _, spare in everyone if spare is not None), None)

    def receive(self, at: int, first: int, units_per_step: list[list[Unit]], now: int) -> None:
        """Take units sampled elsewhere (an asynchronous sampler process, `training.async_sampling`) by the
        policy of step `at` for steps `first ..`; the steps before `now` are dropped (already trained). One
        process only (no fillers); `later_steps` stays None: the sampler sent its own log-probs."""
        self.buffer = {s: units for s, units in self.buffer.items() if s >= now}
        self.sampled_at = {s: a for s, a in self.sampled_at.items() if s >= now}
        for i, units in enumerate(units_per_step):
            self.buffer[first + i], self.sampled_at[first + i] = units, at

    def later_steps(self, step: int) -> list[int] | None:
        """The steps after `step` whose units were sampled at `step`, or None if nothing was sampled then."""
        return [s for s in self.filled if s > step] if step == self.buffer_start else None

    def staleness_of(self, step: int) -> int:
        """How many optimizer steps (policy versions) before `step` its units were sampled."""
        return step - self.sampled_at.get(step, max(self.buffer_start, 0))

    def __call__(self, step: int) -> list[dict]:
        batches = micro_batches(self.buffer.get(step, []), self.layout, self.collate, self.pad_id, self.device)
        return batches + [self._filler() for _ in range(self.counts.get(step, 0) - len(batches))]

    def _filler(self) -> dict:
        """A micro-batch that runs through the model like any other but scores no token (`FILLER`)."""
        batch = self.collate([self.spare], self.pad_id)
        for key, value in batch.items():
            if key.endswith("completion_mask"):
                value.zero_()
        return {**to_device(batch, self.device), FILLER: True}

    def state_dict(self) -> dict:
        return {"buffer": {str(k): v for k, v in self.buffer.items()}, "buffer_start": self.buffer_start,
                "counts": {str(k): v for k, v in self.counts.items()}, "spare": self.spare,
                "sampled_at": {str(k): v for k, v in self.sampled_at.items()}, "filled": self.filled}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = {int(k): v for k, v in state.get("buffer", {}).items()}
        self.buffer_start = state.get("buffer_start", -1)
        self.counts = {int(k): v for k, v in state.get("counts", {}).items()}
        self.spare = state.get("spare")
        self.sampled_at = {int(k): v for k, v in state.get("sampled_at", {}).items()}
        self.filled = state.get("filled", sorted(self.buffer))
