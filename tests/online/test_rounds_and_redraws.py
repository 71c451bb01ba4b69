"""The paper's online DPO/KTO in rounds (`rounds<N>`: sparse sampling with the round's starting policy as the
reference), and equal units per step (`rollout.redraws`, `humanline.sampling.draw`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers_reliability import one_thread, online_config, step_losses
from helpers_train import params
from humanline.errors import UserError
from humanline.experiments.harness.regimes import regime_overrides
from humanline.model.forward import batch_logps_no_grad
from humanline.sampling.draw import draw, short_lines
from humanline.settings.config import DataConfig
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


# ------------------------------------------------------------------ draw, on a scripted sampler


class ScriptedSampler:
    """Two prompts per step; a prompt's group is informative when `informative(step, draw, j)` says so."""

    def __init__(self, informative):
        self.informative, self.calls = informative, []

    def prompts(self, steps, draw=0):
        return [(step, draw, j) for step in steps for j in range(2)]

    def generate(self, at, records, model, draw=0, version=None):
        self.calls.append((at, draw, len(records)))
        return records, {"samples": 4 * len(records), "generated_tokens": 10 * len(records), "time/generation": 1.0}

    def score(self, at, records, rollout):
        groups = [{"id": r, "rewards": [1.0, 0.0] if self.informative(*r) else [1.0, 1.0]} for r in rollout]
        return groups, {"time/reward": 0.5, "sample_reward": 0.5}


def _pairs(group, data):
    return [group] if max(group["rewards"]) != min(group["rewards"]) else []


def test_redraws_top_each_short_step_up_to_the_offline_count():
    """Step 0's first draw gives 1 of 2 units, step 1's 2: only step 0 draws again (its own 2 prompts), and then
    keeps its first 2 units; samples and seconds add up over draws."""
    sampler = ScriptedSampler(lambda step, d, j: step == 1 or d == 1 or j == 0)
    drawn = draw(sampler, None, _pairs, DataConfig(), at=0, first=0, span=2, fill=2, redraws=3)
    assert [len(u) for u in drawn.units] == [2, 2] and drawn.short == []
    assert [u["id"] for u in drawn.units[0]] == [(0, 0, 0), (0, 1, 0)]  # the first draw's unit comes first
    assert sampler.calls == [(0, 0, 4), (0, 1, 2)]
    assert drawn.stats["redraws"] == 1 and drawn.stats["units_short"] == 0
    assert drawn.stats["samples"] == 24 and drawn.stats["time/generation"] == 2.0
    assert drawn.stats["dropped_groups"] == 1  # step 0's second prompt of the first draw


def test_the_bound_on_redraws_leaves_a_short_step_and_one_line():
    sampler = ScriptedSampler(lambda step, d, j: False)
    drawn = draw(sampler, None, _pairs, DataConfig(), at=5, first=5, span=1, fill=2, redraws=3)
    assert drawn.units == [[]] and drawn.short == [(5, 0)] and len(sampler.calls) == 4
    assert drawn.stats["redraws"] == 3 and drawn.stats["units_short"] == 2
    assert short_lines(drawn.short, 2, 3) == ["step 6: 0 of 2 units after 3 redraws (rollout.redraws); it trains on "
                                              "those"]


def test_without_redraws_a_step_trains_on_what_its_draw_gave():
    """redraws 0 is the draw as it always was: no second pass, no cut to the offline count, no extra metrics."""
    sampler = ScriptedSampler(lambda step, d, j: True)
    drawn = draw(sampler, None, _pairs, DataConfig(), at=0, first=0, span=1, fill=1, redraws=0)
    assert [len(u) for u in drawn.units] == [2] and len(sampler.calls) == 1 and "redraws" not in drawn.stats


# ------------------------------------------------------------------ on the tiny model


def _dpo_online(out: Path, steps: int, **changes):
    """Online DPO on the tiny prompts (2 per step, 4 samples, rewarded for digits), one pair per prompt."""
    base = dict(objective={"name": "dpo"}, train={"micro_batch_size": 2}, rollout={"n": 4, "max_new_tokens": 4})
    for section, values in changes.items():
        base.setdefault(section, {}).update(values)
    return online_config(out, steps, **base)


def test_redraws_give_every_online_step_the_offline_units(tmp_path, capsys):
    trainer = Trainer(_dpo_online(tmp_path / "run", 4, rollout={"redraws": 6}))
    for step in range(4):
        trainer.train_step()
        held = trainer.run.schedule.buffer.get(step, [])
        assert len(held) == 2 or f"step {step + 1}: {len(held)} of 2 units" in capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("redraws" in r and "units_short" in r for r in rows if "loss" in r)
    trainer.close_sampler()


def test_rounds_regime_is_sparse_sampling_with_the_sampler_as_reference():
    assert regime_overrides("rounds4") == {"train": {"regime": "sparse", "sample_every": 4, "reference": "sampler"}}
    with pytest.raises(UserError, match="rounds<N> regime takes no variant"):
        regime_overrides("rounds4+humanline")
    with pytest.raises(UserError, match="rounds<N>"):
        regime_overrides("rounds0")


def _rounds(out: Path, steps: int, **changes):
    return _dpo_online(out, steps, train={"regime": "sparse", "sample_every": 3, "reference": "sampler",
                                          **changes.pop("train", {})}, **changes)


def test_the_reference_of_each_round_is_its_starting_policy_bit_for_bit(tmp_path):
    """Rounds of 3 steps: at every step s the reference log-probs of its batches are exactly those of the policy
    at the round's first step (3 * (s // 3)), not of the initial policy nor of the previous step."""
    trainer = Trainer(_rounds(tmp_path / "run", 7))
    starts, checked = {}, 0
    model = trainer.run.unwrapped
    for step in range(7):
        if step % 3 == 0:
            starts[step] = params(model)
        batches = trainer.run.schedule(step) if step % 3 else []
        for i, batch in enumerate(batches):  # later steps of a round: scored when the round was sampled
            recorded = trainer.run.reference.cache[(step, i)]["main"]
            current = params(model)
            model.load_state_dict(starts[step // 3 * 3])
            assert torch.equal(batch_logps_no_grad(model, batch)["main"], recorded)
            model.load_state_dict(current)
            checked += 1
        trainer.train_step()
    assert checked >= 3 and trainer.run.reference.name == "sampler"


def test_a_run_resumed_inside_a_round_equals_the_uninterrupted_one(tmp_path):
    """A checkpoint at step 4, inside the round of steps 3-5 (its batches and reference log-probs of steps 4-5
    sampled at step 3): resumed from there, the run ends with the same losses and weights."""
    changes = dict(train={"save_every": 2, "keep_checkpoints": 5})
    full = tmp_path / "full"
    Trainer(_rounds(full, 7, **changes)).train()
    out = tmp_path / "killed"
    shutil.copytree(full, out)
    shutil.rmtree(out / "final")
    for step in (6, 7):
        shutil.rmtree(out / "checkpoints" / f"step-{step}", ignore_errors=True)
    resumed = Trainer(_rounds(out, 7, **changes), resume=True)
    assert resumed.step == 4
    resumed.train()
    assert step_losses(out) == step_losses(full)
    from safetensors.torch import load_file
    got, expected = load_file(out / "final" / "model.safetensors"), load_file(full / "final" / "model.safetensors")
    assert all(torch.equal(got[k], expected[k]) for k in expected)

