"""Sync rules (core/sync.py): the drift rule's windows by hand, what it reads, its bounds, its state."""

from __future__ import annotations

import math

import pytest
import torch

from humanline.core.humanline import Humanline, HumanlineConfig, make_rule, settings_problems
from humanline.core.sync import DriftRule, SyncRule, next_period


def _tokens(*values: float) -> tuple[torch.Tensor, torch.Tensor]:
    raw = torch.tensor([list(values)], dtype=torch.float64)
    return raw, torch.ones_like(raw, dtype=torch.bool)


def test_next_period_by_hand():
    """floor(L * target / D) within [low, high]; binary fractions keep the arithmetic exact:
    D 1/64 at lag 1, target 1/16 -> 4; D 1/4 at lag 4 -> floor(1) = 1; D 1/64 at lag 3 -> 12 -> high 8;
    D 1/2 at lag 1 -> floor(0.125) = 0 -> low 1."""
    assert next_period(1 / 64, 1, 1 / 16, 1, 8) == 4
    assert next_period(1 / 4, 4, 1 / 16, 1, 8) == 1
    assert next_period(1 / 64, 3, 1 / 16, 1, 8) == 8
    assert next_period(1 / 2, 1, 1 / 16, 1, 8) == 1
    assert next_period(1 / 2, 1, 1 / 16, 2, 8) == 2


def test_drift_rule_windows_by_hand():
    """target 1/16, periods in [1, 8], each at most twice the last. Step 0 syncs (first window: 1 step). Step 1
    syncs; step 0 had lag 0 (the reference was the policy): no information, the period stays 1. Step 1 trains at
    lag 1 with mean |raw| (1/32 + 0) / 2 = 1/64: floor(1 * (1/16) / (1/64)) = 4, capped at 2 * 1, so step 2
    syncs with period 2 (next at 4). Step 3 (lag 2) drifts 1/64 again: floor(2 * 4) = 8, capped at 4 (next at 8).
    Step 7 (lag 3) drifts exactly 0 (no update since the sync): no information, the period stays 4 (next at 12).
    Step 11 (lag 3) drifts 1/8: floor(3 * 0.5) = 1 (next at 13). Other steps' tokens are forgotten."""
    rule = DriftRule(1 / 16, 1, 8)
    decided = []
    drifts = {1: (1 / 32, 0.0), 3: (1 / 32, 0.0), 7: (0.0, 0.0), 11: (-1 / 8, 1 / 8)}
    for step in range(13):
        decided.append(rule.begin(step))
        rule.observe(*_tokens(*drifts.get(step, (0.5 * step,))))
    assert decided == [True, True, True, False, True, False, False, False, True, False, False, False, True]
    assert rule.syncs == [0, 1, 2, 4, 8, 12] and rule.next == 13
    assert [rule.period(s) for s in (0, 1, 2, 4, 8, 12)] == [1, 1, 2, 4, 4, 1]
    assert rule.next_after(2) == 4 and rule.last_before(8) == 4 and rule.count_through(7) == 4
    assert rule.last_drift == pytest.approx(1 / 8)


def test_drift_rule_reads_the_last_step_token_weighted_over_micro_batches_and_processes():
    """Two micro-batches of one step (|raw| 0.125 + 0.375 over 2 tokens, 0.25 over 1 masked-in token of 2) and
    a reduce over 2 identical processes (sums doubled): D = 2 * 0.75 / (2 * 3) = 0.25, lag 1, target 0.5 -> 2."""
    rule = DriftRule(0.5, 1, 8)
    rule.begin(0)
    rule.begin(1)  # a sync (period 1), no information yet
    rule.observe(torch.tensor([[0.125, -0.375]]), torch.tensor([[True, True]]))
    rule.observe(torch.tensor([[0.25, 9.0]]), torch.tensor([[True, False]]))
    assert rule.begin(2, reduce_sum=lambda t: 2 * t)
    assert rule.last_drift == 0.25
    assert rule.next == 4


def test_only_the_main_part_of_training_is_read():
    """Humanline.apply: KTO's mismatched pairs ("kl") and held-out ("eval") log-ratios are not the drift."""
    h = Humanline(HumanlineConfig(enabled=True, sync_every="auto", sync_drift=0.5, sync_max=16, low=-1.0, high=1.0))
    for step in range(2):
        h.begin_step(step)
    h.apply(torch.full((1, 2), 0.25), torch.ones(1, 2, dtype=torch.bool), step=1, index=0)
    h.apply(torch.full((1, 2), 9.0), torch.ones(1, 2, dtype=torch.bool), step=1, index=0, part="kl")
    h.apply(torch.full((1, 2), 9.0), torch.ones(1, 2, dtype=torch.bool), step=1, index=0, mode="eval")
    metrics = h.metrics(1)
    assert metrics["humanline/drift"] == pytest.approx(0.25)
    assert metrics["humanline/sync_period"] == 1.0
    assert h.begin_step(2)
    assert h.rule.next == 4  # target 0.5 * the band's narrower side 1.0; floor(1 * 0.5 / 0.25) = 2
    assert h.metrics(2)["humanline/sync_period"] == 2.0


