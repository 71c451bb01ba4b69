"""A corpus of bad invocations across every subcommand: command-line arguments of `train`, recipe files, resume
situations, run folders that are not a run's, and `data convert`, `data check`, `eval`, `inspect`, `report`,
`config`, `demo` and `reproduce` calls (tests/helpers_invocations*.py: input, exit code, message fragments). Every
one exits with its code (2) and one `humanline: error:` line of at most 300 characters that names what to fix, no
traceback, and leaves the working folder exactly as it was: no file written, changed or removed, no folder made.
Each case runs in this process, in its own folder; resume cases copy one finished 1-step run of the 1-layer tiny
model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from helpers_invocations import _recipe
from helpers_invocations_walk import CASES
from helpers_reliability import DATA, assert_user_error, base_sections, one_thread, run_cli

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)



@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """proj/: data/pairs.jsonl and a finished 1-step run runs/x started from proj/ (frozen reference: a resume
    may train longer)."""
    from humanline.cli import main

    proj = tmp_path_factory.mktemp("finished") / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(DATA / "pairs.jsonl", proj / "data" / "pairs.jsonl")
    sections = base_sections(Path("runs/x"))
    sections["data"]["train"] = "data/pairs.jsonl"
    sections["train"]["reference"] = "frozen"
    here = os.getcwd()
    os.chdir(proj)
    try:
        assert main(["train", str(_recipe(proj, sections))]) == 0
    finally:
        os.chdir(here)
    return proj


def _state(folder: Path) -> dict[str, str]:
    """Every path below `folder`: a folder, a link, or a file's SHA-256."""
    state = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            state[key] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            state[key] = "folder"
        else:
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_invocation_is_one_line_exit_2_and_leaves_nothing(name, tmp_path, monkeypatch, capsys, finished):
    def run(tmp: Path) -> Path:
        proj = tmp / "proj"
        shutil.copytree(finished, proj, symlinks=True)
        inputs = proj / "runs" / "x" / "inputs.json"
        inputs.write_text(inputs.read_text().replace(str(finished.resolve()), str(proj.resolve())))
        return proj / "runs" / "x"

    monkeypatch.chdir(tmp_path)
    make, needles, expected = CASES[name]
    argv = make(tmp_path, run)
    before = _state(tmp_path)
    code, lines = run_cli(argv, capsys)
    assert_user_error(code, lines, *needles, expected_code=expected)
    assert _state(tmp_path) == before, "the invocation changed the folder"


def test_the_corpus_is_large_and_covers_every_subcommand():
    assert len(CASES) >= 150
    assert {name.split("/")[0] for name in CASES} == {"cli", "recipe", "resume", "train", "convert", "check", "eval",
                                                       "inspect", "report", "config", "demo", "reproduce", "top"}
