"""The stale-sample corrections (`humanline.objectives.corrections`), each against a case computed by hand, and
through `grpo_loss`: the loss, its gradient, and no gradient at all where a token is masked."""

from __future__ import annotations

import math

import pytest
import torch

from humanline.objectives import grpo_loss
from humanline.objectives.corrections import (
    behaviour_weights,
    correct,
    effective_sample_size,
    geometric_mask,
    icepop_mask,
    m2po_mask,
    staleness_mask,
    vespo_weights,
)

LN2, LN3 = math.log(2.0), math.log(3.0)


def _loss(corrected, mask, advantages, *, raw=None, beta=0.0, eps=0.2):
    return grpo_loss(corrected.log_ratio, mask, advantages, raw_log_ratio=raw, beta=beta, eps_low=eps,
                     eps_high=eps, weights=corrected.weights, keep=corrected.keep, clip=corrected.clip)


def test_behaviour_weights_are_truncated_at_the_cap():
    w, capped = behaviour_weights(torch.tensor([0.0, LN3, -LN2]), cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64))
    assert capped.tolist() == [False, True, False]
    w, capped = behaviour_weights(torch.tensor([LN3]), cap=None)
    assert torch.allclose(w, torch.tensor([3.0], dtype=torch.float64)) and not capped.any()


def test_staleness_mask_drops_whole_samples_older_than_the_bound():
    mask = torch.ones(3, 2, dtype=torch.bool)
    mask[1, 1] = False
    keep = staleness_mask(torch.tensor([0, 3, 5]), 4, mask)
    assert keep.tolist() == [[True, True], [True, False], [False, False]]


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_within_tau():
    # m = 0.09, 0.01, 0.04, 1.0; sorted suffix means 0.285, 0.0467, 0.025, 0.01: mask the two largest
    lr = torch.tensor([[0.3, 0.1, 0.2, 1.0]])
    keep = m2po_mask(lr, torch.ones_like(lr, dtype=torch.bool), tau=0.04)
    assert keep.tolist() == [[False, True, True, False]]
    kept = lr[keep].square().mean()
    assert kept <= 0.04 and torch.isclose(kept, torch.tensor(0.025))


