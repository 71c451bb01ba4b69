"""What a run shows and logs: the learning rate each step used (warm-up included), and on a terminal a progress
bar carrying the numbers the docs say to watch, with a full step line kept on screen every `log_every` steps."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from helpers_reliability import online_config
from helpers_train import tiny_config
from humanline.training.loop import Trainer
from humanline.training.metrics_log import MetricsLogger


def test_the_logged_lr_is_the_one_the_step_used_so_warm_up_shows(tmp_path):
    """warmup_ratio 0.5 of 4 steps: factors 1/3, 2/3, 1, 1 (`build`'s LambdaLR). The lr logged used to be the next
    step's (2/3, 1, 1, 1): the warm-up never showed."""
    cfg = tiny_config("dpo", tmp_path, steps=4, optim={"lr": 3e-3, "warmup_ratio": 0.5})
    trainer = Trainer(cfg)
    used = []
    step = trainer.run.optimizer.step

    def record(*args, **kwargs):
        used.append(trainer.run.optimizer.param_groups[0]["lr"])
        return step(*args, **kwargs)

    trainer.run.optimizer.step = record
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    logged = [r["lr"] for r in rows if "lr" in r]
    assert used == pytest.approx([1e-3, 2e-3, 3e-3, 3e-3])
    assert logged == pytest.approx(used)


def _logger(tmp_path, monkeypatch, log_every: int) -> MetricsLogger:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    cfg = tiny_config("dpo", tmp_path, logging={"progress": True, "log_every": log_every})
    return MetricsLogger(tmp_path, cfg, SimpleNamespace(is_main_process=True), max_steps=4)


def test_on_a_terminal_the_bar_carries_loss_and_reward_and_step_lines_stay(tmp_path, monkeypatch, capsys):
    logger = _logger(tmp_path, monkeypatch, log_every=2)
    for step in (1, 2):
        logger.log(step, {"loss": 0.5 / step, "reward": 0.1 * step, "grad_norm": 1.0})
    logger.log(2, {"eval/reward_mean": 0.25})
    assert logger.bar.postfix == "loss=0.25, reward=0.2, eval/reward_mean=0.25"
    logger.close()
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("step ")] == [
        "step 2/4 loss=0.25 reward=0.2 grad_norm=1", "step 2/4 eval/reward_mean=0.25"]


def test_on_a_terminal_dpo_shows_its_pair_accuracy(tmp_path, monkeypatch, capsys):
    logger = _logger(tmp_path, monkeypatch, log_every=0)
    logger.log(1, {"loss": 0.69, "rewards/accuracy": 0.75})
    assert logger.bar.postfix == "loss=0.69, pair_accuracy=0.75"
    logger.close()
    assert "step " not in capsys.readouterr().out  # log_every 0: no step lines, as in a log file


def test_without_a_terminal_the_step_lines_carry_the_reward(tmp_path, capsys):
    cfg = online_config(tmp_path / "run", 2, logging={"log_every": 1, "progress": True})
    Trainer(cfg).train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2 and all("reward=" in line and "loss=" in line for line in lines), lines
