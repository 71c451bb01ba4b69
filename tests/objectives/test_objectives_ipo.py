"""IPO over token log-ratios: hand-computed loss, metrics and gradient; bad input; the table entry."""

from __future__ import annotations

import pytest
import torch

from humanline import clip_log_ratio, ipo_loss  # the public API, as for every objective
from humanline.settings.config import ObjectiveConfig
from humanline.training.objective_table import SPECS, LossInput

NAN, INF = float("nan"), float("inf")


def _pairs(requires_grad=True):
    cw = torch.tensor([[0.5, 0.25, NAN], [0.1, -0.3, 0.0]], requires_grad=requires_grad)
    cl = torch.tensor([[-0.25, INF], [0.3, 0.0]], requires_grad=requires_grad)
    mw = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    ml = torch.tensor([[1, 0], [1, 0]], dtype=torch.bool)
    return cw, cl, mw, ml


def test_hand_computed_loss_metrics_and_gradient():
    """tau = 1: target margin 1 / (2 tau) = 0.5. Chosen sums (masked tokens): 0.5 + 0.25 = 0.75 and
    0.1 - 0.3 = -0.2; rejected: -0.25 and 0.3. Margins h = (1.0, -0.5). loss = ((1.0 - 0.5)^2 + (-0.5 - 0.5)^2)
    / 2 = (0.25 + 1.0) / 2 = 0.625. Metrics: chosen 0.275, rejected 0.025, margin 0.25, accuracy 1/2.
    d loss / d lr_w[b, t] = 2 (h_b - 0.5) / 2 = (0.5, -1.0) on masked tokens, (-0.5, +1.0) for lr_l; 0 (not
    nan) at masked positions holding nan or inf."""
    cw, cl, mw, ml = _pairs()
    out = ipo_loss(cw, cl, mw, ml, tau=1.0)
    assert out.loss.item() == pytest.approx(0.625, abs=1e-6)
    assert out.metrics["logratio/chosen"].item() == pytest.approx(0.275, abs=1e-6)
    assert out.metrics["logratio/rejected"].item() == pytest.approx(0.025, abs=1e-6)
    assert out.metrics["logratio/margin"].item() == pytest.approx(0.25, abs=1e-6)
    assert out.metrics["rewards/accuracy"].item() == 0.5
    assert all(not v.requires_grad for v in out.metrics.values())
    out.loss.backward()
    assert torch.allclose(cw.grad, torch.tensor([[0.5, 0.5, 0.0], [-1.0, -1.0, 0.0]]))
    assert torch.allclose(cl.grad, torch.tensor([[-0.5, 0.0], [1.0, 0.0]]))


def test_margin_at_the_target_gives_zero_loss_and_gradient():
    """tau = 0.5: target 1.0; chosen 0.75, rejected -0.25: h = 1.0 exactly, so loss 0 and gradient 0 (unlike
    DPO, IPO does not push a pair past its target)."""
    cw = torch.tensor([[0.5, 0.25]], requires_grad=True)
    cl = torch.tensor([[-0.25]], requires_grad=True)
    out = ipo_loss(cw, cl, torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 1, dtype=torch.bool), tau=0.5)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.0, abs=1e-12)
    assert torch.count_nonzero(cw.grad) == 0 and torch.count_nonzero(cl.grad) == 0


def test_humanline_clip_upstream_zeroes_the_gradient_of_clipped_tokens():
    """Clip to [-0.2, 0.2]: chosen 0.5 -> 0.2 and 0.25 -> 0.2 (no gradient through them), -0.3 -> -0.2;
    rejected -0.25 -> -0.2 and 0.3 -> 0.2. Margins h = (0.4 - (-0.2), (0.1 - 0.2) - 0.2) = (0.6, -0.3); tau = 1:
    loss = ((0.6 - 0.5)^2 + (-0.3 - 0.5)^2) / 2 = (0.01 + 0.64) / 2 = 0.325. Only unclipped tokens carry a
    gradient: cw[1, 0] (0.1) gets 2 (-0.3 - 0.5) / 2 = -0.8; every rejected token is clipped."""
    cw, cl, mw, ml = _pairs()
    out = ipo_loss(clip_log_ratio(cw, low=-0.2, high=0.2), clip_log_ratio(cl, low=-0.2, high=0.2), mw, ml,
                   tau=1.0)
    assert out.loss.item() == pytest.approx(0.325, abs=1e-6)
    out.loss.backward()
    assert torch.allclose(cw.grad, torch.tensor([[0.0, 0.0, 0.0], [-0.8, 0.0, 0.0]]))
    assert torch.count_nonzero(cl.grad) == 0


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_tau_must_be_positive(tau):
    cw, cl, mw, ml = _pairs()
    with pytest.raises(ValueError, match="tau must be > 0"):
        ipo_loss(cw, cl, mw, ml, tau=tau)


def test_mismatched_pair_counts_are_refused():
    cw, cl, mw, ml = _pairs()
    with pytest.raises(ValueError, match="2 chosen vs 1 rejected"):
        ipo_loss(cw, cl[:1], mw, ml[:1], tau=1.0)


def test_table_entry_splits_the_concatenated_batch_and_reads_tau():
    """The `ipo` entry trains on pairs like DPO (rows [0:B] chosen, [B:2B] rejected) and passes objective.tau:
    tau = 0.25 gives target 2; margins (1.0, -0.5) -> loss ((1 - 2)^2 + (-0.5 - 2)^2) / 2 = 3.625. With tau null
    (IPO recipes written before the field) objective.beta is tau; a set tau wins over beta: tau = 0.5 gives
    target 1 -> ((1 - 1)^2 + (-0.5 - 1)^2) / 2 = 1.125."""
    spec = SPECS["ipo"]
    assert (spec.kind, spec.kl_part, spec.own_ratio_clip, spec.sampler_reference) == ("pairwise", False, False, False)
    log_ratio = torch.tensor([[0.5, 0.25], [0.1, -0.3], [-0.25, 0.0], [0.3, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0]], dtype=torch.bool)

    def loss(**fields):
        return spec.loss(LossInput({}, log_ratio, log_ratio, mask), ObjectiveConfig(name="ipo", **fields)).loss.item()

    assert loss(tau=0.25) == pytest.approx(3.625, abs=1e-6)
    assert loss(beta=0.25) == pytest.approx(3.625, abs=1e-6)
    assert loss(beta=0.25, tau=0.5) == pytest.approx(1.125, abs=1e-6)


def test_tau_is_checked_at_load_time_naming_the_field():
    from humanline.errors import UserError
    from humanline.training.config_loading import load_config

    with pytest.raises(UserError, match="objective.tau"):
        load_config(None, {"objective": {"name": "ipo", "tau": -1.0}, "data": {"train": "pairs.jsonl"}})
    cfg = load_config(None, {"objective": {"name": "ipo", "tau": 0.5}, "data": {"train": "pairs.jsonl"}})
    assert cfg.objective.tau == 0.5
