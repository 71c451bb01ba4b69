"""FSDP2 with two CPU processes (gloo), launched as users launch it:
`accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 ...`.

Three launches run every case (`tests/fsdp_worker.py`, several runs per launch to keep the suite short): one
process (micro-batch 4), FSDP2 on two processes and DDP on two processes (micro-batch 2 each: the same global
batch, dealt in contiguous blocks, so each process trains on half of the one-process micro-batch).

- DPO and GRPO (per-sequence reduction, so per-process means average to the global mean), humanline off (the
  cached frozen reference), k = 1 and k = 3 (lookahead), the `frozen` and `copy` references, LoRA: FSDP2 on
  two processes equals one process.
- KTO: its reference point comes from mismatched pairs formed inside each micro-batch and is averaged over
  processes (as in the authors' code), so a two-process run defines it differently from any one-process run;
  FSDP2 is compared with DDP on the same two processes instead, where sharding is the only difference.
- Online and sparse GRPO: each process samples its own prompts with its own random stream (seed, step,
  process), so that generation scales with processes; a one-process run draws one stream for all prompts and
  so samples other completions. FSDP2 (weights gathered for generation, then resharded) is compared with DDP:
  the same completions token for token, and the same training.

Tolerance: float32 throughout. FSDP2 sums gradients by reduce-scatter over shards, DDP by all-reduce, one process
in one backward: the same sums in other orders, ~1e-7 relative per step. After 3 AdamW steps at lr 1e-3 the
weights agree to ~1e-6 (measured), so we allow rtol 1e-4 / atol 1e-5 (as the DDP parity test). Each step moves
every trained weight by ~lr = 1e-3 (AdamW's first steps are sign-like), 100x that tolerance: a reference synced
one step late, or a wrong shard, cannot pass. Losses: rel 1e-4, abs 1e-6.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import TEST_DEVICE
from helpers_train import DATA, ROOT

WORKER = ROOT / "tests" / "fsdp_worker.py"
FSDP_CONFIG = ROOT / "recipes" / "accelerate" / "fsdp.yaml"
DDP_CONFIG = ROOT / "recipes" / "accelerate" / "ddp_cpu.yaml"
RTOL, ATOL = 1e-4, 1e-5
TRAIN = {"dpo": "pairs.jsonl", "kto": "unpaired.jsonl", "grpo": "groups.jsonl"}


def _case(name: str, objective: str, k: int | None = None, *, reference: str = "auto", regime: str = "offline",
          lora: bool = False, grad_accum: int = 1, reward: str = "recipes/tiny/rewards.py:digits") -> dict:
    """A 3-step run of the smallest tiny model (1 layer, hidden 16); `k`: humanline's sync_every (None: off)."""
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


# FSDP2 (2 processes) against one process
AGAINST_ONE = [
    _case("dpo_off", "dpo"), _case("dpo_k1", "dpo", 1), _case("dpo_k3", "dpo", 3),
    _case("grpo_off", "grpo"), _case("grpo_k1", "grpo", 1), _case("grpo_k3", "grpo", 3),
    _case("dpo_frozen", "dpo", reference="frozen"), _case("grpo_copy_k3", "grpo", 3, reference="copy"),
    _case("dpo_lora_frozen", "dpo", reference="frozen", lora=True),
    _case("dpo_lora_copy_k1", "dpo", 1, reference="copy", lora=True),
]
# FSDP2 against DDP (2 processes each)
AGAINST_DDP = [
    _case("kto_off", "kto"), _case("kto_k1", "kto", 1), _case("kto_k3", "kto", 3),
    _case("grpo_online", "grpo", regime="online"),
    _case("grpo_online_k1", "grpo", 1, regime="online"),
    _case("grpo_sparse_k2", "grpo", 2, regime="sparse"),
    _case("dpo_online_k1", "dpo", 1, regime="online"),  # pairs from sampled groups, the copy reference
    # process 1 drops every group it samples: the processes then hold 2 and 0 micro-batches (fillers)
    _case("grpo_online_uneven", "grpo", regime="online", grad_accum=2, reward="tests/fault_rewards.py:flat_on_rank_1"),
]


