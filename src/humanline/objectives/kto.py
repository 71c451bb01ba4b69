"""KTO over token log-ratios (Ethayarajh et al. 2024; docs/method.md §4), with HALOs' reference point."""

from __future__ import annotations

from typing import Callable

import torch

from humanline.core.logps import masked_sum
from humanline.objectives.base import LossOutput, check_token_inputs

# Sums a tensor across processes (e.g. `lambda t: accelerator.reduce(t, "sum")`); identity on one process.
Reducer = Callable[[torch.Tensor], torch.Tensor]


def kto_kl_ref(
    kl_log_ratio: torch.Tensor, kl_mask: torch.Tensor, *, reduce_sum: Reducer | None = None
) -> torch.Tensor:
    """The KTO reference point `z0 = max(0, mean_i sum_t lr_i)` over non-empty mismatched sequences.

    Args:
        kl_log_ratio: `(B, T)` token log-ratios of mismatched (prompt_i, completion_{i+1}) pairs.
        kl_mask: `(B, T)` bool; sequences with no true entry are ignored.
        reduce_sum: hook summing `(total, count)` across processes so every process gets the same `z0`
            (the global mean over sequences, not a mean of per-process means).

    Returns a detached 0-dim tensor; 0 when no sequence is non-empty.
    """
    kl_mask = check_token_inputs("kto_kl_ref", kl_log_ratio, kl_mask)
    with torch.no_grad():
        values = kl_log_ratio.detach()
        seq = masked_sum(values if values.dtype == torch.float64 else values.float(), kl_mask, dim=-1)
        nonempty = kl_mask.any(dim=-1)
        stats = torch.stack([seq.masked_fill(~nonempty, 0.0).sum(), nonempty.sum().to(seq.dtype)])
        if reduce_sum is not None:
            stats = reduce_sum(stats)
        total, count = stats[0], stats[1]
        # no host read: 0 where no sequence counts, decided on the device
        return torch.where(count > 0, total / count.clamp(min=1), 0.0).clamp(min=0.0)


def kto_loss(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    desirable: torch.Tensor,
    kl_ref: torch.Tensor | float,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    present: tuple[bool, bool] | None = None,
) -> LossOutput:
    """Per-example KTO loss, averaged over the micro-batch.

    With `r = sum_t lr` (not beta-scaled) and the reference point `z0 = kl_ref`:
        desirable:   `w_D * (1 - sigmoid(beta * (r - z0)))`
        undesirable: `w_U * (1 - sigmoid(beta * (z0 - r)))`

    Args:
        log_ratio: `(B, T)` token log-ratios; mask: `(B, T)` bool.
        desirable: `(B,)` bool, true for desirable (thumbs-up) examples.
        kl_ref: the reference point from `kto_kl_ref` (treated as a constant).
        beta, desirable_weight, undesirable_weight: as in the KTO paper (HALOs uses w_D = 1.1 in the paper's runs).
        present: whether the batch holds desirable and undesirable examples (their reward metrics are left out
            otherwise), when the caller knows it from the host; None: read from `desirable`.
    """
    mask = check_token_inputs("kto_loss", log_ratio, mask)
    desirable = desirable.bool()
    if desirable.shape != log_ratio.shape[:1]:
        raise ValueError(f"kto_loss: desirable must be ({log_ratio.shape[0]},), got {tuple(desirable.shape)}")
    z0 = torch.as_tensor(kl_ref, dtype=log_ratio.dtype, device=log_ratio.device).detach()
    seq = masked_sum(log_ratio, mask, dim=-1)
    desirable_losses = desirable_weight * (1.0 - torch.sigmoid(beta * (seq - z0)))
    undesirable_losses = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - seq)))
    losses = torch.where(desirable, desirable_losses, undesirable_losses)
    rewards = beta * seq.detach()
    metrics = {"kl_ref": z0.float()}
    if present is None:  # which classes the batch holds (a host read, unless the caller knows)
        present = (bool(desirable.any()), bool((~desirable).any()))
    for name, rows, here in (("desirable", desirable, present[0]), ("undesirable", ~desirable, present[1])):
        if here:  # the class's mean reward, without a data-dependent selection
            metrics[f"rewards/{name}"] = rewards.masked_fill(~rows, 0.0).sum() / rows.sum().clamp(min=1)
    metrics["rewards/accuracy"] = ((seq.detach() > z0) == desirable).float().mean()
    return LossOutput(losses.mean(), metrics)
