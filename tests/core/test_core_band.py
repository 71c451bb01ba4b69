"""The self-calibrating humanline band (docs/method.md §3.4): the rule by hand, reaching and holding its target
on synthetic drift, the sign constraint, zero gradient outside the band it sets, state round trip."""

from __future__ import annotations

import math

import pytest
import torch

from humanline.core.band import MIN_BOUND, AutoBand, FixedBand, make_band, next_bounds
from humanline.core.humanline import Humanline
from humanline.core.transforms import inside_band_fraction
from humanline.errors import UserError
from humanline.training.config_loading import load_config


def test_next_bounds_hand_computed():
    """low -1, high 1, quantiles -0.25 / 0.04, rate 0.5: |low| = 1^0.5 * 0.25^0.5 = 0.5, high = 0.04^0.5 = 0.2;
    rate 1 jumps to the quantiles; rate 0.25 from high 0.16 towards 0.01: 0.16^0.75 * 0.01^0.25 = 0.08."""
    assert next_bounds(-1.0, 1.0, -0.25, 0.04, 0.5) == pytest.approx((-0.5, 0.2))
    assert next_bounds(-1.0, 1.0, -0.25, 0.04, 1.0) == pytest.approx((-0.25, 0.04))
    assert next_bounds(-0.16, 0.16, -0.01, 0.01, 0.25) == pytest.approx((-0.08, 0.08))


def test_quantiles_on_the_wrong_side_of_zero_keep_the_signs():
    """All ratios positive (q_lo = 0.3 > 0, spread 0.6): the lower bound's target is -0.1 * 0.6 = -0.06, never a
    positive number. All negative (-0.9 .. -0.2, spread 0.7): high moves towards 0.07: (0.5 * 0.07)^0.5."""
    low, high = next_bounds(-0.5, 0.5, 0.3, 0.9, 1.0)
    assert low == pytest.approx(-0.06) and high == pytest.approx(0.9)
    low, high = next_bounds(-0.5, 0.5, -0.9, -0.2, 0.5)
    assert low < 0 < high and high == pytest.approx(math.sqrt(0.5 * 0.07))
    assert next_bounds(-0.5, 0.5, 1e-6, 2e-6, 1.0)[0] == pytest.approx(-MIN_BOUND)  # the absolute floor


def test_one_sided_drift_does_not_shut_the_other_side():
    """Finding 5's guard: ten syncs of windows where every ratio fell (KTO pushing all log-probs down) leave the
    upper bound at the drift's scale (0.1 of the spread 0.4 = 0.04), not at the 1e-4 floor that took the gradient
    from every rising token (it reached ~1e-4 before the guard)."""
    low, high = -1.5, 1.5
    for _ in range(10):
        low, high = next_bounds(low, high, -0.5, -0.1, 0.5)
    assert high == pytest.approx(0.04, rel=0.01) and low == pytest.approx(-0.5, rel=0.01)


def _window(band: AutoBand, scale: float, shift: float, gen: torch.Generator, steps: int = 1) -> torch.Tensor:
    """Observe `steps` micro-batches of (8, 32) ratios ~ shift + scale * N(0, 1), a quarter of them masked out
    (set to 100: a masked-out value must never count); return the last one's valid values."""
    for _ in range(steps):
        ratios = shift + scale * torch.randn(8, 32, generator=gen)
        mask = torch.rand(8, 32, generator=gen) > 0.25
        band.observe(ratios.masked_fill(~mask, 100.0), mask)
    return ratios[mask]


