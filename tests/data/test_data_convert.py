"""Conversions between formats, with hand-computed selections."""

from __future__ import annotations

import pytest

from humanline.data import (
    GroupRecord,
    PairRecord,
    UnpairedRecord,
    groups_to_pairs,
    groups_to_unpaired,
    load_records,
    pairs_to_groups,
    pairs_to_unpaired,
    write_records,
)
from humanline.errors import UserError

CHAT = [{"role": "user", "content": "Q"}]


def reply(text):
    return [{"role": "assistant", "content": text}]


GROUPS = [
    GroupRecord("p", ["a", "b", "c"], [0.2, 0.9, 0.5], "g1"),
    GroupRecord("q", ["x", "y"], [0.5, 0.505], "g2"),  # gap 0.005 <= 0.01
    GroupRecord(CHAT, [reply("r"), reply("s"), reply("t")], [1.0, 1.0, 0.0], "g3"),  # tie for best: first wins
]


def test_best_worst_keeps_groups_whose_gap_exceeds_the_threshold():
    """g1: best b (0.9) vs worst a (0.2), gap 0.7; g2: gap 0.005 dropped; g3: best r (first 1.0) vs t."""
    pairs, dropped = groups_to_pairs(GROUPS)
    assert pairs == [PairRecord("p", "b", "a", "g1"), PairRecord(CHAT, reply("r"), reply("t"), "g3")]
    assert dropped == 1
    pairs, dropped = groups_to_pairs(GROUPS, threshold=0.75)  # g1's gap 0.7 no longer exceeds it; g3's 1.0 does
    assert [p.prompt_id for p in pairs] == ["g3"] and dropped == 2


def test_all_pairs_orders_each_pair_by_score():
    """g1 with threshold 0.35: (b, a) gap 0.7 kept, (c, a) gap 0.3 dropped, (b, c) gap 0.4 kept."""
    pairs, dropped = groups_to_pairs(GROUPS[:1], threshold=0.35, mode="all_pairs")
    assert [(p.chosen, p.rejected) for p in pairs] == [("b", "a"), ("b", "c")]
    assert dropped == 1
    pairs, dropped = groups_to_pairs(GROUPS[2:], threshold=0.01, mode="all_pairs")
    assert [(p.chosen, p.rejected) for p in pairs] == [(reply("r"), reply("t")), (reply("s"), reply("t"))]
    assert dropped == 1  # r and s tie


def test_identical_completions_never_become_a_pair():
    pairs, dropped = groups_to_pairs([GroupRecord("p", ["same", "same"], [1.0, 0.0], "g")])
    assert pairs == [] and dropped == 1


def test_groups_to_unpaired_by_mean_and_by_threshold():
    """Mean rule: g1 mean (0.2 + 0.9 + 0.5) / 3 = 0.5333: a and c below, b above; g2 mean 0.5025: x below,
    y above; g3 mean 2/3: r and s above, t below. A completion exactly at its group mean is dropped."""
    records = groups_to_unpaired(GROUPS)
    assert [(r.completion, r.desirable) for r in records[:5]] == [
        ("a", False), ("b", True), ("c", False), ("x", False), ("y", True)]
    assert [r.desirable for r in records[5:]] == [True, True, False] and len(records) == 8
    flat = groups_to_unpaired([GroupRecord("p", ["a", "b", "c"], [0.0, 1.0, 2.0], "m"),
                                        GroupRecord("p", ["d", "e"], [1.0, 1.0], "n")])
    assert [(r.completion, r.desirable) for r in flat] == [("a", False), ("c", True)]  # b, d and e dropped
    by_threshold = groups_to_unpaired(GROUPS[:1], rule="threshold", threshold=0.5)
    assert [r.desirable for r in by_threshold] == [False, True, True]  # 0.5 >= 0.5
    assert all(r.prompt_id == "g1" and r.prompt == "p" for r in by_threshold)


def test_groups_to_unpaired_best_and_worst_only():
    """g1: b (0.9) desirable, a (0.2) undesirable, c left out; g2: y vs x (any gap counts, 0.005 here);
    g3: r (first of the tied best) vs t; a group of equal scores gives nothing."""
    records = groups_to_unpaired([*GROUPS, GroupRecord("p", ["d", "e"], [1.0, 1.0], "n")], rule="best_worst")
    assert [(r.prompt_id, r.completion, r.desirable) for r in records] == [
        ("g1", "b", True), ("g1", "a", False), ("g2", "y", True), ("g2", "x", False),
        ("g3", reply("r"), True), ("g3", reply("t"), False)]


def test_pairs_to_unpaired_and_groups():
    pairs = [PairRecord("p", "a", "b", "1"), PairRecord("p", "a", "c", "1")]
    assert pairs_to_unpaired(pairs) == [UnpairedRecord("p", "a", True, "1"), UnpairedRecord("p", "b", False, "1"),
                                        UnpairedRecord("p", "c", False, "1")]  # the repeated ("a", True) once
    assert pairs_to_groups(pairs[:1]) == [GroupRecord("p", ["a", "b"], [1.0, 0.0], "1")]


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="pair mode 'best': expected one of best_worst, all_pairs"):
        groups_to_pairs(GROUPS, mode="best")
    with pytest.raises(UserError, match="unpaired rule 'median'"):
        groups_to_unpaired(GROUPS, rule="median")
    with pytest.raises(UserError, match="needs a finite threshold, got None"):
        groups_to_unpaired(GROUPS, rule="threshold")


def test_converted_records_round_trip(tmp_path):
    pairs, _ = groups_to_pairs(GROUPS)
    write_records(pairs, tmp_path / "pairs.jsonl")
    assert load_records(tmp_path / "pairs.jsonl").records == pairs
    with pytest.raises(UserError, match="cannot write a mix of formats"):
        write_records(pairs + GROUPS, tmp_path / "mixed.jsonl")
    with pytest.raises(UserError, match="name the output"):
        write_records(pairs, tmp_path / "pairs.csv")
