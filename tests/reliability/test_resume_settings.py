"""Resume from the run, not from the recipe: `--resume` continues the run folder's own settings (command-line
overrides included), accepts only `RESUMABLE` changes (each on record in `segments.jsonl`, `config.yaml` never
rewritten), refuses any other with one line and an untouched folder; the printed stop hint continues the run
exactly, also after a SIGTERM during the final evaluation (honoured at once, the final model saved first); a
lowered `train.max_steps` can be raised again. Every run is the 1-layer tiny model, in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers_reliability import assert_user_error, base_sections, one_thread, run_cli, write_recipe
from helpers_train import tiny_config
from humanline.errors import UserError
from humanline.training.resume_settings import RESUMABLE, SEGMENTS, RunSettings, read_run, resume_changes

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)

# The recipe says 2 steps; every run here is started with a command-line override of it (the runs the stop
# hint used to cut short). Lookahead reference (humanline, k = 2), a checkpoint every 2 steps, a held-out set
# for the final evaluation, and a warm-up long enough that recomputing it from a changed max_steps would show.
ARGS = ["--train.max_steps=6"]


def _recipe(folder: Path, out: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_recipe(folder, base_sections(out), data={"eval_fraction": 0.05},
                        humanline={"enabled": True, "sync_every": 2}, optim={"lr": 1e-2, "warmup_ratio": 0.9},
                        train={"max_steps": 2, "save_every": 2, "keep_checkpoints": 3})


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _losses(out: Path) -> dict[int, float]:
    steps = [r["step"] for r in _rows(out) if "loss" in r]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r["loss"] for r in _rows(out) if "loss" in r}


def _final_eval(out: Path, step: int) -> dict:
    rows = [r for r in _rows(out) if r["step"] == step and any(k.startswith("eval/") for k in r)]
    assert len(rows) == 1, f"{len(rows)} evaluation lines at step {step}"
    return {k: v for k, v in rows[0].items() if k.startswith("eval/") and k != "eval/seconds"}


def _assert_same_run(out: Path, full: Path, steps: int = 6) -> None:
    got, expected = load_file(out / "final" / "model.safetensors"), load_file(full / "final" / "model.safetensors")
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert _losses(out) == _losses(full)
    assert _final_eval(out, steps) == _final_eval(full, steps)


def _hashes(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def _signal_at(monkeypatch, at_step: int) -> None:
    """SIGTERM to this process while step `at_step` is being logged."""
    from humanline.training.metrics_log import MetricsLogger

    real_log = MetricsLogger.log

    def log(self, step, metrics):
        if step == at_step and "loss" in metrics:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_log(self, step, metrics)

    monkeypatch.setattr(MetricsLogger, "log", log)


def _hint(lines: list[str]) -> list[str]:
    """The arguments of the command the stop line prints (after `humanline`)."""
    assert lines[-1].startswith("[humanline] stopped by SIGTERM"), lines[-1]
    command = shlex.split(lines[-1].split("continue with: ", 1)[1])
    assert command[:2] == ["humanline", "train"], command
    return command[1:]


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """The uninterrupted run: the recipe with --train.max_steps=6."""
    from humanline.cli import main

    tmp = tmp_path_factory.mktemp("full")
    out = tmp / "run"
    assert main(["train", str(_recipe(tmp, out)), *ARGS]) == 0
    return out


def test_sigterm_then_the_printed_command_equals_the_uninterrupted_run(tmp_path, full, monkeypatch, capsys):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    with monkeypatch.context() as patch:
        _signal_at(patch, 3)
        code, lines = run_cli(["train", recipe, *ARGS], capsys)
    assert code == 143, "\n".join(lines)
    command = _hint(lines)
    assert command == ["train", "--resume", str(out)]  # the run folder alone: its settings are the run's
    config = (out / "config.yaml").read_bytes()
    recipe.unlink()  # no recipe needed
    code, lines = run_cli(command, capsys)
    assert code == 0, "\n".join(lines)
    assert any("resumed from step 3" in ln for ln in lines), lines
    _assert_same_run(out, full)
    assert (out / "config.yaml").read_bytes() == config, "a resume rewrote the run's config.yaml"
    records = [json.loads(ln) for ln in (out / SEGMENTS).read_text().splitlines()]
    assert [(r["segment"], r["step"], r["changes"]) for r in records] == [(2, 3, {})]


def test_sigterm_during_the_final_evaluation_is_honoured_at_once(tmp_path, full, monkeypatch, capsys):
    """The final evaluation (here made to last a minute) is dropped within seconds of SIGTERM; the checkpoint
    and the final model are saved before it starts; the printed command runs it, and only it."""
    import humanline.training.loop as loop

    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    real_evaluate, sent = loop.evaluate_run, []

    def slow_evaluate(run, cfg):
        assert (out / "final" / "model.safetensors").exists(), "the final model is not saved before its evaluation"
        threading.Timer(0.2, lambda: (sent.append(time.monotonic()), os.kill(os.getpid(), signal.SIGTERM))).start()
        metrics = real_evaluate(run, cfg)
        for _ in range(600):  # an evaluation of a minute, in slices as a batch loop would run
            time.sleep(0.1)
        return metrics

    with monkeypatch.context() as patch:
        patch.setattr(loop, "evaluate_run", slow_evaluate)
        code, lines = run_cli(["train", recipe, *ARGS], capsys)
    stopped = time.monotonic()
    assert code == 143, "\n".join(lines)
    assert sent and stopped - sent[0] < 5, f"SIGTERM honoured {stopped - sent[0]:.1f} s later"
    assert "the final model saved" in lines[-1] and "at step 6" in lines[-1], lines[-1]
    assert not [r for r in _rows(out) if r["step"] == 6 and "eval/loss" in r], "a dropped evaluation was logged"
    got, expected = load_file(out / "final" / "model.safetensors"), load_file(full / "final" / "model.safetensors")
    assert all(torch.equal(got[k], expected[k]) for k in expected)

    code, lines = run_cli(_hint_from(lines), capsys)
    assert code == 0, "\n".join(lines)
    _assert_same_run(out, full)
    code, lines = run_cli(["train", "--resume", out], capsys)  # a finished run: evaluated once, not twice
    assert code == 0, "\n".join(lines)
    _final_eval(out, 6)


def _hint_from(lines: list[str]) -> list[str]:
    return _hint(lines)


def test_sigterm_during_an_evaluation_mid_run_runs_it_on_resume(tmp_path, full, monkeypatch, capsys):
    """train.eval_every=2, SIGTERM inside the evaluation at step 4: it is dropped, the run stops with the step-4
    checkpoint, and the resumed run evaluates step 4 before step 5: every evaluation logged once, the updates
    those of the run without evaluations (an evaluation changes neither the policy nor the training RNG)."""
    import humanline.training.loop as loop

    out = tmp_path / "run"
    real_evaluate, calls = loop.evaluate_run, []

    def evaluate(run, cfg):
        calls.append(1)
        if len(calls) == 2:  # the evaluation at step 4
            os.kill(os.getpid(), signal.SIGTERM)
        return real_evaluate(run, cfg)

    with monkeypatch.context() as patch:
        patch.setattr(loop, "evaluate_run", evaluate)
        code, lines = run_cli(["train", _recipe(tmp_path, out), *ARGS, "--train.eval_every=2"], capsys)
    assert code == 143 and "at step 4" in lines[-1], "\n".join(lines)
    assert [r["step"] for r in _rows(out) if "eval/loss" in r] == [2]
    code, lines = run_cli(_hint(lines), capsys)
    assert code == 0, "\n".join(lines)
    assert [r["step"] for r in _rows(out) if "eval/loss" in r] == [2, 4, 6]
    _assert_same_run(out, full)


def test_a_lowered_max_steps_can_be_raised_again(tmp_path, full, monkeypatch, capsys):
    """6 planned, stopped at 2, resumed to 3 (a finished run), then to 6: the uninterrupted run's weights and
    losses (the lookahead window past step 3 was computed, the warm-up kept its first length); going below the
    steps done is refused; each accepted change is on record, config.yaml is the first segment's."""
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, out)
    with monkeypatch.context() as patch:
        _signal_at(patch, 2)
        assert run_cli(["train", recipe, *ARGS], capsys)[0] == 143
    config = (out / "config.yaml").read_bytes()
    code, lines = run_cli(["train", "--resume", out, "--train.max_steps=3"], capsys)
    assert code == 0, "\n".join(lines)
    assert any("changed: train.max_steps 6 -> 3" in ln for ln in lines), lines
    assert sorted(_losses(out)) == [1, 2, 3]

    before = _hashes(out)
    code, lines = run_cli(["train", "--resume", out, "--train.max_steps=2"], capsys)
    assert_user_error(code, lines, "train.max_steps=2 is below the 3 steps", "--train.max_steps=3")
    assert _hashes(out) == before, "a refused resume changed the run folder"

    code, lines = run_cli(["train", recipe, "--resume", "--train.max_steps=6"], capsys)  # the recipe form
    assert code == 0, "\n".join(lines)
    got, expected = load_file(out / "final" / "model.safetensors"), load_file(full / "final" / "model.safetensors")
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert _losses(out) == _losses(full)
    assert (out / "config.yaml").read_bytes() == config
    records = [json.loads(ln) for ln in (out / SEGMENTS).read_text().splitlines()]
    assert [(r["step"], r["changes"]) for r in records] == [(2, {"train.max_steps": [6, 3]}),
                                                            (3, {"train.max_steps": [3, 6]})]
    assert run_cli(["train", recipe, "--overwrite"], capsys)[0] == 0  # a new run: a new record
    assert not (out / SEGMENTS).exists() and b"max_steps: 2" in (out / "config.yaml").read_bytes()


