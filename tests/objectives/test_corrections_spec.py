"""Every stale-sample correction, built through the objective table (`loss_input` -> `grpo_batch_loss`) as the
trainer builds it, against its definition in SPEC §7, on a case small enough to compute exactly.

The case: one prompt, a policy over 4 one-token completions with logits theta (float64), the sampler mu =
[1/2, 1/4, 1/8, 1/8] and a batch drawn from mu in exact proportion (8 rows: 4 x token 0, 2 x token 1, one each of
tokens 2 and 3), so that the token mean of any per-token loss is its expectation under mu. The gradient is taken
at the pre-update weights (pi_prox = pi_theta, detached). Then, for a weighted rule whose clip and cap do not bind,
E_mu[w * grad PPO] is the on-policy gradient -sum_y pi_theta(y) A_y grad log pi_theta(y): that is what a
behaviour weight is for, and it holds for humanline's weight only when the weight is pi_ref / mu (SPEC §7).
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


def _table_gradient(correction: str, *, humanline: bool, ref_logits: torch.Tensor | None, **objective) -> torch.Tensor:
    """The gradient at theta of the trainer's loss: `loss_input` with the reference (humanline's pi_ref, or the
    sampler mu itself without humanline) and the sampler's log-probs, then GRPO's batch loss."""
    theta = _theta()
    log_mu = torch.log(MU)[TOKENS][:, None]
    ref_main = _logp(ref_logits) if humanline else log_mu
    ref = {"main": ref_main, "behaviour": log_mu if humanline else ref_main}  # the sampler *is* the reference
    band = (lambda raw, mask, part: raw.clamp(-1.5, 1.5)) if humanline else None
    cfg = ObjectiveConfig(name="grpo", correction=correction, eps_low=EPS, eps_high=EPS, grpo_beta=0.0, **objective)
    x = loss_input(SPECS["grpo"], _batch(), lambda part: _logp(theta), ref, transform=band, humanline=humanline)
    SPECS["grpo"].loss(x, cfg).loss.backward()
    return theta.grad


def _definition_gradient(rule) -> torch.Tensor:
    """The gradient at theta of `mean over rows of rule(log pi_theta, log pi_prox, A)` (SPEC §7 written out)."""
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
}


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
