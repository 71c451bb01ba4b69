"""`humanline demo --quick` as a user runs it (CI runs this): table on stdout, results.json, report.md, plot."""

from __future__ import annotations

import json

from humanline.cli import main


def test_demo_quick_runs_to_completion(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| grpo | offline+humanline |" in printed and "| grpo | online |" in printed
    results = json.loads((out / "results.json").read_text())
    assert {r["regime"] for r in results["runs"]} == {"offline", "offline+humanline", "online"}
    assert all(0.0 <= r["final_reward"] <= 1.0 for r in results["runs"])
    assert (out / "report.md").exists() and (out / "reward_grpo.png").exists()