@pytest.mark.parametrize("override, field, values", [
    ("--optim.lr=0.5", "optim.lr", "is 0.01 in the run"),
    ("--objective.beta=0.3", "objective.beta", "is 0.1 in the run"),
    ("--humanline.sync_every=4", "humanline.sync_every", "is 2 in the run"),
])
def test_a_changed_setting_is_refused_and_the_folder_is_untouched(tmp_path_factory, full, capsys, override, field,
                                                                  values):
    before = _hashes(full)
    code, lines = run_cli(["train", "--resume", full, override], capsys)
    line = assert_user_error(code, lines, f"--resume: {field} {values} but {override.split('=')[1]} now",
                             "another --output-dir", "--overwrite")
    assert line.count("\n") == 0
    assert _hashes(full) == before, "a refused resume changed the run folder"


def test_a_recipe_that_disagrees_with_the_run_is_refused(tmp_path, full, capsys):
    before = _hashes(full)
    recipe = write_recipe(tmp_path, base_sections(full), data={"eval_fraction": 0.05},
                          humanline={"enabled": True, "sync_every": 2}, optim={"lr": 1e-2, "warmup_ratio": 0.1},
                          train={"max_steps": 6, "save_every": 2, "keep_checkpoints": 3})
    code, lines = run_cli(["train", recipe, "--resume"], capsys)
    assert_user_error(code, lines, "--resume: optim.warmup_ratio is 0.9 in the run", "but 0.1 now")
    assert _hashes(full) == before


