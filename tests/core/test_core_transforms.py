"""Humanline transforms (docs/method.md §3.1, §3.3): clipping, the inside-band metric, stochastic rejection and its
deterministic limit (Theorem 4.3)."""

from __future__ import annotations

import math

import pytest
import torch

import reference_impl as ref
from humanline import (
    clip_log_ratio,
    deterministic_band,
    inside_band_fraction,
    reject_log_ratio,
    rejection_keep_mask,
)

# ------------------------------------------------------------------------------------------------ clipping


def test_clip_values_hand_computed():
    """Band [-1, 1.5]: -2 -> -1, -1 -> -1, 0.3 -> 0.3, 1.5 -> 1.5, 3 -> 1.5."""
    lr = torch.tensor([[-2.0, -1.0, 0.3, 1.5, 3.0]])
    out = clip_log_ratio(lr, low=-1.0, high=1.5)
    assert out.tolist() == [[-1.0, -1.0, pytest.approx(0.3), 1.5, 1.5]]


def test_clip_gradient_zero_strictly_outside_one_inside():
    """d clamp(x)/dx is exactly 0.0 strictly outside [low, high] and 1 inside; the bounds themselves keep
    their gradient (the docstring's promise; torch.clamp is inclusive)."""
    lr = torch.tensor([[-3.0, -1.5, -1.0, -0.2, 0.0, 0.7, 1.5, 1.51, 9.0]], requires_grad=True)
    clip_log_ratio(lr, low=-1.0, high=1.5).sum().backward()
    assert lr.grad.tolist() == [[0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]]


def test_clip_infinite_band_is_identity_exactly():
    gen = torch.Generator().manual_seed(0)
    lr = (torch.randn(4, 7, generator=gen) * 5).requires_grad_()
    out = clip_log_ratio(lr, low=-math.inf, high=math.inf)
    assert torch.equal(out, lr)
    (out * torch.arange(7.0)).sum().backward()
    assert torch.equal(lr.grad, torch.arange(7.0).expand(4, 7))


@pytest.mark.parametrize("low,high", [(0.0, 1.0), (0.5, 1.0), (-1.0, 0.0), (-1.0, -0.5), (1.0, -1.0)])
def test_clip_rejects_invalid_band(low, high):
    """docs/method.md §3.1: validate log eps_P < 0 < log eps_R."""
    with pytest.raises(ValueError):
        clip_log_ratio(torch.zeros(1, 2), low=low, high=high)


def test_clip_matches_reference_random():
    for seed in range(4):
        gen = torch.Generator().manual_seed(seed)
        b, t = (int(v) for v in torch.randint(1, 7, (2,), generator=gen))
        lr = (torch.randn(b, t, generator=gen) * 2).requires_grad_()
        low, high = -float(torch.rand((), generator=gen)) - 0.1, float(torch.rand((), generator=gen)) + 0.1
        w = torch.randn(b, t, generator=gen)
        (clip_log_ratio(lr, low=low, high=high) * w).sum().backward()
        lr64 = lr.detach().double().requires_grad_()
        expected = ref.clip_log_ratio(lr64, low, high)
        ((expected * w.double()).sum() + 0.0 * lr64.sum()).backward()  # all-clipped: still a graph
        torch.testing.assert_close(clip_log_ratio(lr.detach(), low=low, high=high).double(), expected.detach())
        torch.testing.assert_close(lr.grad.double(), lr64.grad)


# ----------------------------------------------------------------------------------------- inside-band metric


