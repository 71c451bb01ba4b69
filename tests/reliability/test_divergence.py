"""Real numerical and memory faults through the CLI.

- A run that really diverges (optim.lr 1e12 on a shipped recipe, past the start-up bound on optim.lr, which
  these tests lift) follows the documented path: non-finite steps are skipped, logged as JSON null, and
  `train.max_bad_steps` of them in a row stop the run with exit code 3 and one line. No injected NaN: the
  optimizer makes the weights blow up.
- An allocation failure (a real one from torch's CPU allocator, or the out-of-memory error CUDA raises) stops
  the run with exit code 2 and one line naming the settings to lower; the last checkpoint stays intact and
  `--resume` continues from it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import humanline.training.loop
import humanline.training.step
from helpers_reliability import ROOT, assert_user_error, base_sections, one_thread, run_cli, write_recipe
from humanline.training import config_checks
from humanline.training.checkpoint import verify

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
RECIPE = "recipes/tiny/dpo_humanline.yaml"


@pytest.fixture(autouse=True)
def _any_lr(monkeypatch):
    """optim.lr above `MAX_LR` is refused at start-up; these runs diverge on purpose, so the bound is lifted."""
    monkeypatch.setattr(config_checks, "MAX_LR", math.inf)


def _rows(out: Path) -> list[dict]:
    """metrics.jsonl as strict JSON: a NaN or Infinity literal fails the test."""
    text = (out / "metrics.jsonl").read_text()
    strict = {"parse_constant": lambda c: pytest.fail(f"{c} in metrics.jsonl")}
    return [json.loads(line, **strict) for line in text.splitlines()]


@pytest.mark.parametrize("override, hint", [("--optim.lr=1.0e+12", "lower optim.lr (now 1e+12)")])
def test_a_real_divergence_reaches_the_exit_3_path(tmp_path, monkeypatch, capsys, override, hint):
    monkeypatch.chdir(ROOT)  # the recipe names its data relative to the repository
    out = tmp_path / "run"
    code, lines = run_cli(["train", RECIPE, override, "--output-dir", out], capsys)
    assert_user_error(code, lines, "training aborted", "3 consecutive steps", "train.max_bad_steps=3", hint,
                      expected_code=3)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert isinstance(rows[0]["loss"], float) and rows[1]["loss"] is None and rows[2]["grad_norm"] is None
    assert [r["skipped_steps"] for r in rows] == [0, 1, 2]
    assert not (out / "final").exists() and not (out / "checkpoints").exists()
    code, report_lines = run_cli(["report", out], capsys)  # the report reads null values as gaps
    assert code == 0, "\n".join(report_lines)
    assert "trained on nothing: 2" in (out / "report.md").read_text()


def test_float16_weights_on_a_cpu_are_refused_at_start_up(tmp_path, monkeypatch, capsys):
    """float16 weights on a CPU used to train to NaN and stop at step 2 with exit 3: now exit 2 before any
    step, naming the field and the reason, with no metrics written."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    code, lines = run_cli(["train", RECIPE, "--model.dtype=float16", "--output-dir", out], capsys)
    assert_user_error(code, lines, "model.dtype", "float16", "NaN on a CPU", "float32 or bfloat16")
    assert not (out / "metrics.jsonl").exists()


def test_console_line_shows_non_finite_values(tmp_path, monkeypatch, capsys):
    """The per-step console line formats a diverged step (`loss=nan`) instead of crashing on it."""
    monkeypatch.chdir(ROOT)
    from humanline.cli import main

    code = main(["train", RECIPE, "--optim.lr=1e12", "--output-dir", str(tmp_path), "--logging.log_every=1"])
    stdout = capsys.readouterr().out
    assert code == 3
    assert any(line.startswith("step 2/12 ") and "loss=nan" in line and "grad_norm=nan" in line
               for line in stdout.splitlines()), stdout


