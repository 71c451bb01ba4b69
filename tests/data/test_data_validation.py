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

from helpers_data import GOOD_GROUP, GOOD_PAIR, MALFORMED, _write, lines
from humanline.data import KINDS, GroupRecord, PairRecord, PromptRecord, UnpairedRecord, load_records
from humanline.errors import UserError


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


def test_default_mode_counts_all_problems_quotes_the_first_and_lists_five_for_debug(tmp_path):
    bad = '{"prompt": "p", "chosen": "a", "rejected": "a"}'
    path = _write(tmp_path, "many.jsonl", lines(GOOD_PAIR, *[bad] * 7, GOOD_PAIR))
    with pytest.raises(UserError) as err:
        load_records(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: field 'rejected': identical to 'chosen' (a pair needs two different "
                              f"completions) (7 of 9 records are invalid, pairwise format); fix them")
    assert message.count(str(path)) == 1 and "skip_invalid" in message
    details = err.value.details.splitlines()
    assert details[0] == f"  {path}:2: field 'rejected': identical to 'chosen' (a pair needs two different completions)"
    assert len(details) == 6 and details[-1] == "  ... and 2 more"


def test_when_every_record_is_invalid_skipping_them_is_not_suggested(tmp_path):
    """The 1,349-character line suggested skip_invalid, which would have dropped every record."""
    path = _write(tmp_path, "g.jsonl", lines(GOOD_GROUP, GOOD_GROUP))
    with pytest.raises(UserError) as err:
        load_records(path, kind="pairwise")
    assert "skip_invalid" not in str(err.value) and str(err.value).endswith("(every one is: is the file pairwise "
                                                                             "records?)")


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
