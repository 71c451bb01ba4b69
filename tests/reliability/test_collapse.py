"""A collapse is reported: a run that reaches its end with a policy that stopped learning says so on its last line,
in report.md and in run_info.json, and exits with code 5 (`train.allow_collapse`: 0). The criteria and their
bounds: `humanline.evaluation.collapse`; they are read from what the run logged, with no read of the device per
step. The walk that found them: GRPO at lr 0.3 (every group dropped in 14 of 20 steps, the last 9 in a row, held-out
reward 0.18 -> 0), DPO at lr 1 (held-out loss 0.69 -> 22.4) and lr 1e-30 (weights unmoved) all ended with exit 0.
"""

from __future__ import annotations

import json

import pytest

from helpers_reliability import (
    ROOT,
    assert_user_error,
    base_sections,
    one_thread,
    online_sections,
    run_cli,
    write_recipe,
)
from humanline.evaluation.collapse import collapse_reasons

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _steps(losses, skipped=None, **series) -> list[dict]:
    """Step lines of these losses and cumulative skipped-step counts; evaluation lines `eval_KEY={step: value}`."""
    skipped = skipped or [0] * len(losses)
    rows = [{"step": i + 1, "time/step": 0.1, "loss": loss, "skipped_steps": s}
            for i, (loss, s) in enumerate(zip(losses, skipped))]
    for key, values in series.items():
        rows += [{"step": step, "eval/" + key[5:]: v} for step, v in values.items()]
    return sorted(rows, key=lambda r: r["step"])


def test_a_healthy_run_is_not_collapsed():
    """The quickstart's shape: a few dropped steps early, reward rising, loss near 0."""
    rows = _steps([0.01, -0.02, 0.0, 0.01] * 5, skipped=[0, 1, 2, 2] + [2] * 16,
                  eval_reward_mean={10: 0.18, 20: 0.27}, eval_loss={10: 0.7, 20: 0.6})
    assert collapse_reasons(rows, {"weights_moved": True, "updates": 18}) == []


def test_the_last_steps_trained_on_nothing_in_a_row():
    rows = _steps([0.1] * 20, skipped=[0, 1, 1, 2, 3, 4, 5, 5, 5, 5, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    assert collapse_reasons(rows) == ["the last 9 of 20 steps trained on nothing (every group dropped or the update "
                                      "skipped)"]
    assert collapse_reasons(rows[:13]) == []  # the last 2 of 13: fewer than max(3, a quarter of the steps)
    assert collapse_reasons(_steps([0.1] * 20, skipped=list(range(1, 21)))) == []  # all: exit code 4, not 5


def test_a_held_out_score_at_0_after_it_was_above_the_floor():
    assert collapse_reasons(_steps([0.1] * 4, eval_reward_mean={2: 0.18, 4: 0.0})) == [
        "eval/reward_mean 0.18 at step 2, then 0 at step 4"]
    assert collapse_reasons(_steps([0.1] * 4, eval_reward_mean={2: 0.03, 4: 0.0})) == []  # noise: below 0.05
    assert collapse_reasons(_steps([0.1] * 4, **{"eval_pass@1": {2: 0.25, 4: 0.0}}))[0].startswith("eval/pass@1 0.25")


def test_a_loss_past_its_bound():
    assert collapse_reasons(_steps([0.69] * 4, eval_loss={1: 0.69, 4: 22.4})) == [
        "held-out loss 0.69 -> 22.4 (past 10.7)"]
    assert collapse_reasons(_steps([0.69, 0.7, 30.0, 40.0, 50.0])) == ["training loss 0.69 -> 40 (past 10.7)"]
    assert collapse_reasons(_steps([25.0, 40.0, 60.0])) == []  # IPO starts at 25: its bound is 275


def test_weights_that_did_not_move():
    rows = _steps([0.69] * 3) + [{"step": 3, "lr": 1e-30, "time/step": 0.1}]
    assert collapse_reasons(rows, {"weights_moved": False, "updates": 3}) == [
        "the weights did not move in 3 updates at lr 1e-30 (an lr too small for them)"]
    assert collapse_reasons(rows, {"weights_moved": None, "updates": 0}) == []


def _run(tmp_path, capsys, *extra, sections=None):
    recipe = write_recipe(tmp_path, sections or base_sections(tmp_path / "run"), train={"max_steps": 3})
    return run_cli(["train", recipe, *extra], capsys)


def test_an_lr_too_small_to_move_the_weights_exits_5_and_says_so(tmp_path, capsys):
    code, lines = _run(tmp_path, capsys, "--optim.lr=1e-30")
    assert code == 5, "\n".join(lines)
    assert lines[-1].startswith("humanline: warning: THE RUN COLLAPSED by step 3: the weights did not move in 3 "
                                "updates at lr 1e-30") and "exit code 5" in lines[-1] and len(lines[-1]) <= 300
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["end"] == {"step": 3, "updates": 3, "weights_moved": False, "collapse": [
        "the weights did not move in 3 updates at lr 1e-30 (an lr too small for them)"]}
    assert run_cli(["report", tmp_path / "run"], capsys)[0] == 0
    assert "- **collapsed** (the policy stopped learning; `humanline train` exit code 5): the weights did not " \
           "move" in (tmp_path / "run" / "report.md").read_text()


def test_allow_collapse_keeps_exit_0_and_still_says_it(tmp_path, capsys):
    code, lines = _run(tmp_path, capsys, "--optim.lr=1e-30", "--train.allow_collapse=true")
    assert code == 0 and "THE RUN COLLAPSED" in lines[-1] and "exit code 0: train.allow_collapse" in lines[-1]


def test_a_healthy_tiny_run_exits_0(tmp_path, capsys):
    code, lines = _run(tmp_path, capsys)
    assert code == 0 and "COLLAPSED" not in "\n".join(lines)


def test_a_reward_that_stops_telling_samples_apart_collapses_the_run(tmp_path, capsys):
    """Online GRPO whose reward gives every sample the same score after the first call: step 1 trains, steps 2-4
    drop every group (a policy that collapsed to one answer does the same to any reward)."""
    (tmp_path / "flat.py").write_text(
        "calls = []\n\ndef flat(prompts, completions, **_):\n    calls.append(1)\n"
        "    return [float(i % 2) if len(calls) == 1 else 0.5 for i in range(len(completions))]\n")
    sections = online_sections(tmp_path / "run")
    sections["rollout"]["reward"] = f"{tmp_path / 'flat.py'}:flat"
    code, lines = _run(tmp_path, capsys, "--train.max_steps=4", sections=sections)
    assert code == 5, "\n".join(lines)
    assert "the last 3 of 4 steps trained on nothing" in lines[-1]


def test_the_exit_codes_are_documented_together():
    usage = (ROOT / "docs" / "usage.md").read_text()
    section = usage[usage.index("## Exit codes"):]
    assert all(f"- **{code}** " in section for code in (0, 1, 2, 3, 4, 5))
    assert "train.allow_collapse" in section and "10.7" in section


def test_a_collapse_is_no_user_error():
    """Exit 5 is a warning about a finished run, not an error line: `assert_user_error` would refuse it."""
    with pytest.raises(AssertionError):
        assert_user_error(5, ["humanline: warning: THE RUN COLLAPSED by step 3: x (exit code 5)"])