def test_end_step_hands_the_drift_over_and_the_sync_reads_nothing():
    """Humanline.end_step: the step's window sums (already read back: `sums`, here as if reduced over two
    processes, so they differ from this process's own) reach the drift rule; the next sync decides from them and
    reduces nothing itself. Sums [inside, below, above, tokens, sum raw, sum |raw|] with 4 tokens and |raw| 1.0:
    drift 0.25; target 0.5 x the band's narrower side 1.0, lag 1 -> period floor(0.5 / 0.25) = 2."""
    h = Humanline(HumanlineConfig(enabled=True, sync_every="auto", sync_drift=0.5, sync_max=16, low=-1.0, high=1.0))
    for step in range(2):
        h.begin_step(step)
    h.apply(*_tokens(4.0, -4.0), step=1, index=0)  # this process alone: drift 4 (never read)
    sums = h.end_step(1, sums=[4.0, 0.0, 0.0, 4.0, 0.0, 1.0])

    def no_reduce(_):
        raise AssertionError("the sync reduced its own sums")

    assert sums == [4.0, 0.0, 0.0, 4.0, 0.0, 1.0]
    assert h.metrics(1, sums=sums)["humanline/drift"] == pytest.approx(0.25)
    assert h.begin_step(2, reduce_sum=no_reduce)
    assert h.rule.last_drift == pytest.approx(0.25) and h.rule.next == 4
    assert Humanline.off().end_step(0) is None


def test_the_target_is_a_share_of_the_trust_region():
    """Band [-0.5, 2]: width 0.5. With GRPO's clip eps 0.2 / 0.1: min(0.5, 2, -log 0.8 = 0.223, log 1.1 = 0.0953)
    = 0.0953; the rule's target is sync_drift times that, read at each sync."""
    h = HumanlineConfig(enabled=True, sync_every="auto", sync_drift=0.5, low=-0.5, high=2.0)
    assert Humanline(h).trust_width() == 0.5
    grpo = Humanline(h, ratio_clip=(0.2, 0.1))
    assert grpo.trust_width() == pytest.approx(math.log(1.1))
    assert grpo.rule.target() == pytest.approx(0.5 * math.log(1.1))
    assert make_rule(h).target() == 0.25  # without a Humanline: the band's narrower side


def test_a_sync_with_no_scored_token_keeps_the_period():
    rule = DriftRule(0.1, 2, 8)
    for step in range(5):
        rule.begin(step)
    assert rule.syncs == [0, 2, 4]  # the first window is `low` long; nothing observed, so it stays


def test_sparse_sampling_period_bounds_the_window():
    """make_rule: sync_max 32, but a sparse regime sampling every 8 steps caps windows at 8 (and sync_min too)."""
    h = HumanlineConfig(enabled=True, sync_every="auto", sync_min=10, sync_max=32)
    rule = make_rule(h, sample_every=8)
    assert (rule.low, rule.high) == (8, 8)
    assert make_rule(h).high == 32
    assert isinstance(make_rule(HumanlineConfig(enabled=True, sync_every=4), sample_every=2), SyncRule)


def test_state_round_trip_continues_identically():
    """A rule restored mid-window (its observed sums included) decides the next window as the original does."""
    a = DriftRule(0.05, 1, 16)
    for step in range(3):
        a.begin(step)
        a.observe(*_tokens(0.01 * (step + 1), -0.02))
    b = DriftRule(0.05, 1, 16)
    b.load_state_dict(a.state_dict())
    for rule in (a, b):
        for step in range(3, 12):
            rule.begin(step)
            rule.observe(*_tokens(0.01 * step))
    assert a.syncs == b.syncs and a.next == b.next and len(a.syncs) > 3


def test_humanline_state_holds_the_rule_only_when_adaptive():
    fixed = Humanline(HumanlineConfig(enabled=True, sync_every=3))
    assert "sync_rule" not in fixed.state_dict()  # checkpoints of fixed-k runs are unchanged
    auto = Humanline(HumanlineConfig(enabled=True, sync_every="auto"))
    with pytest.raises(ValueError, match="sync_every: auto"):
        auto.load_state_dict(fixed.state_dict())


@pytest.mark.parametrize("fields, field", [
    ({"sync_every": "often"}, "humanline.sync_every"),
    ({"sync_every": 0}, "humanline.sync_every"),
    ({"sync_drift": 0.0}, "humanline.sync_drift"),
    ({"sync_drift": 101.0}, "humanline.sync_drift"),
    ({"sync_min": 0}, "humanline.sync_min"),
    ({"sync_min": 4, "sync_max": 2}, "humanline.sync_max"),
])
def test_bad_settings_name_the_field(fields, field):
    problems = settings_problems(HumanlineConfig(enabled=True, **fields))
    assert problems and problems[0][0] == field


def test_restart_opens_a_new_first_window():
    """The TRL bridge resyncs at train begin (after a resume): the drift rule's next window starts there."""
    rule = DriftRule(0.05, 2, 8)
    for step in range(3):
        rule.begin(step)
    rule.restart(5)
    assert rule.begin(5) and rule.syncs == [0, 2, 5] and rule.next == 7
