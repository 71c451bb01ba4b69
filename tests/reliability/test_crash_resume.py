"""Crash safety: kill -9 and resume gives the uninterrupted run's weights bit for bit; partial and corrupt
checkpoints are reported and skipped; pruning waits for a complete checkpoint; SIGTERM and Ctrl-C save a
checkpoint and exit with 128 + signal number (143, 130), and the run then resumes exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers_reliability import ROOT, one_thread, run_cli
from helpers_train import params, tiny_config
from humanline.errors import UserError
from humanline.training.checkpoint import verify
from humanline.training.loop import Trainer

DPO = ROOT / "recipes" / "tiny" / "dpo_humanline.yaml"
SPARSE = ROOT / "recipes" / "tiny" / "grpo_sparse_humanline.yaml"
STALE = ROOT / "recipes" / "tiny" / "grpo_stale.yaml"  # a queue of 2 batches and their behaviour log-probs
# 12 steps of 4 pairs, a checkpoint every 2 steps, the lookahead reference (its cache is checkpointed too).
# train.deterministic: on a GPU the resumed run's kernels must add in the same order as the uninterrupted
# run's (attention backward without atomics, no TF32, ...); on the CPU it changes nothing.
# HUMANLINE_TEST_DETERMINISTIC=false runs the check without it (benchmarks/gpu_session.sh, for comparison).
DETERMINISTIC = os.environ.get("HUMANLINE_TEST_DETERMINISTIC", "true")
DPO_ARGS = ["--train.max_steps=12", "--train.save_every=2", "--train.keep_checkpoints=2", "--train.eval_every=0",
            "--train.micro_batch_size=4", "--train.grad_accum=1", "--logging.progress=false",
            f"--train.deterministic={DETERMINISTIC}"]
SPARSE_ARGS = ["--train.max_steps=6", "--train.save_every=0", "--logging.progress=false", "--eval.prompts=null"]

# The killed run: the CLI with each step slowed by 0.15 s so that the kill lands mid-run (numerics unchanged).
SLOW_CLI = """
import sys, time
import humanline.training.loop as t
step = t.Trainer.train_step
def slow(self):
    time.sleep(0.15)
    return step(self)
t.Trainer.train_step = slow
import torch
torch.set_num_threads(1)  # as in the test process: bit-exact comparisons need the same thread count
from humanline.cli import main
sys.exit(main(sys.argv[1:]))
"""

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _losses(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _assert_same_final(a: Path, b: Path) -> None:
    got, expected = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


@pytest.fixture(scope="module")
def dpo_reference(tmp_path_factory) -> Path:
    """The uninterrupted 12-step run."""
    from humanline.cli import main

    out = tmp_path_factory.mktemp("dpo-full")
    cwd = os.getcwd()
    os.chdir(ROOT)  # the recipe's data paths are relative to the repository
    try:
        assert main(["train", str(DPO), "--output-dir", str(out), *DPO_ARGS]) == 0
    finally:
        os.chdir(cwd)
    return out


def _last_step(metrics: Path) -> int:
    if not metrics.exists():
        return 0
    lines = [ln for ln in metrics.read_text().splitlines() if ln.strip().endswith("}")]
    return max((json.loads(ln)["step"] for ln in lines), default=0)

def _kill_when(proc: subprocess.Popen, ready, what: str) -> None:
    """kill -9 `proc` once `ready()` holds; fail with its stderr if it ends first, or with `what` after 240 s."""
    deadline = time.monotonic() + 240
    try:
        while not ready():
            assert proc.poll() is None, f"the run ended before it could be killed:\n{proc.stderr.read().decode()}"
            assert time.monotonic() < deadline, what
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()



def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path, dpo_reference, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "killed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "train", str(DPO), "--output-dir", str(out), *DPO_ARGS],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # past the step-2 and step-4 checkpoints, between saves
    _kill_when(proc, lambda: _last_step(out / "metrics.jsonl") >= 5, "the run did not reach step 5 in time")
    killed_at = _last_step(out / "metrics.jsonl")
    assert 5 <= killed_at < 12 and not (out / "final").exists()

    # the run folder alone: the run's own settings, the command-line overrides it was started with included
    code, lines = run_cli(["train", "--resume", out], capsys)
    assert code == 0, "\n".join(lines)
    resumed = [ln for ln in lines if "resumed from step" in ln]
    assert resumed and int(resumed[0].rsplit(" ", 1)[1]) in range(4, killed_at + 1, 2), lines
    _assert_same_final(out, dpo_reference)
    assert _losses(out) == _losses(dpo_reference)  # the same batches, references and updates, step for step


# The killed run, in its final evaluation: the evaluation takes a minute, after saying it started (numerics
# unchanged; the checkpoint and the final model are saved before it).
SLOW_EVAL_CLI = """
import os, sys, time
import humanline.training.loop as t
evaluate = t.evaluate_run
def slow(run, cfg):
    metrics = evaluate(run, cfg)
    open(os.environ["EVALUATING"], "w").close()
    time.sleep(60)
    return metrics
