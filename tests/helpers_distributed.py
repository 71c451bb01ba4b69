"""Shared by the two-process tests (test_fsdp.py, test_deepspeed.py): tiny cases, launching tests/fsdp_worker.py
with one process or through `accelerate launch`, and comparing two runs (tolerances: test_fsdp.py's docstring)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers_train import DATA, ROOT

WORKER = ROOT / "tests" / "fsdp_worker.py"
FSDP_CONFIG = ROOT / "recipes" / "accelerate" / "fsdp.yaml"
DDP_CONFIG = ROOT / "recipes" / "accelerate" / "ddp_cpu.yaml"
RTOL, ATOL = 1e-4, 1e-5
TRAIN = {"dpo": "pairs.jsonl", "kto": "unpaired.jsonl", "grpo": "groups.jsonl"}


def case(name: str, objective: str, k: int | str | None = None, *, reference: str = "auto", regime: str = "offline",
          lora: bool = False, grad_accum: int = 1, reward: str = "recipes/tiny/rewards.py:digits") -> dict:
    """A 3-step run of the smallest tiny model (1 layer, hidden 16); `k`: humanline's sync_every, a number or
    "auto" (None: off)."""
    overrides = {
        "model": {"name": "tiny", "tiny_hidden_size": 16, "tiny_layers": 1, "lora": lora},
        "data": {"max_prompt_length": 32, "max_length": 48},
        "objective": {"name": objective, **({"reduction": "sequence"} if objective == "grpo" else {})},
        "humanline": {"enabled": k is not None, "sync_every": k or 1},
        "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"grad_accum": grad_accum, "max_steps": 3, "reference": reference, "regime": regime},
        "logging": {"progress": False},
    }
    if lora:
        overrides["model"]["lora_target_modules"] = ["q_proj", "v_proj"]
    if regime == "offline":
        overrides["data"]["train"] = str(DATA / TRAIN[objective])
    else:
        overrides["rollout"] = {"prompts": str(DATA / "prompts.jsonl"), "prompts_per_step": 2, "n": 4,
                                "max_new_tokens": 6, "reward": str(ROOT / reward)}
        overrides["train"]["sample_every"] = 1 if regime == "online" else 2
    return {"name": name, "overrides": overrides}


def launch(root: Path, label: str, cases: list[dict], config: Path | None, micro_batch: int,
           launch_args: tuple = ()) -> Path:
    """Run `cases` with tests/fsdp_worker.py into `root/label`: one process (`config` None) or two processes
    through `accelerate launch --config_file config`, with `micro_batch` units per micro-batch and process."""
    cases = json.loads(json.dumps(cases))
    for case in cases:
        case["overrides"]["train"].setdefault("micro_batch_size", micro_batch)
    spec = root / f"{label}.json"
    spec.write_text(json.dumps({"root": str(root / label), "cases": cases}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    if config is None:
        cmd = [sys.executable, str(WORKER), str(spec)]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", "2", "--main_process_port", str(free_port()), *launch_args, str(WORKER), str(spec)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / label


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(got: Path, expected: Path) -> None:
    rows_got, rows_expected = rows(got), rows(expected)
    for key in ("loss", "grad_norm"):
        a = [r[key] for r in rows_got if key in r]
        b = [r[key] for r in rows_expected if key in r]
        assert len(a) == len(b) == 3 and a == pytest.approx(b, rel=RTOL, abs=1e-6), (key, a, b)
    final_got = load_file(got / "final" / "model.safetensors")
    final_expected = load_file(expected / "final" / "model.safetensors")
    assert final_got.keys() == final_expected.keys()
    for name in final_expected:
        torch.testing.assert_close(final_got[name], final_expected[name], rtol=RTOL, atol=ATOL)


