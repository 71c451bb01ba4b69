"""GRPO over token log-ratios (docs/method.md §4): group advantages, the clipped surrogate, the KL term, reductions."""

from __future__ import annotations

import math

import pytest
import torch

import reference_impl as ref
from humanline import clip_log_ratio, group_advantages, grpo_loss

NAN, INF = float("nan"), float("inf")

# ---------------------------------------------------------------------------------------------- advantages


def test_group_advantages_hand_computed_interleaved_groups():
    """Groups by id (not contiguous): 7 -> rewards (1, 2, 3): mean 2, population std sqrt(2/3) = 0.816497,
    A = (-1, 0, 1) / (0.816497 + 0.01) = (-1.209926, 0, 1.209926); 3 -> (5, 5): equal rewards, A = 0;
    9 -> (4): a group of one, A = 0."""
    rewards = torch.tensor([1.0, 5.0, 2.0, 4.0, 5.0, 3.0])
    ids = torch.tensor([7, 3, 7, 9, 3, 7])
    a = group_advantages(rewards, ids)
    expected = [-1.209926, 0.0, 0.0, 0.0, 0.0, 1.209926]
    assert a.tolist() == pytest.approx(expected, abs=1e-6)


def test_group_advantages_population_std_and_eps():
    """Group (0, 1): population std 0.5 -> A = +-0.5 / 0.51 = +-0.980392 (the sample std 0.7071 would
    give +-0.697). eps = 0.5 instead: +-0.5 / 1.0 = +-0.5."""
    rewards, ids = torch.tensor([0.0, 1.0]), torch.tensor([0, 0])
    assert group_advantages(rewards, ids).tolist() == pytest.approx([-0.980392, 0.980392], abs=1e-6)
    assert group_advantages(rewards, ids, eps=0.5).tolist() == pytest.approx([-0.5, 0.5], abs=1e-7)


@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_zero_mean_unit_std_and_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 30, (), generator=gen))
    ids = torch.randint(0, 5, (n,), generator=gen)
    rewards = torch.randn(n, generator=gen) * 3 + 1
    a0 = group_advantages(rewards, ids, eps=1e-12)  # ~0 but not 0: a group of one is 0 / (0 + eps)
    for g in ids.unique():
        members = a0[ids == g].double()
        assert abs(members.mean().item()) < 1e-5
        if members.numel() > 1:
            assert members.std(correction=0).item() == pytest.approx(1.0, abs=1e-5)
    for eps in (0.01, 0.3):
        got = group_advantages(rewards, ids, eps=eps)
        assert got.tolist() == pytest.approx(ref.group_advantages(rewards, ids, eps), rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------------------------------------- surrogate


def test_clipping_regimes_hand_computed():
    """eps_low = 0.2, eps_high = 0.3: ratios are clamped to [0.8, 1.3]. One token per sequence (a second,
    masked column holds nan). Rows (A, ratio) -> surr = min(A ratio, A clamp(ratio)) -> d loss / d lr:
      (2, 1.1)    inside            -> 2.2                 -> -2 * 1.1 / 6 = -0.366667
      (2, 1.5)    above, A > 0      -> min(3.0, 2.6) = 2.6  -> 0 (clipped)
      (2, 0.5)    below, A > 0      -> min(1.0, 1.6) = 1.0  -> -2 * 0.5 / 6 = -0.166667
      (-0.5, 0.5) below, A < 0      -> min(-0.25, -0.4) = -0.4 -> 0 (clipped)
      (-0.5, 1.5) above, A < 0      -> min(-0.75, -0.65) = -0.75 -> 0.5 * 1.5 / 6 = 0.125
      (-0.5, 0.9) inside            -> -0.45               -> 0.5 * 0.9 / 6 = 0.075
    loss = -(2.2 + 2.6 + 1.0 - 0.4 - 0.75 - 0.45) / 6 = -4.2 / 6 = -0.7. clip_fraction = 2/6 (by sign: 1 of
    the 3 A > 0 tokens, 1 of the 3 A < 0 tokens),
    mean ratio = 6.0 / 6 = 1.0, advantage_mean = (6 - 1.5) / 6 = 0.75."""
    ratios = torch.tensor([1.1, 1.5, 0.5, 0.5, 1.5, 0.9], dtype=torch.float64)
    lr = torch.stack([ratios.log(), torch.full((6,), NAN, dtype=torch.float64)], dim=1).requires_grad_()
    mask = torch.tensor([[True, False]] * 6)
    adv = torch.tensor([2.0, 2.0, 2.0, -0.5, -0.5, -0.5], dtype=torch.float64)
    out = grpo_loss(lr, mask, adv, eps_low=0.2, eps_high=0.3)
    assert out.loss.item() == pytest.approx(-0.7, abs=1e-12)
    assert out.metrics["clip_fraction"].item() == pytest.approx(2 / 6)
    assert out.metrics["clip_fraction_pos"].item() == pytest.approx(1 / 3)
    assert out.metrics["clip_fraction_neg"].item() == pytest.approx(1 / 3)
    assert out.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-12)
    assert out.metrics["advantage_mean"].item() == pytest.approx(0.75)
    out.loss.backward()
    grad = lr.grad[:, 0]
    assert grad[1].item() == 0.0 and grad[3].item() == 0.0
    assert grad[[0, 2, 4, 5]].tolist() == pytest.approx([-2.2 / 6, -1.0 / 6, 0.75 / 6, 0.45 / 6], abs=1e-12)
    assert (lr.grad[:, 1] == 0.0).all()