t.evaluate_run = slow
import torch
torch.set_num_threads(1)
from humanline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _eval_line(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/loss" in r]
    assert len(evals) == 1, f"{len(evals)} evaluation lines"
    return {k: v for k, v in evals[0].items() if k.startswith("eval/") and k != "eval/seconds"}


@pytest.mark.slow  # about 25 s: a subprocess run to its final evaluation
def test_sigkill_during_the_final_evaluation_then_resume(tmp_path, dpo_reference, capsys, monkeypatch):
    """kill -9 while the final evaluation runs: the final model is already saved, and `--resume RUN_DIR`
    evaluates it: the uninterrupted run's weights, losses and final metrics."""
    monkeypatch.chdir(ROOT)
    out, marker = tmp_path / "killed", tmp_path / "evaluating"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src"), "EVALUATING": str(marker)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EVAL_CLI, "train", str(DPO), "--output-dir", str(out),
                             *DPO_ARGS], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _kill_when(proc, marker.exists, "the run did not reach its final evaluation in time")
    assert (out / "final" / "model.safetensors").exists() and "eval/loss" not in (out / "metrics.jsonl").read_text()
    code, lines = run_cli(["train", "--resume", out], capsys)
    assert code == 0, "\n".join(lines)
    _assert_same_final(out, dpo_reference)
    assert _losses(out) == _losses(dpo_reference)
    assert _eval_line(out) == _eval_line(dpo_reference)


# A sampler process draws the stale queue (eta = 2) while the trainer trains; a checkpoint every 2 steps.
ASYNC_ARGS = ["--train.max_steps=8", "--train.save_every=2", "--train.keep_checkpoints=2", "--logging.progress=false",
              "--eval.prompts=null"]


@pytest.mark.slow  # about 25 s on an idle machine: a CLI process and two sampler processes start
def test_async_sampling_killed_and_resumed_equals_the_synchronous_stale_run(tmp_path, capsys, monkeypatch):
    """kill -9 of the trainer mid-run (its sampler process then exits by itself), resume with a new sampler
    process: the same weights and losses as the uninterrupted synchronous stale run at the same eta."""
    monkeypatch.chdir(ROOT)
    sync = tmp_path / "sync"
    assert run_cli(["train", STALE, "--output-dir", sync, *ASYNC_ARGS], capsys)[0] == 0
    out, args = tmp_path / "killed", [*ASYNC_ARGS, "--train.async_sampling=true"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, "train", str(STALE), "--output-dir", str(out), *args],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # past the step-2 and step-4 checkpoints
    _kill_when(proc, lambda: _last_step(out / "metrics.jsonl") >= 5, "the run did not reach step 5 in time")
    assert not (out / "final").exists()
    code, lines = run_cli(["train", STALE, "--output-dir", out, "--resume", *args], capsys)
    assert code == 0, "\n".join(lines)
    assert any("resumed from step 4" in ln or "resumed from step 6" in ln for ln in lines), lines
    _assert_same_final(out, sync)
    assert _losses(out) == _losses(sync)


