"""A second run into the same run folder: never two runs' metrics in one metrics.jsonl.

A folder holding a run (a complete checkpoint or a final model) is refused without --resume / --overwrite;
--overwrite removes that run's files (and only those); what a run that failed before its first checkpoint
left behind is cleared by the next run. Every case runs the real CLI in this process on the 1-layer tiny model.
"""

from __future__ import annotations

import json
import shutil
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


def _leftover(tmp: Path, out: Path, capsys) -> None:
    """What a run killed (kill -9) after its steps and before its first checkpoint leaves: its records, metric
    lines no checkpoint holds (the last one torn) and a partial checkpoint."""
    assert run_cli(["train", _recipe(tmp, out, max_steps=2)], capsys)[0] == 0
    shutil.rmtree(out / "checkpoints"), shutil.rmtree(out / "final")
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 3, "lo')
    (out / "checkpoints" / ".tmp-step-2").mkdir(parents=True)


@pytest.mark.parametrize("leftover", ["empty", "killed-before-a-checkpoint", "empty-files-of-a-killed-start"])
def test_folders_left_by_runs_that_failed_early_do_not_block(tmp_path, capsys, leftover):
    out = tmp_path / "run"
    if leftover == "killed-before-a-checkpoint":
        _leftover(tmp_path, out, capsys)
    else:
        out.mkdir()
    if leftover == "empty-files-of-a-killed-start":  # killed while being set up: an empty log, nothing lost
        (out / "metrics.jsonl").write_text("")
        (out / "checkpoints").mkdir()
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=1)], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]


def _users_files(out: Path) -> dict[Path, bytes]:
    """A user's files in `out`: a config.yaml of their own, another tool's checkpoints, notes."""
    files = {out / "config.yaml": b"lr: 3e-4  # my other trainer\n",
             out / "checkpoints" / "other-tool" / "model.safetensors": b"weights of another tool",
             out / "notes.txt": b"mine", out / "metrics.jsonl": b'{"epoch": 1}\n',
             out / "final" / "config.json": b"{}", out / "report.md": b"# my report\n"}
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return files


@pytest.mark.parametrize("flags", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_a_folder_that_holds_no_humanline_run_is_refused_and_left_as_it_is(tmp_path, capsys, flags):
    out = tmp_path / "mine"
    files = _users_files(out)
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=1), *flags], capsys)
    assert_user_error(code, lines, f"'{out}' is not empty and holds no humanline run", "config.yaml",
                      "checkpoints/", "notes.txt", "choose another --output-dir")
    assert {path: path.read_bytes() for path in files} == files
    assert sorted(p.name for p in out.rglob("*")) == sorted({p.name for f in files for p in [f, *f.parents]
                                                              if out in p.parents})


def test_only_config_yaml_of_a_user_is_refused_too(tmp_path, capsys):
    """A lone config.yaml was removed without a word; now the folder is refused."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("mine: 1\n")
    for flags in ([], ["--overwrite"]):
        code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=1), *flags], capsys)
        assert_user_error(code, lines, "holds no humanline run (config.yaml)")
        assert [p.name for p in out.iterdir()] == ["config.yaml"] and (out / "config.yaml").read_text() == "mine: 1\n"


def test_overwrite_removes_only_what_the_run_wrote_and_names_the_rest(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", _recipe(tmp_path, out, max_steps=1)], capsys)[0] == 0
    other = out / "checkpoints" / "other-tool" / "model.safetensors"
    other.parent.mkdir()
    other.write_bytes(b"weights of another tool")
    (out / "notes.txt").write_text("mine")
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2), "--overwrite"], capsys)
    assert code == 0, "\n".join(lines)
    assert other.read_bytes() == b"weights of another tool" and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["other-tool", "step-2"]
    line = next(ln for ln in lines if "removed the previous run's files" in ln)
    assert "left what is not the run's: notes.txt, checkpoints/other-tool" in line, line
    assert _steps(out) == [1, 2]


def test_resume_without_a_checkpoint_drops_the_old_lines(tmp_path, capsys):
    """--resume into a folder whose run never saved a checkpoint starts at step 0 and does not append."""
    out = tmp_path / "run"
    _leftover(tmp_path, out, capsys)
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=2), "--resume"], capsys)
    assert code == 0, "\n".join(lines)
    assert _steps(out) == [1, 2]
    assert "no complete checkpoint found, starting from step 0" in "\n".join(lines)


def test_resume_into_a_folder_of_another_tool_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    files = _users_files(out)
    code, lines = run_cli(["train", _recipe(tmp_path, out, max_steps=1), "--resume"], capsys)
    assert_user_error(code, lines, "holds no run to continue")
    assert {path: path.read_bytes() for path in files} == files


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
