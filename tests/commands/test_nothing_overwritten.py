"""Nothing is overwritten without being asked: `data convert` refuses to write over its input (under any name)
or over an existing file without --overwrite; `eval` writes where its help says and keeps an earlier result
unless told; `inspect` creates its output folder only with its first file, so a user error leaves none."""

from __future__ import annotations

import json
import os

import pytest

from helpers_reliability import DATA, assert_user_error, run_cli

GROUPS = [{"id": f"g{i}", "prompt": f"{i}+1=", "completions": [str(i + 1), "x"], "scores": [1.0, 0.0]}
          for i in range(4)]


@pytest.fixture
def groups(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "groups.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in GROUPS))
    return path


@pytest.mark.parametrize("output", ["groups.jsonl", "./groups.jsonl", "{tmp}/groups.jsonl", "link.jsonl"])
def test_convert_refuses_to_write_over_its_input(groups, tmp_path, capsys, output):
    os.symlink(groups, tmp_path / "link.jsonl")
    before = groups.read_bytes()
    for extra in ([], ["--overwrite"]):  # not even when asked
        code, lines = run_cli(["data", "convert", "groups.jsonl", output.format(tmp=tmp_path), "--to", "pairwise",
                               *extra], capsys)
        assert_user_error(code, lines, "is the input file 'groups.jsonl'", "write to another file")
        assert groups.read_bytes() == before  # the groups and their scores are all there


def test_convert_replaces_an_existing_file_only_with_overwrite(groups, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    out.write_text("mine\n")
    code, lines = run_cli(["data", "convert", groups, out, "--to", "pairwise"], capsys)
    assert_user_error(code, lines, f"'{out}' exists: pass --overwrite to replace it")
    assert out.read_text() == "mine\n"
    assert run_cli(["data", "convert", groups, out, "--to", "pairwise", "--overwrite"], capsys)[0] == 0
    assert len(out.read_text().splitlines()) == 4


def test_eval_of_a_model_name_writes_eval_name_json_and_keeps_an_earlier_result(tmp_path, monkeypatch, capsys):
    """`humanline eval tiny` wrote ./eval.json and replaced the previous one; now ./eval-tiny.json, as --help
    says, and a second evaluation needs --overwrite."""
    monkeypatch.chdir(tmp_path)
    argv = ["eval", "tiny", "--prompts", DATA / "eval_prompts.jsonl", "--reward", "exact_match", "--n", "1",
            "--max-new-tokens", "2"]
    code, lines = run_cli(argv, capsys)
    assert code == 0, "\n".join(lines)
    result = tmp_path / "eval-tiny.json"
    first = result.read_bytes()
    assert json.loads(first)["model"] == "tiny" and not (tmp_path / "eval.json").exists()
    code, lines = run_cli(argv, capsys)
    assert_user_error(code, lines, "'eval-tiny.json' holds an earlier result: pass --overwrite")
    assert result.read_bytes() == first
    assert run_cli([*argv, "--overwrite", "--seed", "1"], capsys)[0] == 0


def test_eval_help_says_where_the_result_goes(capsys):
    with pytest.raises(SystemExit):
        run_cli(["eval", "--help"], capsys)
    text = " ".join(capsys.readouterr().out.split())
    assert "MODEL_OR_RUN/eval.json for a model or run folder, else ./eval-NAME.json" in text


PAIRS = str(DATA / "pairs.jsonl")
INSPECT = {  # each a user error found after the output folder used to be made
    "data/missing-file": lambda tmp: ["inspect", "data", tmp / "none.jsonl", "--model", "tiny"],
    "data/unknown-model": lambda tmp: ["inspect", "data", PAIRS, "--model", "no-such-model"],
    "perception/missing-prompts": lambda tmp: ["inspect", "perception", "--policy", "tiny", "--reference", "tiny",
                                               "--prompts", tmp / "none.jsonl"],
    "perception/missing-data": lambda tmp: ["inspect", "perception", "--policy", "tiny", "--reference", "tiny",
                                            "--prompts", PAIRS, "--data", tmp / "none.jsonl", "--n", "1",
                                            "--max-prompts", "1", "--max-new-tokens", "1", "--bootstrap", "1"],
}


@pytest.mark.parametrize("case", list(INSPECT))
def test_inspect_leaves_no_empty_folder_on_a_user_error(tmp_path, monkeypatch, capsys, case):
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli([*INSPECT[case](tmp_path), "--output-dir", tmp_path / "out" / "inspect"], capsys)
    assert_user_error(code, lines)
    assert list(tmp_path.iterdir()) == [], "a folder was left behind"


def test_inspect_output_under_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, lines = run_cli(["inspect", "data", DATA / "pairs.jsonl", "--model", "tiny", "--output-dir",
                           tmp_path / "file" / "out"], capsys)
    assert_user_error(code, lines, "--output-dir", "is a file, not a folder")
    assert (tmp_path / "file").read_text() == "x"


EVAL = ["--prompts", DATA / "eval_prompts.jsonl", "--reward", "exact_match", "--n", "1", "--max-new-tokens", "1"]


def test_eval_of_a_built_in_name_takes_it_over_a_folder_of_that_name_and_says_so(tmp_path, monkeypatch, capsys):
    """`eval tiny` failed in any folder holding a `tiny/` subfolder, where train and inspect took the built-in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "notes.txt").write_text("mine")
    code, lines = run_cli(["eval", "tiny", *EVAL], capsys)
    assert code == 0, "\n".join(lines)
    assert any("'tiny' is the built-in model; the folder ./tiny is not read" in line for line in lines)
    assert json.loads((tmp_path / "eval-tiny.json").read_text())["model"] == "tiny"
    assert [p.name for p in (tmp_path / "tiny").iterdir()] == ["notes.txt"]


def _read_only(monkeypatch, folder) -> None:
    """`folder` reads as not writable (tests run as root, for whom a chmod changes nothing), and any model load
    fails the test: the refusal must come before the work."""
    from humanline.commands import evaluate

    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: (not mode & os.W_OK and real(path, mode))
                        if str(path).startswith(str(folder)) else real(path, mode))
    monkeypatch.setattr(evaluate, "load_eval_model", lambda *a: pytest.fail("the model was loaded"))


def test_eval_into_a_read_only_folder_is_refused_before_any_generation(tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    _read_only(monkeypatch, locked)
    code, lines = run_cli(["eval", "tiny", *EVAL, "--output", locked / "r.json"], capsys)
    assert_user_error(code, lines, "--output", "is not writable")
    assert list(locked.iterdir()) == []


def test_data_convert_into_a_read_only_folder_is_one_line(groups, tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    _read_only(monkeypatch, locked)
    code, lines = run_cli(["data", "convert", groups, locked / "pairs.jsonl", "--to", "pairwise"], capsys)
    assert_user_error(code, lines, "data convert", "is not writable")


def test_a_write_that_fails_after_the_checks_is_one_line_too(groups, tmp_path, monkeypatch, capsys):
    """The disk may fill between the check and the write: still one line, no traceback."""
    from humanline.commands import data

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data, "write_records", full)
    code, lines = run_cli(["data", "convert", groups, tmp_path / "pairs.jsonl", "--to", "pairwise"], capsys)
    assert_user_error(code, lines, "cannot write", "No space left on device")


def test_eval_shows_its_progress_on_a_terminal(capsys):
    from humanline.data.load import load_records
    from humanline.evaluation.generations import evaluate_generations
    from humanline.model.loading import load_model, load_tokenizer, model_config_for
    from humanline.sampling.rollout import GenerationConfig

    cfg = model_config_for("tiny", tiny_hidden_size=16, tiny_layers=1)
    tokenizer = load_tokenizer(cfg)
    records = load_records(DATA / "eval_prompts.jsonl", kind="prompts").records[:6]
    evaluate_generations(load_model(cfg, tokenizer), tokenizer, records, None, progress=True,
                         gen=GenerationConfig(max_new_tokens=1, n=1, batch_size=4))
    err = capsys.readouterr().err
    assert "eval: sampling 1 per prompt" in err and "6/6" in err
