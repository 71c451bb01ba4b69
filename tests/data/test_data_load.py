"""Loading every format, plain and conversational, from every source type; splits, shuffling, prompt ids."""

from __future__ import annotations

import csv
import hashlib
import json

import pytest

from humanline.data import (
    GroupRecord,
    PairRecord,
    PromptRecord,
    UnpairedRecord,
    hash_prompt,
    load_records,
    parse_rows,
    parse_split,
    split_records,
    write_records,
)
from humanline.errors import UserError

USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


# (kind, plain row, conversational row, expected record from the plain row)
FORMATS = [
    ("pairwise", {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
     {"prompt": USER, "chosen": assistant("Red."), "rejected": assistant("No.")},
     PairRecord("2+2?", "4", "5", hash_prompt("2+2?"))),
    ("unpaired", {"prompt": "2+2?", "completion": "4", "label": True},
     {"prompt": USER, "completion": assistant("Red."), "label": False},
     UnpairedRecord("2+2?", "4", True, hash_prompt("2+2?"))),
    ("groups", {"prompt": "2+2?", "completions": ["4", "5", "22"], "scores": [1, 0, 0.5]},
     {"prompt": USER, "completions": [assistant("Red."), assistant("Blue.")], "scores": [0.2, 0.1]},
     GroupRecord("2+2?", ["4", "5", "22"], [1.0, 0.0, 0.5], hash_prompt("2+2?"))),
    ("prompts", {"prompt": "2+2?", "answer": 4},
     {"prompt": USER, "answer": "red"},
     PromptRecord("2+2?", hash_prompt("2+2?"), "4", {})),
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_csv(path, rows):
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: v if isinstance(v, str) else json.dumps(v) for k, v in row.items()})
    return path


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_json(path, rows):
    path.write_text(json.dumps(rows, indent=2))
    return path


WRITERS = {"jsonl": write_jsonl, "json": write_json, "csv": write_csv, "parquet": write_parquet}


@pytest.mark.parametrize("suffix", sorted(WRITERS))
@pytest.mark.parametrize("kind, plain, chat, expected", FORMATS, ids=[f[0] for f in FORMATS])
def test_each_format_loads_plain_and_conversational_from_each_file_type(tmp_path, suffix, kind, plain, chat, expected):
    rows = [plain, chat]
    if suffix == "parquet":  # one Arrow type per column: write plain and conversational to separate files
        result_plain = load_records(write_parquet(tmp_path / "a.parquet", [plain]))
        result_chat = load_records(write_parquet(tmp_path / "b.parquet", [chat]))
        records = result_plain.records + result_chat.records
        assert result_plain.kind == result_chat.kind == kind
    else:
        result = load_records(WRITERS[suffix](tmp_path / f"data.{suffix}", rows))
        assert result.kind == kind and result.problems == [] and result.skipped == 0
        records = result.records
    assert records[0] == expected
    assert isinstance(records[1].prompt, list) and records[1].prompt[0]["role"] == "system"
    assert records[1].prompt_id == hash_prompt(USER)


def test_locations_are_file_lines_for_text_and_rows_for_tables(tmp_path):
    rows = [{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "d", "chosen": "e", "rejected": "f"}]
    jsonl = load_records(write_jsonl(tmp_path / "d.jsonl", rows)).records
    assert [str(r.source) for r in jsonl] == [f"{tmp_path}/d.jsonl:1", f"{tmp_path}/d.jsonl:2"]
    # Pretty-printed JSON: indent=2 puts '[' on line 1, the first object on line 2, the second on line 7.
    pretty = load_records(write_json(tmp_path / "d.json", rows)).records
    assert [r.source.line for r in pretty] == [2, 7]
    table = load_records(write_parquet(tmp_path / "d.parquet", rows)).records
    assert [str(r.source) for r in table] == [f"{tmp_path}/d.parquet row 0", f"{tmp_path}/d.parquet row 1"]


def test_trl_implicit_prompt_and_armorm_full_conversations_are_split_at_the_prompt(tmp_path):
    """TRL implicit prompt: shared leading turns become the prompt. UltraFeedback-ArmoRM: `chosen` repeats the
    user turn of the string `prompt`; groups come from `all_generated_responses` / `all_rm_scores`."""
    convo = [{"role": "user", "content": "Hi"}]
    implicit = {"chosen": convo + assistant("Hello!"), "rejected": convo + assistant("Bye.")}
    armorm = {"prompt_id": "abc", "prompt": "Hi", "chosen": convo + assistant("Hello!"),
              "rejected": convo + assistant("Bye."), "all_generated_responses": ["Hello!", "Bye.", "Hm."],
              "all_rm_scores": [0.9, 0.1, 0.5]}
    pair = parse_rows([implicit]).records[0]
    assert (pair.prompt, pair.chosen, pair.rejected) == (convo, assistant("Hello!"), assistant("Bye."))
    path = write_jsonl(tmp_path / "armorm.jsonl", [armorm])
    groups = load_records(path)
    assert groups.kind == "groups"
    assert groups.records[0] == GroupRecord("Hi", ["Hello!", "Bye.", "Hm."], [0.9, 0.1, 0.5], "abc")
    pairs = load_records(path, kind="pairwise").records
    assert pairs[0] == PairRecord("Hi", assistant("Hello!"), assistant("Bye."), "abc")