@pytest.mark.parametrize("quantiles", [(0.1, 0.9), (0.025, 0.975), (0.1, 0.99)])
def test_auto_band_reaches_and_holds_its_target_under_drift(quantiles):
    """Synthetic drift: the spread of the ratios grows 20x over 40 syncs (policy moving faster), then stays;
    the mean drifts positive. Starting from +-1.5, 15 syncs after the drift stops, every fresh window has close
    to p_lo of its tokens below the band and 1 - p_hi above it (sampling noise of 192 tokens: about 0.03)."""
    p_lo, p_hi = quantiles
    gen = torch.Generator().manual_seed(0)
    band = AutoBand(-1.5, 1.5, quantiles=quantiles, rate=0.5)
    for sync in range(40):
        _window(band, scale=0.01 * (1 + sync / 2), shift=0.002 * sync, gen=gen, steps=2)
        band.update()
    below, above = [], []
    for sync in range(40):
        fresh = _window(band, scale=0.2, shift=0.08, gen=gen, steps=2)
        if sync >= 15:
            below.append(float((fresh < band.low).float().mean()))
            above.append(float((fresh > band.high).float().mean()))
        band.update()
    assert band.low < 0 < band.high
    assert sum(below) / len(below) == pytest.approx(p_lo, abs=0.015)
    assert sum(above) / len(above) == pytest.approx(1 - p_hi, abs=0.015)
    assert all(abs(b - p_lo) < 0.08 and abs(a - (1 - p_hi)) < 0.08 for b, a in zip(below, above))
    # and the bounds sit near the true quantiles of N(0.08, 0.2)
    normal = torch.distributions.Normal(0.08, 0.2)
    assert band.low == pytest.approx(normal.icdf(torch.tensor(p_lo)).item(), abs=0.04)
    assert band.high == pytest.approx(normal.icdf(torch.tensor(p_hi)).item(), abs=0.04)


def test_auto_band_follows_a_drift_that_shrinks_again():
    """Spread 0.3 for 20 syncs, then 0.01: the bounds shrink by ~30x within 15 syncs and keep ~90% inside."""
    gen = torch.Generator().manual_seed(2)
    band = AutoBand(-1.5, 1.5, quantiles=(0.05, 0.95), rate=0.5)
    for scale in [0.3] * 20 + [0.01] * 15:
        _window(band, scale=scale, shift=0.0, gen=gen)
        band.update()
    fresh = torch.cat([_window(band, scale=0.01, shift=0.0, gen=gen) for _ in range(10)])
    inside = float(inside_band_fraction(fresh, torch.ones_like(fresh, dtype=torch.bool), low=band.low, high=band.high))
    assert inside == pytest.approx(0.9, abs=0.03)
    assert 0.01 < band.high < 0.025 and -0.025 < band.low < -0.01  # 1.645 sigma = 0.016


def test_a_window_of_exact_zeros_or_no_tokens_leaves_the_bounds():
    band = AutoBand(-1.0, 2.0, quantiles=(0.05, 0.95), rate=0.5)
    assert band.update() is False  # nothing observed
    band.observe(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))  # step 0: reference == policy
    assert band.update() is False and (band.low, band.high) == (-1.0, 2.0)
    band.observe(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))  # nothing masked in
    assert band.update() is False and band.updates == 0


def test_processes_agree_on_the_mean_of_their_quantiles():
    """reduce_sum adds [q_lo, q_hi, 1] over processes: two processes with quantiles (-0.2, 0.2) and (-0.4, 0.6)
    move, at rate 1, to the means (-0.3, 0.4); a process whose window is empty adds zeros."""
    values = torch.tensor([-0.2, 0.2]), torch.tensor([-0.4, 0.6])
    bands = [AutoBand(-1.0, 1.0, quantiles=(0.25, 0.75), rate=1.0) for _ in values]
    for band, v in zip(bands, values):
        band.observe(torch.stack([v[0], v[0], v[1], v[1]]).view(1, 4), torch.ones(1, 4, dtype=torch.bool))
    empty = AutoBand(-1.0, 1.0, quantiles=(0.25, 0.75), rate=1.0)
    stats = [b.quantiles() for b in (*bands, empty)]
    total = sum(stats)
    for band in (*bands, empty):
        assert band.update(lambda t: total) is True
        assert (band.low, band.high) == pytest.approx((-0.3, 0.4))