def _launch(root: Path, label: str, cases: list[dict], config: Path | None, micro_batch: int) -> Path:
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
               "--num_processes", "2", "--main_process_port", str(_free_port()), str(WORKER), str(spec)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / label


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    if TEST_DEVICE != "cpu":
        pytest.skip("two gloo processes on the CPU; HUMANLINE_TEST_DEVICE=cpu runs it")
    root = tmp_path_factory.mktemp("fsdp")
    fsdp = _launch(root, "fsdp", AGAINST_ONE + AGAINST_DDP + [UNINTERRUPTED], FSDP_CONFIG, 2)
    info = json.loads((fsdp / "dpo_k1" / "run_info.json").read_text())
    assert info["distributed"] == "FSDP" and info["processes"] == 2, info
    return {"fsdp": fsdp, "one": _launch(root, "one", AGAINST_ONE, None, 4),
            "ddp": _launch(root, "ddp", AGAINST_DDP, DDP_CONFIG, 2)}


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(got: Path, expected: Path) -> None:
    rows_got, rows_expected = _rows(got), _rows(expected)
    for key in ("loss", "grad_norm"):
        a = [r[key] for r in rows_got if key in r]
        b = [r[key] for r in rows_expected if key in r]
        assert len(a) == len(b) == 3 and a == pytest.approx(b, rel=RTOL, abs=1e-6), (key, a, b)
    final_got = load_file(got / "final" / "model.safetensors")
    final_expected = load_file(expected / "final" / "model.safetensors")
    assert final_got.keys() == final_expected.keys()
    for name in final_expected:
        torch.testing.assert_close(final_got[name], final_expected[name], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", [c["name"] for c in AGAINST_ONE])
def test_fsdp_two_processes_equal_one(runs, case):
    _assert_same_run(runs["fsdp"] / case, runs["one"] / case)


@pytest.mark.parametrize("case", [c["name"] for c in AGAINST_DDP])
def test_fsdp_equals_ddp_on_two_processes(runs, case):
    _assert_same_run(runs["fsdp"] / case, runs["ddp"] / case)


@pytest.mark.parametrize("case", ["grpo_online", "grpo_online_k1", "grpo_sparse_k2", "grpo_online_uneven",
                                  "dpo_online_k1"])
def test_fsdp_samples_the_same_completions(runs, case):
    """Sampling from the gathered weights draws exactly what DDP's processes draw, on each process."""
    for rank in (0, 1):
        got = json.loads((runs["fsdp"] / case / f"samples_{rank}.json").read_text())
        expected = json.loads((runs["ddp"] / case / f"samples_{rank}.json").read_text())
        steps = {"grpo_sparse_k2": ["0", "2"]}.get(case, ["0", "1", "2"])
        assert sorted(got) == steps and got == expected, (rank, got, expected)
        assert all(len(group) == 4 for step in got.values() for group in step)  # rollout.n completions per prompt


def test_uneven_processes_train_with_fillers(runs):
    """Process 1 drops every group (equal rewards), process 0 trains: both run the same forwards and
    backwards, process 1's are fillers with weight 0, and no step counts as empty."""
    rows = _rows(runs["fsdp"] / "grpo_online_uneven")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert all(r["samples_generated"] > 0 for r in rows if "loss" in r)


@pytest.mark.parametrize("case", ["grpo_copy_k3", "dpo_lora_copy_k1", "grpo_online_k1", "grpo_sparse_k2",
                                  "dpo_online_k1"])
def test_fsdp_reference_holds_the_pre_update_weights(runs, case):
    """After each step, the sharded `copy` reference, gathered whole on every process, equals the policy from
    just before that step's update at a sync step (s % k == 0) and is unchanged otherwise; the update moved the
    policy by ~lr, so a copy taken after the update would differ."""
    sync_every = yaml.safe_load((runs["fsdp"] / case / "config.yaml").read_text())["humanline"]["sync_every"]
    for rank in (0, 1):
        checks = json.loads((runs["fsdp"] / case / f"sync_{rank}.json").read_text())
        assert [c["step"] for c in checks] == [0, 1, 2]
        assert [c["synced"] for c in checks] == [s % sync_every == 0 for s in range(3)]
        assert all(c["equal"] for c in checks), checks
        assert all(c["moved"] > 50 * ATOL and c["from_post"] > 50 * ATOL for c in checks), checks


# ---------------------------------------------------------------- SIGKILL and resume of a sharded run

SPARSE = "recipes/tiny/grpo_sparse_humanline.yaml"  # samples every 4 steps; the sharded copy reference, k = 2
RESUME_OVERRIDES = {"model": {"tiny_hidden_size": 16, "tiny_layers": 1},
                    "train": {"max_steps": 6, "save_every": 2, "micro_batch_size": 4},
                    "eval": {"prompts": None}, "logging": {"progress": False}}
RESUME_ARGS = ["--train.max_steps=6", "--train.save_every=2", "--train.micro_batch_size=4",
               "--model.tiny_hidden_size=16", "--model.tiny_layers=1", "--eval.prompts=null",
               "--logging.progress=false"]
# The killed run: the CLI with each step slowed by 0.3 s, so that the kill lands between checkpoints.
SLOW_CLI = """
import sys, time
import humanline.train as t
step = t.Trainer.train_step
def slow(self):
    time.sleep(0.3)
    return step(self)
t.Trainer.train_step = slow
from humanline.cli import main
sys.exit(main(sys.argv[1:]))
"""
UNINTERRUPTED = {"name": "sparse_uninterrupted", "recipe": SPARSE, "overrides": RESUME_OVERRIDES}  # FSDP launch


def _fsdp_cli(script: list[str], args: list, **popen) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG),
           "--num_processes", "2", "--main_process_port", str(_free_port()), *script, *map(str, args)]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            **popen)


def _last_step(metrics: Path) -> int:
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return max((json.loads(line)["step"] for line in lines if line.strip().endswith("}")), default=0)