def test_prompt_id_comes_from_the_data_or_a_stable_hash():
    rows = [{"prompt": "p", "completion": "a", "label": True}, {"prompt": "p", "completion": "b", "label": False},
            {"prompt": "q", "completion": "c", "label": True, "id": 7},
            {"prompt": "q", "completion": "c", "label": True, "id": 7, "prompt_id": "P"}]
    records = parse_rows(rows).records
    # The hash is sha1 of the prompt's canonical JSON ('"p"'), first 16 hex digits: stable across runs.
    assert records[0].prompt_id == records[1].prompt_id == hashlib.sha1(b'"p"').hexdigest()[:16]
    assert hash_prompt("p") != hash_prompt("q")
    assert [records[2].prompt_id, records[3].prompt_id] == ["7", "P"]  # prompt_id wins over id


def test_prompt_rows_keep_answer_and_extra_columns_as_metadata():
    row = {"prompt": "1+1?", "answer": "2", "level": 3, "metadata": {"source": "x"}, "chosen": "2"}
    record = parse_rows([row], kind="prompts").records[0]
    assert record.answer == "2" and record.metadata == {"level": 3, "source": "x"}


@pytest.mark.parametrize("kind, plain, chat, expected", FORMATS, ids=[f[0] for f in FORMATS])
def test_write_records_round_trips_through_load_records(tmp_path, kind, plain, chat, expected):
    records = parse_rows([plain, chat, {**plain, "prompt_id": "x"}]).records
    path = tmp_path / "sub" / f"{kind}.jsonl"
    assert write_records(records, path) == 3
    again = load_records(path)
    assert again.kind == kind and again.records == records and again.records[2].prompt_id == "x"


def test_datasets_folder_with_splits_and_slices(tmp_path):
    import datasets

    rows = [{"prompt": f"p{i}", "chosen": "a", "rejected": "b"} for i in range(10)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:3])}).save_to_disk(str(tmp_path / "ds"))
    assert [r.prompt for r in load_records(tmp_path / "ds", split="test").records] == ["p0", "p1", "p2"]
    assert [r.prompt for r in load_records(tmp_path / "ds", split="train[8:]").records] == ["p8", "p9"]
    with pytest.raises(UserError, match=r"no split 'validation' \(splits: train, test\)"):
        load_records(tmp_path / "ds", split="validation")


def test_folder_of_split_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "a"}])
    write_jsonl(tmp_path / "test.jsonl", [{"prompt": "b"}, {"prompt": "c"}])
    assert len(load_records(tmp_path, split="test").records) == 2
    with pytest.raises(UserError, match="holds a 'eval' file"):
        load_records(tmp_path, split="eval")


def test_split_slices_of_a_file_are_complementary_and_shuffle_is_seeded(tmp_path):
    """10 rows: 'train[:75%]' takes floor(10 * 75 / 100) = 7 rows, 'train[75%:]' the other 3."""
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(10)])
    head = [r.prompt for r in load_records(path, split="train[:75%]").records]
    tail = [r.prompt for r in load_records(path, split="train[75%:]").records]
    assert head == [f"p{i}" for i in range(7)] and tail == ["p7", "p8", "p9"]
    shuffled = [r.prompt for r in load_records(path, shuffle=True, seed=3).records]
    assert shuffled == [r.prompt for r in load_records(path, shuffle=True, seed=3).records]
    assert sorted(shuffled) == sorted(head + tail) and shuffled != head + tail
    with pytest.raises(UserError, match="a single file holds one split"):
        load_records(path, split="test")


@pytest.mark.parametrize("split", ["train[:150%]", "train[a:b]", "tr ain", "train[:5"])
def test_bad_split_specs_are_user_errors(split):
    with pytest.raises(UserError, match="split"):
        parse_split(split)


def test_split_records_keeps_each_prompt_on_one_side():
    rows = [{"prompt": f"p{i // 3}", "completion": f"c{i}", "label": i % 2 == 0} for i in range(30)]  # 10 prompts
    records = parse_rows(rows).records
    train, held_out = split_records(records, 0.2, seed=1)
    assert len({r.prompt_id for r in held_out}) == 2 and len(held_out) == 6  # round(10 * 0.2) prompts x 3
    assert not {r.prompt_id for r in train} & {r.prompt_id for r in held_out}
    assert split_records(records, 0.2, seed=1) == (train, held_out)
    assert split_records(records, 0.0) == (records, [])
    one_prompt = records[:3]
    assert split_records(one_prompt, 0.5) == (one_prompt, [])  # never everything to eval
    with pytest.raises(UserError, match=r"eval_fraction: expected a number in \[0, 1\)"):
        split_records(records, 1.0)


def test_missing_sources_and_offline_hub_are_user_errors(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="no such file or folder"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "data.txt").write_text("hello")
    with pytest.raises(UserError, match="unsupported file type '.txt'"):
        load_records(tmp_path / "data.txt")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="owner/dataset: not a local file or folder, nor a hub dataset in the local "
                                        "cache .*HF_HUB_OFFLINE is set"):
        load_records("owner/dataset")
