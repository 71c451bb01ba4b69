"""Objectives applied to collated batches: the bridge between the batch layout and the pure losses.

The trainer computes the policy's and the reference's token log-probs, then calls one of these through the
plain name -> function table `BATCH_LOSSES`. Each takes the humanline-transformed log-ratio `log_ratio`, the
raw one `raw_log_ratio`, and a `LossContext` with what some objectives need beyond the main sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from humanline.config import ObjectiveConfig
from humanline.objectives import LossOutput, dpo_loss, group_advantages, grpo_loss, kto_kl_ref, kto_loss


@dataclass
class LossContext:
    batch: dict
    mask: torch.Tensor  # (N, T) completion mask of the main part
    cfg: ObjectiveConfig
    kl_log_ratio: torch.Tensor | None = None  # KTO: transformed log-ratio of the mismatched pairs
    kl_mask: torch.Tensor | None = None
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None  # sums across processes


def batch_dpo(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """Rows [0:B] are chosen, [B:2B] rejected (one concatenated forward)."""
    half = log_ratio.shape[0] // 2
    return dpo_loss(log_ratio[:half], log_ratio[half:], ctx.mask[:half], ctx.mask[half:], beta=ctx.cfg.beta)


def batch_kto(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """KTO with the reference point from the mismatched pairs, summed across processes."""
    z0 = kto_kl_ref(ctx.kl_log_ratio, ctx.kl_mask, reduce_sum=ctx.reduce_sum)
    return kto_loss(
        log_ratio,
        ctx.mask,
        ctx.batch["desirable"],
        z0,
        beta=ctx.cfg.beta,
        desirable_weight=ctx.cfg.desirable_weight,
        undesirable_weight=ctx.cfg.undesirable_weight,
    )


def batch_grpo(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """Group statistics per micro-batch: a group is never split across micro-batches or processes, so the
    per-micro-batch advantages equal the global ones."""
    advantages = group_advantages(ctx.batch["rewards"], ctx.batch["group_ids"], eps=ctx.cfg.advantage_eps)
    out = grpo_loss(
        log_ratio,
        ctx.mask,
        advantages.to(log_ratio.device),
        raw_log_ratio=raw_log_ratio,
        beta=ctx.cfg.grpo_beta,
        eps_low=ctx.cfg.eps_low,
        eps_high=ctx.cfg.eps_high,
        reduction=ctx.cfg.reduction,
    )
    out.metrics["reward"] = ctx.batch["rewards"].float().mean()
    return out


BATCH_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor, LossContext], LossOutput]] = {
    "dpo": batch_dpo,
    "kto": batch_kto,
    "grpo": batch_grpo,
}
