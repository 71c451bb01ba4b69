"""Every stale-sample correction, built through the objective table (`loss_input` -> `grpo_batch_loss`) as the
trainer builds it, against its definition in docs/method.md §3.6, on a case small enough to compute exactly.

The case: one prompt, a policy over 4 one-token completions with logits theta (float64), the sampler mu =
[1/2, 1/4, 1/8, 1/8] and a batch drawn from mu in exact proportion (8 rows: 4 x token 0, 2 x token 1, one each of
tokens 2 and 3), so that the token mean of any per-token loss is its expectation under mu. The gradient is taken
at the pre-update weights (pi_prox = pi_theta, detached). Then, for a weighted rule whose clip and cap do not bind,
E_mu[w * grad PPO] is the on-policy gradient -sum_y pi_theta(y) A_y grad log pi_theta(y): that is what a
behaviour weight is for, and it holds for humanline's weight only when the weight is pi_ref / mu (docs/method.md §3.6).
"""

from __future__ import annotations

import math

import pytest
import torch

from humanline.objectives import group_advantages
from humanline.objectives.corrections import behaviour_weights
from humanline.settings.config import ObjectiveConfig
from humanline.training.objective_table import SPECS, loss_input

TOKENS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3])  # drawn from MU in exact proportion
MU = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
REWARDS = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.2])
EPS = 0.2


def _batch() -> dict:
    n = len(TOKENS)
    return {"input_ids": torch.stack([torch.full((n,), 7), TOKENS], dim=1),
            "completion_mask": torch.tensor([[0, 1]] * n), "rewards": REWARDS,
            "group_ids": torch.zeros(n, dtype=torch.long), "n_groups": 1}


def _theta() -> torch.Tensor:
    return torch.tensor([0.3, -0.2, 0.1, -0.4], dtype=torch.float64, requires_grad=True)


