"""The training loop: sync order, reference equivalences, step-0 ratios, resume, saved outputs."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from helpers_train import params, tiny_config
from humanline.model.forward import batch_logps_no_grad
from humanline.training.loop import Trainer
from humanline.training.run_info import code_commit


def _metrics(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
@pytest.mark.parametrize("humanline", [False, True])
def test_offline_run_changes_parameters_and_writes_outputs(tmp_path, objective, humanline):
    cfg = tiny_config(objective, tmp_path, hl=humanline, steps=3)
    trainer = Trainer(cfg)
    before = params(trainer.run.unwrapped)
    trainer.train()
    after = params(trainer.run.unwrapped)
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    for row in rows:
        for key, value in row.items():
            assert not isinstance(value, str), f"{key} is not finite at step {row['step']}: {value}"
    assert (tmp_path / "config.yaml").exists()
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["forward_path"].startswith("fused output head, packed rows")
    assert info["reference"] == trainer.run.reference.name
    assert info["code"] == code_commit()  # the commit of the source this test imports, or None from a wheel
    assert (tmp_path / "checkpoints" / "step-3" / "complete.json").exists()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    AutoTokenizer.from_pretrained(tmp_path / "final")
    for name, value in reloaded.state_dict().items():
        assert torch.allclose(value, after[name]), name


def test_step_zero_log_ratios_are_zero(tmp_path):
    """At step 0 the reference is the initial policy: every log-ratio is 0, so DPO loss = log 2 = 0.6931."""
    cfg = tiny_config("dpo", tmp_path, hl=True, steps=1)
    Trainer(cfg).train()
    first = _metrics(tmp_path)[0]
    assert first["log_ratio/mean"] == 0.0
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert first["humanline/inside_band"] == 1.0


class _Recorder:
    """Wraps a reference to record the log-probs it hands out, per step."""

    def __init__(self, reference):
        self.inner, self.seen = reference, {}
        self.name = reference.name

    def logps(self, step, index, batch):
        out = self.inner.logps(step, index, batch)
        self.seen[(step, index)] = {k: v.clone() for k, v in out.items()}
        return out

    def capture_pre_update(self, step):
        return self.inner.capture_pre_update(step)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


@pytest.mark.parametrize("strategy", ["copy", "lookahead"])
def test_k1_reference_at_step_s_is_policy_after_s_minus_1_updates(tmp_path, strategy):
    """docs/method.md §3.2: with k = 1 the reference used at step s holds theta_{s-1} (the weights before update s-1),
    and at step 0 it holds theta_0."""
    cfg = tiny_config("dpo", tmp_path, hl=True, steps=4, train={"reference": strategy})
    trainer = Trainer(cfg)
    trainer.run.reference = recorder = _Recorder(trainer.run.reference)
    snapshots = [params(trainer.run.unwrapped)]  # theta_0
    for _ in range(4):
        trainer.train_step()
        snapshots.append(params(trainer.run.unwrapped))
    probe = trainer.run.unwrapped
    current = params(probe)
    for step in range(4):
        expected_theta = snapshots[max(step - 1, 0)]
        probe.load_state_dict(expected_theta)
        batch = trainer.run.schedule(step)[0]
        expected = batch_logps_no_grad(probe, batch)["main"]
        torch.testing.assert_close(recorder.seen[(step, 0)]["main"], expected, rtol=0, atol=1e-6)
        if step >= 2:  # and it is not the current policy (which would make every ratio 1)
            probe.load_state_dict(snapshots[step])
            assert not torch.allclose(batch_logps_no_grad(probe, batch)["main"], expected)
    probe.load_state_dict(current)


@pytest.mark.parametrize("objective", ["dpo", "kto", "grpo"])
def test_lookahead_equals_synced_copy_step_for_step(tmp_path, objective):
    losses = {}
    for strategy in ("copy", "lookahead"):
        out = tmp_path / strategy
        cfg = tiny_config(objective, out, steps=5,
                          humanline={"enabled": True, "sync_every": 2}, train={"reference": strategy})
        Trainer(cfg).train()
        losses[strategy] = [r["loss"] for r in _metrics(out) if "loss" in r]
    assert len(losses["copy"]) == 5
    assert losses["copy"] == pytest.approx(losses["lookahead"], rel=1e-5, abs=1e-6)


def test_cache_reference_equals_frozen_reference(tmp_path):
    losses = {}
    for strategy in ("frozen", "cache"):
        out = tmp_path / strategy
        Trainer(tiny_config("dpo", out, steps=4, train={"reference": strategy})).train()
        losses[strategy] = [r["loss"] for r in _metrics(out) if "loss" in r]
    assert losses["frozen"] == pytest.approx(losses["cache"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("strategy", ["lookahead", "copy"])
def test_resume_gives_the_same_parameters(tmp_path, strategy):
    """N steps + resume + N steps == 2N uninterrupted steps (reference state and data order included)."""
    full = tmp_path / "full"
    cfg = tiny_config("dpo", full, steps=6, humanline={"enabled": True, "sync_every": 2},
                      train={"reference": strategy, "save_every": 3, "keep_checkpoints": 5})
    trainer = Trainer(cfg)
    trainer.train()
    expected = params(trainer.run.unwrapped)
    # Keep only the mid-run checkpoint, as if the run had died after step 3.
    shutil.rmtree(full / "checkpoints" / "step-6")
    shutil.rmtree(full / "final")
    resumed = Trainer(cfg, resume=True)
    assert resumed.step == 3
    resumed.train()
    got = params(resumed.run.unwrapped)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0)
    steps = [r["step"] for r in _metrics(full) if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]


def _sparse_grpo_trainer(tmp_path, **rollout) -> Trainer:
    """Tiny sparse GRPO without humanline (sampler reference): 6 steps, a buffer every 3."""
    from helpers_train import ROOT
    from humanline.training.config_loading import load_config

    return Trainer(load_config(ROOT / "recipes/tiny/grpo_sparse.yaml",
                               {"train": {"output_dir": str(tmp_path), "max_steps": 6, "sample_every": 3},
                                "rollout": {"prompts": str(ROOT / "recipes/tiny/data/prompts.jsonl"),
                                            "reward": str(ROOT / "recipes/tiny/rewards.py") + ":digits", **rollout},
                                "eval": {"prompts": None}, "logging": {"progress": False}}))


def test_sampler_reference_is_the_policy_that_drew_the_buffer(tmp_path):
    """Sparse GRPO without humanline: every step of a buffer sampled at step s0 uses theta_{s0} as its
    reference (the behaviour policy), so the ratio is the standard GRPO/PPO old-policy ratio."""
    trainer = _sparse_grpo_trainer(tmp_path)
    assert trainer.run.reference.name == "sampler"
    trainer.run.reference = recorder = _Recorder(trainer.run.reference)
    snapshots = [params(trainer.run.unwrapped)]
    batches = {}
    for step in range(6):
        trainer.train_step()
        batches[step] = trainer.run.schedule(step)
        snapshots.append(params(trainer.run.unwrapped))
    probe = trainer.run.unwrapped
    for step in range(6):
        probe.load_state_dict(snapshots[step - step % 3])  # the weights when this step's buffer was drawn
        expected = batch_logps_no_grad(probe, batches[step][0])["main"]
        torch.testing.assert_close(recorder.seen[(step, 0)]["main"], expected, rtol=0, atol=1e-6)


def test_sampler_reference_when_the_first_step_of_a_buffer_has_nothing_to_train(tmp_path):
    """Every group of a buffer's first step degenerate (equal rewards): that step is skipped, yet the later
    steps of the buffer still get the sampling policy's log-probs (regression: they were never cached, and
    step 1 raised)."""
    trainer = _sparse_grpo_trainer(tmp_path)
    schedule = trainer.run.schedule
    real_fill = schedule.fill

    def first_step_degenerate(step, first, units_per_step):
        real_fill(step, first, [[]] + units_per_step[1:])

    schedule.fill = first_step_degenerate
    trainer.run.reference = recorder = _Recorder(trainer.run.reference)
    snapshots, batches, skipped = [params(trainer.run.unwrapped)], {}, []
    for step in range(6):
        skipped.append(trainer.train_step().get("skipped", 0.0))
        batches[step] = schedule(step)
        snapshots.append(params(trainer.run.unwrapped))
    assert skipped == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    probe = trainer.run.unwrapped
    for step in (1, 2, 4, 5):
        probe.load_state_dict(snapshots[step - step % 3])  # the weights that drew this step's buffer
        expected = batch_logps_no_grad(probe, batches[step][0])["main"]
        torch.testing.assert_close(recorder.seen[(step, 0)]["main"], expected, rtol=0, atol=1e-6)


def test_each_rollout_samples_from_the_weights_of_the_latest_optimizer_step(tmp_path, monkeypatch):
    """Sparse GRPO sampling every 2 steps: the buffers of steps 0, 2, 4 are drawn from theta_0, theta_2,
    theta_4 (the weights after the latest update), never from weights an update has already replaced."""
    import humanline.sampling.rollout as rollout

    trainer = _sparse_grpo_trainer(tmp_path)
    trainer.run.schedule.sample_every = 2
    model = trainer.run.unwrapped
    after_update = [params(model)]  # theta_0, then the weights after each optimizer step
    step_fn = trainer.run.optimizer.step

    def stepping(*args, **kwargs):
        out = step_fn(*args, **kwargs)
        after_update.append(params(model))
        return out

    trainer.run.optimizer.step = stepping
    sampled_from = []
    generate = rollout.HFGenerateBackend.generate

    def recording(self, policy, *args, **kwargs):
        sampled_from.append((len(after_update) - 1, params(policy)))
        return generate(self, policy, *args, **kwargs)

    monkeypatch.setattr(rollout.HFGenerateBackend, "generate", recording)
    trainer.train()
    assert [n for n, _ in sampled_from] == [0, 2, 4]
    for n, weights in sampled_from:
        assert all(torch.equal(weights[k], after_update[n][k]) for k in weights), f"stale weights at update {n}"
    assert any(not torch.equal(after_update[4][k], after_update[0][k]) for k in after_update[0])


def test_rollout_dtype_bfloat16_samples_from_a_rounded_copy_of_the_latest_weights(tmp_path, monkeypatch):
    """`rollout.dtype: bfloat16`: every buffer is drawn by one bfloat16 copy of the policy holding the weights
    after the latest update, rounded; the policy itself stays in float32 and trains."""
    import humanline.sampling.rollout as rollout

    trainer = _sparse_grpo_trainer(tmp_path, dtype="bfloat16")
    trainer.run.schedule.sample_every = 2
    model = trainer.run.unwrapped
    sampled = []
    generate = rollout.HFGenerateBackend.generate

    def recording(self, policy, *args, **kwargs):
        current = dict(model.named_parameters())
        sampled.append((policy, all(torch.equal(v, current[k].detach().to(torch.bfloat16))
                                    for k, v in policy.named_parameters())))
        return generate(self, policy, *args, **kwargs)

    monkeypatch.setattr(rollout.HFGenerateBackend, "generate", recording)
    first = params(model)
    trainer.train()
    assert len(sampled) == 3 and all(same for _, same in sampled), "a buffer was drawn from stale weights"
    assert len({id(policy) for policy, _ in sampled}) == 1 and sampled[0][0] is not model  # one copy, reused
    assert all(p.dtype == torch.bfloat16 for p in sampled[0][0].parameters())
    assert all(b.dtype == torch.float32 for b in sampled[0][0].buffers() if b.is_floating_point())  # rotary
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(first[k], v) for k, v in params(model).items())


@pytest.mark.parametrize("dtype, lora, message", [("float16", False, "policy | bfloat16"),
                                                   ("bfloat16", True, "model.lora")])
def test_a_bad_rollout_dtype_is_refused_naming_the_field(tmp_path, dtype, lora, message):
    from humanline.errors import UserError
    from humanline.training.config_loading import load_config

    with pytest.raises(UserError, match=rf"rollout\.dtype.*{message}"):
        load_config(None, {"rollout": {"dtype": dtype}, "model": {"lora": lora}})


def test_a_second_run_in_one_process_that_needs_other_accelerate_settings_is_a_clear_error(tmp_path):
    """accelerate's state is process-wide and cannot change: a second Trainer in the same process (a notebook,
    a test) that resolves another mixed precision fails with a message naming the field, before training."""
    from humanline.errors import UserError

    first = Trainer(tiny_config("dpo", tmp_path / "a", steps=1, train={"mixed_precision": "no"}))
    with pytest.raises(UserError) as err:
        Trainer(tiny_config("dpo", tmp_path / "b", steps=1, train={"mixed_precision": "bf16"}))
    message = str(err.value)
    assert "mixed precision 'no'" in message and "mixed precision 'bf16'" in message, message
    assert "train.mixed_precision" in message and "fresh process" in message, message
    first.train()  # the earlier run is untouched by the refusal
    assert (tmp_path / "a" / "final").exists()


def test_mixed_precision_auto_and_half_weight_warning(tmp_path):
    """`auto` is bf16 autocast on a CUDA GPU only; half-precision weights at a small learning rate are
    warned about (a bf16 weight resolves 1/256 of itself: AdamW steps of 1e-6 round away)."""
    from humanline.training.accelerator import mixed_precision
    from humanline.training.build import _half_weights_note

    assert mixed_precision("auto", on_cpu=True) == "no"
    assert mixed_precision("fp16", on_cpu=True) == "fp16"
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        assert mixed_precision("auto", on_cpu=False) == "bf16"
    bf16 = tiny_config("dpo", tmp_path, model={"dtype": "bfloat16"}, optim={"lr": 1e-6})
    assert "model.dtype=bfloat16" in _half_weights_note(bf16) and "optim.lr=1e-06" in _half_weights_note(bf16)
    assert _half_weights_note(tiny_config("dpo", tmp_path, optim={"lr": 1e-6})) is None
    assert _half_weights_note(tiny_config("dpo", tmp_path, model={"dtype": "bfloat16"}, optim={"lr": 1e-3})) is None


def test_data_shuffle_false_trains_in_file_order(tmp_path):
    """data.shuffle=false: step s trains on units [s*4, (s+1)*4) of the file, in every epoch."""
    trainer = Trainer(tiny_config("dpo", tmp_path, steps=2, data={"shuffle": False}))
    ids = [[u["id"] for u in trainer.run.schedule.step_units(s)] for s in range(2)]
    assert ids == [["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"]]
    shuffled = Trainer(tiny_config("dpo", tmp_path / "b", steps=2))
    assert [u["id"] for u in shuffled.run.schedule.step_units(0)] != ids[0]


def test_run_info_names_the_code_commit(tmp_path, monkeypatch):
    """`code_commit` reads the checkout's HEAD, marks a modified tracked file, and is None outside a checkout."""
    import subprocess

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # `plain` is not inside any checkout above
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "one"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert code_commit(repo) == head
    (repo / "a.py").write_text("x = 2\n")
    assert code_commit(repo) == head + "+modified"
    (tmp_path / "plain").mkdir()
    assert code_commit(tmp_path / "plain") is None
