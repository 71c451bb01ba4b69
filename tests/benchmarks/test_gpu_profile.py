"""The GPU profile script: its trace arithmetic on a hand-made trace (default suite), and a whole `--small`
run on the CPU (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers_train import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import trace_stats  # noqa: E402


def _x(cat, name, ts, dur, tid=1, corr=None):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {} if corr is None else {"correlation": corr}}


def test_step_stats_on_a_hand_made_trace():
    """One step of 100 us: phases collate [0, 20), forward+loss [20, 60) with the head's label [40, 60) inside,
    optimizer [60, 100). Kernels: a gemm [25, 35) launched at 22, a softmax [45, 50) launched at 41 (in the head),
    adam [80, 90) launched at 62. Busy 10 + 5 + 10 = 25 us of 100. Gaps, charged to the phase that launched the
    kernel ending them: [0, 25) and [35, 45) to forward+loss (35 us), [50, 80) to the optimizer (30 us), the tail
    [90, 100) to "after last kernel". Groups: the gemm is GEMM, the softmax head (its launch was under the head's
    label), adam optimizer. One cudaStreamSynchronize, one aten op."""
    events = [_x("user_annotation", "profiled_step", 0, 100), _x("user_annotation", "collate", 0, 20),
              _x("user_annotation", "forward+loss", 20, 40), _x("user_annotation", "head", 40, 20),
              _x("user_annotation", "optimizer", 60, 40),
              _x("cuda_runtime", "cudaLaunchKernel", 22, 1, corr=1),
              _x("cuda_runtime", "cudaLaunchKernel", 41, 1, corr=2),
              _x("cuda_runtime", "cudaLaunchKernel", 62, 1, corr=3),
              _x("cuda_runtime", "cudaStreamSynchronize", 95, 2),
              _x("kernel", "ampere_bf16_gemm_128x64", 25, 10, tid=7, corr=1),
              _x("kernel", "softmax_warp_forward", 45, 5, tid=7, corr=2),
              _x("kernel", "multi_tensor_apply_kernel<FusedAdamMathFunctor>", 80, 10, tid=7, corr=3),
              _x("cpu_op", "aten::mm", 23, 5)]
    stats = trace_stats.step_stats(events, step="profiled_step", phases={"collate", "forward+loss", "optimizer"})
    assert stats["device_busy_share"] == pytest.approx(0.25)
    assert stats["kernel_launches_per_step"] == 3 and stats["cuda_syncs_per_step"] == 1
    assert stats["device_ms_per_step_by_group"] == pytest.approx({"GEMM": 0.010, "head": 0.005, "optimizer": 0.010})
    assert stats["idle_ms_per_step_by_phase"] == pytest.approx(
        {"forward+loss": 0.035, "optimizer": 0.030, "after last kernel": 0.010})
    assert stats["host_ms_per_step_by_phase"] == pytest.approx({"collate": 0.02, "forward+loss": 0.04,
                                                               "optimizer": 0.04})
    assert stats["aten_ops_per_step"] == 1


@pytest.mark.slow
def test_small_run_on_the_cpu(tmp_path):
    """The whole script on a tiny model: every part runs and reports (the figures mean nothing on a CPU)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--small", "--deadline", "900"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = ROOT / "benchmarks" / "results" / "gpu_profile_small.json"
    results = json.loads(written.read_text())["results"]
    written.unlink()  # a check of the script, not figures to keep
    assert not [r for r in results if "error" in r], results
    steps = [r for r in results if r["kind"] == "step"]
    assert {(r["objective"], r["side"]) for r in steps} == {(o, s) for o in ("dpo", "grpo") for s in ("trl", "ours")}
    for r in steps:
        assert r["s_per_step"] > 0 and r["aten_ops_per_step"] > 0 and r["host_ms_per_step_by_phase"]
        assert r["syncs_per_step"]["total"] >= 0
    ours = [r for r in steps if r["side"] == "ours"]
    assert all(r["host_ms_per_step_by_phase"].get("forward+loss", 0) > 0 for r in ours)
    rates = next(r for r in results if r["kind"] == "rates")
    assert set(rates["sampling_tokens_per_s"]) == set(rates["training_tokens_per_s"]) == {"16", "32"}
    assert all(v > 0 for v in rates["sampling_tokens_per_s"].values())
