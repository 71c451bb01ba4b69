"""Soak: a few hundred tiny steps with periodic checkpoints and evaluation, stopped by SIGTERM half-way and
resumed, must not grow the process's memory step over step (a leak over 10 KiB per step fails).

Run with `pytest -m slow tests/test_soak.py -s` to see the RSS numbers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from helpers_reliability import one_thread
from helpers_train import DATA, tiny_config
from humanline.training.loop import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")]
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

WARMUP = 40  # steps per phase before memory is expected to be flat (allocator pools, caches, lazy imports)
TOLERANCE_MIB = 4.0  # RSS gained from the end of warm-up to the end of a phase
MAX_SLOPE_KIB = 10.0  # per step; measured 1-3.3 KiB/step (allocator noise) on the tiny runs


def rss_mib() -> float:
    """Resident set size of this process, from /proc/self/status (MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


def _run_phase(cfg, *, resume: bool, stop_at: int | None, record: list) -> Trainer:
    trainer = Trainer(cfg, resume=resume)
    real = trainer.train_step

    def one_step():
        out = real()
        record.append((trainer.step, rss_mib()))
        if stop_at is not None and trainer.step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # checkpoint and stop, as a preempted job would
        return out

    trainer.train_step = one_step
    trainer.train()
    return trainer


def _growth(record: list[tuple[int, float]]) -> tuple[float, float]:
    """(MiB gained from the end of warm-up to the end, least-squares slope in KiB per step) after warm-up."""
    tail = record[WARMUP:]
    xs, ys = [s for s, _ in tail], [r for _, r in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    settled = sum(ys[:10]) / 10
    final = sum(ys[-10:]) / 10
    return final - settled, slope * 1024


SPARSE = {  # sample 4 prompts x 4 completions every 4 steps; generation-based evaluation on 8 prompts
    "data": {"train": None},
    "train": {"regime": "sparse", "sample_every": 4},
    "rollout": {"prompts": str(DATA / "prompts.jsonl"), "prompts_per_step": 2, "n": 4, "max_new_tokens": 4,
                "reward": str(DATA.parent / "rewards.py") + ":digits"},
    "eval": {"prompts": str(DATA / "eval_prompts.jsonl"), "max_prompts": 8, "n": 2, "max_new_tokens": 4},
}


@pytest.mark.parametrize("objective, extra", [("dpo", {}), ("grpo", {}), ("grpo", SPARSE)],
                         ids=["dpo-offline", "grpo-offline", "grpo-sparse"])
def test_memory_is_flat_over_hundreds_of_steps_with_checkpoints_resume_and_eval(tmp_path, objective, extra):
    steps = 300
    sections = {"model": {"tiny_hidden_size": 32, "tiny_layers": 1}, "data": {"eval_fraction": 0.1},
                "humanline": {"enabled": True, "sync_every": 2},
                "train": {"save_every": 20, "keep_checkpoints": 2, "eval_every": 25, "micro_batch_size": 2}}
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    cfg = tiny_config(objective, tmp_path, steps=steps, **sections)
    first: list = []
    stopped = _run_phase(cfg, resume=False, stop_at=steps // 2, record=first)
    assert stopped.stopped_by == signal.SIGTERM and stopped.step == steps // 2
    del stopped
    second: list = []
    resumed = _run_phase(cfg, resume=True, stop_at=None, record=second)
    assert resumed.step == steps and [s for s, _ in second][:1] == [steps // 2 + 1]

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r["step"] for r in rows if "loss" in r or "skipped" in r]  # online: degenerate groups skip a step
    assert trained == list(range(1, steps + 1))
    key = "eval/reward_mean" if extra else "eval/loss"  # online: generation metrics on held-out prompts
    assert len([r for r in rows if key in r]) >= steps // 25
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-280", f"step-{steps}"]

    report = []
    for name, record in (("first half", first), ("after resume", second)):
        gained, slope = _growth(record)
        report.append(f"{objective} {cfg.train.regime} {name}: steps {record[WARMUP][0]}-{record[-1][0]}, "
                      f"RSS {record[WARMUP][1]:.1f} -> {record[-1][1]:.1f} MiB (peak {max(r for _, r in record):.1f}), "
                      f"gained {gained:+.2f} MiB, slope {slope:+.2f} KiB/step")
        assert gained < TOLERANCE_MIB, report[-1]
        assert slope < MAX_SLOPE_KIB, report[-1]
    print("\n" + "\n".join(report), file=sys.stderr)
