"""DPO over token log-ratios (Rafailov et al. 2023; docs/method.md §4). No length normalisation, as in HALOs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from humanline.core.logps import masked_sum
from humanline.objectives.base import LossOutput, check_token_inputs


def dpo_loss(
    chosen_log_ratio: torch.Tensor,
    rejected_log_ratio: torch.Tensor,
    chosen_mask: torch.Tensor,
    rejected_mask: torch.Tensor,
    *,
    beta: float,
) -> LossOutput:
    """`loss = mean_b -log sigmoid(beta * sum_t lr(y_w) - beta * sum_t lr(y_l))`.

    Args:
        chosen_log_ratio: `(B, Tw)` token log-ratios of the preferred completions (already humanline-transformed
            if humanline is on); rejected_log_ratio: `(B, Tl)` for the dispreferred ones.
        chosen_mask, rejected_mask: bool masks of the same shapes; other positions are inert (may hold nan).
        beta: inverse temperature of the implicit reward.

    Metrics: mean implicit rewards `beta * sum_t lr` of chosen and rejected, their margin, the accuracy
    (share of pairs with chosen reward > rejected reward), and `pair_weight`, the mean of sigmoid(-margin): the
    factor each pair's gradient carries (1/2 at margin 0, as at every step of k = 1 humanline, docs/method.md §5).
    """
    chosen_mask = check_token_inputs("dpo_loss chosen", chosen_log_ratio, chosen_mask)
    rejected_mask = check_token_inputs("dpo_loss rejected", rejected_log_ratio, rejected_mask)
    if chosen_log_ratio.shape[0] != rejected_log_ratio.shape[0]:
        raise ValueError(
            f"dpo_loss: {chosen_log_ratio.shape[0]} chosen vs {rejected_log_ratio.shape[0]} rejected sequences"
        )
    chosen_rewards = beta * masked_sum(chosen_log_ratio, chosen_mask, dim=-1)
    rejected_rewards = beta * masked_sum(rejected_log_ratio, rejected_mask, dim=-1)
    margins = chosen_rewards - rejected_rewards
    loss = -F.logsigmoid(margins).mean()
    metrics = {
        "rewards/chosen": chosen_rewards.detach().mean(),
        "rewards/rejected": rejected_rewards.detach().mean(),
        "rewards/margin": margins.detach().mean(),
        "rewards/accuracy": (margins.detach() > 0).float().mean(),
        "pair_weight": torch.sigmoid(-margins.detach()).mean(),
    }
    return LossOutput(loss, metrics)
