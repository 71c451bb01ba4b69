"""The demo pipeline end to end at a toy size: policies, offline data, every regime, table, files, plots."""

from __future__ import annotations

import json

import pytest

from humanline.demo.base import BaseConfig
from humanline.demo.results import write_outputs
from humanline.demo.run import DemoSettings, run_all
from humanline.errors import UserError


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
    from humanline.demo.regimes import ABLATION, REGIMES
    from humanline.demo.run import OBJECTIVES, run_config

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    for objective in OBJECTIVES:
        for regime in (*REGIMES, *ABLATION):
            cfg = run_config(DemoSettings(), data, objective, regime, 0, tmp_path)
            assert cfg.objective.name == objective
            assert cfg.humanline.enabled == ("+" in regime)
            assert cfg.train.regime == regime.split("+")[0]


def test_regime_names_set_the_humanline_variant(tmp_path):
    """Each part of the ablation is what its name says, on top of the objective's own k and band."""
    from humanline.demo.regimes import NO_SYNC
    from humanline.demo.run import OBJECTIVES, run_config

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}

    def h(regime, objective="dpo"):
        return run_config(DemoSettings(), data, objective, regime, 0, tmp_path).humanline

    default = OBJECTIVES["dpo"]["humanline"]
    both = h("offline+humanline")
    assert (both.transform, both.sync_every, both.low, both.high, both.band) == (
        "clip", default["sync_every"], default["low"], default["high"], "fixed")
    assert h("offline+sync-only").transform == "none" and h("offline+sync-only").sync_every == default["sync_every"]
    assert h("offline+clip-only").sync_every == NO_SYNC and h("offline+clip-only").transform == "clip"
    assert h("offline+reject").transform == "reject"
    assert h("offline+humanline-k16").sync_every == 16
    auto = h("offline+humanline-auto")
    assert (auto.band, auto.low, auto.high, auto.band_quantiles) == ("auto", -1.5, 1.5, [0.1, 0.99])
    assert h("offline+humanline-auto0.1,0.95").band_quantiles == [0.1, 0.95]
    banded = h("offline+humanline-k2-band-0.3,0.25")
    assert (banded.sync_every, banded.low, banded.high) == (2, -0.3, 0.25)


@pytest.mark.parametrize("name", ["nowhere", "offline+humanlin", "offline+humanline-k", "offline+humanline-x3",
                                  "offline+humanline-band0.1,0.2", "offline+reject-auto"])
def test_malformed_regime_names_are_one_line_errors(name):
    """A name that cannot be read fails in `--regimes`; one that reads but gives an invalid config (a band
    with low > 0, the auto band without the clip) fails when its config loads; both as one line."""
    from humanline.demo.run import run_config

    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    with pytest.raises(UserError) as info:
        run_config(DemoSettings(), data, "dpo", name, 0, "x")
    assert "\n" not in str(info.value) and ("--regimes" in str(info.value) or "humanline." in str(info.value))


def test_ablation_plan_covers_every_part_once_per_objective():
    """9 regimes per objective: k equal to the objective's default is its offline+humanline row, not repeated."""
    settings = DemoSettings(ablation=True, objectives=["dpo", "grpo", "kto"])
    plan = settings.plan()
    assert len(plan) == 27
    grpo = [r for o, r in plan if o == "grpo"]
    assert "offline+humanline-k1" not in grpo and {"offline+humanline-k4", "offline+humanline-k16"} <= set(grpo)
    dpo = [r for o, r in plan if o == "dpo"]
    assert "offline+humanline-k4" not in dpo and "offline+humanline-k1" in dpo
    assert {"offline+sync-only", "offline+clip-only", "offline+reject", "offline+humanline-auto"} <= set(dpo)