def test_m2po_ignores_unscored_tokens_and_keeps_at_least_one():
    lr = torch.tensor([[0.3, 9.0, 0.1], [2.0, 0.2, 5.0]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    # scored m = 0.09, 0.01, 4.0, 0.04 -> suffix means 1.035, 0.0467, 0.025, 0.01: with tau 0.05 mask 4.0 only
    assert m2po_mask(lr, mask, tau=0.05).tolist() == [[True, False, True], [False, True, False]]
    # every suffix mean above tau: all but the smallest are masked
    assert m2po_mask(lr, mask, tau=1e-6).tolist() == [[False, False, True], [False, False, False]]
    assert not m2po_mask(lr, torch.zeros_like(mask), tau=0.05).any()


def test_effective_sample_size():
    mask = torch.tensor([True, True, True, True, False])
    assert torch.isclose(effective_sample_size(torch.tensor([1.0, 1.0, 0.0, 2.0, 50.0]), mask),
                         torch.tensor(16 / 24))
    assert effective_sample_size(torch.ones(5), mask) == 1.0


def test_none_is_the_plain_loss_bit_for_bit():
    torch.manual_seed(0)
    lr, mask, adv = torch.randn(3, 5), torch.rand(3, 5) > 0.3, torch.randn(3)
    out = _loss(correct("none", lr, mask, humanline=False), mask, adv, raw=lr, beta=0.1)
    plain = grpo_loss(lr, mask, adv, raw_log_ratio=lr, beta=0.1, eps_low=0.2, eps_high=0.2)
    assert torch.equal(out.loss, plain.loss)


def test_tis_weighs_the_policy_gradient_against_the_proximal_policy():
    """Against the sampler (humanline off): the ratio becomes pi_theta / pi_prox = 1 and each token's loss is
    -w A with w = min(pi_prox / pi_behav, 2) = [2, 1]: loss -(2 + 1) / 2, gradient -w / 2."""
    lr = torch.tensor([[LN3, 0.0]], requires_grad=True)  # log pi_theta - log pi_behav
    mask = torch.ones(1, 2, dtype=torch.bool)
    c = correct("tis", lr, mask, humanline=False, behaviour_log_ratio=lr.detach(), cap=2.0)
    out = _loss(c, mask, torch.tensor([1.0]))
    assert torch.isclose(out.loss, torch.tensor(-1.5))
    out.loss.backward()
    assert torch.allclose(lr.grad, torch.tensor([[-1.0, -0.5]]))
    assert torch.isclose(c.metrics["correction/capped"], torch.tensor(0.5))
    assert torch.isclose(c.metrics["correction/ess"], torch.tensor(9 / 10))  # (2 + 1)^2 / (2 (4 + 1))


def test_decoupled_puts_the_behaviour_weight_on_humanlines_clipped_loss():
    """Against a humanline reference: ratios e^0.5 (clipped to 1.2, A > 0) and e^-0.5 (not clipped), behaviour
    weights 3 and 1 (no cap): loss -(3 * 1.2 + e^-0.5) / 2; the clipped token has no gradient."""
    lr = torch.tensor([[0.5, -0.5]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    c = correct("decoupled", lr, mask, humanline=True, behaviour_log_ratio=torch.tensor([[LN3, 0.0]]))
    out = _loss(c, mask, torch.tensor([1.0]))
    assert torch.isclose(out.loss, torch.tensor(-(3 * 1.2 + math.exp(-0.5)) / 2))
    out.loss.backward()
    assert torch.allclose(lr.grad, torch.tensor([[0.0, -math.exp(-0.5) / 2]]))
    assert c.metrics["correction/capped"] == 0.0


def test_m2po_trains_the_unclipped_ratio_on_the_tokens_it_keeps_and_nothing_else():
    """Tokens 0.3 and 1.0 are masked (see above); the rest give -(e^0.1 + e^0.2) / 4 over all 4 tokens."""
    lr = torch.tensor([[0.3, 0.1, 0.2, 1.0]], requires_grad=True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    c = correct("m2po", lr, mask, humanline=False, behaviour_log_ratio=lr.detach(), tau=0.04)
    out = _loss(c, mask, torch.tensor([1.0]), beta=0.1, raw=lr)
    kl = sum(math.exp(-x) + x - 1 for x in (0.1, 0.2))
    assert torch.isclose(out.loss, torch.tensor((-(math.exp(0.1) + math.exp(0.2)) + 0.1 * kl) / 4))
    out.loss.backward()
    assert lr.grad[0, 0] == 0 and lr.grad[0, 3] == 0 and (lr.grad[0, 1:3] != 0).all()
    assert c.metrics["correction/masked"] == 0.5
    assert torch.isclose(c.metrics["correction/ess"], torch.tensor(0.5))


def test_drop_removes_stale_samples_from_the_loss_and_the_gradient():
    lr = torch.tensor([[0.1, 0.2], [0.3, -0.1]], requires_grad=True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    c = correct("drop", lr, mask, humanline=False, staleness=torch.tensor([2, 9]), max_staleness=4)
    out = _loss(c, mask, torch.tensor([1.0, -1.0]), raw=lr, beta=0.1)
    out.loss.backward()
    assert (lr.grad[1] == 0).all() and (lr.grad[0] != 0).all()
    assert c.metrics["correction/masked"] == 0.5


def test_an_unknown_correction_is_refused():
    with pytest.raises(ValueError, match="unknown correction 'is'"):
        correct("is", torch.zeros(1, 1), torch.ones(1, 1), humanline=False)


def test_a_token_left_out_gives_no_nan_whatever_its_log_ratio():
    """m2po masks the token of log-ratio 100 (its square dominates); exp(100) overflows float32, and a masked
    token's inf x 0 would be nan in the gradient: it is zeroed before exp, so the kept token's gradient is exact."""
    lr = torch.tensor([[0.1, 100.0]], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    c = correct("m2po", lr, mask, humanline=True, behaviour_log_ratio=lr.detach(), tau=0.04)
    assert c.keep.tolist() == [[True, False]]
    out = _loss(c, mask, torch.tensor([1.0]), raw=lr, beta=0.1)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lr.grad).all() and lr.grad[0, 1] == 0


def test_an_uncapped_behaviour_weight_past_float32_stays_finite():
    """decoupled without a cap: pi_prox / pi_behav = e^100 is past float32's range (cast, it would be inf and the
    loss -inf); the weight is held at float32's largest value, so the loss and its gradient stay finite."""
    lr = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    c = correct("decoupled", lr, mask, humanline=False, behaviour_log_ratio=torch.tensor([[1.0, 100.0]]))
    assert c.weights[0, 1] == torch.finfo(torch.float32).max and torch.isclose(c.weights[0, 0], torch.tensor(math.e))
    out = _loss(c, mask, torch.tensor([1.0]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lr.grad).all()


def test_vespo_weights_by_hand():
    """The docstring's case: token log-ratios [0.1, -0.3] (log w = -0.2, w = 0.818731): phi = exp(3 - 0.4 -
    2.456192) = 1.154662 for a positive advantage, exp(2 - 0.6 - 1.637462) = 0.788627 for a negative one; a
    padded token counts nothing; w = 1 gives phi = 1 on either side; far from 1 (log w = -3 or +2) phi falls
    towards 0 (the kernel binds)."""
    log_ratio = torch.tensor([[0.1, -0.3, 9.0]] * 2 + [[0.0, 0.0, 0.0]] * 2 + [[-3.0, 0.0, 0.0], [2.0, 0.0, 0.0]],
                             dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]] * 6, dtype=torch.bool)
    advantages = torch.tensor([0.5, -0.5, 1.0, -1.0, 1.0, 1.0])
    got = vespo_weights(log_ratio, mask, advantages)
    w = math.exp(-0.2)
    assert got[0].item() == pytest.approx(math.exp(3 - 0.4 - 3 * w), abs=1e-12)
    assert got[0].item() == pytest.approx(1.154662, abs=1e-6) and got[1].item() == pytest.approx(0.788627, abs=1e-6)
    assert got[2].item() == pytest.approx(1.0, abs=1e-12) and got[3].item() == pytest.approx(1.0, abs=1e-12)
    assert got[4].item() == pytest.approx(math.exp(3 - 6 - 3 * math.exp(-3)), abs=1e-12) and got[4] < 0.05
    assert got[5].item() == pytest.approx(math.exp(3 + 4 - 3 * math.exp(2)), abs=1e-12) and got[5] < 1e-5


def test_vespo_clamps_as_trl_does():
    """A log w below log 1e-8 counts as log 1e-8 (phi then ~ 1e-16 x e^3), one above 20 as 20 (phi 0), no nan."""
    log_ratio = torch.tensor([[-30.0], [50.0]])
    got = vespo_weights(log_ratio, torch.ones(2, 1, dtype=torch.bool), torch.tensor([1.0, 1.0]))
    assert got[0].item() == pytest.approx(math.exp(3 + 2 * math.log(1e-8) - 3e-8), rel=1e-9)
    assert got[1].item() == 0.0 and torch.isfinite(got).all()


def test_icepop_keeps_the_tokens_inside_its_band():
    log_ratio = torch.tensor([[0.0, math.log(3), -math.log(4), math.log(1.5)]])
    keep = icepop_mask(log_ratio, torch.ones(1, 4, dtype=torch.bool), (0.5, 2.0))
    assert keep.tolist() == [[True, False, False, True]]


def test_the_geometric_mask_drops_whole_sequences_by_their_mean_ratio():
    log_ratio = torch.tensor([[0.004, 0.004, 5.0], [0.02, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    keep = geometric_mask(log_ratio, mask, (0.99, 1.01))
    assert keep.tolist() == [[True, True, False], [False, False, False]]


@pytest.mark.parametrize("name", ["vespo", "icepop", "geo_mask"])
def test_the_new_rules_leave_no_gradient_where_they_mask_or_weigh_zero(name):
    """Tokens a mask drops, or a sequence whose VESPO weight is 0 (log w past 20), get exactly zero gradient."""
    theta = torch.zeros(2, 3, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    behaviour = torch.tensor([[0.0, 0.0, 0.0], [25.0, 1.0, 1.0]])  # row 1 far from the sampler
    out = correct(name, theta * 1.0, mask, humanline=False, behaviour_log_ratio=behaviour,
                  advantages=torch.tensor([1.0, 1.0]), band=(0.5, 2.0) if name == "icepop" else (0.99, 1.01))
    weights = out.weights if out.weights is not None else torch.ones(2, 3)
    keep = out.keep if out.keep is not None else mask
    (-(torch.exp(out.log_ratio) * weights * keep).sum()).backward()
    assert torch.all(theta.grad[1] == 0) and torch.all(theta.grad[0] != 0)