def test_skipped_steps_are_counted_in_the_done_line(tmp_path, capsys):
    """With room for the bad steps (max_bad_steps 5), the diverged run completes and says how many of its
    steps trained on nothing."""
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"), optim={"lr": 1.0e12},
                          train={"max_steps": 3, "max_bad_steps": 5})
    code, lines = run_cli(["train", recipe], capsys)
    assert code == 0, "\n".join(lines)
    done = [line for line in lines if line.startswith("[humanline] done:")]
    assert done and done[0].endswith("2 of 3 steps trained on nothing (every group dropped: 0; non-finite, "
                                     "update skipped: 2)"), done


def _allocation_failure_at(step_index: int, monkeypatch, trainer_step) -> None:
    """From the given 0-based step on, the policy forward asks torch's CPU allocator for 4 EiB: a real
    `RuntimeError: DefaultCPUAllocator: can't allocate memory`."""
    real = humanline.training.step.part_logps

    def part_logps(model, batch, part="main"):
        if trainer_step() >= step_index:
            torch.empty(2**62, dtype=torch.uint8)
        return real(model, batch, part)

    monkeypatch.setattr(humanline.training.step, "part_logps", part_logps)


def test_cpu_allocation_failure_is_one_line_and_the_checkpoint_survives(tmp_path, monkeypatch, capsys):
    steps = {"now": 0}
    real_step = humanline.training.loop.Trainer.train_step

    def counting(self):
        steps["now"] = self.step
        return real_step(self)

    monkeypatch.setattr(humanline.training.loop.Trainer, "train_step", counting)
    _allocation_failure_at(2, monkeypatch, lambda: steps["now"])
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, base_sections(out), train={"max_steps": 4, "save_every": 1})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "out of memory at step 3", "DefaultCPUAllocator", "train.micro_batch_size=4",
                      "data.max_length=48", "the last checkpoint (step-2) is intact", "--resume")
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-1", "step-2"] and verify(out / "checkpoints" / "step-2") is None
    assert not (out / "final").exists()

    monkeypatch.undo()  # memory is back: the run continues from step 2
    code, lines = run_cli(["train", recipe, "--resume"], capsys)
    assert code == 0, "\n".join(lines)
    assert [r["step"] for r in _rows(out) if "loss" in r] == [1, 2, 3, 4]


def test_accelerator_out_of_memory_mid_update_writes_no_checkpoint(tmp_path, monkeypatch, capsys):
    """`torch.OutOfMemoryError` (what CUDA raises) inside the optimizer step of step 2: the half-updated
    weights are never saved."""
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, base_sections(out), train={"max_steps": 3, "save_every": 1})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "out of memory at step 2 (OutOfMemoryError: CUDA out of memory",
                      "train.micro_batch_size", "(step-1) is intact")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]


def test_out_of_memory_while_building_names_the_model_settings(tmp_path, monkeypatch, capsys):
    import humanline.training.build

    def load_model(cfg, tokenizer):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")

    monkeypatch.setattr(humanline.training.build, "load_model", load_model)
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"))
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "out of memory while building the run", "model.name", "model.lora=true")


def test_out_of_memory_in_generation_is_not_skipped_as_a_prompt_failure(tmp_path, monkeypatch, capsys):
    """rollout.on_error=skip skips prompts whose generation fails; an allocation failure is no prompt's fault
    (skipping it would skip every step): it stops the run naming the rollout settings."""
    import humanline.sampling.sampler
    from helpers_reliability import online_sections

    def generate(*args, **kwargs):
        torch.empty(2**62, dtype=torch.uint8)

    monkeypatch.setattr(humanline.sampling.sampler, "generate", generate)  # where the sampler calls it
    recipe = write_recipe(tmp_path, online_sections(tmp_path / "run"), rollout={"on_error": "skip"})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "out of memory at step 1", "can't allocate memory", "rollout.batch_size=16",
                      "no checkpoint was written")
