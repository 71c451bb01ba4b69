"""Every shipped recipe loads and validates; every tiny recipe trains, changes parameters and logs finite metrics."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers_train import ROOT
from humanline.cli import main
from humanline.model.tiny import make_model, make_tokenizer
from humanline.training.config_loading import load_config
from humanline.training.objective_table import SPECS

RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "accelerate" not in p.parts)
TINY = sorted(p for p in (ROOT / "recipes" / "tiny").glob("*.yaml") if p.stem != "quickstart")  # its own test


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_loads(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_config(path)
    assert cfg.objective.name in SPECS


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.stem)
def test_tiny_recipe_trains(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert main(["train", str(path), "--output-dir", str(out), "--logging.progress=false"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss" in r]
    assert trained, "no step trained"
    for row in rows:
        assert all(not isinstance(v, str) for v in row.values()), row
    cfg = load_config(path)
    initial = make_model(make_tokenizer(), hidden_size=cfg.model.tiny_hidden_size,
                         num_layers=cfg.model.tiny_layers).state_dict()
    final = load_file(out / "final" / "model.safetensors")
    assert any(not torch.equal(final[k], initial[k]) for k in final), "parameters did not change"


def test_report_writes_curves_and_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert main(["train", str(ROOT / "recipes/tiny/dpo_humanline.yaml"), "--output-dir", str(out),
                 "--train.max_steps=4", "--train.eval_every=2"]) == 0
    assert main(["report", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "objective: dpo" in text and "humanline: on (k = 2" in text
    assert "| loss |" in text and "| humanline/inside_band | 1 |" in text
    assert (out / "curves.png").stat().st_size > 10_000


def test_report_on_a_folder_without_metrics_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "accelerate").glob("*.yaml")), ids=lambda p: p.stem)
def test_accelerate_config_is_valid_yaml(path):
    import yaml

    cfg = yaml.safe_load(path.read_text())
    assert cfg["distributed_type"] in ("MULTI_GPU", "MULTI_CPU", "FSDP", "DEEPSPEED")
    assert cfg["num_processes"] >= 2


@pytest.mark.parametrize("path", [p for p in RECIPES if "reward_model:" not in p.read_text()],
                         ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_recipe_reward_specs_build(path, monkeypatch):
    """Reward specs are only resolved at run time; build them here so a typo fails in CI, not on a cluster."""
    from humanline.sampling.reward_spec import build_reward

    monkeypatch.chdir(ROOT)
    cfg = load_config(path)
    for spec in (cfg.rollout.reward, cfg.eval.reward):
        if spec is not None:
            assert callable(build_reward(spec))
