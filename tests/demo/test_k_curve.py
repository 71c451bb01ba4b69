"""scripts/experiments/k_curve.py on two hand-made demo folders: the paired differences and the mechanism
columns equal values computed by hand."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "k_curve.py"


def _run_dir(root: Path, name: str, rows: list[dict]) -> str:
    run = root / name
    run.mkdir(parents=True)
    lines = [json.dumps({"step": i, "loss": 0.1, **r}) for i, r in enumerate(rows)]
    lines.append(json.dumps({"event": "final"}))  # not a training row: left out of the means
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return str(run)


def _folder(root: Path, runs: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "results.json").write_text(json.dumps({"runs": runs}))
    return root


def test_k_curve_pairs_by_seed_and_reads_the_mechanism(tmp_path, capsys, monkeypatch):
    k1 = [{"regime": "offline+humanline-k1", "seed": s, "final_reward": v,
           "run_dir": _run_dir(tmp_path / "runs", f"k1-{s}", [{"log_ratio/abs_mean": 0.01, "clip_fraction": 0.1,
                                                               "humanline/sync_period": 1}])}
          for s, v in [(0, 0.50), (1, 0.60), (2, 0.70)]]
    auto = [{"regime": "offline+humanline-kauto", "seed": s, "final_reward": v,
             "run_dir": _run_dir(tmp_path / "runs", f"auto-{s}",
                                 [{"log_ratio/abs_mean": 0.02, "clip_fraction": 0.2, "humanline/sync_period": 2},
                                  {"log_ratio/abs_mean": 0.04, "clip_fraction": 0.0, "humanline/sync_period": 4}])}
            for s, v in [(0, 0.55), (1, 0.60), (3, 0.90)]]  # seed 3 has no k = 1 partner
    a = _folder(tmp_path / "a", k1)
    b = _folder(tmp_path / "b", auto)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(a), str(b)])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0].strip("| "): line for line in out[2:]}
    assert rows["offline+humanline-k1"].split(" | ")[3:5] == ["—", "—"]
    # paired over seeds 0 and 1: diffs 0.05 and 0.00 -> mean 0.025, sd 0.0354, se 0.025, z 1.0
    cells = [c.strip() for c in rows["offline+humanline-kauto"].strip("|").split("|")]
    assert cells[1] == "0.683 ± 0.189"  # 0.55 / 0.60 / 0.90
    assert cells[3] == "+0.025 ± 0.025" and cells[4] == "+1.0"
    assert cells[5:] == ["0.0300", "3.0", "0.100"]


def test_k_curve_names_a_missing_results_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_.value.code == 2
    assert f"{tmp_path / 'results.json'}: no such file" in capsys.readouterr().err
