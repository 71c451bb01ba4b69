"""The smaller edges a new user meets: an override written with a space or without its section is one line
saying how to write it; a reward model path that is no folder is our one line, not the hub library's; a folder
another process trains in is said to be so (no --resume hint); an empty recipe is reported as empty; an
eval_fraction that can hold nothing out is an error; a log file gets plain lines, no progress bars."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_reliability import (
    DATA,
    assert_user_error,
    base_sections,
    one_thread,
    online_sections,
    run_cli,
    write_recipe,
)
from humanline.cli import main

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


@pytest.mark.parametrize("args, fix", [
    (["--optim.lr", "1e-3"], "--optim.lr=1e-3"),
    (["--model=tiny"], "--model.name=tiny"),
    (["--steps", "10"], "--train.max_steps=10"),
    (["--lr=1e-4"], "--optim.lr=1e-4"),
])
def test_an_override_written_another_way_is_one_line_saying_how(tmp_path, capsys, args, fix):
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"))
    code, lines = run_cli(["train", recipe, *args], capsys)
    line = assert_user_error(code, lines, "write overrides as --section.key=value", fix)
    assert len(lines) == 1 and "usage:" not in line
    assert not (tmp_path / "run").exists()


def test_a_reward_model_path_that_is_no_folder_is_our_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    sections = online_sections(tmp_path / "run")
    recipe = write_recipe(tmp_path, sections, rollout={"reward": "reward_model:./no_rm"})
    code, lines = run_cli(["train", recipe], capsys)
    line = assert_user_error(code, lines, "reward_model './no_rm': no such folder", "a hub id owner/name")
    assert "Repo id" not in line


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(60)
"""


def test_a_new_run_into_a_folder_another_process_trains_in_does_not_suggest_resume(tmp_path, capsys):
    """The folder holds a run and another process trains in it: "pass --resume" would only meet the lock."""
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path, base_sections(out))
    assert run_cli(["train", recipe], capsys)[0] == 0
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        code, lines = run_cli(["train", recipe], capsys)
        line = assert_user_error(code, lines, "another process is training in it")
        assert "--resume" not in line
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("text", ["", "# nothing here yet\n", "{}\n"])
def test_an_empty_recipe_is_reported_as_empty(tmp_path, capsys, text):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    code, lines = run_cli(["train", recipe], capsys)
    line = assert_user_error(code, lines, f"{recipe}: the recipe is empty")
    assert "data.train" not in line


def test_an_eval_fraction_that_holds_nothing_out_is_an_error(tmp_path, capsys):
    """40 prompts sharing one id: the records of a prompt stay on one side, so data.eval_fraction 0.1 gave no
    held-out set at all, and no word about it."""
    rows = [json.loads(line) for line in (DATA / "pairs.jsonl").read_text().splitlines()[:40]]
    data = tmp_path / "one_id.jsonl"
    data.write_text("".join(json.dumps({**row, "id": "same"}) + "\n" for row in rows))
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"), data={"train": str(data), "eval_fraction": 0.1})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "'data.eval_fraction': 0.1", "its 40 records share one prompt id",
                      "set data.eval")
    assert not (tmp_path / "run").exists()


def test_a_log_file_gets_plain_lines_and_no_progress_bar(tmp_path, capsys):
    """stderr not a terminal (here captured; a log file alike), logging.progress on: no progress bar, ours or the
    libraries' ("Writing model shards"), whose carriage returns make one line of every update."""
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"), logging={"progress": True})
    capsys.readouterr()
    assert main(["train", str(recipe)]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "it/s" not in err and "%|" not in err, err
    assert "[humanline] done:" in err
