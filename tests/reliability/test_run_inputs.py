"""A run folder is self-contained about its inputs: a resume works from any directory and from a moved project,
names the same file any way it likes, and refuses a data file edited in place or a hand-edited config.yaml (one
line, the folder untouched); a finished run is not saved again; `--resume` with no run there is exit 2. Every
run is the 1-layer tiny model, 1 or 2 steps, in this process (`humanline.training.run_inputs`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from helpers_reliability import DATA, assert_user_error, base_sections, one_thread, run_cli
from humanline.training.resume_settings import SEGMENTS

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _project(root: Path) -> Path:
    """root/proj: data/pairs.jsonl and recipe.yaml naming it relative to the recipe, run into runs/x."""
    proj = root / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(DATA / "pairs.jsonl", proj / "data" / "pairs.jsonl")
    sections = base_sections(Path("runs/x"))
    sections["data"]["train"] = "data/pairs.jsonl"
    sections["train"].update(save_every=1, reference="frozen")  # frozen: a resume may go past step 1
    (proj / "recipe.yaml").write_text(yaml.safe_dump(sections, sort_keys=False))
    return proj


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Path:
    """A project whose run `runs/x` stopped after 1 of 2 steps (`train.max_steps=1`), started from the project's
    folder with relative paths (copied by each test that changes it)."""
    import os

    from humanline.cli import main

    root = tmp_path_factory.mktemp("started")
    proj = _project(root)
    here = os.getcwd()
    os.chdir(proj)
    try:
        assert main(["train", "recipe.yaml", "--train.max_steps=1"]) == 0
    finally:
        os.chdir(here)
    return proj


def _copy(started: Path, tmp_path: Path) -> Path:
    """A copy of the project, as if the run had been started there (its recorded absolute paths name the copy)."""
    proj = tmp_path / "proj"
    shutil.copytree(started, proj)
    inputs = proj / "runs" / "x" / "inputs.json"
    if inputs.exists():
        inputs.write_text(inputs.read_text().replace(str(started.resolve()), str(proj.resolve())))
    return proj


def _hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _segments(out: Path) -> list[dict]:
    path = out / SEGMENTS
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_run_records_its_inputs_with_paths_that_resolve_from_anywhere(started):
    record = json.loads((started / "runs" / "x" / "inputs.json").read_text())
    (entry,) = record["inputs"]
    assert entry["field"] == "data.train" and entry["given"] == "data/pairs.jsonl"
    assert entry["path"] == str((started / "data" / "pairs.jsonl").resolve())
    assert entry["from_run"] == "../../data/pairs.jsonl"
    assert entry["sha256"] == hashlib.sha256((started / "data" / "pairs.jsonl").read_bytes()).hexdigest()
    config = (started / "runs" / "x" / "config.yaml").read_bytes()
    assert record["config.yaml"]["sha256"] == hashlib.sha256(config).hexdigest()
    assert b"train: data/pairs.jsonl" in config  # the spelling the run was started with, for reading


def test_a_resume_from_another_directory_continues_the_run(started, tmp_path, monkeypatch, capsys):
    proj = _copy(started, tmp_path)
    monkeypatch.chdir(tmp_path)  # not where the run started
    code, lines = run_cli(["train", "--resume", proj / "runs" / "x", "--train.max_steps=2"], capsys)
    assert code == 0, "\n".join(lines)
    assert any("resumed from step 1" in line for line in lines), lines
    (segment,) = _segments(proj / "runs" / "x")
    assert segment["changes"] == {"train.max_steps": [1, 2]}
    assert list(segment["inputs"]["data.train"]) == ["data/pairs.jsonl"]  # the fingerprints this segment checked


@pytest.mark.parametrize("spelling", ["./data/pairs.jsonl", "{proj}/data/pairs.jsonl", "data/../data/pairs.jsonl"])
def test_the_same_file_named_another_way_is_the_same_file(started, tmp_path, monkeypatch, capsys, spelling):
    proj = _copy(started, tmp_path)
    monkeypatch.chdir(proj)
    code, lines = run_cli(["train", "recipe.yaml", "--resume", "--train.max_steps=2",
                           f"--data.train={spelling.format(proj=proj)}"], capsys)
    assert code == 0, "\n".join(lines)
    assert _segments(proj / "runs" / "x")[0]["changes"] == {"train.max_steps": [1, 2]}


def test_a_project_moved_with_its_run_resumes_from_anywhere(started, tmp_path, monkeypatch, capsys):
    """The project (data and run folder) moved: the absolute paths are gone, the paths relative to the run folder
    find the inputs; a third directory resumes it."""
    proj = _copy(started, tmp_path / "a")
    moved = tmp_path / "b" / "proj"
    moved.parent.mkdir()
    shutil.move(proj, moved)
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli(["train", "--resume", moved / "runs" / "x", "--train.max_steps=2"], capsys)
    assert code == 0, "\n".join(lines)


def test_a_moved_project_whose_old_place_is_gone_resumes(started, tmp_path, monkeypatch, capsys):
    proj = _copy(started, tmp_path)
    record = json.loads((proj / "runs" / "x" / "inputs.json").read_text())
    record["inputs"][0]["path"] = str(tmp_path / "gone" / "data" / "pairs.jsonl")  # where it was before a move
    (proj / "runs" / "x" / "inputs.json").write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli(["train", "--resume", proj / "runs" / "x", "--train.max_steps=2"], capsys)
    assert code == 0, "\n".join(lines)


def test_a_data_file_edited_in_place_is_refused_and_the_folder_is_untouched(started, tmp_path, monkeypatch, capsys):
    """Chosen and rejected swapped in the run's own data file: the resume would train on reversed preferences."""
    proj = _copy(started, tmp_path)
    data = proj / "data" / "pairs.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps({**r, "chosen": r["rejected"], "rejected": r["chosen"]}) + "\n" for r in rows))
    out, before = proj / "runs" / "x", _hashes(proj / "runs" / "x")
    monkeypatch.chdir(proj)
    code, lines = run_cli(["train", "--resume", "runs/x", "--train.max_steps=2"], capsys)
    assert_user_error(code, lines, "--resume: data.train: file 'data/pairs.jsonl'", "changed since the run started",
                      "restore it", "another --output-dir")
    assert _hashes(out) == before


