"""docs/adding-an-objective.md kept true: a throwaway objective, registered at run time by its `SPECS` entry
alone, goes through the table and the trainer; the demo leaves it out until it is given demo settings (optional),
then plans it; and every source file that holds a table keyed by objective names is one the document lists."""

from __future__ import annotations

import ast
import math
import re

import pytest
import torch

from helpers_train import DATA, ROOT, params
from humanline.cli import build_parser
from humanline.commands.demo import demo_settings
from humanline.core.logps import masked_sum
from humanline.errors import UserError
from humanline.experiments.demo import run as demo_run
from humanline.experiments.harness.regimes import REGIMES
from humanline.objectives import LossOutput
from humanline.training.config_loading import load_config
from humanline.training.loop import Trainer
from humanline.training.objective_table import PAIRWISE, SPECS, LossInput, ObjectiveSpec

NAME = "hinge"
DOC = ROOT / "docs" / "adding-an-objective.md"


def hinge_loss(chosen_log_ratio, rejected_log_ratio, chosen_mask, rejected_mask, *, beta: float) -> LossOutput:
    """A throwaway pure loss (SLiC's hinge on the pair margin): `mean_b max(0, 1 - beta h_b)`."""
    margins = masked_sum(chosen_log_ratio, chosen_mask, dim=-1) - masked_sum(rejected_log_ratio, rejected_mask, dim=-1)
    return LossOutput(torch.relu(1.0 - beta * margins).mean(), {"margin": margins.detach().mean()})


def hinge_batch_loss(x: LossInput, cfg) -> LossOutput:
    half = x.log_ratio.shape[0] // 2
    return hinge_loss(x.log_ratio[:half], x.log_ratio[half:], x.mask[:half], x.mask[half:], beta=cfg.beta)


@pytest.fixture
def hinge(monkeypatch):
    """The edit of docs/adding-an-objective.md that makes a new objective run: its entry in the table."""
    monkeypatch.setitem(SPECS, NAME, ObjectiveSpec(NAME, loss=hinge_batch_loss, **PAIRWISE))


@pytest.fixture
def hinge_in_the_demo(hinge, monkeypatch):
    """The optional step: its demo settings."""
    monkeypatch.setitem(demo_run.OBJECTIVES, NAME, {"objective": {"name": NAME, "beta": 0.1},
                                                    "humanline": {"sync_every": 4, "low": -0.1, "high": 0.2},
                                                    "optim": {"lr": 1e-4}})


def _config(out, regime: str, humanline: bool):
    overrides = {
        "model": {"name": "tiny"}, "objective": {"name": NAME, "beta": 0.5},
        "data": {"train": str(DATA / "groups.jsonl"), "max_prompt_length": 32, "max_length": 48},
        "humanline": {"enabled": humanline, "sync_every": 1},
        "rollout": {"prompts": str(DATA / "prompts.jsonl"), "prompts_per_step": 4, "n": 4, "max_new_tokens": 6,
                    "reward": str(ROOT / "recipes/tiny/rewards.py") + ":digits"},
        "optim": {"lr": 1e-2, "warmup_ratio": 0.0},
        "train": {"regime": regime, "micro_batch_size": 4, "max_steps": 1, "output_dir": str(out)},
        "logging": {"progress": False, "log_every": 0},
    }
    return load_config(None, overrides)


@pytest.mark.parametrize("regime, humanline", [("offline", True), ("online", False)])
def test_a_new_objective_trains_through_the_table(hinge, tmp_path, regime, humanline):
    """Offline its scored groups reach it through the conversion table (groups -> pairs); online its pairs come
    from sampled groups by the entry's `units_from_group`. One step changes the policy; the loss is finite."""
    trainer = Trainer(_config(tmp_path / regime, regime, humanline), overwrite=True)
    before = params(trainer.run.unwrapped)
    record = trainer.train_step()
    assert math.isfinite(record["loss"]) and "margin" in str(record)
    assert any(not torch.equal(before[k], v) for k, v in params(trainer.run.unwrapped).items())


def test_the_demo_leaves_out_an_objective_without_demo_settings(hinge):
    """The table alone does not put an objective in the demo: `--objective hinge` is refused, `all` leaves it out."""
    with pytest.raises(UserError, match="invalid choice: 'hinge'"):
        build_parser().parse_args(["demo", "--objective", NAME])
    assert NAME not in demo_settings(build_parser().parse_args(["demo", "--objective", "all"])).objectives


def test_the_demo_offers_plans_and_estimates_a_new_objective(hinge_in_the_demo, tmp_path):
    """With its demo settings, `humanline demo --objective hinge`: the flag accepts it, every regime's config loads,
    and the run-time estimate needs no entry of its own (it follows the record format)."""
    args = build_parser().parse_args(["demo", "--objective", NAME, "--regimes", *REGIMES])
    settings = demo_settings(args)
    assert {o for o, _ in settings.plan()} == {NAME}
    data = {"base": "tiny", "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    for _, regime in settings.plan():
        assert demo_run.run_config(settings, data, NAME, regime, 0, tmp_path).objective.name == NAME
        assert demo_run.run_estimate(settings, NAME, regime) == demo_run.run_estimate(settings, "dpo", regime) > 0
    assert NAME in demo_settings(build_parser().parse_args(["demo", "--objective", "all"])).objectives


def _objective_tables(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of dict literals keyed by two or more objective names (also inside tuple keys), and of comparisons
    with an objective name: the places a new objective might need an entry."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
            found = {e.value for k in keys for e in (k.elts if isinstance(k, ast.Tuple) else [k])
                     if isinstance(e, ast.Constant) and e.value in names}
            if len(found) >= 2:
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            if any(isinstance(c, ast.Constant) and c.value in names for c in [node.left, *node.comparators]):
                lines.append(node.lineno)
    return lines


def test_every_file_that_names_objectives_is_listed_in_the_document():
    """A fourth place nobody listed (the demo's run-time table once was one) fails here, naming the file."""
    listed = set(re.findall(r"`(src/humanline/[\w/]+\.py)`", DOC.read_text()))
    assert {"src/humanline/training/objective_table.py", "src/humanline/objectives/__init__.py"} <= listed
    assert all((ROOT / path).exists() for path in listed), sorted(p for p in listed if not (ROOT / p).exists())
    unlisted = {}
    for path in sorted((ROOT / "src" / "humanline").rglob("*.py")):
        lines = _objective_tables(ast.parse(path.read_text()), set(SPECS))
        if lines and str(path.relative_to(ROOT)) not in listed:
            unlisted[str(path.relative_to(ROOT))] = lines
    assert unlisted == {}, f"tables or tests of objective names that {DOC.name} does not list: {unlisted}"