def test_inside_band_fraction_strict_and_masked_only():
    """Band (-1, 1.5). Masked tokens: -1.0 (on the bound: outside), -0.5 (in), 0.0 (in), 1.5 (bound: out),
    2.0 (out), 1.0 (in) -> 3 / 6 = 0.5. The unmasked positions hold in-band values and a nan: ignored."""
    lr = torch.tensor([[-1.0, -0.5, 0.0, 0.2, float("nan")], [1.5, 2.0, 1.0, 0.1, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    frac = inside_band_fraction(lr, mask, low=-1.0, high=1.5)
    assert frac.item() == 0.5
    assert not frac.requires_grad


def test_inside_band_fraction_empty_mask_is_nan():
    frac = inside_band_fraction(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), low=-1.0, high=1.0)
    assert math.isnan(frac.item())


def test_inside_band_fraction_matches_reference_random():
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        b, t = (int(v) for v in torch.randint(1, 9, (2,), generator=gen))
        lr = torch.randn(b, t, generator=gen) * 1.5
        mask = torch.rand(b, t, generator=gen) < 0.6
        mask[0, 0] = True
        lr[~mask] = float("nan")
        got = inside_band_fraction(lr, mask, low=-1.0, high=1.2).item()
        assert got == pytest.approx(ref.inside_band_fraction(lr, mask, -1.0, 1.2), rel=1e-6)


# ----------------------------------------------------------------------------------------- stochastic rejection


def _rejection_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lr = torch.randn(6, 10, generator=gen)
    mask = torch.rand(6, 10, generator=gen) < 0.7
    return lr, mask


def test_rejection_reproducible_with_seeded_generator():
    lr, mask = _rejection_inputs()
    kw = dict(gamma_p=0.5, gamma_r=0.3)
    a = rejection_keep_mask(lr, mask, generator=torch.Generator().manual_seed(7), **kw)
    b = rejection_keep_mask(lr, mask, generator=torch.Generator().manual_seed(7), **kw)
    c = rejection_keep_mask(lr, mask, generator=torch.Generator().manual_seed(8), **kw)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)  # 42 tokens, each kept with probability < 1 for most: a tie is ~impossible
    assert 0 < int(a.sum()) < int(mask.sum())
    x1 = reject_log_ratio(lr, mask, generator=torch.Generator().manual_seed(7), **kw)
    x2 = reject_log_ratio(lr, mask, generator=torch.Generator().manual_seed(7), **kw)
    assert torch.equal(x1, x2)


def test_rejected_tokens_keep_value_and_get_zero_gradient():
    lr, mask = _rejection_inputs(1)
    lr = lr.requires_grad_()
    kw = dict(gamma_p=0.5, gamma_r=0.3)
    keep = rejection_keep_mask(lr, mask, generator=torch.Generator().manual_seed(3), **kw)
    out = reject_log_ratio(lr, mask, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(out, lr.detach())  # values unchanged everywhere
    out.sum().backward()
    assert torch.equal(lr.grad, keep.float())  # 1 on kept tokens, exactly 0.0 on rejected and masked-out
    assert not bool((keep & ~mask).any())
    assert int((mask & ~keep).sum()) > 0 and int(keep.sum()) > 0


def test_rejection_masked_positions_inert():
    """Whatever the masked-out positions hold (inf, nan, huge), the keep decisions on masked tokens and the
    gradients are the same for the same seed, and all finite."""
    lr, mask = _rejection_inputs(2)
    kw = dict(gamma_p=0.5, gamma_r=0.3)
    results = []
    for fill in (0.0, math.inf, -math.inf, math.nan, 50.0):
        x = lr.masked_fill(~mask, fill).requires_grad_()
        keep = rejection_keep_mask(x, mask, generator=torch.Generator().manual_seed(5), **kw)
        out = reject_log_ratio(x, mask, generator=torch.Generator().manual_seed(5), **kw)
        out.masked_fill(~mask, 0.0).sum().backward()
        assert torch.isfinite(x.grad).all()
        results.append((keep, x.grad))
    for keep, grad in results[1:]:
        assert torch.equal(keep, results[0][0])
        assert torch.equal(grad, results[0][1])


def test_rejection_empty_mask_keeps_nothing():
    keep = rejection_keep_mask(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool), gamma_p=0.5, gamma_r=0.5)
    assert not bool(keep.any())


@pytest.mark.parametrize("gp,gr", [(0.0, 0.5), (0.5, 0.0), (-1.0, 0.5)])
def test_rejection_rejects_nonpositive_gamma(gp, gr):
    with pytest.raises(ValueError):
        rejection_keep_mask(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), gamma_p=gp, gamma_r=gr)


