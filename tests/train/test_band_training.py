"""The auto band inside the training loop: bounds logged every step, moved only at syncs, resumed exactly;
and the cost counters every step logs."""

from __future__ import annotations

import json
import shutil

import torch

from helpers_train import params, tiny_config
from humanline.training.loop import Trainer


def _rows(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_auto_band_moves_at_syncs_is_logged_and_resumes_exactly(tmp_path):
    """k = 2, 6 steps, a checkpoint after step 3 (inside a sync window): resuming from it gives the same
    parameters and the same logged bounds as the uninterrupted run."""
    full = tmp_path / "full"
    cfg = tiny_config("dpo", full, steps=6, humanline={"enabled": True, "sync_every": 2, "band": "auto"},
                      train={"save_every": 3, "keep_checkpoints": 5})
    trainer = Trainer(cfg)
    trainer.train()
    expected, rows = params(trainer.run.unwrapped), [r for r in _rows(full) if "loss" in r]
    bounds = [(r["humanline/low"], r["humanline/high"]) for r in rows]
    # syncs before steps 0, 2, 4: the first has seen nothing; the next two move the bounds, which then hold
    # for their window (step 0's ratios are exactly 0, step 1's are not)
    assert bounds[:2] == [(-1.5, 1.5)] * 2
    assert bounds[2] == bounds[3] != bounds[4] == bounds[5] and bounds[2] != (-1.5, 1.5)
    assert all(low < 0 < high for low, high in bounds)
    shutil.rmtree(full / "checkpoints" / "step-6")
    shutil.rmtree(full / "final")
    resumed = Trainer(cfg, resume=True)
    assert resumed.step == 3
    resumed.train()
    for name, value in params(resumed.run.unwrapped).items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0)
    again = [(r["humanline/low"], r["humanline/high"]) for r in _rows(full) if "loss" in r]
    assert again == bounds


def test_grpo_auto_band_holds_its_start_and_trains_as_the_fixed_band(tmp_path, capsys):
    """GRPO clips the ratio itself (PPO clip), so `band: auto` keeps [low, high]: the bounds logged at every
    step are the starting ones, and the run's parameters equal those of `band: fixed` exactly. DPO, which has
    no clip of its own, moves them at its syncs (the test above)."""
    runs = {}
    for band in ("auto", "fixed"):
        cfg = tiny_config("grpo", tmp_path / band, steps=4,
                          humanline={"enabled": True, "sync_every": 1, "band": band, "low": -0.02, "high": 0.03})
        trainer = Trainer(cfg)
        said = capsys.readouterr().err
        assert ("grpo clips the ratio itself" in said) == (band == "auto")
        trainer.train()
        runs[band] = params(trainer.run.unwrapped)
        rows = [r for r in _rows(tmp_path / band) if "loss" in r]
        assert [(r["humanline/low"], r["humanline/high"]) for r in rows] == [(-0.02, 0.03)] * 4
        assert any(r["humanline/inside_band"] < 1 for r in rows)  # the band binds: holding it is visible
    for name, value in runs["auto"].items():
        torch.testing.assert_close(value, runs["fixed"][name], rtol=0, atol=0)


def test_costs_are_logged_cumulatively(tmp_path):
    """Offline KTO: no tokens generated; forward tokens = 2 x (main + mismatched part), backward = main."""
    cfg = tiny_config("kto", tmp_path, steps=2)
    trainer = Trainer(cfg)
    batches = [trainer.run.schedule(s) for s in range(2)]
    trainer.train()
    rows = [r for r in _rows(tmp_path) if "loss" in r]
    main = sum(int(b["attention_mask"].sum()) for step in batches for b in step)
    kl = sum(int(b["kl_attention_mask"].sum()) for step in batches for b in step)
    assert rows[-1]["cost/generated_tokens"] == 0
    assert rows[-1]["cost/backward_tokens"] == main
    assert rows[-1]["cost/forward_tokens"] == 2 * (main + kl)
    assert 0 < rows[0]["cost/cpu_seconds"] < rows[1]["cost/cpu_seconds"]
