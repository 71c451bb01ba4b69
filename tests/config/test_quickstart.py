"""README's first command visibly learns on a CPU: recipes/tiny/quickstart.yaml raises the reward it prints."""

from __future__ import annotations

import json

from helpers_train import ROOT
from humanline.cli import main


def test_the_quickstart_reward_rises(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as README runs it, from any folder
    out = tmp_path / "run"
    assert main(["train", str(ROOT / "recipes" / "tiny" / "quickstart.yaml"), "--output-dir", str(out),
                 "--logging.progress=false"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward"] for r in rows if "reward" in r]
    evals = [r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r]
    assert len(rewards) == 20 and len(evals) == 2
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > 2 * early and late > 0.15, rewards  # measured: 0.06 -> 0.25 (seed 0, CPU)
    assert evals[1] > evals[0]