def test_reductions_token_and_sequence():
    """beta = 0, ratios inside the band so loss_t = -A ratio_t. seq0: A = 1, ratios (1.1, 0.9) -> (-1.1, -0.9);
    seq1: A = 2, ratio 1.0 -> -2.0; seq2: no masked token.
    token:    (-1.1 - 0.9 - 2.0) / 3 = -1.333333.
    sequence: mean over the 2 non-empty sequences of their means: (-1.0 + -2.0) / 2 = -1.5
              (counting the empty one as 0 would give -1.0)."""
    lr = torch.tensor([[math.log(1.1), math.log(0.9)], [0.0, INF], [NAN, NAN]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, 2.0, 5.0])
    assert grpo_loss(lr, mask, adv).loss.item() == pytest.approx(-4.0 / 3, abs=1e-6)
    assert grpo_loss(lr, mask, adv, reduction="sequence").loss.item() == pytest.approx(-1.5, abs=1e-6)
    with pytest.raises(ValueError):
        grpo_loss(lr, mask, adv, reduction="batch")


def test_kl_uses_raw_log_ratio():
    """beta = 0.1, A = 0 (surrogate 0). raw = (2.0, -0.5), clipped to [-1, 1.5] -> (1.5, -0.5).
    kl(x) = exp(-x) + x - 1 (= exp(ref - pol) - (ref - pol) - 1): kl(2.0) = 1.135335, kl(-0.5) = 0.148721,
    loss = 0.1 (1.135335 + 0.148721) / 2 = 0.0642028; kl(1.5) = 0.723130 would be the clipped (wrong) one.
    d loss / d raw = 0.1 (1 - exp(-raw)) / 2."""
    raw = torch.tensor([[2.0, -0.5]], requires_grad=True)
    lr = clip_log_ratio(raw, low=-1.0, high=1.5)
    out = grpo_loss(lr, torch.ones(1, 2, dtype=torch.bool), torch.zeros(1), raw_log_ratio=raw, beta=0.1)
    assert out.loss.item() == pytest.approx(0.0642028, abs=1e-6)
    assert out.metrics["kl"].item() == pytest.approx((1.135335 + 0.148721) / 2, abs=1e-6)
    out.loss.backward()
    expected = [0.1 * (1 - math.exp(-2.0)) / 2, 0.1 * (1 - math.exp(0.5)) / 2]
    assert raw.grad[0].tolist() == pytest.approx(expected, abs=1e-7)
    # Without raw_log_ratio the KL falls back to the log-ratio it was given.
    fallback = grpo_loss(lr.detach(), torch.ones(1, 2, dtype=torch.bool), torch.zeros(1), beta=0.1)
    assert fallback.loss.item() == pytest.approx(0.1 * (0.723130 + 0.148721) / 2, abs=1e-6)


def test_beta_zero_ignores_raw():
    """beta = 0: the loss is the surrogate alone; raw_log_ratio gets no gradient, the KL is still reported."""
    gen = torch.Generator().manual_seed(0)
    lr, mask = torch.randn(3, 4, generator=gen) * 0.3, torch.ones(3, 4, dtype=torch.bool)
    adv = torch.randn(3, generator=gen)
    raw_a = torch.randn(3, 4, generator=gen).requires_grad_()
    raw_b = (raw_a.detach() * 5).requires_grad_()
    a = grpo_loss(lr, mask, adv, raw_log_ratio=raw_a, beta=0.0)
    b = grpo_loss(lr, mask, adv, raw_log_ratio=raw_b, beta=0.0)
    assert torch.equal(a.loss, b.loss)
    assert torch.equal(a.loss, grpo_loss(lr, mask, adv).loss)
    assert a.metrics["kl"].item() > 0
    if a.loss.requires_grad:
        a.loss.backward()
    assert raw_a.grad is None or (raw_a.grad == 0).all()


# ------------------------------------------------------------------------------------------------ humanline


def _case(seed: int, n: int = 5, t: int = 6):
    gen = torch.Generator().manual_seed(seed)
    raw, mask = torch.randn(n, t, generator=gen) * 0.8, torch.rand(n, t, generator=gen) < 0.7
    adv = torch.randn(n, generator=gen)
    return raw, mask, adv


def _grads(raw, mask, adv, band=None, beta=0.05, reduction="token"):
    x = raw.clone().requires_grad_()
    lr = x if band is None else clip_log_ratio(x, low=band[0], high=band[1])
    # The KL input is kept separate (detached) so that x.grad is the surrogate's gradient through the clip.
    out = grpo_loss(lr, mask, adv, raw_log_ratio=raw, beta=beta, eps_low=0.2, eps_high=0.3, reduction=reduction)
    out.loss.backward()
    return out.loss.detach(), x.grad


