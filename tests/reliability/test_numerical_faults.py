"""Numerical faults: a non-finite loss or gradient skips the update (weights and optimizer state untouched), is
counted in `skipped_steps` and logged with the batch's prompt ids; the run goes on, and aborts with exit code 3
after `train.max_bad_steps` consecutive bad steps. Weights with NaN or inf are never written.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import humanline.training.loop
import humanline.training.step
from helpers_reliability import assert_user_error, base_sections, one_thread, run_cli, write_recipe
from helpers_train import params, tiny_config
from humanline.errors import NonFiniteError
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _nan_policy_forward(monkeypatch, trainer_step: callable, bad_steps: set[int]) -> None:
    """Make the policy's log-probs NaN (loss and gradient both non-finite) at the given 0-based steps.

    Only the trainer's own `part_logps` is patched: reference log-probs stay finite.
    """
    real = humanline.training.step.part_logps

    def part_logps(model, batch, part="main"):
        out = real(model, batch, part)
        return out + float("nan") if trainer_step() in bad_steps else out

    monkeypatch.setattr(humanline.training.step, "part_logps", part_logps)


def _optimizer_state(trainer: Trainer) -> dict:
    return copy.deepcopy(trainer.run.optimizer.state_dict())


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _record_steps(trainer: Trainer) -> list[tuple]:
    """Wrap `trainer.train_step` to keep (params, optimizer state) before and after every step."""
    seen = []
    real = trainer.train_step

    def one_step():
        before = (params(trainer.run.unwrapped), _optimizer_state(trainer))
        out = real()
        seen.append((before, (params(trainer.run.unwrapped), _optimizer_state(trainer))))
        return out

    trainer.train_step = one_step
    return seen


@pytest.mark.parametrize("fault", ["loss", "gradient"])
def test_bad_step_is_skipped_counted_logged_and_the_run_continues(tmp_path, monkeypatch, capsys, fault):
    """Bad steps 2 and 4 (1-based) with max_bad_steps=2: never 2 in a row, so the run finishes its 5 steps."""
    cfg = tiny_config("dpo", tmp_path, steps=5, train={"max_bad_steps": 2, "save_every": 1, "keep_checkpoints": 10})
    trainer = Trainer(cfg)
    bad = {1, 3}
    if fault == "loss":
        _nan_policy_forward(monkeypatch, lambda: trainer.step, bad)
    else:  # a finite loss whose gradient is NaN: only the gradient-norm check can catch it
        weight = trainer.run.unwrapped.model.embed_tokens.weight
        weight.register_hook(lambda g: g * float("nan") if trainer.step in bad else g)
    seen = _record_steps(trainer)
    trainer.train()

    assert len(seen) == 5, "the run did not continue after a bad step"
    for step, ((p0, o0), (p1, o1)) in enumerate(seen):
        if step in bad:  # nothing applied: weights and AdamW moments/step counts as before
            assert all(torch.equal(p0[k], p1[k]) for k in p0), f"step {step + 1} changed the weights"
            assert _same_state(o0, o1), f"step {step + 1} changed the optimizer state"
        else:
            assert any(not torch.equal(p0[k], p1[k]) for k in p0), f"step {step + 1} did not update"
    rows = [r for r in _metrics(tmp_path) if "loss" in r]
    assert [r["skipped_steps"] for r in rows] == [0, 1, 1, 2, 2]
    nonfinite = [r["step"] for r in rows if r["grad_norm"] is None]  # JSON has no NaN: null (training.metrics_log)
    assert nonfinite == [2, 4]
    if fault == "loss":
        assert [r["step"] for r in rows if r["loss"] is None] == [2, 4]
    err = capsys.readouterr().err
    for step in (2, 4):
        ids = [i for batch in trainer.run.schedule(step - 1) for i in batch["ids"]]
        assert f"step {step}: non-finite loss or gradient, update skipped (prompt ids: {ids[:8]})" in err
    for folder in [*(tmp_path / "checkpoints").glob("step-*"), tmp_path / "final"]:
        weights = load_file(folder / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values()), folder


def test_consecutive_bad_steps_abort_with_exit_code_3(tmp_path, monkeypatch, capsys):
    """Every step from the 2nd on is NaN; max_bad_steps=2 stops the run at step 3 with one clear line."""
    steps = {"count": 0}
    real_step = Trainer.train_step

    def counting(self):
        steps["count"] = self.step
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", counting)
    _nan_policy_forward(monkeypatch, lambda: steps["count"], set(range(1, 100)))
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, base_sections(out), train={"max_steps": 6, "max_bad_steps": 2, "save_every": 1})
    code, lines = run_cli(["train", recipe], capsys)
    line = assert_user_error(code, lines, "training aborted", "2 consecutive steps",
                             "train.max_bad_steps=2", "prompt ids", expected_code=3)
    assert "step 3: non-finite" in "\n".join(lines)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert not (out / "final").exists()
    for name in ("step-1", "step-2"):
        weights = load_file(out / "checkpoints" / name / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values())
    rows = [r for r in _metrics(out) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["skipped_steps"] == 1
    assert line.count("\n") == 0


def test_nan_weights_are_never_written(tmp_path, capsys):
    trainer = Trainer(tiny_config("dpo", tmp_path, steps=2, train={"save_every": 1}))
    trainer.train()
    assert (tmp_path / "checkpoints" / "step-2").exists()
    with torch.no_grad():
        trainer.run.unwrapped.model.norm.weight[0] = math.nan
    trainer.step = 3
    with pytest.raises(NonFiniteError, match="refusing to write checkpoint step-3"):
        trainer.save_checkpoint()
    with pytest.raises(NonFiniteError, match="refusing to write"):
        trainer.save_final()
    assert not (tmp_path / "checkpoints" / "step-3").exists()
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    final = load_file(tmp_path / "final" / "model.safetensors")  # the earlier, finite final model is kept
    assert all(torch.isfinite(t).all() for t in final.values())
