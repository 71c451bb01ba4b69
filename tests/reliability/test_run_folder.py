"""A second run into the same run folder: never two runs' metrics in one metrics.jsonl.

A folder holding a run (a complete checkpoint or a final model) is refused without --resume / --overwrite;
--overwrite removes that run's files (and only those); what a run that failed before its first checkpoint
left behind is cleared by the next run. Every case runs the real CLI in this process on the 1-layer tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers_reliability import assert_user_error, base_sections, one_thread, run_cli, write_recipe
from helpers_train import tiny_config
from humanline.errors import UserError
from humanline.training.loop import Trainer

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _steps(out: Path) -> list[int]:
    """Step numbers of metrics.jsonl, which must be strict JSON (no NaN literals)."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))["step"] for line in lines]


def _recipe(tmp: Path, out: Path, **train) -> Path:
    return write_recipe(tmp, base_sections(out), train=train)


def test_second_run_is_refused_then_overwrite_starts_clean(tmp_path, capsys):
    out = tmp_path / "run"
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2)], capsys)
    assert code == 0, "\n".join(lines)
    first = (out / "metrics.jsonl").read_text()
    assert _steps(out) == [1, 2]

    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=3)], capsys)
    line = assert_user_error(code, lines, f"'{out}' holds a run", "checkpoint step-2", "a final model",
                             "pass --resume to continue it, or --overwrite to start again")
    assert (out / "metrics.jsonl").read_text() == first, "a refused run touched the folder"

    (out / "notes.txt").write_text("mine")  # not a run file: --overwrite must leave it alone
    (out / "report.md").write_text("report of the first run")
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=3), "--overwrite"], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1, 2, 3], "metrics of the two runs were mixed"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3"]
    assert (out / "notes.txt").read_text() == "mine" and not (out / "report.md").exists()
    assert any("removed the previous run's files" in ln and "checkpoints" in ln for ln in lines)
    assert line.count("\n") == 0


def test_resume_continues_and_resume_with_overwrite_is_refused(tmp_path, capsys):
    """A copy reference (offline humanline) can go past the first run's max_steps (a recipe may differ from the
    run in that field); the default cache reference holds log-probs for the first run's steps only, so extending
    it is refused with one line, not a crash."""
    out = tmp_path / "run"
    copy = {"humanline": {"enabled": True}, "train": {"reference": "copy"}}

    def recipe(steps: int, reference: dict) -> Path:
        changes = {k: dict(v) for k, v in reference.items()}
        changes.setdefault("train", {}).update(max_steps=steps)
        return write_recipe(tmp_path, base_sections(out), **changes)

    assert run_cli(["train", recipe(2, copy)], capsys)[0] == 0
    code, lines = run_cli(["train", recipe(3, copy), "--resume"], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1, 2, 3]
    code, lines = run_cli(["train", recipe(4, copy), "--resume", "--overwrite"], capsys)
    assert_user_error(code, lines, "--resume and --overwrite exclude each other")

    assert run_cli(["train", recipe(2, {}), "--overwrite"], capsys)[0] == 0
    before = {name: (out / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    code, lines = run_cli(["train", recipe(3, {}), "--resume"], capsys)
    assert_user_error(code, lines, "--resume", "train.reference=cache", "first 2 steps", "train.max_steps <= 2")
    assert _steps(out) == [1, 2]
    assert {name: (out / name).read_bytes() for name in before} == before  # the refusal changed nothing


def test_a_run_into_what_a_diverged_run_left_gives_exactly_its_own_metrics(tmp_path, capsys, monkeypatch):
    """A real divergence (lr 1e12, past the start-up bound on optim.lr, lifted here) stops with exit 3 before any
    checkpoint; its metrics, run_info.json and config.yaml are left. A valid run into that folder starts clean:
    its metrics are exactly its own steps."""
    from humanline.training import config_checks

    monkeypatch.setattr(config_checks, "MAX_LR", float("inf"))
    out = tmp_path / "run"
    bad = write_recipe(tmp_path, base_sections(out), optim={"lr": 1.0e12},
                       train={"max_steps": 4, "max_bad_steps": 1, "micro_batch_size": 4})
    code, lines = run_cli(["train", bad], capsys)
    assert code == 3, "\n".join(lines)
    assert _steps(out) == [1] and not (out / "checkpoints").exists()  # the aborting step 2 is not logged

    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2)], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1, 2]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(r["loss"], float) for r in rows), "a step of the diverged run survived"
    assert json.loads((out / "run_info.json").read_text())  # rewritten by the new run


