"""Malformed data: each file gets its own precise message (file:line, field, what was expected), and arbitrary
JSON lines give either valid records or a `UserError`, never another exception."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from humanline.data import KINDS, GroupRecord, PairRecord, PromptRecord, UnpairedRecord, load_records
from humanline.errors import UserError

GOOD_PAIR = '{"prompt": "p", "chosen": "a", "rejected": "b"}'
GOOD_UNPAIRED = '{"prompt": "p", "completion": "a", "label": true}'
GOOD_GROUP = '{"prompt": "p", "completions": ["a", "b"], "scores": [1, 0]}'
GOOD_PROMPT = '{"prompt": "p", "answer": "1"}'
USER = '{"role": "user", "content": "hi"}'
BOT = '{"role": "assistant", "content": "yo"}'


def lines(*rows: str) -> str:
    return "".join(r + "\n" for r in rows)


# (file name, content, expected substring of the error: file:line, field and what was expected)
MALFORMED = [
    ("syntax.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a"'),
     "syntax.jsonl:2: invalid JSON: Expecting ',' delimiter (column 30)"),
    ("array_line.jsonl", lines(GOOD_PAIR, '["p", "a", "b"]'),
     "array_line.jsonl:2: expected a JSON object (one record), got a list"),
    ("no_chosen.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "rejected": "b"}'),
     "no_chosen.jsonl:2: field 'chosen': missing: a pairwise record needs 'prompt', 'chosen' and 'rejected'"),
    ("null_chosen.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": null, "rejected": "b"}'),
     "null_chosen.jsonl:2: field 'chosen': missing"),
    ("number_prompt.jsonl", lines(GOOD_PAIR, '{"prompt": 5, "chosen": "a", "rejected": "b"}'),
     "number_prompt.jsonl:2: field 'prompt': expected a string or a list of messages, got a number: 5"),
    ("empty_prompt.jsonl", lines(GOOD_PAIR, GOOD_PAIR, '{"prompt": "", "chosen": "a", "rejected": "b"}'),
     "empty_prompt.jsonl:3: field 'prompt': empty prompt"),
    ("empty_completion.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "", "label": false}'),
     "empty_completion.jsonl:2: field 'completion': empty completion"),
    ("blank_completion.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": " \\n ", "label": false}'),
     "blank_completion.jsonl:2: field 'completion': empty completion"),
    ("same.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a", "rejected": "a"}'),
     "same.jsonl:2: field 'rejected': identical to 'chosen'"),
    ("label_text.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "a", "label": "yes"}'),
     "label_text.jsonl:2: field 'label': expected true or false, got \"yes\""),
    ("no_label.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": "a"}'),
     "no_label.jsonl:2: field 'label': missing: an unpaired record needs"),
    ("nan.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b", "c"], "scores": [0.1, NaN, 2]}'),
     "nan.jsonl:2: field 'scores': expected a list of 3 finite numbers (one per completion), got [0.1, NaN, 2]"),
    ("inf.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [Infinity, 0]}'),
     "inf.jsonl:2: field 'scores': expected a list of 2 finite numbers (one per completion), got [Infinity, 0]"),
    ("huge.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [1' + "0" * 400 + ', 0]}'),
     "huge.jsonl:2: field 'scores': expected a list of 2 finite numbers"),
    ("short_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b", "c"], "scores": [1, 0]}'),
     "short_scores.jsonl:2: field 'scores': expected a list of 3 finite numbers (one per completion), got [1, 0]"),
    ("bool_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": [true, false]}'),
     "bool_scores.jsonl:2: field 'scores': expected a list of 2 finite numbers (one per completion), "
     "got [true, false]"),
    ("text_scores.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", "b"], "scores": ["1", "0"]}'),
     "text_scores.jsonl:2: field 'scores': expected a list of 2 finite numbers"),
    ("one.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a"], "scores": [1]}'),
     "one.jsonl:2: field 'completions': expected a list of at least 2 completions, got 1"),
    ("text_completions.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": "a b", "scores": [1]}'),
     "text_completions.jsonl:2: field 'completions': expected a list of at least 2 completions, got a string: \"a b\""),
    ("empty_member.jsonl", lines(GOOD_GROUP, '{"prompt": "p", "completions": ["a", ""], "scores": [1, 0]}'),
     "empty_member.jsonl:2: field 'completions[1]': empty completion"),
    ("armorm.jsonl", lines('{"prompt": "p", "all_generated_responses": ["a", "b", "c"], "all_rm_scores": [1, 2]}'),
     "armorm.jsonl:1: field 'all_rm_scores': expected a list of 3 finite numbers (one per completion), got [1, 2]"),
    ("role.jsonl", lines(GOOD_PAIR, '{"prompt": [{"role": "bot", "content": "hi"}], "chosen": "a", "rejected": "b"}'),
     "role.jsonl:2: field 'prompt[0].role': unknown role \"bot\" (expected one of assistant, developer, system, "
     "tool, user)"),
    ("no_content.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + '], "chosen": [{"role": "assistant"}], '
                                          '"rejected": "b"}'),
     "no_content.jsonl:2: field 'chosen[0]': message has no 'content' key (keys: role)"),
    ("list_content.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + ', {"role": "user", "content": ["x"]}], '
                                            '"chosen": "a", "rejected": "b"}'),
     "list_content.jsonl:2: field 'prompt[1].content': expected a string, got a list: [\"x\"]"),
    ("user_completion.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + '], "chosen": [' + BOT + '], '
                                               '"rejected": [' + USER + ']}'),
     "user_completion.jsonl:2: field 'rejected[0].role': a completion holds assistant messages only, got 'user'"),
    ("prompt_ends_assistant.jsonl", lines(GOOD_PAIR, '{"prompt": [' + USER + ', ' + BOT + '], "chosen": "a", '
                                                     '"rejected": "b"}'),
     "prompt_ends_assistant.jsonl:2: field 'prompt[1].role': a prompt must end with a user or tool message, "
     "got 'assistant'"),
    ("empty_messages.jsonl", lines(GOOD_PAIR, '{"prompt": [], "chosen": "a", "rejected": "b"}'),
     "empty_messages.jsonl:2: field 'prompt': expected a string or a non-empty list of {'role', 'content'} messages"),
    ("message_text.jsonl", lines(GOOD_UNPAIRED, '{"prompt": "p", "completion": ["a"], "label": true}'),
     "message_text.jsonl:2: field 'completion[0]': expected a message object with 'role' and 'content', got \"a\""),
    ("implicit.jsonl", lines('{"chosen": [' + BOT + '], "rejected": [{"role": "assistant", "content": "no"}]}'),
     "implicit.jsonl:1: field 'prompt': missing, and 'chosen' and 'rejected' share no leading prompt messages"),
    ("bad_id.jsonl", lines(GOOD_PAIR, '{"prompt": "p", "chosen": "a", "rejected": "b", "prompt_id": [1]}'),
     "bad_id.jsonl:2: field 'prompt_id': expected a non-empty string or an integer id, got [1]"),
    ("answer.jsonl", lines(GOOD_PROMPT, '{"prompt": "p", "answer": {"x": 1}}'),
     "answer.jsonl:2: field 'answer': expected a string or a number, got an object: {\"x\": 1}"),
    ("metadata.jsonl", lines(GOOD_PROMPT, '{"prompt": "p", "metadata": "easy"}'),
     "metadata.jsonl:2: field 'metadata': expected an object, got a string: \"easy\""),
    # '{"prompt": "caf' is 15 bytes, so the Latin-1 e-acute is byte 16.
    ("latin1.jsonl", lines(GOOD_PAIR).encode() + b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n',
     "latin1.jsonl:2: not valid UTF-8 text (byte 16 of the line)"),
    ("empty.jsonl", "\n\n", "empty.jsonl: no records"),
    ("unknown.jsonl", lines('{"question": "q", "response": "r"}'),
     "unknown.jsonl:1: cannot tell the format from the columns (question, response)"),
    ("garbage.jsonl", lines("hello", "world"), "garbage.jsonl:1: cannot tell the format: no row is a JSON object"),
    ("syntax.json", '[\n  {"prompt": "p",\n   "chosen": "a" "rejected": "b"}\n]\n',
     "syntax.json:3: invalid JSON: Expecting ',' delimiter (column 18)"),
    ("scalar.json", "42", "scalar.json: expected a JSON list of records"),
    ("second.json", '[\n  {"prompt": "p", "chosen": "a", "rejected": "b"},\n\n  {"prompt": "q", "chosen": "a"}\n]',
     "second.json:4: field 'rejected': missing"),
    ("cells.csv", 'prompt,chosen,rejected\np,a,b\nq,a,b,c\n', "cells.csv:3: 1 more cells than the header has columns"),
    ("scores.csv", 'prompt,completions,scores\np,"[""a"", ""b""]","[1, 0"\n',
     "scores.csv:2: field 'scores': invalid JSON: Expecting ',' delimiter (column 6)"),
    ("label.csv", 'prompt,completion,label\np,a,true\nq,b,maybe\n',
     "label.csv:3: field 'label': expected true or false, got \"maybe\""),
    ("multiline.csv", 'prompt,chosen,rejected\n"line one\nline two",a,b\nq,"x",""\n',
     "multiline.csv:4: field 'rejected': empty completion"),
    ("dup.csv", "prompt,prompt,chosen,rejected\na,b,c,d\n", "dup.csv:1: the header repeats column(s) 'prompt'"),
    ("latin1.csv", b"prompt,chosen,rejected\np,a,b\ncaf\xe9,a,b\n", "latin1.csv:3: not valid UTF-8 text"),
    ("deep.jsonl", lines(GOOD_PAIR, '{"prompt": ' + "[" * 5000 + "]" * 5000 + "}"),
     "deep.jsonl:2: invalid JSON: nested too deeply"),
    # Deeper than any record format, shallower than any Python's parser recursion limit: the same message on
    # every Python version (3.12 parses the 5,000 levels above that 3.11 refuses).
    ("deep150.jsonl", lines(GOOD_PAIR, '{"prompt": ' + "[" * 150 + "]" * 150 + "}"),
     "deep150.jsonl:2: invalid JSON: nested too deeply (more than 100 levels)"),
    ("deep150.json", '[{"prompt": ' + "[" * 150 + "]" * 150 + ', "chosen": "a", "rejected": "b"}]',
     "deep150.json: invalid JSON: nested too deeply (more than 100 levels in a record)"),
    ("broken.parquet", b"PAR1 this is not parquet PAR1", "broken.parquet: cannot read Parquet"),
]


def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_the_corpus_is_large_and_every_message_is_distinct():
    assert len(MALFORMED) >= 25
    assert len({expected for _, _, expected in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize("name, content, expected", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_file_gives_its_precise_message(tmp_path, name, content, expected):
    path = _write(tmp_path, name, content)
    with pytest.raises(UserError) as default:
        load_records(path)
    assert expected in str(default.value)
    assert "\n" not in str(default.value)
    with pytest.raises(UserError) as strict:
        load_records(path, strict=True)
    assert expected in str(strict.value)


def test_default_mode_counts_all_problems_and_quotes_the_first_five(tmp_path):
    bad = '{"prompt": "p", "chosen": "a", "rejected": "a"}'
    path = _write(tmp_path, "many.jsonl", lines(GOOD_PAIR, *[bad] * 7, GOOD_PAIR))
    with pytest.raises(UserError) as err:
        load_records(path)
    message = str(err.value)
    assert "7 of 9 records are invalid (pairwise format)" in message
    assert "many.jsonl:6: field 'rejected'" in message and "many.jsonl:7:" not in message
    assert "(and 2 more)" in message and "skip_invalid" in message


def test_strict_stops_at_the_first_problem(tmp_path):
    path = _write(tmp_path, "s.jsonl", lines(GOOD_PAIR, '{"prompt": 1, "chosen": "a", "rejected": "b"}', "oops"))
    with pytest.raises(UserError) as err:
        load_records(path, strict=True)
    expected = "s.jsonl:2: field 'prompt': expected a string or a list of messages, got a number: 1"
    assert str(err.value).endswith(expected)


def test_skip_invalid_keeps_valid_records_and_reports_why(tmp_path):
    same = '{"prompt": "p", "chosen": "a", "rejected": "a"}'
    path = _write(tmp_path, "k.jsonl", lines(GOOD_PAIR, same, "{", GOOD_PAIR))
    result = load_records(path, skip_invalid=True)
    assert len(result.records) == 2 and result.skipped == 2
    assert [(p.line, p.field) for p in result.problems] == [(2, "rejected"), (3, None)]
    assert [r.source.line for r in result.records] == [1, 4]
    with pytest.raises(UserError, match="no valid records"):
        load_records(_write(tmp_path, "all_bad.jsonl", lines("{", "[")), kind="pairwise", skip_invalid=True)


def test_explicit_format_that_does_not_fit_hints_at_convert(tmp_path):
    path = _write(tmp_path, "g.jsonl", lines(GOOD_GROUP))
    with pytest.raises(UserError, match="field 'chosen': missing.*looks groups; convert it with "
                                        "`humanline data convert --to pairwise`"):
        load_records(path, kind="pairwise")
    with pytest.raises(UserError, match="data format 'pairs': expected one of pairwise, unpaired, groups, prompts"):
        load_records(path, kind="pairs")


# --- property: arbitrary JSON lines never crash the loader -------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                          max_size=3), max_leaves=8)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "bot"]),
                                  "content": st.text(max_size=4) | _scalars})
_field_value = _json | st.lists(_message, max_size=3) | st.lists(st.text(max_size=3), max_size=4) | st.lists(
    st.floats(allow_nan=True) | st.integers(), max_size=4)
_keys = st.sampled_from(["prompt", "chosen", "rejected", "completion", "label", "completions", "scores", "answer",
                         "metadata", "id", "prompt_id", "all_generated_responses", "all_rm_scores", "other"])
_row = st.dictionaries(_keys, _field_value, max_size=6)
_text_line = st.text(max_size=12).filter(lambda t: "\n" not in t)  # the reader splits on b"\n" only
_line = _row.map(json.dumps) | _json.map(json.dumps) | _text_line


def _assert_valid(record) -> None:
    def is_text_or_messages(value):
        if isinstance(value, str):
            return bool(value.strip())
        return bool(value) and all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in value)

    assert is_text_or_messages(record.prompt) and isinstance(record.prompt_id, str) and record.prompt_id
    if isinstance(record, PairRecord):
        assert is_text_or_messages(record.chosen) and is_text_or_messages(record.rejected)
        assert record.chosen != record.rejected
    elif isinstance(record, UnpairedRecord):
        assert is_text_or_messages(record.completion) and isinstance(record.desirable, bool)
    elif isinstance(record, GroupRecord):
        assert len(record.completions) >= 2 and len(record.scores) == len(record.completions)
        assert all(is_text_or_messages(c) for c in record.completions)
        assert all(isinstance(s, float) and math.isfinite(s) for s in record.scores)
    else:
        assert isinstance(record, PromptRecord) and isinstance(record.metadata, dict)
        assert record.answer is None or isinstance(record.answer, str)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_line, min_size=0, max_size=5), kind=st.sampled_from((None,) + KINDS),
       skip=st.booleans())
def test_arbitrary_json_lines_give_records_or_user_error(rows, kind, skip):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.jsonl"
        path.write_text("\n".join(rows), encoding="utf-8")
        try:
            result = load_records(path, kind=kind, skip_invalid=skip)
        except UserError as err:
            assert str(err)
            return
    assert result.kind in KINDS and result.records
    for record in result.records:
        _assert_valid(record)