def test_tokens_outside_the_band_it_set_get_exactly_zero_gradient():
    """The humanline object's clip reads the auto band's *current* bounds: after a sync moved them, a token
    outside them has gradient exactly 0, one inside exactly 1."""
    cfg = load_config(None, {"humanline": {"enabled": True, "band": "auto", "band_rate": 1.0, "sync_every": 2,
                                           "band_quantiles": [0.25, 0.75]},
                             "data": {"train": "x.jsonl"}})
    humanline = Humanline(cfg.humanline)
    assert isinstance(humanline.band, AutoBand)
    mask = torch.ones(1, 4, dtype=torch.bool)
    humanline.apply(torch.tensor([[-0.2, -0.1, 0.1, 0.2]]), mask, step=0, index=0)  # observed
    assert humanline.begin_step(1) is False and humanline.band.low == -1.5  # not a sync step: bounds stay
    assert humanline.begin_step(2) is True  # quantiles 0.25 / 0.75 of the four values: -0.125, 0.125
    assert (humanline.band.low, humanline.band.high) == pytest.approx((-0.125, 0.125))
    ratios = torch.tensor([[-0.3, -0.1, 0.0, 0.12, 0.13, 1.4]], requires_grad=True)
    out = humanline.apply(ratios, torch.ones_like(ratios, dtype=torch.bool), step=2, index=0)
    out.sum().backward()
    assert ratios.grad.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0, 0.0]]
    assert out.detach().tolist()[0] == pytest.approx([-0.125, -0.1, 0.0, 0.12, 0.125, 0.125])


def test_state_round_trip_keeps_bounds_and_the_open_window():
    gen = torch.Generator().manual_seed(1)
    band = AutoBand(-1.5, 1.5, quantiles=(0.05, 0.95), rate=0.5)
    _window(band, 0.1, 0.0, gen)
    band.update()
    _window(band, 0.3, 0.0, gen)  # a window still open at the checkpoint
    restored = AutoBand(-1.5, 1.5, quantiles=(0.05, 0.95), rate=0.5)
    restored.load_state_dict(band.state_dict())
    assert (restored.low, restored.high, restored.updates) == (band.low, band.high, 1)
    band.update()
    restored.update()
    assert (restored.low, restored.high) == (band.low, band.high)


def test_auto_band_holds_its_start_where_the_objective_clips_the_ratio_itself():
    """`own_ratio_clip` (GRPO's PPO clip): `band: auto` gives the starting bounds, which never move; without it
    the same config gives a self-calibrating band."""
    h = load_config(None, {"humanline": {"enabled": True, "band": "auto", "low": -1.0, "high": 2.0},
                           "data": {"train": "x.jsonl"}}).humanline
    assert isinstance(make_band(h), AutoBand)
    held = make_band(h, own_ratio_clip=True)
    assert type(held) is FixedBand and (held.low, held.high) == (-1.0, 2.0)
    held.observe(torch.tensor([[-0.5, 0.5]]), torch.ones(1, 2, dtype=torch.bool))
    assert held.update() is False and (held.low, held.high) == (-1.0, 2.0)


def test_fixed_band_never_moves_and_config_checks():
    band = make_band(load_config(None, {"data": {"train": "x.jsonl"}}).humanline)
    assert type(band) is FixedBand and (band.low, band.high) == (-1.5, 1.5)
    band.observe(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool))
    assert band.update() is False and band.state_dict() == {}
    for field, value in (("band", "quantile"), ("band_quantiles", [0.5, 0.4]), ("band_quantiles", [0.1]),
                         ("band_quantiles", [0.0, 0.9]), ("band_rate", 0.0)):
        with pytest.raises(UserError, match=f"humanline.{field}"):
            load_config(None, {"humanline": {field: value}, "data": {"train": "x.jsonl"}})
    with pytest.raises(UserError, match="humanline.band'"):
        load_config(None, {"humanline": {"band": "auto", "transform": "reject"}, "data": {"train": "x.jsonl"}})
