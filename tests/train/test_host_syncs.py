"""Host syncs of a training step: from its start to its optimizer step, one read-back of the step's metrics.

On a GPU every operation that makes the host wait for the device (a scalar read, a copy to the host, a
data-dependent shape) stalls the launch queue; on the CPU they cost nothing, so they are counted here
(`humanline.diagnostics.syncs`) in one steady step of every objective, with humanline on and off, under every
reference strategy. The optimizer step itself is left out of the count (AdamW's step counters are host
tensors on a GPU; on the CPU they look like device reads).
"""

from __future__ import annotations

import pytest
import torch

from helpers_train import ROOT, tiny_config
from humanline.diagnostics.syncs import SyncCounter
from humanline.training.loop import Trainer

MAX_SYNCS = 1  # the step's one read-back (`training.step.read_back`)
STRATEGIES = [(False, "frozen"), (False, "cache"), (True, "lookahead"), (True, "copy"), (False, "sampler")]


def _trainer(name: str, hl: bool, reference: str, out, **extra) -> Trainer:
    sections = {"train": {"reference": reference}}
    if reference == "sampler" or "regime" in extra.get("train", {}):  # a sampled run (sparse unless told)
        sections["train"].update(regime="sparse", sample_every=4)
        sections["data"] = {"train": None}
        sections["rollout"] = {"prompts": str(ROOT / "recipes/tiny/data/prompts.jsonl"), "prompts_per_step": 4,
                               "n": 4, "max_new_tokens": 6, "reward": str(ROOT / "recipes/tiny/rewards.py") + ":digits"}
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    objective = sections.pop("objective", {})  # tiny_config names the objective itself
    cfg = tiny_config(name, out, hl=hl, steps=6, **sections)
    for key, value in objective.items():
        setattr(cfg.objective, key, value)
    return Trainer(cfg)


def count_step(trainer: Trainer) -> SyncCounter:
    """The syncs of the trainer's next step, its optimizer step left out."""
    optimizer_step = trainer.run.optimizer.step
    with SyncCounter(trainer.run.accelerator.device, record=True) as syncs:
        def step(*args, **kwargs):
            with syncs.paused():
                return optimizer_step(*args, **kwargs)

        trainer.run.optimizer.step = step
        try:
            trainer.train_step()
        finally:
            trainer.run.optimizer.step = optimizer_step
    return syncs


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("hl,reference", STRATEGIES, ids=[s for _, s in STRATEGIES])
def test_a_steady_step_reads_the_device_once(objective, hl, reference, tmp_path):
    trainer = _trainer(objective, hl, reference, tmp_path / "run")
    trainer.train_step()  # step 0: probes, the cache's whole-run pass, the first sampling
    trainer.train_step()
    syncs = count_step(trainer)
    assert syncs.total <= MAX_SYNCS, f"{syncs.total} host syncs: {syncs.where}"
    assert syncs.by_kind["tolist"] == 1  # the read-back did happen (the counter sees it)


def test_more_micro_batches_and_the_stochastic_transform_add_none(tmp_path):
    trainer = _trainer("dpo", True, "lookahead", tmp_path / "run", humanline={"transform": "reject"},
                       train={"micro_batch_size": 2, "grad_accum": 2})
    trainer.train_step(), trainer.train_step()
    syncs = count_step(trainer)
    assert syncs.total <= MAX_SYNCS, syncs.where


def test_an_auto_band_reads_its_quantiles_once_per_sync(tmp_path):
    """At a sync step the auto band moves to the window's quantiles (docs/method.md §3.4): one more read."""
    trainer = _trainer("dpo", True, "lookahead", tmp_path / "run", humanline={"band": "auto"})
    trainer.train_step(), trainer.train_step()
    syncs = count_step(trainer)  # sync_every = 1: every step is a sync step
    assert syncs.total <= MAX_SYNCS + 1, syncs.where


@pytest.mark.parametrize("reference", ["lookahead", "copy"])
def test_the_drift_rule_reads_nothing_more(reference, tmp_path):
    """`sync_every: auto` (docs/method.md §3.5) decides at sync steps from the last step's drift, which the step's
    one read-back already brought (`DriftRule.note`): no read of its own. Windows of 1 step: every step syncs."""
    trainer = _trainer("grpo", True, reference, tmp_path / "run",
                       humanline={"sync_every": "auto", "sync_min": 1, "sync_max": 1})
    trainer.train_step(), trainer.train_step()
    syncs = count_step(trainer)
    assert trainer.run.humanline.rule.last_drift is not None  # it did decide from a measured drift
    assert syncs.total <= MAX_SYNCS, syncs.where


def test_the_counter_sees_each_kind_of_sync():
    """What it counts on the CPU, and what it does not (integer gathers, reductions, host numpy)."""
    t = torch.tensor([3, 0, 2, 2])
    with SyncCounter("cpu") as syncs:
        t.sum().item(), float(t.max()), bool(t.any())  # 3 scalar reads
        t.nonzero(), t[t > 1], torch.unique(t), torch.repeat_interleave(t, t)
        t.tolist(), t.cpu()
        t.index_select(0, torch.tensor([0, 2])), t[torch.tensor([1, 3])], t.cumsum(0), t.numpy().sum()
        torch.repeat_interleave(t, t, output_size=7)
        with syncs.paused():
            t.tolist()
    assert dict(syncs.by_kind) == {"item": 3, "nonzero": 1, "boolean index": 1, "unique": 1,
                                   "repeat_interleave": 1, "tolist": 1, "cpu": 1}
    with SyncCounter("cuda") as other:  # host tensors of a GPU run: bookkeeping, not syncs
        t.sum().item(), t.tolist(), t[t > 1]
    assert other.total == 0


@pytest.mark.parametrize("correction", ["drop", "tis", "decoupled", "m2po"])
@pytest.mark.parametrize("hl", [False, True], ids=["sampler", "humanline"])
def test_the_stale_corrections_read_nothing_more(correction, hl, tmp_path):
    """A stale run (eta = 2, 4 steps) counted on step 2, which trains on its queue and samples nothing more (step
    4 is past the end): the corrections' masks, weights and shares stay on the device (M2PO's sort included)."""
    trainer = _trainer("grpo", hl, "auto", tmp_path / "run", objective={"correction": correction},
                       train={"regime": "stale", "staleness": 2, "sample_every": 1, "max_steps": 4})
    trainer.train_step(), trainer.train_step()
    syncs = count_step(trainer)
    assert syncs.total <= MAX_SYNCS, syncs.where
    assert syncs.by_kind["tolist"] == 1