def test_resume_arguments_are_checked(tmp_path, capsys):
    assert_user_error(*run_cli(["train", "--resume"], capsys), "expected a recipe", "--resume RUN_DIR")
    assert_user_error(*run_cli(["train", "--resume", tmp_path], capsys), "no config.yaml there",
                      "--output-dir")
    assert_user_error(*run_cli(["train", "--resume", tmp_path / "a", "--output-dir", tmp_path / "b"], capsys),
                      "name two run folders")


# ---------------------------------------------------------------- the settings record, without training


def test_resumable_changes_are_listed_and_others_refused(tmp_path):
    run = tiny_config("dpo", tmp_path, steps=4)
    recorded = RunSettings(first=run, now=run, segments=1)
    changed = tiny_config("dpo", tmp_path / ".", steps=8, train={"eval_every": 2}, logging={"log_every": 5})
    assert resume_changes(recorded, changed, tmp_path) == {  # output_dir written as tmp/. is the same folder
        "train.max_steps": [4, 8], "train.eval_every": [0, 2], "logging.log_every": [0, 5]}
    moved = tiny_config("dpo", tmp_path / "moved", steps=4)
    assert resume_changes(recorded, moved, tmp_path / "moved") == {
        "train.output_dir": [str(tmp_path), str(tmp_path / "moved")]}
    with pytest.raises(UserError, match=r"data.max_length is 48 in the run but 64 now \(also changed: "
                                        r"optim.lr\)"):
        resume_changes(recorded, tiny_config("dpo", tmp_path, steps=4, data={"max_length": 64},
                                             optim={"lr": 0.5}), tmp_path)


def test_the_run_settings_are_config_yaml_with_every_segment_applied(tmp_path, capsys):
    from humanline.training.metrics_log import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny_config("dpo", tmp_path, steps=4).to_dict()))
    (tmp_path / SEGMENTS).write_text(
        json.dumps({"segment": 2, "step": 2, "changes": {"train.max_steps": [4, 3]}}) + "\n"
        + json.dumps({"segment": 3, "step": 3, "changes": {"train.max_steps": [3, 9],
                                                           "logging.log_every": [0, 2]}}) + "\n"
        + '{"segment": 4, "st')  # torn by a kill while written: that segment never trained
    run = read_run(tmp_path)
    assert (run.first.train.max_steps, run.now.train.max_steps, run.now.logging.log_every) == (4, 9, 2)
    assert run.segments == 3
    assert read_run(tmp_path / "nothing") is None


def test_the_resumable_fields_are_documented_and_exist():
    from helpers_train import ROOT
    from humanline.training.resume_settings import flat

    usage = (ROOT / "docs" / "usage.md").read_text()
    known = flat(tiny_config("dpo", Path("x")))
    for name in RESUMABLE:
        assert name in known, f"{name} is not a config field"
        assert f"`{name}`" in usage, f"docs/usage.md does not list {name} as resumable"
