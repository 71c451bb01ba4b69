"""The objective table: online unit building follows the same rules as the offline conversions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from humanline.data import GroupRecord, groups_to_pairs, groups_to_unpaired
from humanline.errors import UserError
from humanline.sampling.sampler import units_per_step
from humanline.settings.config import DataConfig
from humanline.training.objective_table import SPECS


def _group(rewards, completions=None, gid="g"):
    completions = completions or [[10 + i] for i in range(len(rewards))]
    return {"id": gid, "prompt": [1, 2], "completions": completions, "rewards": list(rewards)}


def test_kto_completion_at_the_group_mean_is_left_out_online_as_offline():
    """Rewards [1, 0.5, 0], mean 0.5: completion 0 desirable, 2 undesirable, 1 (at the mean) carries no signal
    (it used to be labelled undesirable online while the offline conversion dropped it)."""
    units = SPECS["kto"].units_from_group(_group([1.0, 0.5, 0.0]), DataConfig())
    assert [(u["completion"], u["desirable"]) for u in units] == [([10], True), ([12], False)]


def test_online_units_follow_pair_mode_and_unpaired_rule():
    """all_pairs with threshold 0.35 on [0.2, 0.9, 0.5]: (1, 0) gap 0.7 and (1, 2) gap 0.4 kept, (2, 0) 0.3 not;
    KTO threshold 0.5: 0.9 and 0.5 desirable, 0.2 not, nothing dropped."""
    group = _group([0.2, 0.9, 0.5])
    pairs = SPECS["dpo"].units_from_group(group, DataConfig(pair_mode="all_pairs", pair_threshold=0.35))
    assert [(p["chosen"], p["rejected"]) for p in pairs] == [([11], [10]), ([11], [12])]
    best_worst = SPECS["dpo"].units_from_group(group, DataConfig())
    assert [(p["chosen"], p["rejected"]) for p in best_worst] == [([11], [10])]
    labels = SPECS["kto"].units_from_group(group, DataConfig(unpaired_rule="threshold", unpaired_threshold=0.5))
    assert [u["desirable"] for u in labels] == [False, True, True]


def test_grpo_keeps_groups_with_signal_and_drops_equal_rewards():
    assert SPECS["grpo"].units_from_group(_group([1.0, 0.0]), DataConfig()) == [_group([1.0, 0.0])]
    assert SPECS["grpo"].units_from_group(_group([1.0, 1.0]), DataConfig()) == []


def test_identical_completions_are_never_paired():
    pairs = SPECS["dpo"].units_from_group(_group([1.0, 0.0], completions=[[7], [7]]), DataConfig())
    assert pairs == []


@settings(max_examples=200, deadline=None)
@given(scores=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=2, max_size=5),
       mode=st.sampled_from(["best_worst", "all_pairs"]), rule=st.sampled_from(["mean", "threshold"]))
def test_online_units_equal_the_offline_conversions(scores, mode, rule):
    """Any scored group: the units built online select exactly the records the offline conversion makes."""
    data = DataConfig(pair_mode=mode, unpaired_rule=rule, unpaired_threshold=0.5)
    completions = [[100 + i] for i in range(len(scores))]
    record = GroupRecord("p", [f"c{i}" for i in range(len(scores))], list(scores), "g")
    offline_pairs, _ = groups_to_pairs([record], threshold=data.pair_threshold, mode=mode)
    online_pairs = SPECS["dpo"].units_from_group(_group(scores, completions), data)
    assert [(p.chosen, p.rejected) for p in offline_pairs] == \
        [(f"c{p['chosen'][0] - 100}", f"c{p['rejected'][0] - 100}") for p in online_pairs]
    offline_kto = groups_to_unpaired([record], rule=rule, threshold=0.5)
    online_kto = SPECS["kto"].units_from_group(_group(scores, completions), data)
    assert [(u.completion, u.desirable) for u in offline_kto] == \
        [(f"c{u['completion'][0] - 100}", u["desirable"]) for u in online_kto]


def test_units_per_step_splits_step_major_and_counts_groups_without_units():
    """4 groups for 2 steps: step 0 gets groups 0-1, step 1 groups 2-3; group 1 (equal rewards) gives none."""
    groups = [_group([1.0, 0.0], gid="a"), _group([1.0, 1.0], gid="b"), _group([0.0, 1.0], gid="c"),
              _group([0.5, 0.0], gid="d")]
    per_step, dropped = units_per_step(groups, SPECS["grpo"].units_from_group, DataConfig(), 2)
    assert [[u["id"] for u in units] for units in per_step] == [["a"], ["c", "d"]] and dropped == 1


def test_convert_names_the_formats_an_objective_accepts():
    assert SPECS["grpo"].convert([], "groups", DataConfig()) == ([], None)
    with pytest.raises(UserError, match="unpaired data cannot train objective 'dpo' \\(expected pairwise or groups\\)"):
        SPECS["dpo"].convert([], "unpaired", DataConfig())
    assert SPECS["kto"].kl_part and not SPECS["dpo"].kl_part and not SPECS["grpo"].kl_part
