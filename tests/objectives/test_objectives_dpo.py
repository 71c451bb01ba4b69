"""DPO over token log-ratios (docs/method.md §4), plain and with humanline clipping upstream."""

from __future__ import annotations

import math

import pytest
import torch

import reference_impl as ref
from humanline import clip_log_ratio, dpo_loss

NAN, INF = float("nan"), float("inf")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_hand_computed_loss_metrics_and_gradient():
    """beta = 0.1. Chosen sums (masked tokens only): 0.5 + 0.3 = 0.8 and 0.2 - 0.1 + 0.4 = 0.5;
    rejected: -0.2 + 0.4 - 0.6 = -0.4 and 1.0 + 0.5 = 1.5. Rewards r_w = (0.08, 0.05), r_l = (-0.04, 0.15),
    margins (0.12, -0.10). loss = (log(1 + e^-0.12) + log(1 + e^0.10)) / 2 = (0.634946 + 0.744397) / 2
    = 0.689671. Metrics: chosen 0.065, rejected 0.055, margin 0.01, accuracy 1/2.
    d loss / d lr_w[b, t] = -beta sigmoid(-margin_b) / 2 on masked tokens, +that for lr_l."""
    cw = torch.tensor([[0.5, 0.3, NAN], [0.2, -0.1, 0.4]], requires_grad=True)
    cl = torch.tensor([[-0.2, 0.4, -0.6], [1.0, 0.5, INF]], requires_grad=True)
    mw = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    ml = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    out = dpo_loss(cw, cl, mw, ml, beta=0.1)
    expected = (math.log1p(math.exp(-0.12)) + math.log1p(math.exp(0.10))) / 2
    assert expected == pytest.approx(0.689671, abs=1e-6)
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.metrics["rewards/chosen"].item() == pytest.approx(0.065, abs=1e-6)
    assert out.metrics["rewards/rejected"].item() == pytest.approx(0.055, abs=1e-6)
    assert out.metrics["rewards/margin"].item() == pytest.approx(0.01, abs=1e-6)
    assert out.metrics["rewards/accuracy"].item() == 0.5
    # each pair's gradient factor sigmoid(-margin): (sigmoid(-0.12) + sigmoid(0.10)) / 2 = (0.470036 + 0.524979) / 2
    assert out.metrics["pair_weight"].item() == pytest.approx(0.497508, abs=1e-6)
    assert all(not v.requires_grad for v in out.metrics.values())
    out.loss.backward()
    g0, g1 = 0.1 * _sigmoid(-0.12) / 2, 0.1 * _sigmoid(0.10) / 2
    torch.testing.assert_close(cw.grad, torch.tensor([[-g0, -g0, 0.0], [-g1, -g1, -g1]]))
    torch.testing.assert_close(cl.grad, torch.tensor([[g0, g0, g0], [g1, g1, 0.0]]))


def _case(seed: int, n: int = 4, t: int = 6):
    gen = torch.Generator().manual_seed(seed)
    cw, cl = torch.randn(n, t, generator=gen) * 1.5, torch.randn(n, t + 1, generator=gen) * 1.5
    mw, ml = torch.rand(n, t, generator=gen) < 0.7, torch.rand(n, t + 1, generator=gen) < 0.7
    return cw, cl, mw, ml


def _grads(cw, cl, mw, ml, beta=0.2, band=None):
    cw, cl = cw.clone().requires_grad_(), cl.clone().requires_grad_()
    xw, xl = cw, cl
    if band is not None:
        xw, xl = clip_log_ratio(cw, low=band[0], high=band[1]), clip_log_ratio(cl, low=band[0], high=band[1])
    out = dpo_loss(xw, xl, mw, ml, beta=beta)
    out.loss.backward()
    return out.loss.detach(), cw.grad, cl.grad


def test_the_pair_weight_is_one_half_when_the_reference_is_the_policy():
    """At a sync step the reference is the policy: every log-ratio is 0, every margin 0, every pair weighs
    sigmoid(0) = 1/2 (DPO with beta -> 0 under Adam, docs/method.md §5)."""
    zeros, mask = torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool)
    assert dpo_loss(zeros, zeros, mask, mask, beta=0.1).metrics["pair_weight"].item() == 0.5