# ---------------------------------------------------------------- partial and corrupt checkpoints


def _run(out: Path, steps: int, *, resume: bool = False, **train) -> Trainer:
    cfg = tiny_config("dpo", out, steps=steps, humanline={"enabled": True, "sync_every": 2},
                      train={"save_every": 2, "keep_checkpoints": 5, **train})
    trainer = Trainer(cfg, resume=resume)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory) -> tuple[Path, dict]:
    """A finished 6-step run with checkpoints at steps 2, 4 and 6, and its final parameters."""
    out = tmp_path_factory.mktemp("six")
    trainer = _run(out, 6)
    return out, params(trainer.run.unwrapped)


def _copy_run(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    shutil.rmtree(target / "final")
    return target


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage", [
    ("model.safetensors", _truncate, "bytes"),
    ("optimizer.bin", _truncate, "bytes"),
    ("random_states_0.pkl", _flip_last_byte, "checksum"),  # accelerate would silently skip a bad RNG file
    ("humanline_state_0.pt", _flip_last_byte, "checksum"),
    ("trainer_state.json", Path.unlink, "missing"),
], ids=lambda d: d[0])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, six_steps, capsys, damage):
    source, expected = six_steps
    out = _copy_run(source, tmp_path / "run")
    name, spoil, reason = damage
    spoil(out / "checkpoints" / "step-6" / name)
    capsys.readouterr()
    trainer = _run(out, 6, resume=True)
    err = capsys.readouterr().err
    assert f"skipping corrupt checkpoint {out / 'checkpoints' / 'step-6'}" in err and reason in err, err
    assert "resumed from step 4" in err
    got = params(trainer.run.unwrapped)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    assert verify(out / "checkpoints" / "step-6") is None, "the corrupt checkpoint was not rewritten"


def test_partial_checkpoint_folder_is_reported_and_skipped(tmp_path, six_steps, capsys):
    source, expected = six_steps
    out = _copy_run(source, tmp_path / "run")
    ckpts = out / "checkpoints"
    (ckpts / "step-6").rename(ckpts / ".tmp-step-6")  # killed after writing, before the rename
    (ckpts / ".tmp-step-6" / "complete.json").unlink()
    shutil.copytree(ckpts / "step-4", ckpts / "step-5")
    (ckpts / "step-5" / "complete.json").unlink()  # a step folder without its marker
    capsys.readouterr()
    trainer = _run(out, 6, resume=True)
    err = capsys.readouterr().err
    assert f"skipping incomplete checkpoint {ckpts / '.tmp-step-6'}" in err
    assert f"skipping incomplete checkpoint {ckpts / 'step-5'}" in err
    assert "resumed from step 4" in err
    got = params(trainer.run.unwrapped)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not list(ckpts.glob(".tmp-step-*")), "leftover partial checkpoints are cleaned up by the next save"


def test_old_checkpoints_are_pruned_only_after_a_new_one_is_complete(tmp_path, monkeypatch):
    """keep_checkpoints=1: when the disk fills up while writing step 4, step 2 is still there and resumable,
    and the error is a one-line `UserError` saying what is kept."""
    out = tmp_path / "run"
    trainer = Trainer(tiny_config("dpo", out, steps=6, train={"save_every": 2, "keep_checkpoints": 1}))
    real_save_state = trainer.run.accelerator.save_state

    def dies_at_step_4(folder):
        real_save_state(folder)
        if folder.endswith("step-4"):
            (Path(folder) / "optimizer.bin").write_bytes(b"")  # as if the disk filled up
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(trainer.run.accelerator, "save_state", dies_at_step_4)
    with pytest.raises(UserError, match=r"cannot write checkpoint .*step-4 \(No space left on device\); complete "
                                        r"checkpoints kept: step-2; free space .* --resume"):
        trainer.train()
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-2"]  # the partial one is removed to free space
    assert verify(ckpts / "step-2") is None
    monkeypatch.undo()
    resumed = Trainer(tiny_config("dpo", out, steps=6, train={"save_every": 2, "keep_checkpoints": 1}), resume=True)
    assert resumed.step == 2
    resumed.train()
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-6"]  # 4 pruned only after 6 was complete