@pytest.mark.parametrize("gamma_p,gamma_r", [(0.5, 0.3), (0.5, 0.01), (2.0, 1.0)])
def test_rejection_keep_probability_monte_carlo(gamma_p, gamma_r):
    """A token with ratio r is kept with probability min(1, r/M_P)^g_P * min(1, 1/(r M_R))^g_R, with M_P,
    M_R over the *masked* tokens. N identical rows give N independent draws per column while leaving M_P and
    M_R unchanged. The masked-out columns hold log-ratios +8 and -8: had they entered M_P (M_R), every
    probability would shrink by e^{-(8 - 0.9) g_P} (e^{-(8 - 1.2) g_R}; 0.93 even at g_R = 0.01), far beyond
    the tolerance of 5 binomial standard errors sqrt(p (1 - p) / N) (about 0.017 at N = 20000)."""
    row = torch.tensor([-1.2, -0.6, -0.1, 0.0, 0.4, 0.9, 8.0, -8.0])
    row_mask = torch.tensor([1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    n = 20000
    lr = row.expand(n, -1).contiguous()
    mask = row_mask.expand(n, -1).contiguous()
    keep = rejection_keep_mask(lr, mask, gamma_p=gamma_p, gamma_r=gamma_r, generator=torch.Generator().manual_seed(0))
    freq = keep.double().mean(dim=0)
    p = ref.keep_probability(row[None], row_mask[None], gamma_p, gamma_r)[0]
    for t in range(row.numel()):
        if not row_mask[t]:
            assert freq[t] == 0.0
            continue
        se = math.sqrt(max(p[t] * (1 - p[t]), 1e-12) / n)
        assert abs(float(freq[t]) - float(p[t])) <= 5 * se + 1e-12, (t, float(freq[t]), float(p[t]))
    # Sanity of the fixture itself: the extremes are kept with certainty on their own side only.
    assert 0.0 < float(p[row_mask].min()) < float(p[row_mask].max()) <= 1.0


# ------------------------------------------------------------------------------------ Theorem 4.3 (deterministic)


def test_deterministic_band_hand_computed():
    """Masked log-ratios {-0.5, 0.2, 0.5}: log M_P = 0.5, log M_R = 0.5. gamma_p = 1: mean(B_P) = 1/2, so
    low = 0.5 + log(1/2) = -0.19315; gamma_r = 0.25: mean(B_R) = 0.2, high = -(0.5 + log 0.2) = 1.10944.
    The unmasked 3.0 must not enter M_P."""
    lr = torch.tensor([[-0.5, 0.2, 0.5, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    low, high = deterministic_band(lr, mask, gamma_p=1.0, gamma_r=0.25)
    assert low == pytest.approx(0.5 + math.log(0.5), abs=1e-6)
    assert high == pytest.approx(-(0.5 + math.log(0.2)), abs=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_deterministic_band_equals_mean_draw_rejection(seed):
    """Replacing B_P, B_R by their means g/(g+1) in the rejection rule keeps exactly the masked tokens in
    [low, high] (computed directly in ratio space by the reference); and clipping to that band gives
    gradient exactly on those tokens — the clip is the deterministic limit of the sampler."""
    gen = torch.Generator().manual_seed(seed)
    lr = torch.randn(5, 9, generator=gen, dtype=torch.float64) * 0.4
    mask = torch.rand(5, 9, generator=gen) < 0.8
    gamma_p, gamma_r = 0.5, 0.2
    low, high = deterministic_band(lr, mask, gamma_p=gamma_p, gamma_r=gamma_r)
    direct = ref.deterministic_keep(lr, mask, gamma_p, gamma_r)
    in_band = (lr >= low) & (lr <= high) & mask
    assert torch.equal(in_band, direct)
    assert 0 < int(direct.sum()) < int(mask.sum())  # the band binds on this fixture
    assert low < 0 < high
    x = lr.clone().requires_grad_()
    clip_log_ratio(x, low=low, high=high).masked_fill(~mask, 0.0).sum().backward()
    assert torch.equal(x.grad != 0, direct)
