"""KTO over token log-ratios (docs/method.md §4): the reference point z0 and the loss, plain and humanline."""

from __future__ import annotations

import math

import pytest
import torch

import reference_impl as ref
from humanline import clip_log_ratio, kto_kl_ref, kto_loss

NAN, INF = float("nan"), float("inf")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ------------------------------------------------------------------------------------------ reference point


def test_kl_ref_mean_over_nonempty_sequences():
    """Sums 0.5 + 0.5 = 1.0 and -0.2; the third sequence has no token and is ignored:
    z0 = (1.0 - 0.2) / 2 = 0.4 (a mean that counted the empty row would give 0.8 / 3 = 0.267)."""
    x = torch.tensor([[0.5, 0.5, NAN], [-0.2, INF, 3.0], [NAN, NAN, NAN]], requires_grad=True)
    m = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    z0 = kto_kl_ref(x, m)
    assert z0.item() == pytest.approx(0.4, abs=1e-7)
    assert z0.dim() == 0 and not z0.requires_grad


def test_kl_ref_floor_at_zero_and_all_empty():
    """Sums -1.0 and -0.5: mean -0.75, floored to 0. No non-empty sequence at all: 0."""
    x = torch.tensor([[-0.4, -0.6], [-0.5, 7.0]])
    assert kto_kl_ref(x, torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)).item() == 0.0
    assert kto_kl_ref(x, torch.zeros(2, 2, dtype=torch.bool)).item() == 0.0


def _two_process_kl_ref(x0, m0, x1, m1):
    """Simulate 2 processes: record each one's local statistics through the hook, then give each process
    the element-wise sum of both, as an all-reduce would."""
    recorded = {}

    def recorder(rank):
        def hook(stats):
            recorded[rank] = stats.clone()
            return stats

        return hook

    kto_kl_ref(x0, m0, reduce_sum=recorder(0))
    kto_kl_ref(x1, m1, reduce_sum=recorder(1))
    assert set(recorded) == {0, 1}
    z0_rank0 = kto_kl_ref(x0, m0, reduce_sum=lambda s: s + recorded[1])
    z0_rank1 = kto_kl_ref(x1, m1, reduce_sum=lambda s: recorded[0] + s)
    return z0_rank0, z0_rank1


def test_kl_ref_reduce_sum_hook_global_mean():
    """Rank 0 sums (1.0, 2.0); rank 1 sums (-0.9) and one empty row. Global mean over the 3 non-empty
    sequences: (1 + 2 - 0.9) / 3 = 0.7 on both ranks — not the mean of per-rank means ((1.5 - 0.9) / 2 = 0.3)
    nor the mean of per-rank floored values ((1.5 + 0) / 2 = 0.75)."""
    x0, m0 = torch.tensor([[1.0, NAN], [1.5, 0.5]]), torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    x1, m1 = torch.tensor([[-0.9, 5.0], [INF, NAN]]), torch.tensor([[1, 0], [0, 0]], dtype=torch.bool)
    z_a, z_b = _two_process_kl_ref(x0, m0, x1, m1)
    assert z_a.item() == pytest.approx(0.7, abs=1e-6)
    assert z_b.item() == pytest.approx(0.7, abs=1e-6)
    full = kto_kl_ref(torch.cat([x0, x1]), torch.cat([m0, m1]))
    assert full.item() == pytest.approx(0.7, abs=1e-6)


def test_kl_ref_floor_applies_after_global_mean():
    """Rank 0 alone: 0.2 > 0. Global: (0.2 - 1.0 - 0.5) / 3 = -0.433, floored to 0 on both ranks."""
    x0, m0 = torch.tensor([[0.2]]), torch.tensor([[True]])
    x1, m1 = torch.tensor([[-1.0], [-0.5]]), torch.tensor([[True], [True]])
    assert kto_kl_ref(x0, m0).item() == pytest.approx(0.2)
    z_a, z_b = _two_process_kl_ref(x0, m0, x1, m1)
    assert z_a.item() == 0.0 and z_b.item() == 0.0


# ---------------------------------------------------------------------------------------------------- loss


