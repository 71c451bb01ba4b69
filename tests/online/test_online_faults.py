"""Online faults: a reward that raises or returns NaN for one prompt, or a generation that fails, stops the run
naming the prompt id (`rollout.on_error=fail`) or is skipped and counted (`rollout.on_error=skip`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import humanline.sampling.sampler
from helpers_reliability import assert_user_error, one_thread, online_sections, run_cli, write_jsonl, write_recipe
from helpers_train import TESTS

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
REWARDS = TESTS / "fault_rewards.py"


def _recipe(tmp: Path, reward: str, on_error: str) -> Path:
    """2 online GRPO steps; each samples all 4 prompts (4 completions each), one of which is flaky."""
    prompts = [{"id": f"ok-{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(3)]
    prompts.insert(2, {"id": "bad-7", "prompt": "7+7=", "answer": "14", "flaky": True})
    write_jsonl(tmp / "prompts.jsonl", prompts)
    return write_recipe(tmp, online_sections(tmp / "run"), train={"max_steps": 2, "micro_batch_size": 3},
                        rollout={"prompts": str(tmp / "prompts.jsonl"), "prompts_per_step": 4, "n": 4,
                                 "reward": f"{REWARDS}:{reward}", "on_error": on_error})


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("reward, reason", [("raises", "RuntimeError: reward server timed out"),
                                            ("nan", "non-finite score nan")])
def test_failing_reward_with_on_error_fail_names_the_prompt_id(tmp_path, capsys, reward, reason):
    code, lines = run_cli(["train", _recipe(tmp_path, reward, "fail")], capsys)
    assert_user_error(code, lines, f":{reward} failed on prompt id 'bad-7'", reason, "at step 1",
                      "rollout.on_error=skip")
    assert not (tmp_path / "run" / "final").exists()


@pytest.mark.parametrize("reward", ["raises", "nan"])
def test_failing_reward_with_on_error_skip_is_counted_and_the_run_goes_on(tmp_path, capsys, reward):
    code, lines = run_cli(["train", _recipe(tmp_path, reward, "skip")], capsys)
    assert code == 0, "\n".join(lines)
    rows = [r for r in _rows(tmp_path / "run") if "reward_failures" in r]
    assert [r["step"] for r in rows] == [1, 2]  # sampled at both steps, trained at both
    assert all(r["reward_failures"] == 4 for r in rows)  # the 4 completions of 'bad-7', every step
    assert all(r["samples"] == 16 for r in rows)
    warnings = [ln for ln in lines if "samples without a reward" in ln]
    assert len(warnings) == 2 and all("'bad-7'" in w for w in warnings)
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_generation_failure_follows_on_error(tmp_path, capsys, monkeypatch):
    """fail: the run stops with a last line naming the prompt ids (exit 1: not the user's input);
    skip: the step is skipped, counted in `generation_failures` and `skipped_steps`, and the run goes on."""
    real = humanline.sampling.sampler.generate
    calls = {"n": 0}

    def generate_fails_once(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(*args, **kwargs)

    monkeypatch.setattr(humanline.sampling.sampler, "generate", generate_fails_once)
    (tmp_path / "fail").mkdir()
    code, lines = run_cli(["train", _recipe(tmp_path / "fail", "raises", "fail")], capsys)
    assert code == 1 and lines[-1].startswith("humanline: internal error: RuntimeError: generation failed at step 1")
    assert "'bad-7'" in lines[-1] and "CUDA out of memory (simulated)" in lines[-1]

    calls["n"] = 0
    (tmp_path / "skip").mkdir()
    code, lines = run_cli(["train", _recipe(tmp_path / "skip", "nan", "skip")], capsys)
    assert code == 0, "\n".join(lines)
    rows = _rows(tmp_path / "skip" / "run")
    assert rows[0]["step"] == 1 and rows[0]["skipped"] == 1 and rows[0]["generation_failures"] == 4
    assert "loss" in rows[1] and rows[1]["skipped_steps"] == 1
    assert any("generation failed at step 1" in ln and "skipping steps 1-1" in ln for ln in lines)
