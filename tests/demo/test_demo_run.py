"""The demo pipeline end to end at a toy size: policies, offline data, every regime, table, files, plots."""

from __future__ import annotations

import json

from humanline.demo.base import BaseConfig
from humanline.demo.results import write_outputs
from humanline.demo.run import DemoSettings, run_all


def test_demo_pipeline_writes_results_report_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    settings = DemoSettings(
        objectives=["grpo"], regimes=["offline", "offline+humanline", "online", "sparse+humanline"],
        seeds=1, steps=2, prompts_per_step=4, samples_per_prompt=4, sparse_every=2, eval_every=1,
        eval_prompts=8, eval_samples=1, train_prompts=64,
        base=BaseConfig(steps=3, hidden_size=32, num_layers=1, batch_size=8),
    )
    out = tmp_path / "demo"
    results = run_all(settings, out, log=lambda m: None)
    text = write_outputs(results, out, elapsed=1.0)
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["runs"]) == 4
    regimes = {(r["objective"], r["regime"]) for r in saved["summary"]}
    assert ("grpo", "sparse+humanline") in regimes and ("grpo", "online") in regimes
    for run in saved["runs"]:
        assert [p["step"] for p in run["curve"]] == [1, 2]
        assert 0.0 <= run["final_reward"] <= 1.0
    online = [r for r in saved["runs"] if r["regime"] == "online"]
    offline = [r for r in saved["runs"] if r["regime"] == "offline"]
    assert all(r["samples_generated"] > 0 for r in online)
    assert all(r["samples_generated"] == 0 for r in offline)
    assert "| grpo | online |" in text
    assert (out / "reward_grpo.png").exists()
    assert "## What this shows" in (out / "report.md").read_text()


def test_demo_run_configs_validate_for_every_objective_and_regime(tmp_path):
    from humanline.demo.run import OBJECTIVES, REGIMES, run_config

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    for objective in OBJECTIVES:
        for regime in REGIMES:
            cfg = run_config(DemoSettings(), data, objective, regime, 0, tmp_path)
            assert cfg.objective.name == objective
            assert cfg.humanline.enabled == regime.endswith("+humanline")
            assert cfg.train.regime == regime.split("+")[0]