def test_hand_computed_loss_metrics_and_gradient():
    """beta = 0.5, z0 = 0.2, w_D = 1.1, w_U = 0.9; r = sum of masked lr (not beta-scaled).
    ex0 desirable, r = 0.6 + 0.4 = 1.0:   1.1 (1 - sigmoid(0.5 (1.0 - 0.2)))  = 1.1 (1 - s(0.4))  = 0.441444
    ex1 undesirable, r = -0.3 - 0.3 + 0.1 = -0.5: 0.9 (1 - sigmoid(0.5 (0.2 + 0.5))) = 0.9 (1 - s(0.35)) = 0.372044
    ex2 undesirable, r = 0.7 + 0.2 = 0.9: 0.9 (1 - sigmoid(0.5 (0.2 - 0.9))) = 0.9 (1 - s(-0.35)) = 0.527956
    loss = (0.441444 + 0.372044 + 0.527956) / 3 = 0.447148.
    Metrics: rewards/desirable = 0.5 * 1.0 = 0.5; rewards/undesirable = (0.5 (-0.5) + 0.5 (0.9)) / 2 = 0.1;
    accuracy: ex0 above z0 and desirable, ex1 below and undesirable, ex2 above but undesirable -> 2/3.
    Gradients per masked token: ex0 -1.1 * 0.5 s(0.4)(1 - s(0.4)) / 3; ex1 and ex2 +0.9 * 0.5 s(x)(1 - s(x)) / 3."""
    x = torch.tensor([[0.6, 0.4, NAN], [-0.3, -0.3, 0.1], [0.7, 0.2, -INF]], requires_grad=True)
    m = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    desirable = torch.tensor([True, False, False])
    kl_ref = torch.tensor(0.2, requires_grad=True)
    out = kto_loss(x, m, desirable, kl_ref, beta=0.5, desirable_weight=1.1, undesirable_weight=0.9)
    assert out.loss.item() == pytest.approx(0.447148, abs=1e-6)
    assert out.metrics["kl_ref"].item() == pytest.approx(0.2)
    assert out.metrics["rewards/desirable"].item() == pytest.approx(0.5, abs=1e-6)
    assert out.metrics["rewards/undesirable"].item() == pytest.approx(0.1, abs=1e-6)
    assert out.metrics["rewards/accuracy"].item() == pytest.approx(2 / 3)
    out.loss.backward()
    assert kl_ref.grad is None  # the reference point is a constant
    d = lambda v: _sigmoid(v) * (1 - _sigmoid(v))  # noqa: E731
    g0, g1, g2 = -1.1 * 0.5 * d(0.4) / 3, 0.9 * 0.5 * d(0.35) / 3, 0.9 * 0.5 * d(-0.35) / 3
    torch.testing.assert_close(x.grad, torch.tensor([[g0, g0, 0.0], [g1, g1, g1], [g2, g2, 0.0]]))


def test_weights_scale_only_their_class():
    """Every example's loss is linear in its own class weight and independent of the other one."""
    gen = torch.Generator().manual_seed(0)
    x, m = torch.randn(6, 4, generator=gen), torch.rand(6, 4, generator=gen) < 0.8
    desirable = torch.tensor([True, True, False, True, False, False])
    base = kto_loss(x, m, desirable, 0.1, beta=0.3).loss
    only_d = kto_loss(x, m, desirable, 0.1, beta=0.3, desirable_weight=3.0).loss
    only_u = kto_loss(x, m, desirable, 0.1, beta=0.3, undesirable_weight=3.0).loss
    d_part, u_part = (only_d - base) / 2.0, (only_u - base) / 2.0  # the extra 2x of each class
    assert d_part.item() > 0 and u_part.item() > 0
    assert (d_part + u_part).item() == pytest.approx(base.item(), rel=1e-5)
    all_d = kto_loss(x, m, torch.ones(6, dtype=torch.bool), 0.1, beta=0.3, desirable_weight=1.1, undesirable_weight=7.0)
    plain = kto_loss(x, m, torch.ones(6, dtype=torch.bool), 0.1, beta=0.3)
    assert all_d.loss.item() == pytest.approx(1.1 * plain.loss.item(), rel=1e-6)
    assert "rewards/undesirable" not in all_d.metrics


def _case(seed: int, n: int = 6, t: int = 5):
    gen = torch.Generator().manual_seed(seed)
    x, m = torch.randn(n, t, generator=gen) * 1.5, torch.rand(n, t, generator=gen) < 0.7
    desirable = torch.rand(n, generator=gen) < 0.5
    desirable[0], desirable[1] = True, False
    return x, m, desirable


