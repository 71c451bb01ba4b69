"""Shared helpers for training tests: tiny configs and parameter snapshots."""

from __future__ import annotations

from pathlib import Path

import torch

from humanline.training.config_loading import load_config

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = ROOT / "recipes" / "tiny" / "data"
TRAIN_DATA = {"dpo": "pairs.jsonl", "kto": "unpaired.jsonl", "grpo": "groups.jsonl"}


def tiny_config(objective: str, out: Path, *, hl: bool = False, steps: int = 4, **extra):
    """A tiny offline run: 2-layer hidden-64 model, 4 units per micro-batch, no eval/checkpoint unless asked."""
    overrides = {
        "model": {"name": "tiny"},
        "data": {"train": str(DATA / TRAIN_DATA[objective]), "max_prompt_length": 32, "max_length": 48},
        "objective": {"name": objective},
        "humanline": {"enabled": hl, "sync_every": 1},
        "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"micro_batch_size": 4, "grad_accum": 1, "max_steps": steps, "output_dir": str(out)},
        "logging": {"progress": False, "log_every": 0},
    }
    for section, values in extra.items():
        overrides.setdefault(section, {}).update(values)
    return load_config(None, overrides)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the model's state (tests compare tensors on one device, whatever the run's device)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
