"""Prospect-theory functions (docs/method.md §2): value function, capacity Omega+, CPT decision weights."""

from __future__ import annotations

import math

import pytest
import torch

import reference_impl as ref
from humanline import capacity, decision_weights, value_function

GAMMAS = [0.3, 0.5, 0.61, 0.8, 0.95]


# ------------------------------------------------------------------------------------------------- capacity


@pytest.mark.parametrize("gamma", GAMMAS + [1.0, 1.5])
def test_capacity_fixed_points(gamma):
    out = capacity(torch.tensor([0.0, 1.0], dtype=torch.float64), gamma=gamma)
    assert out.tolist() == [0.0, 1.0]


def test_capacity_hand_computed():
    """gamma = 0.5, a = 0.25: sqrt(0.25) / (sqrt(0.25) + sqrt(0.75))^2 = 0.5 / 1.366025^2 = 0.5 / 1.866025
    = 0.267949."""
    out = capacity(torch.tensor(0.25, dtype=torch.float64), gamma=0.5)
    assert out.item() == pytest.approx(0.267949, abs=1e-6)


@pytest.mark.parametrize("gamma", GAMMAS)
def test_capacity_inverse_s(gamma):
    """gamma in (0, 1): above the diagonal for small a (over-weights unlikely extremes), below for large a;
    the crossing lies in (0.1, 0.5) for gamma >= 0.3. Monotone increasing. Omega(a) / a^gamma -> 1 at 0
    (the Beta(gamma, 1) CDF link)."""
    small = torch.tensor([1e-4, 1e-3, 0.01, 0.05, 0.1], dtype=torch.float64)
    large = torch.tensor([0.5, 0.7, 0.9, 0.99, 0.9999], dtype=torch.float64)
    assert (capacity(small, gamma=gamma) > small).all()
    assert (capacity(large, gamma=gamma) < large).all()
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    assert (capacity(grid, gamma=gamma).diff() > 0).all()
    tiny = torch.tensor(1e-40, dtype=torch.float64)
    assert (capacity(tiny, gamma=gamma) / tiny**gamma).item() == pytest.approx(1.0, rel=1e-3)


def test_capacity_gamma_one_is_identity_and_reference():
    a = torch.linspace(0, 1, 101, dtype=torch.float64)
    torch.testing.assert_close(capacity(a, gamma=1.0), a)
    for gamma in GAMMAS:
        expected = torch.tensor([ref.capacity(float(v), gamma) for v in a], dtype=torch.float64)
        torch.testing.assert_close(capacity(a, gamma=gamma), expected, rtol=1e-12, atol=1e-12)


def test_capacity_rejects_nonpositive_gamma():
    with pytest.raises(ValueError):
        capacity(torch.tensor([0.5]), gamma=0.0)


# ------------------------------------------------------------------------------------------ decision weights


def test_decision_weights_hand_computed():
    """Outcomes (3, 1, 2), gamma = 0.5, ranked best first: 3 gets Omega(1/3) - Omega(0), 2 gets
    Omega(2/3) - Omega(1/3), 1 gets Omega(1) - Omega(2/3). Omega(1/3) = 0.577350 / (0.577350 + 0.816497)^2
    = 0.577350 / 1.942809 = 0.297173; Omega(2/3) = 0.816497 / 1.942809 = 0.420266. In input order:
    3 -> 0.297173, 1 -> 1 - 0.420266 = 0.579734, 2 -> 0.420266 - 0.297173 = 0.123093."""
    w = decision_weights(torch.tensor([3.0, 1.0, 2.0]), gamma=0.5)
    o13 = math.sqrt(1 / 3) / (math.sqrt(1 / 3) + math.sqrt(2 / 3)) ** 2
    o23 = math.sqrt(2 / 3) / (math.sqrt(2 / 3) + math.sqrt(1 / 3)) ** 2
    assert o13 == pytest.approx(0.297173, abs=1e-6) and o23 == pytest.approx(0.420266, abs=1e-6)
    assert w.tolist() == pytest.approx([0.297173, 0.579734, 0.123093], abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_decision_weights_properties_and_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 25, (), generator=gen))
    outcomes = torch.randint(-4, 5, (n,), generator=gen).float()  # many ties
    for gamma in (0.4, 0.61, 0.9):
        w = decision_weights(outcomes, gamma=gamma)
        assert w.shape == outcomes.shape
        assert (w >= 0).all()
        assert w.sum().item() == pytest.approx(1.0, abs=1e-12)
        for value in outcomes.unique():
            tied = w[outcomes == value]
            assert torch.equal(tied, tied[0].expand_as(tied))
        assert w.tolist() == pytest.approx(ref.decision_weights(outcomes.tolist(), gamma), abs=1e-12)
    uniform = decision_weights(outcomes, gamma=1.0)
    assert uniform.tolist() == pytest.approx([1.0 / n] * n, abs=1e-12)


def test_decision_weights_overweight_extremes():
    """N = 10 distinct outcomes, gamma = 0.61: the best and the worst get more than 1/N, the median ones less."""
    w = decision_weights(torch.arange(10.0), gamma=0.61)
    assert w[9] > 0.1 and w[0] > 0.1
    assert (w[3:7] < 0.1).all()


# ------------------------------------------------------------------------------------------- value function


def test_value_function_hand_computed_and_loss_aversion():
    """alpha = 0.5, lam = 2, z0 = 0: v(4) = 4^0.5 = 2, v(-4) = -2 * 2 = -4, v(0) = 0. With z0 = 1:
    v(5) = 2, v(-3) = -4. Loss aversion: -v(-x) = lam v(x) > v(x) for x > 0."""
    z = torch.tensor([4.0, -4.0, 0.0])
    assert value_function(z, alpha=0.5, lam=2.0).tolist() == [2.0, -4.0, 0.0]
    assert value_function(torch.tensor([5.0, -3.0]), alpha=0.5, lam=2.0, z0=1.0).tolist() == [2.0, -4.0]
    x = torch.linspace(0.1, 5, 20, dtype=torch.float64)
    v_gain, v_loss = value_function(x), value_function(-x)
    assert (-v_loss > v_gain).all()
    torch.testing.assert_close(-v_loss, 2.25 * v_gain)
    assert (v_gain.diff().diff() < 0).all()  # concave for gains (alpha < 1)
    for zi in (-2.5, -0.3, 0.0, 0.7, 3.0):
        got = value_function(torch.tensor(zi, dtype=torch.float64), alpha=0.7, lam=1.8, z0=0.2).item()
        assert got == pytest.approx(ref.value(zi, 0.7, 1.8, 0.2), abs=1e-12)
