"""Two CPU processes (gloo) match one process with the same global batch.

DPO and GRPO with per-sequence reduction are exactly parallel: DDP averages equal-sized per-process means.
KTO is not part of this parity check on purpose: its mismatched (KL) pairs are formed inside each
micro-batch (as in the authors' code), so splitting a batch differently changes the reference point itself;
its cross-process reduction of that point is tested in test_objectives_kto.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers_train import DATA


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, objective: str, processes: int) -> tuple[dict, list[dict]]:
    out = tmp_path / f"{objective}-{processes}"
    data = {"dpo": "pairs.jsonl", "grpo": "groups.jsonl"}[objective]
    cfg = {
        "model": {"name": "tiny"},
        "data": {"train": str(DATA / data), "max_prompt_length": 32, "max_length": 48},
        "objective": {"name": objective, "reduction": "sequence"},
        "humanline": {"enabled": True, "sync_every": 2},
        "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"micro_batch_size": 4 // processes, "max_steps": 3, "output_dir": str(out)},
        "logging": {"progress": False},
    }
    path = tmp_path / f"{objective}-{processes}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if processes == 1:
        cmd = [sys.executable, "-m", "humanline", "train", str(path)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
               f"--master_port={_free_port()}", "-m", "humanline", "train", str(path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return load_file(out / "final" / "model.safetensors"), rows


@pytest.mark.parametrize("objective", ["dpo", "grpo"])
def test_two_processes_match_one(tmp_path, objective, device):
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"2 NCCL ranks need 2 GPUs, this machine has {torch.cuda.device_count()}; "
                    f"HUMANLINE_TEST_DEVICE=cpu runs the same check with 2 gloo ranks")
    one, rows_one = _run(tmp_path, objective, 1)
    two, rows_two = _run(tmp_path, objective, 2)
    assert set(one) == set(two)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)
    loss_one = [r["loss"] for r in rows_one if "loss" in r]
    loss_two = [r["loss"] for r in rows_two if "loss" in r]
    assert loss_two == pytest.approx(loss_one, rel=1e-4, abs=1e-6)
    grad_one = [r["grad_norm"] for r in rows_one if "grad_norm" in r]
    grad_two = [r["grad_norm"] for r in rows_two if "grad_norm" in r]
    assert grad_two == pytest.approx(grad_one, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("recipe, extra", [
    ("dpo_humanline", []),  # offline, lookahead
    ("kto", []),  # offline, cache
    ("dpo", ["--train.reference=frozen"]),  # a sharded frozen copy
    ("grpo_online_humanline", []),  # online: weights gathered for sampling, the sharded copy reference
    ("grpo_sparse_humanline", []),  # sparse: the same, every 4 steps
], ids=lambda v: v if isinstance(v, str) else "")
def test_fsdp_recipe_trains_at_world_size_1(tmp_path, device, recipe, extra):
    """The FSDP recipe (FSDP2, bf16) on one GPU, one regime and reference strategy each: trains and saves.
    (tests/train/test_fsdp.py runs every regime with two gloo processes on the CPU.)"""
    if device.type != "cuda":
        pytest.skip("FSDP on one GPU (HUMANLINE_TEST_DEVICE=cuda); tests/train/test_fsdp.py runs FSDP2 on the CPU")
    from helpers_train import ROOT

    out = tmp_path / "fsdp"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "recipes/accelerate/fsdp.yaml"), "--num_processes", "1", "-m", "humanline", "train",
           str(ROOT / f"recipes/tiny/{recipe}.yaml"), "--output-dir", str(out), "--train.max_steps=3",
           "--eval.prompts=null", *extra]  # the recipes' data paths are relative to ROOT
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "run_info.json").read_text())
    assert info["distributed"] == "FSDP" and info["device"].startswith("cuda")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert (out / "final" / "config.json").exists()
