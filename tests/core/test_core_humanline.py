"""The humanline object (core/humanline.py): sync rule, lag, token-weighted metrics by hand, the off form,
seeded draws per part, and the one settings check shared by recipes and the TRL bridge."""

from __future__ import annotations

import pytest
import torch

from humanline.core.humanline import Humanline, HumanlineConfig, SyncRule, settings_problems


def _on(**fields) -> Humanline:
    return Humanline(HumanlineConfig(enabled=True, **fields))


def test_sync_rule_and_lag_by_hand():
    """k = 3: syncs at 0, 3, 6; the reference used at step s holds theta_j, j the last sync before s (theta_0 at
    step 0), so the lag s - j is 0, 1, 2, 3, 1, 2, 3, 1; syncs counted through s: 1, 1, 1, 2, 2, 2, 3, 3."""
    h = _on(sync_every=3)
    assert [h.rule.at(s) for s in range(7)] == [True, False, False, True, False, False, True]
    assert [h.steps_since_sync(s) for s in range(8)] == [0, 1, 2, 3, 1, 2, 3, 1]
    assert [h.rule.count_through(s) for s in range(8)] == [1, 1, 1, 2, 2, 2, 3, 3]
    assert h.rule.next_after(3) == 6 and h.rule.last_before(3) == 0 and h.rule.last_before(0) is None
    h.restart(4)  # the reference was reset to theta_4 (a bridge resyncs at train begin after a resume)
    assert [h.steps_since_sync(s) for s in (4, 5, 6, 7)] == [0, 1, 2, 1]
    assert [h.begin_step(s) for s in range(4)] == [True, False, False, True]


def test_metrics_are_token_weighted_by_hand():
    """Band [-1, 1]. Micro-batch 1: raws 0.5, -2 and a masked-out 9 (2 tokens: 1 inside, 1 below). Micro-batch 2:
    raws 0, 0.2, 3, 0.1 (4 tokens: 3 inside, 1 above). Token-weighted: inside 4/6, below 1/6, above 1/6, mean raw
    (0.5 - 2 + 0 + 0.2 + 3 + 0.1) / 6 = 0.3. (A mean of per-micro-batch fractions would give inside 0.625.)"""
    h = _on(sync_every=2, low=-1.0, high=1.0)
    h.apply(torch.tensor([[0.5, -2.0, 9.0]]), torch.tensor([[True, True, False]]), step=1, index=0)
    h.apply(torch.tensor([[0.0, 0.2], [3.0, 0.1]]), torch.ones(2, 2, dtype=torch.bool), step=1, index=1)
    h.apply(torch.tensor([[5.0]]), torch.ones(1, 1, dtype=torch.bool), step=1, index=1, part="kl")  # not counted
    m = h.metrics(1)
    assert m["humanline/inside_band"] == pytest.approx(4 / 6)
    assert m["humanline/below_band"] == pytest.approx(1 / 6) and m["humanline/above_band"] == pytest.approx(1 / 6)
    assert m["humanline/log_ratio_mean"] == pytest.approx(0.3)
    assert (m["humanline/low"], m["humanline/high"]) == (-1.0, 1.0)
    assert m["humanline/steps_since_sync"] == 1.0 and m["humanline/syncs"] == 1.0
    doubled = h.metrics(2, reduce_sum=lambda t: 2 * t)  # a new window: nothing scored, bounds and counters only
    assert "humanline/inside_band" not in doubled and doubled["humanline/syncs"] == 2.0


def test_reduce_sum_combines_processes_by_tokens():
    """Process A: 1 of 1 token inside; process B: 0 of 3 inside. Across processes: 1/4, not (1 + 0) / 2."""
    a, b = _on(low=-1.0, high=1.0), _on(low=-1.0, high=1.0)
    a.apply(torch.tensor([[0.1]]), torch.ones(1, 1, dtype=torch.bool), step=0, index=0)
    b.apply(torch.tensor([[2.0, 3.0, -4.0]]), torch.ones(1, 3, dtype=torch.bool), step=0, index=0)
    total = a.windows["train"].sums + b.windows["train"].sums
    assert a.metrics(0, reduce_sum=lambda t: total)["humanline/inside_band"] == pytest.approx(0.25)


def test_off_form_is_the_identity_and_logs_nothing():
    h = Humanline.off()
    raw = torch.tensor([[3.0, -3.0]], requires_grad=True)
    assert h.apply(raw, torch.ones(1, 2, dtype=torch.bool), step=0, index=0) is raw
    assert h.begin_step(0) is False and h.metrics(0) == {} and not h.rule.at(0)
    assert h.generator(0, 0) is None


def test_clip_zero_gradient_outside_and_reject_draws_seeded_per_part():
    h = _on(low=-0.5, high=0.5)
    raw = torch.tensor([[-1.0, 0.2, 0.9]], requires_grad=True)
    h.apply(raw, torch.ones(1, 3, dtype=torch.bool), step=0, index=0).sum().backward()
    assert raw.grad.tolist() == [[0.0, 1.0, 0.0]]
    r = _on(transform="reject")
    draws = {(p, i): torch.rand(4, generator=r.generator(3, i, p)) for p in ("main", "kl") for i in (0, 1)}
    assert torch.equal(draws[("main", 0)], torch.rand(4, generator=r.generator(3, 0, "main")))
    assert not torch.equal(draws[("main", 0)], draws[("kl", 0)])
    assert not torch.equal(draws[("main", 0)], draws[("main", 1)])


@pytest.mark.parametrize("fields,name", [
    ({"sync_every": 0}, "humanline.sync_every"), ({"transform": "mix"}, "humanline.transform"),
    ({"low": 0.1}, "humanline.low"), ({"high": -1.0}, "humanline.high"), ({"gamma_r": 0}, "humanline.gamma_r"),
    ({"band": "wide"}, "humanline.band"), ({"band_quantiles": [0.9, 0.1]}, "humanline.band_quantiles"),
    ({"band_rate": 0.0}, "humanline.band_rate"), ({"band": "auto", "transform": "reject"}, "humanline.band"),
])
def test_settings_problems_name_the_field(fields, name):
    assert settings_problems(HumanlineConfig(**fields))[0][0] == name
    assert settings_problems(HumanlineConfig()) == []


def test_sync_rule_never():
    rule = SyncRule(None)
    assert not rule.at(0) and rule.next_after(5) is None and rule.count_through(9) == 0
