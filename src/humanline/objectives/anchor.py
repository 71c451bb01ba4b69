"""The NLL anchor (`objective.nll_weight`): a supervised term on the answers a preference objective prefers.

Correct-against-incorrect pairs often differ in a few tokens, and DPO then lowers the chosen answer's likelihood
too (Smaug); iterative RPO (Pang et al. 2024) adds the chosen answer's negative log-likelihood, normalised by its
length, to the DPO loss (TRL: `loss_type=["sigmoid", "sft"]`). It reads the policy's own token log-probs, never a
log-ratio: humanline's transform and reference do not touch it.
"""

from __future__ import annotations

import torch

from humanline.core.logps import masked_sum
from humanline.objectives.base import LossOutput, check_token_inputs


def nll_anchor(policy_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean over rows of each row's length-normalised negative log-likelihood, `-sum_t log pi(y_t) / |y|`.

    Args:
        policy_logps: `(B, T)` the policy's token log-probs (with gradient) of the anchored answers.
        mask: `(B, T)` their tokens; a row without tokens counts 0 and is left out of the mean.

    Example: rows of log-probs [-1, -3] and [-0.5, (pad)] give NLLs 2 and 0.5, anchor 1.25. (TRL's "sft" loss takes
    the mean over all tokens instead, (1 + 3 + 0.5) / 3 = 1.5: the two agree when every answer has one length.)
    """
    mask = check_token_inputs("nll_anchor", policy_logps, mask)
    lengths = mask.sum(-1)
    present = lengths > 0
    per_row = -masked_sum(policy_logps, mask, dim=-1) / lengths.clamp(min=1)
    return (per_row * present).sum() / present.sum().clamp(min=1)


def with_anchor(out: LossOutput, anchor: torch.Tensor, weight: float) -> LossOutput:
    """`out` with `weight x anchor` added to its loss, and the anchor logged as `nll` (detached)."""
    return LossOutput(out.loss + weight * anchor, {**out.metrics, "nll": anchor.detach()})
