"""The stale regime (`train.regime: stale`, `train.staleness: eta`): eta = 0 is online bit for bit; each batch
is drawn, and its behaviour log-probs recorded, by the policy eta versions before the step that trains on it;
the corrections run in it; a resumed run equals the uninterrupted one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from helpers_reliability import ROOT, one_thread, online_config, step_losses
from helpers_train import params
from humanline.errors import UserError
from humanline.model.forward import batch_logps_no_grad
from humanline.training.config_loading import load_config
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _config(out: Path, steps: int = 4, **changes):
    return online_config(out, steps, **changes)


def test_zero_staleness_is_online_bit_for_bit(tmp_path):
    online = Trainer(_config(tmp_path / "online"))
    online.train()
    stale = Trainer(_config(tmp_path / "stale", train={"regime": "stale", "staleness": 0}))
    stale.train()
    losses = step_losses(tmp_path / "stale")
    assert step_losses(tmp_path / "online") == losses and len(losses) == 4
    got, expected = params(stale.run.unwrapped), params(online.run.unwrapped)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_each_batch_is_drawn_by_the_policy_eta_versions_earlier(tmp_path):
    """eta = 2: steps 0..2 train on the initial policy's samples, step s >= 2 on those of step s - 2; the
    sampler reference's log-probs of step s's batch are exactly the log-probs of the policy of step s - 2."""
    trainer = Trainer(_config(tmp_path / "run", steps=5, train={"regime": "stale", "staleness": 2},
                              rollout={"prompts_per_step": 4, "n": 4}))
    snapshots, buffer, checked = [], trainer.run.schedule, 0
    for step in range(5):
        snapshots.append(params(trainer.run.unwrapped))
        if step >= 1:  # the queue holds steps step .. step + 1; this step samples step + 2
            assert {s for s in (step, step + 1) if s < 5} <= set(buffer.buffer) and step + 2 not in buffer.buffer
            for i, batch in enumerate(buffer(step)):
                checked += 1
                recorded = trainer.run.reference.cache[(step, i)]["main"]
                model = trainer.run.unwrapped
                current = params(model)
                model.load_state_dict(snapshots[max(step - 2, 0)])
                assert torch.equal(batch_logps_no_grad(model, batch)["main"], recorded)
                model.load_state_dict(current)
        trainer.train_step()
        assert buffer.staleness_of(step) == min(step, 2)
    assert buffer.sampled_at == {2: 0, 3: 1, 4: 2} and checked >= 2  # steps 3, 4 sampled nothing (past the end)


@pytest.mark.parametrize("correction", ["tis", "decoupled", "m2po"])
@pytest.mark.parametrize("hl", [False, True], ids=["plain", "humanline"])
def test_every_correction_trains_and_logs_its_shares(tmp_path, correction, hl):
    """Each correction runs in the loop with and without humanline, on the log-probs the sampler recorded as it
    drew the tokens, and the shares are logged (their values are pinned on an exact case in
    tests/objectives/test_corrections_spec.py)."""
    cfg = _config(tmp_path / "run", steps=3, train={"regime": "stale", "staleness": 1},
                  objective={"correction": correction}, humanline={"enabled": hl, "sync_every": 1})
    trainer = Trainer(cfg)
    rows = [trainer.train_step() for _ in range(3)]
    trained = [r for r in rows if "loss" in r]
    assert trained and all(0 < r["correction/ess"] <= 1 and 0 <= r["correction/masked"] < 1 for r in trained)
    assert trainer.run.behaviour == correction
    assert all(("clip_fraction" in r) == (hl or correction != "m2po") for r in trained)  # m2po alone: no clip


def test_a_step_that_drop_empties_moves_nothing(tmp_path, capsys):
    """eta = 2 and max_staleness 1: steps 0 and 1 train (ages 0, 1); steps 2 and 3 (age 2) take no optimizer or
    LR-schedule step, leave the weights and AdamW's moments alone, and count as skipped, each with one line. The
    warm-up spans all 4 steps, so a schedule step taken at a dropped step would change the learning rate; the run
    report names the dropped steps for what they are."""
    from humanline.evaluation.run_report import read_metrics, summarize

    cfg = _config(tmp_path / "run", steps=4, train={"regime": "stale", "staleness": 2},
                  objective={"correction": "drop", "max_staleness": 1}, optim={"warmup_ratio": 0.99},
                  rollout={"prompts_per_step": 4, "n": 4})
    trainer = Trainer(cfg)
    rows = [trainer.train_step() for _ in range(2)]
    weights, lr = params(trainer.run.unwrapped), trainer.run.lr_scheduler.get_last_lr()[0]
    optimizer_state = {k: v.clone() for k, v in trainer.run.optimizer.state_dict()["state"][0].items()}
    rows += [trainer.train_step() for _ in range(2)]
    assert ["loss" in r for r in rows] == [True, True, False, False]
    assert all(torch.equal(v, weights[k]) for k, v in params(trainer.run.unwrapped).items())
    assert trainer.run.lr_scheduler.get_last_lr()[0] == lr
    assert all(torch.equal(v, optimizer_state[k]) for k, v in trainer.run.optimizer.state_dict()["state"][0].items())
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2]
    assert [r.get("stale_steps") for r in rows] == [None, None, 1, 2]
    assert capsys.readouterr().err.count("versions old, past objective.max_staleness") == 2
    trainer.run.logger.close()
    report = summarize(read_metrics(tmp_path / "run"), tmp_path / "run", None)
    assert "trained on nothing: 2 (every group dropped: 0; samples past objective.max_staleness: 2; non-finite: 0)" \
        in report


def test_resume_equals_the_uninterrupted_run(tmp_path):
    """Checkpoints at steps 2 and 4 of a 6-step eta = 2 run (the queue then holds 2 batches sampled ahead, with
    the log-probs their sampler recorded): a run resumed from step 2 — as after a kill -9 at step 3 —
    ends with the same weights and losses."""
    changes = dict(train={"regime": "stale", "staleness": 2, "save_every": 2, "keep_checkpoints": 5},
                   objective={"correction": "decoupled"}, humanline={"enabled": True, "sync_every": 1})
    full = tmp_path / "full"
    Trainer(_config(full, steps=6, **changes)).train()
    out = tmp_path / "killed"
    shutil.copytree(full, out)
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints" / "step-4"), shutil.rmtree(out / "checkpoints" / "step-6")
    resumed = Trainer(_config(out, steps=6, **changes), resume=True)
    assert resumed.step == 2
    resumed.train()
    assert step_losses(out) == step_losses(full)
    from safetensors.torch import load_file
    got, expected = load_file(out / "final" / "model.safetensors"), load_file(full / "final" / "model.safetensors")
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("changes, message", [
    ({"train": {"regime": "online", "staleness": 2}}, "train.staleness"),
    ({"train": {"regime": "stale", "sample_every": 2}}, "train.sample_every"),
    ({"objective": {"name": "dpo", "correction": "tis"}}, "objective.correction"),
    ({"objective": {"correction": "is"}}, "objective.correction"),
])
def test_settings_that_cannot_work_are_refused(tmp_path, changes, message):
    with pytest.raises(UserError, match=message):
        _config(tmp_path / "run", **changes)


def test_the_tiny_recipe_loads():
    cfg = load_config(ROOT / "recipes" / "tiny" / "grpo_stale.yaml")
    assert (cfg.train.regime, cfg.train.staleness, cfg.objective.correction) == ("stale", 2, "decoupled")


def test_a_later_end_on_resume_is_said_to_restart_the_queue(tmp_path):
    """The queue draws nothing at or past the end, so a resume that moves the end later trains the next eta
    steps on batches of the resumed policy: said in one line (docs/method.md §3.6); nothing to say otherwise."""
    from humanline.training.resume_settings import stale_queue_note

    cfg = _config(tmp_path / "run", steps=10, train={"regime": "stale", "staleness": 4})
    note = stale_queue_note(cfg, {"train.max_steps": [6, 10]})
    assert note is not None and "steps 7-10 train on batches drawn by the resumed policy" in note
    assert stale_queue_note(cfg, {"train.max_steps": [10, 6]}) is None
    assert stale_queue_note(_config(tmp_path / "online", steps=10), {"train.max_steps": [6, 10]}) is None


def test_a_lag_that_reaches_the_end_of_the_run_is_named_and_samples_once(tmp_path, capsys):
    """eta >= steps - 1: the queue filled at step 0 holds every step's batch, so the initial policy draws them all
    (one sampling call) and the run says so in one warning line; eta = steps - 2 still samples later and says
    nothing."""
    stale = Trainer(_config(tmp_path / "past", steps=4, train={"regime": "stale", "staleness": 3}))
    err = capsys.readouterr().err
    assert "warning: train.staleness=3 with 4 steps: the initial policy draws every step's batch" in err
    assert "needs more than 4 steps" in err
    calls = []
    generate = stale.run.sampler.generate
    stale.run.sampler.generate = lambda *a, **k: calls.append(1) or generate(*a, **k)
    stale.train()
    assert len(calls) == 1
    Trainer(_config(tmp_path / "within", steps=4, train={"regime": "stale", "staleness": 2}))
    assert "train.staleness" not in capsys.readouterr().err
