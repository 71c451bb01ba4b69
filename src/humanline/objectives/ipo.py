"""IPO over token log-ratios (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
Human Preferences", eq. 17): a squared loss that regresses the log-ratio margin of a preference pair onto a
fixed target `1 / (2 tau)`, instead of pushing it without bound as DPO's sigmoid does.

Like DPO it is reference-based, so humanline applies: the transform clips the token log-ratios upstream.
Deviation from some implementations: the sequence log-ratio is the plain sum over tokens, as in the paper
(and as `dpo_loss` here); some libraries average over tokens for IPO instead.
"""

from __future__ import annotations

import torch

from humanline.core.logps import masked_sum
from humanline.objectives.base import LossOutput, check_token_inputs


def ipo_loss(
    chosen_log_ratio: torch.Tensor,
    rejected_log_ratio: torch.Tensor,
    chosen_mask: torch.Tensor,
    rejected_mask: torch.Tensor,
    *,
    tau: float,
) -> LossOutput:
    """`loss = mean_b (h_b - 1 / (2 tau))^2`, `h_b = sum_t lr(y_w) - sum_t lr(y_l)`.

    Args:
        chosen_log_ratio: `(B, Tw)` token log-ratios of the preferred completions (humanline-transformed if
            humanline is on); rejected_log_ratio: `(B, Tl)` for the dispreferred ones.
        chosen_mask, rejected_mask: bool masks of the same shapes; other positions are inert (may hold nan).
        tau: regularisation strength (> 0); the margin's target is `1 / (2 tau)` nats.

    Gradient: `d loss / d lr_w[b, t] = 2 (h_b - 1 / (2 tau)) / B` on masked tokens, the negative for `lr_l`.
    Metrics: mean sequence log-ratios of chosen and rejected, the margin `h`, and the accuracy (share of
    pairs with `h > 0`).
    """
    if tau <= 0:
        raise ValueError(f"ipo_loss: tau must be > 0, got {tau}")
    chosen_mask = check_token_inputs("ipo_loss chosen", chosen_log_ratio, chosen_mask)
    rejected_mask = check_token_inputs("ipo_loss rejected", rejected_log_ratio, rejected_mask)
    if chosen_log_ratio.shape[0] != rejected_log_ratio.shape[0]:
        raise ValueError(
            f"ipo_loss: {chosen_log_ratio.shape[0]} chosen vs {rejected_log_ratio.shape[0]} rejected sequences"
        )
    chosen = masked_sum(chosen_log_ratio, chosen_mask, dim=-1)
    rejected = masked_sum(rejected_log_ratio, rejected_mask, dim=-1)
    margins = chosen - rejected
    loss = ((margins - 1.0 / (2.0 * tau)) ** 2).mean()
    metrics = {
        "logratio/chosen": chosen.detach().mean(),
        "logratio/rejected": rejected.detach().mean(),
        "logratio/margin": margins.detach().mean(),
        "rewards/accuracy": (margins.detach() > 0).float().mean(),
    }
    return LossOutput(loss, metrics)
