"""Sampling that overlaps training (`train.async_sampling`): a sampler process exactly eta versions behind
equals the synchronous stale regime bit for bit; every step trains its own batch once, across a checkpoint and
resume too; a dead sampler process is a one-line error, not a hang. Each test spawns a sampler process (its
imports take a few seconds)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from helpers_reliability import one_thread, online_config, step_losses
from helpers_train import params
from humanline.errors import UserError
from humanline.training.async_sampling import SamplerDied
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _config(out: Path, steps: int = 5, **changes):
    """The online recipe as the stale regime at eta = 2, each section then updated with `changes`."""
    return online_config(out, steps, **{**changes, "train": {"regime": "stale", "staleness": 2,
                                                             **changes.get("train", {})}})


def _train_recording(trainer: Trainer, steps: int | None = None) -> list[tuple]:
    """Run `steps` steps (None: `train()` to the end); for each step, (its index, the prompt ids of the batch it
    trained on, the step whose policy drew them)."""
    seen, buffer = [], trainer.run.schedule
    real = trainer.train_step

    def step():
        out = real()
        s = trainer.step - 1
        seen.append((s, [u["id"] for u in buffer.buffer.get(s, [])], buffer.sampled_at.get(s)))
        return out

    trainer.train_step = step
    if steps is None:
        trainer.train()
    else:
        for _ in range(steps):
            trainer.train_step()
    return seen


def test_fixed_lag_equals_the_synchronous_stale_regime_and_resumes_exactly(tmp_path):
    """eta = 2, the sampler reference (GRPO's old-policy ratio) and TIS: the async run stopped after step 3
    with a checkpoint (the queue then holds steps 3 and 4: the checkpoint waits for any still being drawn),
    resumed by a new trainer with a new sampler process, trains the same batches at the same steps, with the
    same losses and weights, as the synchronous run; each step's batch exactly once."""
    changes = {"objective": {"correction": "tis"}, "rollout": {"prompts_per_step": 4, "n": 4}}
    sync = Trainer(_config(tmp_path / "sync", **changes))
    expected = _train_recording(sync)
    out = tmp_path / "async"
    first = Trainer(_config(out, train={"async_sampling": True, "save_every": 3}, **changes))
    seen = _train_recording(first, steps=3)
    first.save_checkpoint()
    first.close_sampler()
    resumed = Trainer(_config(out, train={"async_sampling": True, "save_every": 3}, **changes), resume=True)
    assert resumed.step == 3 and {3, 4} <= set(resumed.run.schedule.buffer)
    seen += _train_recording(resumed)
    assert [s for s, _, _ in seen] == list(range(5))  # no gap, no repeat
    assert seen == expected and [at for _, _, at in seen] == [0, 0, 0, 1, 2]
    assert step_losses(out) == step_losses(tmp_path / "sync") and len(step_losses(out)) >= 3
    got, want = params(resumed.run.unwrapped), params(sync.run.unwrapped)
    assert all(torch.equal(got[k], want[k]) for k in want)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    waits = [r["async/wait_seconds"] for r in rows if "async/wait_seconds" in r]
    assert len(waits) == 5 and all(w >= 0 for w in waits) and not any("async/dropped" in r for r in rows)


def test_fixed_lag_equals_the_synchronous_stale_regime_under_bf16_autocast(tmp_path):
    """`train.mixed_precision: bf16` on the CPU, humanline with TIS (its behaviour log-probs come from the
    sampler): the sampler process computes them in the trainer's precision (the forward accelerate gives the
    trainer's model), so the asynchronous run trains the same numbers as the synchronous one, bit for bit."""
    changes = {"objective": {"correction": "tis"}, "rollout": {"prompts_per_step": 4, "n": 4},
               "humanline": {"enabled": True, "sync_every": 2}}
    sync = Trainer(_config(tmp_path / "sync", steps=4, train={"mixed_precision": "bf16"}, **changes))
    sync.train()
    run = Trainer(_config(tmp_path / "async", steps=4, train={"mixed_precision": "bf16", "async_sampling": True},
                          **changes))
    run.train()
    assert sync.run.accelerator.mixed_precision == "bf16"
    assert step_losses(tmp_path / "async") == step_losses(tmp_path / "sync") and len(step_losses(tmp_path / "sync"))
    got, want = params(run.run.unwrapped), params(sync.run.unwrapped)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_bounded_mode_trains_each_step_its_own_prompts_once_at_most_eta_versions_old(tmp_path):
    """`train.async_mode: bounded`, eta = 2: each step trains the batch of its own prompts, drawn by a version
    between `step - eta` and `step` (the newest the sampler had), once, across a checkpoint and a resume by a new
    trainer with a new sampler process too; the run ends with its planned steps and nothing asked for."""
    out, changes = tmp_path / "bounded", {"rollout": {"prompts_per_step": 2, "n": 4}}
    config = _config(out, steps=6, train={"async_sampling": True, "async_mode": "bounded", "save_every": 3},
                     **changes)
    first = Trainer(config)
    try:
        seen = _train_recording(first, steps=3)
        first.save_checkpoint()
        assert not first.async_sampling.pending  # the checkpoint took in every batch asked for
    finally:
        first.close_sampler()
    resumed = Trainer(config, resume=True)
    seen += _train_recording(resumed)
    assert [s for s, _, _ in seen] == list(range(6))  # no gap, no repeat
    for step, ids, at in seen:
        assert 0 <= step - at <= 2, (step, at)
        wanted = {str(rec.prompt_id) for rec in resumed.run.sampler.prompts([step])}
        assert ids and set(ids) <= wanted, (step, ids, wanted)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ages = {r["step"]: r["staleness"] for r in rows if "staleness" in r}
    assert sorted(ages) == list(range(1, 7)) and all(0 <= a <= 2 for a in ages.values())
    assert resumed.step == 6 and not resumed.async_sampling.pending


def test_a_dead_sampler_process_is_a_one_line_error(tmp_path):
    """The sampler process killed after step 1: the step that waits for its next batch fails with one line
    within seconds (result reads time out and look at the process)."""
    trainer = Trainer(_config(tmp_path / "run", steps=6, train={"staleness": 1, "async_sampling": True}))
    try:
        trainer.train_step()
        os.kill(trainer.async_sampling.process.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(SamplerDied, match=r"sampler process exited \(code -9\) while step \d waited for it; "
                                              r"resume .* --resume"):
            for _ in range(5):
                trainer.train_step()
        assert time.monotonic() - start < 30
    finally:
        trainer.close_sampler()


def test_the_sampler_processs_own_error_comes_back_as_its_one_line(tmp_path):
    """A reward that breaks its contract (one score for the batch) fails in the sampler process: the trainer
    raises the very `UserError` the synchronous run would, naming the reward and the step."""
    reward = str(Path(__file__).resolve().parents[1] / "fault_rewards.py") + ":one_score"
    trainer = Trainer(_config(tmp_path / "run", train={"async_sampling": True}, rollout={"reward": reward}))
    try:
        with pytest.raises(UserError, match=r"one_score.*\(at step 1\)") as caught:
            trainer.train_step()
        assert not isinstance(caught.value, SamplerDied) and "\n" not in str(caught.value)
    finally:
        trainer.close_sampler()


@pytest.mark.parametrize("changes, message", [
    ({"train": {"regime": "online", "staleness": 0, "async_sampling": True}}, "train.async_sampling"),
    ({"train": {"staleness": 0, "async_sampling": True}}, "train.async_sampling"),
    ({"train": {"async_sampling": True, "sampler_device": "gpu1"}}, "train.sampler_device"),
    ({"train": {"async_sampling": True, "async_mode": "free"}}, "train.async_mode"),
])
def test_settings_that_cannot_work_are_refused(tmp_path, changes, message):
    with pytest.raises(UserError, match=message):
        _config(tmp_path / "run", **changes)


def test_a_sampler_device_this_machine_lacks_is_refused_before_the_process_starts(tmp_path):
    """`train.sampler_device: cuda:N` past the CUDA devices torch sees is one line when the trainer is built (the
    sampler process used to fail on it at the first step, as "Torch not compiled with CUDA enabled")."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    config = _config(tmp_path / "run", train={"async_sampling": True, "sampler_device": f"cuda:{count}"})
    with pytest.raises(UserError, match=rf"train.sampler_device.*cuda:{count} but torch sees {count} CUDA device"):
        Trainer(config)