def test_clip_gradient_zero_outside_and_plain_inside():
    """Band [-0.8, 1.0]. Tokens strictly outside: gradient exactly 0.0. Inside: the plain objective's gradient
    at the clipped inputs (clipping only changes which tokens move, not how the loss weights them)."""
    cw, cl, mw, ml = _case(0)
    low, high = -0.8, 1.0
    _, gw, gl = _grads(cw, cl, mw, ml, band=(low, high))
    _, pw, pl = _grads(cw.clamp(low, high), cl.clamp(low, high), mw, ml)
    for x, g, p, m in ((cw, gw, pw, mw), (cl, gl, pl, ml)):
        outside = (x < low) | (x > high)
        assert outside.any() and (~outside & m).any()
        assert (g[outside] == 0.0).all()
        assert torch.equal(g[~outside], p[~outside])


def test_clip_all_inside_equals_plain_and_infinite_band_exact():
    cw, cl, mw, ml = _case(1)
    plain = _grads(cw, cl, mw, ml)
    for band in ((-math.inf, math.inf), (-100.0, 100.0)):
        clipped = _grads(cw, cl, mw, ml, band=band)
        for a, b in zip(plain, clipped):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fill", [INF, -INF, NAN, 1e4, "random"])
def test_masked_positions_inert(fill):
    cw, cl, mw, ml = _case(2)
    base = _grads(cw, cl, mw, ml)
    if fill == "random":
        gen = torch.Generator().manual_seed(11)
        fw, fl = torch.randn(cw.shape, generator=gen) * 50, torch.randn(cl.shape, generator=gen) * 50
        dirty = _grads(torch.where(mw, cw, fw), torch.where(ml, cl, fl), mw, ml)
    else:
        dirty = _grads(cw.masked_fill(~mw, fill), cl.masked_fill(~ml, fill), mw, ml)
    for a, b in zip(base, dirty):
        assert torch.isfinite(b).all()
        assert torch.equal(a, b)


def test_rejects_mismatched_batch_and_mask():
    with pytest.raises(ValueError):
        dpo_loss(torch.zeros(2, 3), torch.zeros(3, 3), torch.ones(2, 3), torch.ones(3, 3), beta=0.1)
    with pytest.raises(ValueError):
        dpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 4), torch.ones(2, 3), beta=0.1)


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_random(seed):
    """Random shapes, masks with empty rows, a random band: loss, metrics and gradients agree with the naive
    float64 re-derivation to float32 precision."""
    gen = torch.Generator().manual_seed(100 + seed)
    n, tw, tl = (int(v) for v in torch.randint(1, 9, (3,), generator=gen))
    cw, cl = torch.randn(n, tw, generator=gen) * 2, torch.randn(n, tl, generator=gen) * 2
    mw, ml = torch.rand(n, tw, generator=gen) < 0.6, torch.rand(n, tl, generator=gen) < 0.6
    mw[0] = False  # an empty chosen sequence: reward 0
    cw[~mw], cl[~ml] = NAN, INF
    beta = float(torch.rand((), generator=gen)) * 0.5 + 0.01
    low, high = -0.5 - float(torch.rand((), generator=gen)), 0.5 + float(torch.rand((), generator=gen))

    xw, xl = cw.clone().requires_grad_(), cl.clone().requires_grad_()
    out = dpo_loss(clip_log_ratio(xw, low=low, high=high), clip_log_ratio(xl, low=low, high=high), mw, ml, beta=beta)
    out.loss.backward()

    rw, rl = cw.double().requires_grad_(), cl.double().requires_grad_()
    loss, metrics = ref.dpo(ref.clip_log_ratio(rw, low, high), ref.clip_log_ratio(rl, low, high), mw, ml, beta)
    (loss + 0.0 * (rw.nan_to_num().sum() + rl.nan_to_num(posinf=0.0).sum())).backward()

    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    for key, value in metrics.items():
        assert out.metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(xw.grad.double(), rw.grad.nan_to_num(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(xl.grad.double(), rl.grad.nan_to_num(), rtol=1e-5, atol=1e-7)
