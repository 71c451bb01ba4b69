"""`humanline report` includes the numbers of the `eval.json` that `humanline eval` wrote beside the run."""

from __future__ import annotations

import json

from humanline.cli import main


def _run(folder, eval_result=None):
    folder.mkdir()
    rows = [{"step": s, "loss": 0.7 - 0.1 * s, "time/step": 0.1, "elapsed_s": 0.2 * s} for s in (1, 2)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if eval_result is not None:
        (folder / "eval.json").write_text(json.dumps(eval_result))
    return folder


def test_the_report_shows_eval_json_numbers(tmp_path, capsys):
    result = {"model": "runs/x", "prompts": "p.jsonl", "reward_spec": "math_verify", "num_prompts": 32, "n": 4,
              "reward": {"mean": 0.28125, "std": 0.45, "num_failed": 0}, "pass@1": 0.28125,
              "pass@1_stderr": 0.061, "pass@4": 0.5, "success_threshold": 1.0,
              "length": {"tokens": {"mean": 41.25}}}
    run = _run(tmp_path / "run", result)
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert "## Evaluation (eval.json: `humanline eval`)" in text
    assert "- model: runs/x; prompts: p.jsonl (32 x 4 samples); reward: math_verify" in text
    assert "- reward: 0.2812 ± 0.45 (std over samples; 0 failed)" in text
    assert "- pass@1 = 0.2812 ± 0.061 (s.e.), pass@4 = 0.5" in text
    assert "- mean completion length: 41.2 tokens" in text
    assert text == capsys.readouterr().out.rstrip("\n") + "\n"


def test_without_eval_json_there_is_no_evaluation_section(tmp_path):
    run = _run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    assert "## Evaluation" not in (run / "report.md").read_text()


def test_an_unreadable_eval_json_is_named(tmp_path):
    run = _run(tmp_path / "run")
    (run / "eval.json").write_text("{not json")
    assert main(["report", str(run)]) == 0
    assert "eval.json: unreadable (JSONDecodeError), not reported" in (run / "report.md").read_text()


def test_an_earlier_report_edited_by_hand_is_kept_without_overwrite(tmp_path, capsys):
    run = _run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    (run / "report.md").write_text("# my notes on this run\n")
    png = (run / "curves.png").read_bytes()
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("humanline: error: report:")
    assert "report.md exists" in err[-1] and "--overwrite" in err[-1]
    assert (run / "report.md").read_text() == "# my notes on this run\n" and (run / "curves.png").read_bytes() == png
    assert main(["report", str(run), "--overwrite"]) == 0
    assert (run / "report.md").read_text().startswith("# Run report")


def test_the_report_counts_the_syncs_the_run_logged(tmp_path):
    """It read a key no run logs ("syncs") and said 0 beside its own plot of humanline/syncs."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 0.7, "time/step": 0.1, "humanline/syncs": syncs} for s, syncs in ((1, 6), (2, 20))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run)]) == 0
    assert "reference syncs: 20" in (run / "report.md").read_text()


def test_a_read_only_run_folder_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    import os

    from humanline.evaluation import run_report

    run = _run(tmp_path / "run")
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path).startswith(str(run)) else real(path, mode))
    monkeypatch.setattr(run_report, "plot_run", lambda *a: (_ for _ in ()).throw(AssertionError("plotted")))
    capsys.readouterr()
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"humanline: error: report: cannot write into {run} (not writable); report.md and curves.png go "
                   f"there"]
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]