# ---------------------------------------------------------------- SIGTERM and Ctrl-C


def _signal_at(monkeypatch, signum: int, at_step: int) -> None:
    """Deliver `signum` to this process while step `at_step` is being logged (mid-run, mid-buffer)."""
    from humanline.training.metrics_log import MetricsLogger

    real_log = MetricsLogger.log

    def log(self, step, metrics):
        if step == at_step and "loss" in metrics:
            os.kill(os.getpid(), signum)
        return real_log(self, step, metrics)

    monkeypatch.setattr(MetricsLogger, "log", log)


@pytest.mark.parametrize("recipe, args, signum, at_step, code", [
    (DPO, DPO_ARGS, signal.SIGINT, 3, 130),
    (SPARSE, SPARSE_ARGS, signal.SIGTERM, 2, 143),  # mid-buffer: the samples drawn at step 0 serve steps 0-3
    (STALE, SPARSE_ARGS, signal.SIGTERM, 3, 143),  # the queue holds the batches of steps 3 and 4, sampled ahead
], ids=["dpo-sigint", "grpo-sparse-sigterm", "grpo-stale-sigterm"])
def test_signal_saves_a_checkpoint_and_the_run_resumes_exactly(tmp_path, monkeypatch, capsys, recipe, args, signum,
                                                                at_step, code):
    monkeypatch.chdir(ROOT)
    full = tmp_path / "full"
    assert run_cli(["train", recipe, "--output-dir", full, *args], capsys)[0] == 0
    out = tmp_path / "stopped"
    handler = signal.getsignal(signum)
    with monkeypatch.context() as patch:
        _signal_at(patch, signum, at_step)
        got, lines = run_cli(["train", recipe, "--output-dir", out, *args], capsys)
    assert got == code, "\n".join(lines)
    assert "Traceback" not in "\n".join(lines)
    assert lines[-1].startswith(f"[humanline] stopped by {signal.Signals(signum).name} at step {at_step}")
    assert "--resume" in lines[-1]
    assert (out / "checkpoints" / f"step-{at_step}" / "complete.json").exists()
    assert not (out / "final").exists()
    assert signal.getsignal(signum) is handler, "the previous signal handler was not restored"
    got, lines = run_cli(["train", recipe, "--output-dir", out, "--resume", *args], capsys)
    assert got == 0, "\n".join(lines)
    assert any(f"resumed from step {at_step}" in ln for ln in lines)
    _assert_same_final(out, full)
    assert _losses(out) == _losses(full)


def test_a_refused_resume_leaves_the_run_folder_as_it_was(tmp_path):
    """A cache reference holds log-probs for the first run's steps only: resuming a 4-step run (checkpoint at
    step 2) with train.max_steps 8 is refused, and config.yaml and metrics.jsonl are untouched."""
    out = tmp_path / "run"
    Trainer(tiny_config("dpo", out, steps=4, train={"save_every": 2, "reference": "cache"})).train()
    shutil.rmtree(out / "checkpoints" / "step-4")  # as if the run had been stopped after step 2
    before = {name: (out / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    with pytest.raises(UserError, match=r"train.reference=cache .* first 4 steps only .*train.max_steps <= 4"):
        Trainer(tiny_config("dpo", out, steps=8, train={"save_every": 2, "reference": "cache"}), resume=True)
    assert {name: (out / name).read_bytes() for name in before} == before
