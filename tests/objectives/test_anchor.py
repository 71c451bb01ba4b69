"""The NLL anchor (`objective.nll_weight`): hand-computed values, and what it adds to DPO's and KTO's losses and
gradients through the objective table."""

from __future__ import annotations

import math

import pytest
import torch

from humanline.objectives import nll_anchor
from humanline.settings.config import ObjectiveConfig
from humanline.training.objective_table import SPECS, loss_input


def test_the_anchor_by_hand():
    """Rows [-1, -3] and [-0.5, pad]: NLLs 2 and 0.5, mean 1.25; a row without tokens is left out of the mean."""
    logps = torch.tensor([[-1.0, -3.0], [-0.5, float("nan")], [-7.0, -7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)
    assert nll_anchor(logps, mask).item() == pytest.approx(1.25, abs=1e-12)
    assert nll_anchor(logps, torch.zeros_like(mask)).item() == 0.0


def _dpo_batch():
    """Two pairs: rows 0-1 chosen, 2-3 rejected; each row one prompt token then its completion tokens."""
    return {"input_ids": torch.zeros(4, 3, dtype=torch.long),
            "completion_mask": torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [0, 1, 1]])}


def test_dpo_adds_the_chosen_answers_nll():
    """Policy log-probs: chosen rows [-1, -2] and [-0.4]; reference 0 everywhere, so the log-ratios are the
    log-probs. DPO: margins beta x ((-3) - (-1)) = -0.2 and beta x ((-0.4) - (-3)) = 0.26; anchor (3/2 + 0.4/1) / 2
    = 0.95; loss = mean(-log sigmoid(margins)) + 0.5 x 0.95. The rejected rows carry no anchor gradient."""
    policy = torch.tensor([[-1.0, -2.0], [-0.4, 0.0], [-0.5, -0.5], [-1.0, -2.0]], dtype=torch.float64,
                          requires_grad=True)
    ref = {"main": torch.zeros(4, 2, dtype=torch.float64)}
    base = ObjectiveConfig(name="dpo", beta=0.1)
    anchored = ObjectiveConfig(name="dpo", beta=0.1, nll_weight=0.5)
    x = loss_input(SPECS["dpo"], _dpo_batch(), lambda part: policy, ref)
    plain, with_nll = SPECS["dpo"].loss(x, base), SPECS["dpo"].loss(x, anchored)
    margins = [0.1 * (-3.0 + 1.0), 0.1 * (-0.4 + 3.0)]
    expected = sum(-math.log(1 / (1 + math.exp(-m))) for m in margins) / 2
    assert plain.loss.item() == pytest.approx(expected, abs=1e-12)
    assert with_nll.loss.item() == pytest.approx(expected + 0.5 * 0.95, abs=1e-12)
    assert with_nll.metrics["nll"].item() == pytest.approx(0.95, abs=1e-12)
    (with_nll.loss - plain.loss).backward()  # the anchor's own gradient: -0.5 / (2 x length) on chosen tokens
    assert torch.allclose(policy.grad, torch.tensor([[-0.125, -0.125], [-0.25, 0.0], [0.0, 0.0], [0.0, 0.0]],
                                                    dtype=torch.float64), atol=1e-12)


def test_kto_anchors_the_desirable_examples_only():
    policy = torch.tensor([[-1.0, -1.0], [-4.0, -4.0], [-2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    batch = {"input_ids": torch.zeros(3, 3, dtype=torch.long),
             "completion_mask": torch.tensor([[0, 1, 1], [0, 1, 1], [0, 1, 0]]),
             "desirable": torch.tensor([True, False, True]),
             "kl_input_ids": torch.zeros(3, 3, dtype=torch.long),
             "kl_completion_mask": torch.tensor([[0, 1, 0]] * 3)}
    ref = {"main": torch.zeros(3, 2, dtype=torch.float64), "kl": torch.zeros(3, 2, dtype=torch.float64)}
    x = loss_input(SPECS["kto"], batch, lambda part: policy if part == "main" else torch.zeros(3, 2,
                                                                                               dtype=torch.float64),
                   ref)
    plain = SPECS["kto"].loss(x, ObjectiveConfig(name="kto"))
    anchored = SPECS["kto"].loss(x, ObjectiveConfig(name="kto", nll_weight=2.0))
    assert anchored.metrics["nll"].item() == pytest.approx((1.0 + 2.0) / 2, abs=1e-12)  # rows 0 and 2
    assert anchored.loss.item() == pytest.approx(plain.loss.item() + 2.0 * 1.5, abs=1e-12)
    (anchored.loss - plain.loss).backward()
    assert torch.all(policy.grad[1] == 0)


@pytest.mark.parametrize("name", ["grpo"])
def test_an_anchor_on_an_objective_without_preferred_answers_is_refused(tmp_path, name):
    from helpers_reliability import online_config
    from humanline.errors import UserError

    with pytest.raises(UserError, match="objective.nll_weight"):
        online_config(tmp_path / "run", 1, objective={"nll_weight": 0.1})