def test_sigkill_and_resume_of_a_sharded_run_equals_the_uninterrupted_run(runs, tmp_path):
    """`accelerate launch` (FSDP2, 2 processes) of sparse GRPO + humanline, killed with SIGKILL (launcher and
    both processes) after step 3, then `--resume`d by the same command: it continues from the sharded checkpoint
    of step 2 (model and optimizer shards, each process's reference shards, sample buffer and RNG states) and
    ends bit for bit where the uninterrupted run (in the FSDP launch above) ended, step for step."""
    import signal
    import time

    out, script = tmp_path / "killed", tmp_path / "slow_cli.py"
    script.write_text(SLOW_CLI)
    proc = _fsdp_cli([str(script)], ["train", SPARSE, "--output-dir", out, *RESUME_ARGS], start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while _last_step(out / "metrics.jsonl") < 3:
            assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "the run did not reach step 3 in time"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
    killed_at = _last_step(out / "metrics.jsonl")
    assert 3 <= killed_at < 6 and not (out / "final").exists(), killed_at

    resumed = _fsdp_cli(["-m", "humanline"], ["train", SPARSE, "--output-dir", out, "--resume", *RESUME_ARGS])
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert "resumed from step" in err, err[-3000:]
    expected = runs["fsdp"] / "sparse_uninterrupted"
    got_final, expected_final = (load_file(p / "final" / "model.safetensors") for p in (out, expected))
    assert got_final.keys() == expected_final.keys()
    assert all(torch.equal(got_final[k], expected_final[k]) for k in expected_final)
    losses = [{r["step"]: r["loss"] for r in _rows(p) if "loss" in r} for p in (out, expected)]
    assert losses[0] == losses[1] and sorted(losses[0]) == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------- start-up refusals (DeepSpeed, FSDP settings)


ROLLOUT = {"prompts": str(DATA / "prompts.jsonl"), "reward": str(ROOT / "recipes" / "tiny" / "rewards.py") + ":digits"}


def _startup_config(tmp_path, **sections):
    from helpers_train import tiny_config

    return tiny_config("grpo", tmp_path, **sections)


@pytest.mark.parametrize("stage, regime, reference, installed, on_cpu, expected", [
    ("1", "offline", "auto", True, False, "DeepSpeed ZeRO stage 1: expected one of 2, 3"),
    ("", "offline", "auto", True, False, "DeepSpeed ZeRO stage (not set): expected one of 2, 3"),
    ("2", "offline", "auto", False, False, "the 'deepspeed' package is not installed (pip install deepspeed)"),
    ("2", "offline", "auto", True, True, "DeepSpeed on the CPU: accelerate enables DeepSpeed only on accelerators"),
    ("3", "online", "auto", True, False, "ZeRO-3 partitions every weight, and sampling (train.regime=online)"),
    ("3", "offline", "copy", True, False, "train.reference=copy has no whole weights to copy"),
    ("3", "offline", "frozen", True, False, "train.reference=frozen has no whole weights to copy"),
    ("3", "offline", "auto", True, False, None),  # humanline off, offline: the cached reference
    ("2", "online", "auto", True, False, None),
])
def test_deepspeed_settings_are_checked_at_start_up(tmp_path, monkeypatch, stage, regime, reference, installed,
                                                    on_cpu, expected):
    """A DeepSpeed launch (accelerate sets ACCELERATE_USE_DEEPSPEED and the ZeRO stage) is refused in one line
    where humanline cannot run it: another ZeRO stage, no deepspeed package, a CPU, or ZeRO-3 where whole
    weights are needed (sampling, a weight-copy reference)."""
    import types

    from humanline.errors import UserError
    from humanline.objective_specs import SPECS
    from humanline.run_builder import check_deepspeed

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", stage)
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed") if installed else None)
    extra = {"rollout": ROLLOUT, "train": {"regime": regime, "max_steps": 2}} if regime != "offline" else {}
    cfg = _startup_config(tmp_path, **extra)
    cfg.train.reference = reference
    if expected is None:
        check_deepspeed(cfg, SPECS["grpo"], on_cpu)
        return
    with pytest.raises(UserError) as info:
        check_deepspeed(cfg, SPECS["grpo"], on_cpu)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_fsdp_refuses_a_bf16_sampling_copy_and_fsdp1(tmp_path):
    """Under FSDP2 `rollout.dtype: bfloat16` (a second, unsharded copy) is refused with what to use instead;
    an FSDP version 1 config is refused."""
    from types import SimpleNamespace

    from humanline.errors import UserError
    from humanline.run_builder import check_distributed

    extra = {"rollout": {**ROLLOUT, "dtype": "bfloat16"}, "train": {"regime": "online", "max_steps": 2}}
    cfg = _startup_config(tmp_path, **extra)
    fsdp2 = SimpleNamespace(is_fsdp2=True, distributed_type=SimpleNamespace(name="FSDP"))
    with pytest.raises(UserError, match="under FSDP use train.mixed_precision: bf16"):
        check_distributed(cfg, fsdp2)
    fsdp1 = SimpleNamespace(is_fsdp2=False, distributed_type=SimpleNamespace(name="FSDP"))
    with pytest.raises(UserError, match="humanline supports FSDP2"):
        check_distributed(_startup_config(tmp_path), fsdp1)
