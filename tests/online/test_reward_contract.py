"""A reward that breaks its protocol, and steps that train on nothing, through the CLI.

A wrong number of scores is an error naming the reward and the counts (no item-by-item re-scoring that turned
every score into a failure, dropped every group and "succeeded"); when every group of a step is dropped the
log says so, `metrics.jsonl` records it, and the final line counts such steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_reliability import assert_user_error, one_thread, online_sections, run_cli, write_recipe
from helpers_train import TESTS

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
REWARDS = TESTS / "fault_rewards.py"


def _recipe(tmp: Path, reward: str, on_error: str = "fail") -> Path:
    return write_recipe(tmp, online_sections(tmp / "run"), train={"max_steps": 2},
                        rollout={"reward": f"{REWARDS}:{reward}", "on_error": on_error, "n": 4})


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_wrong_number_of_scores_names_the_reward_and_the_counts(tmp_path, capsys, on_error):
    code, lines = run_cli(["train", _recipe(tmp_path, "one_score", on_error)], capsys)
    line = assert_user_error(code, lines, "reward", ":one_score returned 1 scores for 8 completions",
                             "one score per completion", "at step 1")
    assert "on_error" not in line  # no setting turns a broken reward into a working one
    assert not (tmp_path / "run" / "final").exists()


def test_steps_that_train_on_nothing_are_logged_recorded_and_counted(tmp_path, capsys):
    code, lines = run_cli(["train", _recipe(tmp_path, "constant")], capsys)
    assert code == 4, "\n".join(lines)  # no step trained: the loud warning's exit code
    assert lines[-1].startswith("humanline: warning: NOTHING WAS TRAINED in 2 of 2 steps")
    lines = lines[:-1]
    warnings = [ln for ln in lines if "every group was dropped" in ln and "nothing to train on" in ln]
    assert [w.split(":")[1].strip() for w in warnings] == ["step 1", "step 2"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["skipped"], r["dropped_groups"], r["empty_steps"]) for r in rows] == [(1, 1, 2, 1),
                                                                                                 (2, 1, 2, 2)]
    assert lines[-1].startswith("[humanline] done:")
    assert lines[-1].endswith("2 of 2 steps trained on nothing (every group dropped: 2; non-finite, update "
                              "skipped: 0)")
