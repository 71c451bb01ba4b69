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
from helpers_distributed import ATOL, DDP_CONFIG, FSDP_CONFIG, assert_same_run, case, free_port, launch, rows
from helpers_train import DATA, ROOT

# FSDP2 (2 processes) against one process
AGAINST_ONE = [
    case("dpo_off", "dpo"), case("dpo_k1", "dpo", 1), case("dpo_k3", "dpo", 3),
    case("grpo_off", "grpo"), case("grpo_k1", "grpo", 1), case("grpo_k3", "grpo", 3),
    case("dpo_frozen", "dpo", reference="frozen"), case("grpo_copy_k3", "grpo", 3, reference="copy"),
    case("dpo_lora_frozen", "dpo", reference="frozen", lora=True),
    case("dpo_lora_copy_k1", "dpo", 1, reference="copy", lora=True),
    case("grpo_auto", "grpo", "auto"),  # the drift rule: its statistic reduced over processes at each sync
]
# FSDP2 against DDP (2 processes each)
AGAINST_DDP = [
    case("kto_off", "kto"), case("kto_k1", "kto", 1), case("kto_k3", "kto", 3),
    case("grpo_online", "grpo", regime="online"),
    case("grpo_online_k1", "grpo", 1, regime="online"),
    case("grpo_sparse_k2", "grpo", 2, regime="sparse"),
    case("dpo_online_k1", "dpo", 1, regime="online"),  # pairs from sampled groups, the copy reference
    # process 1 drops every group it samples: the processes then hold 2 and 0 micro-batches (fillers)
    case("grpo_online_uneven", "grpo", regime="online", grad_accum=2, reward="tests/fault_rewards.py:flat_on_rank_1"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    if TEST_DEVICE != "cpu":
        pytest.skip("two gloo processes on the CPU; HUMANLINE_TEST_DEVICE=cpu runs it")
    root = tmp_path_factory.mktemp("fsdp")
    fsdp = launch(root, "fsdp", AGAINST_ONE + AGAINST_DDP + [UNINTERRUPTED], FSDP_CONFIG, 2)
    info = json.loads((fsdp / "dpo_k1" / "run_info.json").read_text())
    assert info["distributed"] == "FSDP" and info["processes"] == 2, info
    return {"fsdp": fsdp, "one": launch(root, "one", AGAINST_ONE, None, 4),
            "ddp": launch(root, "ddp", AGAINST_DDP, DDP_CONFIG, 2)}


@pytest.mark.parametrize("case", [c["name"] for c in AGAINST_ONE])
def test_fsdp_two_processes_equal_one(runs, case):
    assert_same_run(runs["fsdp"] / case, runs["one"] / case)


@pytest.mark.parametrize("case", [c["name"] for c in AGAINST_DDP])
def test_fsdp_equals_ddp_on_two_processes(runs, case):
    assert_same_run(runs["fsdp"] / case, runs["ddp"] / case)


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
    logged = rows(runs["fsdp"] / "grpo_online_uneven")
    assert [r["step"] for r in logged if "loss" in r] == [1, 2, 3]
    assert all(r["samples_generated"] > 0 for r in logged if "loss" in r)


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
import humanline.training.loop as t
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
           "--num_processes", "2", "--main_process_port", str(free_port()), *script, *map(str, args)]
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
    losses = [{r["step"]: r["loss"] for r in rows(p) if "loss" in r} for p in (out, expected)]
    assert losses[0] == losses[1] and sorted(losses[0]) == [1, 2, 3, 4, 5, 6]


# ---------------------------------------------------------------- start-up refusals (DeepSpeed, FSDP settings)


ROLLOUT = {"prompts": str(DATA / "prompts.jsonl"), "reward": str(ROOT / "recipes" / "tiny" / "rewards.py") + ":digits"}


def _startup_config(tmp_path, **sections):
    from helpers_train import tiny_config

    return tiny_config("grpo", tmp_path, **sections)


@pytest.mark.parametrize("stage, regime, reference, installed, extra, expected", [
    ("1", "offline", "auto", True, {}, "DeepSpeed ZeRO stage 1: expected one of 2, 3"),
    ("", "offline", "auto", True, {}, "DeepSpeed ZeRO stage (not set): expected one of 2, 3"),
    ("2", "offline", "auto", False, {}, "the 'deepspeed' package is not installed (pip install deepspeed)"),
    ("2", "offline", "auto", True, {"train": {"grad_accum": 2}}, "'train.grad_accum': 2 under DeepSpeed"),
    ("3", "online", "auto", True, {}, "ZeRO-3 partitions every weight, and sampling (train.regime=online)"),
    ("3", "offline", "auto", True, {"eval": {"prompts": str(DATA / "eval_prompts.jsonl"), "reward": "exact_match"}},
     "sampling (eval.prompts)"),
    ("3", "offline", "copy", True, {}, "train.reference=copy has no whole weights to copy"),
    ("3", "offline", "frozen", True, {}, "train.reference=frozen has no whole weights to copy"),
    ("3", "offline", "auto", True, {}, None),  # humanline off, offline: the cached reference
    ("2", "online", "auto", True, {}, None),
])
def test_deepspeed_settings_are_checked_at_start_up(tmp_path, monkeypatch, stage, regime, reference, installed,
                                                    extra, expected):
    """A DeepSpeed launch (accelerate sets ACCELERATE_USE_DEEPSPEED and the ZeRO stage) is refused in one line
    where humanline cannot run it: another ZeRO stage, no deepspeed package, gradient accumulation, or ZeRO-3
    where whole weights are needed (sampling, a weight-copy reference)."""
    import types

    from humanline.errors import UserError
    from humanline.training.accelerator import check_deepspeed
    from humanline.training.build import reference_strategy
    from humanline.training.objective_table import SPECS

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", stage)
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed") if installed else None)
    sections = {"rollout": ROLLOUT, "train": {"regime": regime, "max_steps": 2}} if regime != "offline" else {}
    for section, values in extra.items():
        sections.setdefault(section, {}).update(values)
    cfg = _startup_config(tmp_path, **sections)
    cfg.train.reference = reference
    if expected is None:
        check_deepspeed(cfg, reference_strategy(cfg, SPECS["grpo"]))
        return
    with pytest.raises(UserError) as info:
        check_deepspeed(cfg, reference_strategy(cfg, SPECS["grpo"]))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_fsdp_refuses_a_bf16_sampling_copy_and_fsdp1(tmp_path):
    """Under FSDP2 `rollout.dtype: bfloat16` (a second, unsharded copy) is refused with what to use instead;
    an FSDP version 1 config is refused."""
    from types import SimpleNamespace

    from humanline.errors import UserError
    from humanline.training.accelerator import check_distributed

    extra = {"rollout": {**ROLLOUT, "dtype": "bfloat16"}, "train": {"regime": "online", "max_steps": 2}}
    cfg = _startup_config(tmp_path, **extra)
    fsdp2 = SimpleNamespace(is_fsdp2=True, distributed_type=SimpleNamespace(name="FSDP"))
    with pytest.raises(UserError, match="under FSDP use train.mixed_precision: bf16"):
        check_distributed(cfg, fsdp2)
    fsdp1 = SimpleNamespace(is_fsdp2=False, distributed_type=SimpleNamespace(name="FSDP"))
    with pytest.raises(UserError, match="humanline supports FSDP2"):
        check_distributed(_startup_config(tmp_path), fsdp1)