@pytest.mark.parametrize("edit, field", [("beta: 0.1", "beta: 0.5"), ("lr: 0.001", "lr: 0.5")])
def test_a_hand_edited_config_yaml_is_refused(started, tmp_path, monkeypatch, capsys, edit, field):
    """An edited objective.beta used to take effect unrecorded, an edited optim.lr to be ignored: both refused."""
    proj = _copy(started, tmp_path)
    out = proj / "runs" / "x"
    config = out / "config.yaml"
    assert edit in config.read_text()
    config.write_text(config.read_text().replace(edit, field))
    before = _hashes(out)
    monkeypatch.chdir(proj)
    code, lines = run_cli(["train", "--resume", "runs/x", "--train.max_steps=2"], capsys)
    assert_user_error(code, lines, "runs/x/config.yaml was edited after the run started", "undo it",
                      "--section.key=value")
    assert _hashes(out) == before


def test_a_finished_run_is_not_saved_again_and_gets_no_segment(started, tmp_path, monkeypatch, capsys):
    proj = _copy(started, tmp_path)
    monkeypatch.chdir(proj)
    assert run_cli(["train", "--resume", "runs/x", "--train.max_steps=2"], capsys)[0] == 0  # to its end
    out = proj / "runs" / "x"
    before, segments = _hashes(out), _segments(out)
    stamps = {p: p.stat().st_mtime_ns for p in (out / "final").iterdir()}
    code, lines = run_cli(["train", "--resume", "runs/x"], capsys)
    assert code == 0, "\n".join(lines)
    assert "the run is finished (step 2 of 2" in lines[-1] and "--train.max_steps=N (N > 2)" in lines[-1]
    assert {p: p.stat().st_mtime_ns for p in (out / "final").iterdir()} == stamps, "final/ was saved again"
    assert _segments(out) == segments and _hashes(out) == before


