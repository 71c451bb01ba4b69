"""What a new user meets first: a run that trained on nothing says so loudly and exits 4; an unknown model is one
line naming what is expected; a typo in a command-line override is blamed on the command line; a run that never
started leaves no folder behind; the files a run writes follow the umask."""

from __future__ import annotations

from helpers_reliability import run_cli
from helpers_train import ROOT

GRPO_ONLINE = ROOT / "recipes" / "tiny" / "grpo_online.yaml"
DPO = ROOT / "recipes" / "tiny" / "dpo_humanline.yaml"
QUIET = "--logging.progress=false"


def test_a_run_that_trained_on_nothing_warns_and_exits_4(tmp_path, capsys):
    # exact_match on the random tiny model: every completion scores 0, every group is dropped in every step
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", tmp_path / "run", "--rollout.reward=exact_match",
                           "--eval.reward=exact_match", "--train.max_steps=2", "--eval.max_prompts=2", QUIET], capsys)
    assert code == 4, lines
    assert lines[-1].startswith("humanline: warning: NOTHING WAS TRAINED in 2 of 2 steps: every group was dropped")
    assert "(exit code 4)" in lines[-1]


def test_a_run_that_trained_exits_0(tmp_path, capsys):
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", tmp_path / "run", "--train.max_steps=1",
                           "--eval.max_prompts=2", QUIET], capsys)
    assert code == 0 and not any("warning: NOTHING" in line for line in lines), lines