@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_clip_gradient_zero_outside_and_plain_inside(reduction):
    raw, mask, adv = _case(0)
    low, high = -0.5, 0.4
    _, g = _grads(raw, mask, adv, band=(low, high), reduction=reduction)
    _, p = _grads(raw.clamp(low, high), mask, adv, reduction=reduction)
    outside = (raw < low) | (raw > high)
    assert (outside & mask).any() and (~outside & mask).any()
    assert (g[outside] == 0.0).all()
    assert torch.equal(g[~outside], p[~outside])


@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_clip_infinite_band_exact(reduction):
    raw, mask, adv = _case(1)
    plain = _grads(raw, mask, adv, reduction=reduction)
    for band in ((-math.inf, math.inf), (-100.0, 100.0)):
        for a, b in zip(plain, _grads(raw, mask, adv, band=band, reduction=reduction)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fill", [INF, -INF, NAN, 1e4, "random"])
@pytest.mark.parametrize("reduction", ["token", "sequence"])
def test_masked_positions_inert(fill, reduction):
    """Both the log-ratio and the raw log-ratio hold garbage at masked positions; loss, gradients of both and
    metrics are unchanged and finite."""
    raw, mask, adv = _case(2)
    mask[1] = False  # an empty sequence too

    def run(lr_in, raw_in):
        x, r = lr_in.clone().requires_grad_(), raw_in.clone().requires_grad_()
        out = grpo_loss(x, mask, adv, raw_log_ratio=r, beta=0.05, reduction=reduction)
        out.loss.backward()
        return [out.loss.detach(), x.grad, r.grad] + [out.metrics[k] for k in sorted(out.metrics)]

    lr = raw.clamp(-0.5, 0.5)
    base = run(lr, raw)
    if fill == "random":
        gen = torch.Generator().manual_seed(3)
        dirty = run(torch.where(mask, lr, torch.randn(lr.shape, generator=gen) * 80),
                    torch.where(mask, raw, torch.randn(raw.shape, generator=gen) * 80))
    else:
        dirty = run(lr.masked_fill(~mask, fill), raw.masked_fill(~mask, fill))
    for a, b in zip(base, dirty):
        assert torch.isfinite(b).all()
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(6))
def test_matches_reference_random(seed):
    """Random shapes, groups, masks with empty rows, band, beta (sometimes 0), eps_low != eps_high and both
    reductions: loss, metrics and gradients (through the clip and through the KL) agree with the naive
    float64 re-derivation to float32 precision."""
    gen = torch.Generator().manual_seed(300 + seed)
    n, t = (int(v) for v in torch.randint(2, 9, (2,), generator=gen))
    raw, mask = torch.randn(n, t, generator=gen) * 0.7, torch.rand(n, t, generator=gen) < 0.6
    mask[0] = False
    mask[-1, 0] = True
    raw[~mask] = NAN
    adv = group_advantages(torch.randn(n, generator=gen), torch.randint(0, 3, (n,), generator=gen))
    beta = 0.0 if seed % 3 == 0 else float(torch.rand((), generator=gen)) * 0.2
    eps_low = 0.05 + float(torch.rand((), generator=gen)) * 0.3
    eps_high = 0.05 + float(torch.rand((), generator=gen)) * 0.3
    low, high = -0.3 - float(torch.rand((), generator=gen)), 0.3 + float(torch.rand((), generator=gen))
    for reduction in ("token", "sequence"):
        x = raw.clone().requires_grad_()
        out = grpo_loss(clip_log_ratio(x, low=low, high=high), mask, adv, raw_log_ratio=x, beta=beta,
                        eps_low=eps_low, eps_high=eps_high, reduction=reduction)
        out.loss.backward()
        rx = raw.double().requires_grad_()
        loss, metrics = ref.grpo(ref.clip_log_ratio(rx, low, high), mask, adv, raw_lr=rx, beta=beta,
                                 eps_low=eps_low, eps_high=eps_high, reduction=reduction)
        (loss + 0.0 * rx.nan_to_num().sum()).backward()
        assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7), reduction
        for key, value in metrics.items():
            assert out.metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), (key, reduction)
        torch.testing.assert_close(x.grad.double(), rx.grad.nan_to_num(), rtol=1e-5, atol=1e-7)


def test_group_advantages_with_known_group_count_equal_the_renumbering_path():
    """Collation numbers a micro-batch's groups 0 .. G - 1, so `n_groups` lets the ids index the groups
    directly (no `unique`, no host read); same advantages as renumbering them."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    rewards = torch.randn(9, generator=gen)
    rewards[3:5] = 0.5  # a group of equal rewards: advantage 0
    torch.testing.assert_close(group_advantages(rewards, ids, n_groups=3), group_advantages(rewards, ids),
                               rtol=0, atol=0)