def test_a_run_without_inputs_json_resumes_only_when_trusted_and_records_them(started, tmp_path, monkeypatch, capsys):
    proj = _copy(started, tmp_path)
    out = proj / "runs" / "x"
    (out / "inputs.json").unlink()  # as an earlier version left it, or removed by hand
    monkeypatch.chdir(proj)
    before = _hashes(out)
    code, lines = run_cli(["train", "--resume", "runs/x", "--train.max_steps=2"], capsys)
    assert_user_error(code, lines, "has no inputs.json", "--trust-inputs")  # never whatever the inputs are now
    assert _hashes(out) == before
    code, lines = run_cli(["train", "--resume", "runs/x", "--train.max_steps=2", "--trust-inputs"], capsys)
    assert code == 0, "\n".join(lines)
    assert any("no inputs.json" in line and "recorded now" in line for line in lines), lines
    assert json.loads((out / "inputs.json").read_text())["inputs"][0]["given"] == "data/pairs.jsonl"


def test_resume_with_no_run_to_continue_is_exit_2(tmp_path, monkeypatch, capsys):
    """`--resume` where nothing was run, also `train --resume RECIPE` (a recipe file for a folder), never starts a
    new run: exit 2, nothing created."""
    proj = _project(tmp_path)
    monkeypatch.chdir(proj)
    for argv in (["train", "recipe.yaml", "--resume"], ["train", "--resume", "recipe.yaml"],
                 ["train", "recipe.yaml", "--resume", "--output-dir", "runs/y"]):
        code, lines = run_cli(argv, capsys)
        assert_user_error(code, lines, "holds no run to continue", "leave out --resume")
        assert not (proj / "runs").exists()


# ---------------------------------------------------------------- fingerprints, without training


def test_a_large_file_is_hashed_in_spread_blocks_and_any_rewrite_shows(tmp_path, monkeypatch):
    from humanline.training import run_inputs  # new with inputs.json

    monkeypatch.setattr(run_inputs, "FULL_HASH_LIMIT", 1000)
    monkeypatch.setattr(run_inputs, "BLOCK", 100)
    path = tmp_path / "big.bin"
    path.write_bytes(bytes(range(256)) * 20)  # 5120 bytes: over the limit
    first = run_inputs.fingerprint(path)
    assert first["sha256"].startswith("sampled:") and first["size"] == 5120
    assert run_inputs.fingerprint(path) == first
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last block is always read
    path.write_bytes(bytes(data))
    assert run_inputs.fingerprint(path) != first


def test_a_folder_print_covers_every_file_but_hidden_ones(tmp_path):
    from humanline.training import run_inputs  # new with inputs.json

    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(b"abc")
    first = run_inputs.fingerprint(folder)
    assert first["kind"] == "folder" and first["size"] == 5
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x").write_text("download metadata")
    assert run_inputs.fingerprint(folder) == first  # caches are not the model
    (folder / "sub" / "w.bin").write_bytes(b"abd")
    assert run_inputs.fingerprint(folder) != first


def test_inputs_are_local_paths_and_names_are_strings(tmp_path, monkeypatch):
    from helpers_train import tiny_config
    from humanline.training import run_inputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()  # a folder named like the tiny model does not make `tiny` a folder
    (tmp_path / "r.py").write_text("def f(prompts, completions, **_):\n    return [0.0] * len(completions)\n")
    cfg = tiny_config("dpo", tmp_path / "run", rollout={"reward": [{"type": "r.py:f", "weight": 1.0},
                                                                  "exact_match"]},
                      eval={"reward": "./r.py:f", "prompts": "reasoning_gym:chain_sum?size=4"})
    fields = [(field, Path(path).name) for field, path in run_inputs.local_paths(cfg)]
    assert fields == [("data.train", "pairs.jsonl"), ("rollout.reward", "r.py"), ("eval.reward", "r.py")]
    assert run_inputs.canonical("rollout.reward", ["./r.py:f"]) == run_inputs.canonical(
        "rollout.reward", [f"{tmp_path}/r.py:f"])
    assert run_inputs.canonical("data.train", "owner/dataset") == "owner/dataset"
    (tmp_path / "runs" / "sft" / "final").mkdir(parents=True)  # a run folder as the model: its final model
    (tmp_path / "runs" / "sft" / "final" / "config.json").write_text("{}")
    assert run_inputs.canonical("model.name", "./runs/sft") == str(tmp_path.resolve() / "runs" / "sft" / "final")