def _logp(dist_logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(dist_logits, dim=0)[TOKENS][:, None]  # (8, 1)


def _table_gradient(correction: str, *, humanline: bool, ref_logits: torch.Tensor | None, band_width: float = 1.5,
                    **objective) -> torch.Tensor:
    """The gradient at theta of the trainer's loss: `loss_input` with the reference (humanline's pi_ref, or the
    sampler mu itself without humanline) and the sampler's log-probs, then GRPO's batch loss. Humanline's band:
    +-`band_width`, applied as the Trainer applies it (the transform of `loss_input`)."""
    theta = _theta()
    log_mu = torch.log(MU)[TOKENS][:, None]
    ref_main = _logp(ref_logits) if humanline else log_mu
    ref = {"main": ref_main, "behaviour": log_mu if humanline else ref_main}  # the sampler *is* the reference
    band = (lambda raw, mask, part: raw.clamp(-band_width, band_width)) if humanline else None
    cfg = ObjectiveConfig(name="grpo", correction=correction, eps_low=EPS, eps_high=EPS, grpo_beta=0.0, **objective)
    x = loss_input(SPECS["grpo"], _batch(), lambda part: _logp(theta), ref, transform=band, humanline=humanline)
    SPECS["grpo"].loss(x, cfg).loss.backward()
    return theta.grad


def _definition_gradient(rule) -> torch.Tensor:
    """The gradient at theta of `mean over rows of rule(log pi_theta, log pi_prox, A)` (docs/method.md §3.6 written
    out)."""
    theta = _theta()
    advantages = group_advantages(REWARDS, torch.zeros(8, dtype=torch.long)).double()[:, None]
    logp = _logp(theta)
    rule(logp, logp.detach(), advantages).mean().backward()
    return theta.grad


def ppo(log_r: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    r = torch.exp(log_r)
    return -torch.minimum(r * a, r.clamp(1 - EPS, 1 + EPS) * a)


LOG_MU = torch.log(MU)[TOKENS][:, None]
REF_LOGITS = torch.tensor([0.32, -0.23, 0.14, -0.42], dtype=torch.float64)  # pi_ref: the policy a few steps ago
LOG_REF = torch.log_softmax(REF_LOGITS, 0)[TOKENS][:, None]


def on_policy_gradient() -> torch.Tensor:
    """-sum_y pi_theta(y) A_y grad log pi_theta(y), with A_y the batch's advantages of token y."""
    theta = _theta()
    advantages = group_advantages(REWARDS, torch.zeros(8, dtype=torch.long)).double()
    a_of = {int(t): float(a) for t, a in zip(TOKENS, advantages)}
    logp = torch.log_softmax(theta, 0)
    (-sum(logp.detach().exp()[y] * a_of[y] * logp[y] for y in range(4))).backward()
    return theta.grad


def phi(log_w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """VESPO's weight written out (arXiv 2602.10693; TRL's defaults): exp(lambda + k log w - lambda w), with (k,
    lambda) = (2, 3) where A >= 0 and (3, 2) where A < 0."""
    k, lam = torch.where(a >= 0, 2.0, 3.0), torch.where(a >= 0, 3.0, 2.0)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w))


def inside(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    return (torch.exp(log_ratio) >= low) & (torch.exp(log_ratio) <= high)


GEO = (0.7, 1.5)  # a geometric band that binds on some rows of this case (each row is one token)

CASES = {
    # name: (correction, humanline, objective settings, the definition per row)
    "plain": ("none", False, {}, lambda lp, prox, a: ppo(lp - LOG_MU, a)),
    "tis": ("tis", False, {"tis_cap": 2.0},
            lambda lp, prox, a: torch.exp(prox - LOG_MU).clamp(max=2.0) * ppo(lp - prox, a)),
    "decoupled": ("decoupled", False, {}, lambda lp, prox, a: torch.exp(prox - LOG_MU) * ppo(lp - prox, a)),
    "humanline": ("none", True, {}, lambda lp, prox, a: ppo((lp - LOG_REF).clamp(-1.5, 1.5), a)),
    "humanline-tis": ("tis", True, {"tis_cap": 2.0},
                      lambda lp, prox, a: torch.exp(LOG_REF - LOG_MU).clamp(max=2.0) * ppo(lp - LOG_REF, a)),
    "humanline-decoupled": ("decoupled", True, {},
                            lambda lp, prox, a: torch.exp(LOG_REF - LOG_MU) * ppo(lp - LOG_REF, a)),
    # VESPO: phi of the sequence ratio (one token per row here) times the policy gradient, no clip
    "vespo": ("vespo", False, {}, lambda lp, prox, a: -phi(prox - LOG_MU, a) * a * lp),
    "humanline-vespo": ("vespo", True, {},
                        lambda lp, prox, a: phi(LOG_REF - LOG_MU, a) * ppo((lp - LOG_REF).clamp(-1.5, 1.5), a)),
    # IcePop: tokens whose ratio to the sampler lies outside [0.5, 2] count for nothing; the rest as tis, unweighted
    "icepop": ("icepop", False, {},
               lambda lp, prox, a: torch.where(inside(prox - LOG_MU, 0.5, 2.0), ppo(lp - prox, a), 0.0)),
    "humanline-icepop": ("icepop", True, {}, lambda lp, prox, a: torch.where(
        inside(LOG_REF - LOG_MU, 0.5, 2.0), ppo((lp - LOG_REF).clamp(-1.5, 1.5), a), 0.0)),
    # the geometric mask: a sequence (a row) whose geometric-mean ratio lies outside the band counts for nothing
    "geo_mask": ("geo_mask", False, {"geo_band": list(GEO)},
                 lambda lp, prox, a: torch.where(inside(prox - LOG_MU, *GEO), ppo(lp - prox, a), 0.0)),
    "humanline-geo_mask": ("geo_mask", True, {"geo_band": list(GEO)}, lambda lp, prox, a: torch.where(
        inside(LOG_REF - LOG_MU, *GEO), ppo((lp - LOG_REF).clamp(-1.5, 1.5), a), 0.0)),
}


@pytest.mark.parametrize("log_ratio, low, high", [("prox", 0.5, 2.0), ("ref", 0.5, 2.0), ("prox", *GEO),
                                                  ("ref", *GEO)])
def test_the_masks_bind_on_this_case(log_ratio, low, high):
    """Each mask's case above keeps some rows and drops others (so the gradients compared are not all or nothing)."""
    log_pi = torch.log_softmax(_theta().detach(), 0)[TOKENS][:, None] if log_ratio == "prox" else LOG_REF
    kept = inside(log_pi - LOG_MU, low, high)
    assert 0 < int(kept.sum()) < len(TOKENS)


@pytest.mark.parametrize("name", list(CASES))
def test_each_correction_has_the_gradient_of_its_definition(name):
    correction, humanline, objective, rule = CASES[name]
    got = _table_gradient(correction, humanline=humanline, ref_logits=REF_LOGITS, **objective)
    assert torch.allclose(got, _definition_gradient(rule), atol=1e-12, rtol=0), name


def test_m2po_masks_by_the_second_moment_and_trains_the_unclipped_ratio_to_the_sampler():
    """(log pi_prox / mu)^2 per token: 0.0.. for the 4 rows of token 0 and more elsewhere; with tau 0.1 the
    largest are masked until the mean of the rest is at most 0.1. The kept rows train -A pi_theta / mu (no clip),
    divided by all 8 rows."""
    got = _table_gradient("m2po", humanline=False, ref_logits=None, m2_threshold=0.1)
    m = (torch.log_softmax(_theta().detach(), 0)[TOKENS] - LOG_MU[:, 0]) ** 2
    order = sorted(range(8), key=lambda i: -float(m[i]))
    masked = 0
    while float(m[order[masked:]].mean()) > 0.1:
        masked += 1
    keep = torch.ones(8, dtype=torch.bool)
    keep[order[:masked]] = False
    assert 0 < masked < 8
    want = _definition_gradient(lambda lp, prox, a: torch.where(keep[:, None], -torch.exp(lp - LOG_MU) * a, 0.0))
    assert torch.allclose(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["tis", "decoupled", "humanline-tis", "humanline-decoupled"])
def test_a_behaviour_weight_gives_the_on_policy_gradient_at_the_pre_update_weights(name):
    """With a cap that does not bind (pi / mu < 2.4 < 3; |log pi_theta / pi_ref| < 0.04, inside the clip), E_mu[w
    grad PPO] is the on-policy gradient exactly, for humanline's weight pi_ref / mu as for pi_prox / mu without
    humanline. (At the cap of 2 of the cases above token 2's weight is cut, and it is not.)"""
    correction, humanline, objective, _ = CASES[name]
    objective = {**objective, "tis_cap": 3.0} if "tis_cap" in objective else objective
    got = _table_gradient(correction, humanline=humanline, ref_logits=REF_LOGITS, **objective)
    assert torch.allclose(got, on_policy_gradient(), atol=1e-12, rtol=0)


def test_humanlines_weight_against_the_current_policy_would_not():
    """The weight pi_prox / mu on humanline's loss (the drift since the sync counted twice) misses the
    on-policy gradient by the ratio pi_theta / pi_ref: the check above can fail."""
    wrong = _definition_gradient(lambda lp, prox, a: torch.exp(prox - LOG_MU) * ppo(lp - LOG_REF, a))
    assert not torch.allclose(wrong, on_policy_gradient(), atol=1e-6, rtol=0)


def test_humanlines_behaviour_weight_is_pi_ref_over_mu_capped():
    """Through the table: rows of token 0 have pi_ref(0) / mu(0) = e^(-0.7) / 0.5 (mu 1/2) and a cap of 2 cuts
    token 2's pi_ref / mu = 0.3 / 0.125 = 2.4. Hand-computed weights, read back from the loss input."""
    log_ref = torch.log(torch.tensor([math.exp(-0.7), 0.2, 0.3, 1 - math.exp(-0.7) - 0.5], dtype=torch.float64))
    log_mu = torch.log(MU)
    theta = torch.zeros(4, dtype=torch.float64)
    ref = {"main": log_ref[TOKENS][:, None], "behaviour": log_mu[TOKENS][:, None]}
    x = loss_input(SPECS["grpo"], _batch(), lambda part: _logp(theta), ref, humanline=True)
    weights, capped = behaviour_weights(x.behaviour_log_ratio, cap=2.0)
    expected = torch.tensor([math.exp(-0.7) / 0.5] * 4 + [0.8] * 2 + [2.0, (1 - math.exp(-0.7) - 0.5) / 0.125],
                            dtype=torch.float64)
    assert torch.allclose(weights[:, 0], expected, atol=1e-12)
    assert capped[:, 0].tolist() == [False] * 6 + [True, False]


FAR_REF_LOGITS = torch.tensor([0.6, -0.5, 0.1, -0.1], dtype=torch.float64)  # pi_ref far enough for a band to bind
LOG_FAR_REF = torch.log_softmax(FAR_REF_LOGITS, 0)[TOKENS][:, None]
NARROW = 0.1  # humanline's band +-0.1: |log pi_theta / pi_ref| reaches 0.2-0.4 on every token of this case


@pytest.mark.parametrize("correction, objective, weight", [
    ("tis", {"tis_cap": 2.0}, lambda a: torch.exp(LOG_FAR_REF - LOG_MU).clamp(max=2.0)),
    ("vespo", {}, lambda a: phi(LOG_FAR_REF - LOG_MU, a)),
    ("icepop", {}, lambda a: inside(LOG_FAR_REF - LOG_MU, 0.5, 2.0).double()),
    ("m2po", {"m2_threshold": 10.0}, lambda a: torch.ones_like(a)),  # a tau that masks nothing: the band alone
])
def test_humanline_with_a_correction_where_the_band_binds(correction, objective, weight):
    """Humanline's band, +-0.1 here, binds on every token (the log-ratios to pi_ref are 0.2-0.4 in size), so each
    token's gradient is zero and only the ratio clipped to the band remains in the loss value: the table's gradient
    equals the definition with the band and differs from the one without it (a loss that skipped the band would
    fail here)."""
    log_theta = torch.log_softmax(_theta().detach(), 0)[TOKENS][:, None]
    assert torch.all((log_theta - LOG_FAR_REF).abs() > NARROW)
    got = _table_gradient(correction, humanline=True, ref_logits=FAR_REF_LOGITS, band_width=NARROW, **objective)
    banded = _definition_gradient(lambda lp, prox, a: weight(a) * ppo((lp - LOG_FAR_REF).clamp(-NARROW, NARROW), a))
    unbanded = _definition_gradient(lambda lp, prox, a: weight(a) * ppo(lp - LOG_FAR_REF, a))
    assert torch.allclose(got, banded, atol=1e-12, rtol=0)
    assert not torch.allclose(got, unbanded, atol=1e-6, rtol=0)


def test_humanline_with_a_correction_where_the_band_binds_on_some_tokens():
    """A band of +-0.3 binds on the rows of tokens 0 and 2 only: those rows give no gradient, the others train
    humanline's ratio times the tis weight (checked against the definition, and against the band left out)."""
    log_theta = torch.log_softmax(_theta().detach(), 0)[TOKENS][:, None]
    outside = (log_theta - LOG_FAR_REF).abs() > 0.3
    assert 0 < int(outside.sum()) < len(TOKENS)
    got = _table_gradient("tis", humanline=True, ref_logits=FAR_REF_LOGITS, band_width=0.3, tis_cap=2.0)
    weight = torch.exp(LOG_FAR_REF - LOG_MU).clamp(max=2.0)
    banded = _definition_gradient(lambda lp, prox, a: weight * ppo((lp - LOG_FAR_REF).clamp(-0.3, 0.3), a))
    unbanded = _definition_gradient(lambda lp, prox, a: weight * ppo(lp - LOG_FAR_REF, a))
    assert torch.allclose(got, banded, atol=1e-12, rtol=0)
    assert not torch.allclose(got, unbanded, atol=1e-6, rtol=0)