@pytest.mark.parametrize("leftover", ["empty", "config-only", "torn-metrics"])
def test_folders_left_by_runs_that_failed_early_do_not_block(tmp_path, capsys, leftover):
    out = tmp_path / "run"
    out.mkdir()
    if leftover != "empty":
        (out / "config.yaml").write_text("model: {name: tiny}\n")
    if leftover == "torn-metrics":  # killed mid-write before its first checkpoint
        (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.7}\n{"step": 2, "lo')
        (out / "checkpoints" / ".tmp-step-2").mkdir(parents=True)
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=1)], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]


def test_resume_without_a_checkpoint_drops_the_old_lines(tmp_path, capsys):
    """--resume into a folder whose run never saved a checkpoint starts at step 0 and does not append."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 0.7}\n{"step": 2, "loss": 0.6}\n{"step": 3, "loss": 0.5}\n')
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2), "--resume"], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1, 2]
    assert "no complete checkpoint found, starting from step 0" in "\n".join(lines)


def test_python_api_has_the_same_rules(tmp_path):
    cfg = tiny_config("dpo", tmp_path, steps=1)
    Trainer(cfg).train()
    with pytest.raises(UserError, match=r"holds a run .*resume=True \| overwrite=True"):
        Trainer(cfg)
    with pytest.raises(UserError, match="exclude each other"):
        Trainer(cfg, resume=True, overwrite=True)
    Trainer(cfg, overwrite=True).train()
    assert _steps(tmp_path) == [1]


@pytest.mark.slow
def test_demo_twice_into_the_same_folder(tmp_path, monkeypatch, capsys):
    """`humanline demo` trains into runs/<name> under its output folder: a second demo run replaces them
    (about 2 minutes: the demo's data are cached by the first run)."""
    from humanline.cli import main

    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "demo"
    for _ in range(2):
        assert main(["demo", "--quick", "--output-dir", str(out)]) == 0
    for run in (out / "runs").iterdir():
        steps = _steps(run)  # eval lines repeat a step number; two runs would restart at 1
        assert steps[0] == 1 and steps == sorted(steps), f"{run}: metrics of the first demo run were kept"


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(60)
"""


def _try_lock(folder: Path) -> int:
    """Exit status of another process that tries to lock `folder` without waiting (0: it got the lock)."""
    import subprocess
    import sys

    probe = "import fcntl, os, sys; fcntl.flock(os.open(sys.argv[1], os.O_RDONLY), fcntl.LOCK_EX | fcntl.LOCK_NB)"
    return subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True).returncode


def test_a_folder_another_process_trains_in_is_refused_before_anything_changes(tmp_path, capsys):
    """Another process holds the folder (as a run still training, or a reproduction's orphaned worker, does): a
    new run into it, and a resumed one, stop with one line naming the folder, and nothing in it changes. Once a
    run's `train()` has returned, another process may take the folder."""
    import subprocess
    import sys

    out = tmp_path / "run"
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2)], capsys)
    assert code == 0, "\n".join(lines)
    assert _try_lock(out) == 0  # released at the end of train()
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in (["--overwrite"], ["--resume"]):
            code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=3), *extra], capsys)
            assert_user_error(code, lines, f"train.output_dir '{out}': another process is training in it")
        assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()