def _grads(x, m, desirable, band=None, kl_ref=0.3):
    x = x.clone().requires_grad_()
    lr = x if band is None else clip_log_ratio(x, low=band[0], high=band[1])
    out = kto_loss(lr, m, desirable, kl_ref, beta=0.4, desirable_weight=1.1)
    out.loss.backward()
    return out.loss.detach(), x.grad


def test_clip_gradient_zero_outside_and_plain_inside():
    x, m, desirable = _case(0)
    low, high = -0.7, 0.9
    _, g = _grads(x, m, desirable, band=(low, high))
    _, p = _grads(x.clamp(low, high), m, desirable)
    outside = (x < low) | (x > high)
    assert (outside & m).any() and (~outside & m).any()
    assert (g[outside] == 0.0).all()
    assert torch.equal(g[~outside], p[~outside])


def test_clip_infinite_band_exact():
    x, m, desirable = _case(1)
    plain = _grads(x, m, desirable)
    for band in ((-math.inf, math.inf), (-100.0, 100.0)):
        for a, b in zip(plain, _grads(x, m, desirable, band=band)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("fill", [INF, -INF, NAN, 1e4, "random"])
def test_masked_positions_inert(fill):
    x, m, desirable = _case(2)
    base = _grads(x, m, desirable)
    z_base = kto_kl_ref(x, m)
    if fill == "random":
        dirty_x = torch.where(m, x, torch.randn(x.shape, generator=torch.Generator().manual_seed(5)) * 50)
    else:
        dirty_x = x.masked_fill(~m, fill)
    for a, b in zip(base, _grads(dirty_x, m, desirable)):
        assert torch.isfinite(b).all()
        assert torch.equal(a, b)
    assert torch.equal(kto_kl_ref(dirty_x, m), z_base)


@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_random(seed):
    """Random shapes and masks (with empty rows), a random band applied to both the examples and the
    mismatched KL pairs: z0, loss, metrics and gradients agree with the naive float64 re-derivation."""
    gen = torch.Generator().manual_seed(200 + seed)
    n, t = (int(v) for v in torch.randint(2, 9, (2,), generator=gen))
    x, m = torch.randn(n, t, generator=gen) * 2, torch.rand(n, t, generator=gen) < 0.6
    kl_x, kl_m = torch.randn(n, t, generator=gen) * 2 + 0.5, torch.rand(n, t, generator=gen) < 0.6
    m[0], kl_m[-1] = False, False
    x[~m], kl_x[~kl_m] = NAN, -INF
    desirable = torch.rand(n, generator=gen) < 0.5
    beta = float(torch.rand((), generator=gen)) + 0.05
    w_d, w_u = 0.5 + float(torch.rand((), generator=gen)), 0.5 + float(torch.rand((), generator=gen))
    low, high = -0.5 - float(torch.rand((), generator=gen)), 0.5 + float(torch.rand((), generator=gen))

    z0 = kto_kl_ref(clip_log_ratio(kl_x, low=low, high=high), kl_m)
    z0_ref = ref.kto_kl_ref(ref.clip_log_ratio(kl_x, low, high), kl_m)
    assert z0.item() == pytest.approx(z0_ref, rel=1e-5, abs=1e-7)

    xx = x.clone().requires_grad_()
    out = kto_loss(clip_log_ratio(xx, low=low, high=high), m, desirable, z0, beta=beta,
                   desirable_weight=w_d, undesirable_weight=w_u)
    out.loss.backward()
    rx = x.double().requires_grad_()
    loss, metrics = ref.kto(ref.clip_log_ratio(rx, low, high), m, desirable, z0_ref, beta, w_d, w_u)
    (loss + 0.0 * rx.nan_to_num().sum()).backward()

    assert out.loss.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert set(out.metrics) == set(metrics)
    for key, value in metrics.items():
        assert out.metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(xx.grad.double(), rx.grad.nan_to_num(), rtol=1e-5, atol=1e-7)


def test_classes_known_to_the_caller_need_no_host_read():
    """`present` (from collation) decides which class means are logged; the means are the same masked means."""
    x, m, desirable = _case(3)
    read = kto_loss(x, m, desirable, 0.2, beta=0.4)
    told = kto_loss(x, m, desirable, 0.2, beta=0.4, present=(True, True))
    assert told.metrics.keys() == read.metrics.keys()
    for key in read.metrics:
        torch.testing.assert_close(told.metrics[key], read.metrics[key])
    assert "rewards/undesirable" not in kto_loss(x, m, desirable, 0.2, beta=0.4, present=(True, False)).metrics
