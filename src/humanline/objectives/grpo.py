"""GRPO over token log-ratios (Shao et al. 2024; docs/method.md §4), with HALOs' semantics: the ratio is taken
against the reference, which plays the old policy's role when humanline syncing is on."""

from __future__ import annotations

import torch

from humanline.core.logps import masked_sum
from humanline.objectives.base import LossOutput, check_token_inputs


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 0.01,
                     n_groups: int | None = None) -> torch.Tensor:
    """`A_i = (s_i - mean_g s) / (std_g s + eps)` with the population std of each group g.

    Args:
        rewards: `(N,)` scalar rewards; group_ids: `(N,)` integer id of each completion's prompt group.
        n_groups: when the ids are known to be 0 .. n_groups - 1 (collation numbers the groups of a micro-batch
            so), they index the groups directly: no `unique`, no host read. None: any ids, renumbered here.
    Returns `(N,)` float advantages (zero for a group of one, or a group with equal rewards).
    """
    rewards = rewards.detach().double()
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_advantages: rewards and group_ids must be (N,), got {tuple(rewards.shape)}, "
            f"{tuple(group_ids.shape)}"
        )
    if n_groups is None:
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    else:
        inverse = group_ids.long()
    counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, inverse, torch.ones_like(rewards)
    )
    sums = torch.zeros_like(counts).index_add_(0, inverse, rewards)
    means = sums / counts
    centred = rewards - means[inverse]
    variances = torch.zeros_like(counts).index_add_(0, inverse, centred**2) / counts
    std = variances.sqrt()[inverse]
    if eps < 0:
        raise ValueError(f"group_advantages: eps must be >= 0, got {eps}")
    # A group of one, or with equal rewards, has no signal: advantage 0 (also when eps = 0, not 0/0).
    return torch.where(centred == 0, torch.zeros_like(centred), centred / (std + eps)).float()


def grpo_loss(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    raw_log_ratio: torch.Tensor | None = None,
    beta: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    reduction: str = "token",
    weights: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
    clip: bool = True,
) -> LossOutput:
    """Clipped surrogate with an optional k3 KL penalty.

    Per token, with `ratio = exp(lr)`:
        `surr = min(A * ratio, A * clamp(ratio, 1 - eps_low, 1 + eps_high))`
        `kl   = exp(-raw) + raw - 1`   (= exp(ref - pol) - (ref - pol) - 1, on the *unclipped* log-ratio)
        `loss_t = -surr + beta * kl`

    Args:
        log_ratio: `(B, T)` token log-ratios (humanline-transformed if on); mask: `(B, T)` bool.
        advantages: `(B,)` per-sequence advantages (see `group_advantages`).
        raw_log_ratio: `(B, T)` untransformed log-ratio for the KL term; defaults to `log_ratio`.
        beta: KL coefficient (HALOs 0.01; 0 disables the term's gradient, the KL is still reported).
        eps_low, eps_high: PPO clip range of the ratio (HALOs 0.01; TRL 0.2).
        reduction: "token" = mean over all masked tokens of the micro-batch (HALOs);
            "sequence" = mean over non-empty sequences of each sequence's token mean.
        weights: `(B, T)` detached token weights on the surrogate (a stale-sample correction's behaviour
            weight, `objectives.corrections`); None: 1.
        keep: `(B, T)` bool, the scored tokens that count (a correction's mask; None: all of `mask`). A token
            left out has no loss and no gradient, KL term included; the means still divide by `mask`'s
            tokens, so masking does not scale up the tokens kept (AReaL's and M2PO's normalisation).
        clip: False drops the PPO clip (`surr = A * ratio`: M2PO's loss).
    """
    mask = check_token_inputs("grpo_loss", log_ratio, mask)
    if advantages.shape != log_ratio.shape[:1]:
        raise ValueError(f"grpo_loss: advantages must be ({log_ratio.shape[0]},), got {tuple(advantages.shape)}")
    if reduction not in ("token", "sequence"):
        raise ValueError(f"grpo_loss: reduction must be 'token' or 'sequence', got {reduction!r}")
    raw = log_ratio if raw_log_ratio is None else raw_log_ratio
    if raw.shape != log_ratio.shape:
        raise ValueError(f"grpo_loss: raw_log_ratio shape {tuple(raw.shape)} != {tuple(log_ratio.shape)}")
    scored = mask if keep is None else mask & keep.bool()
    # Zero every position that does not count first (padding, and tokens a correction left out), so that an
    # inf/nan or a large log-ratio there cannot reach exp() or its gradient.
    lr = log_ratio.masked_fill(~scored, 0.0)
    raw = raw.masked_fill(~scored, 0.0)
    adv = advantages.to(lr.dtype)[:, None]
    ratio = torch.exp(lr)
    surrogate = torch.minimum(adv * ratio, adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)) if clip else adv * ratio
    if weights is not None:
        surrogate = surrogate * weights.detach().masked_fill(~scored, 0.0)
    kl = torch.exp(-raw) + raw - 1.0
    per_token = -surrogate + beta * kl if beta else -surrogate
    loss = _reduce(per_token, mask, scored, reduction)
    with torch.no_grad():
        metrics = _metrics(ratio, kl, adv, advantages, scored, eps_low, eps_high, clip)
    return LossOutput(loss, metrics)


def _reduce(per_token: torch.Tensor, mask: torch.Tensor, scored: torch.Tensor, reduction: str) -> torch.Tensor:
    """The loss of `per_token` `(B, T)` over the `scored` tokens, divided by `mask`'s tokens (so tokens left out
    by `keep` do not scale up the rest): "token" is the mean over the micro-batch, "sequence" the mean over
    non-empty sequences of each sequence's mean."""
    if reduction == "token":
        return masked_sum(per_token, scored) / mask.sum().clamp(min=1)
    lengths = mask.sum(dim=-1)
    seq_means = masked_sum(per_token, scored, dim=-1) / lengths.clamp(min=1)
    nonempty = lengths > 0
    return seq_means.masked_fill(~nonempty, 0.0).sum() / nonempty.sum().clamp(min=1)


def _metrics(ratio: torch.Tensor, kl: torch.Tensor, adv: torch.Tensor, advantages: torch.Tensor,
             mask: torch.Tensor, eps_low: float, eps_high: float, clip: bool) -> dict[str, torch.Tensor]:
    """`grpo_loss`'s logged metrics (no gradient): token means of the KL and the ratio over the tokens that count
    (`mask`), the share of them where the clip binds, overall and by the sign of the advantage (only when the
    loss clips), and the mean advantage."""
    n_tok = mask.sum().clamp(min=1)
    metrics = {"kl": masked_sum(kl.detach(), mask) / n_tok, "ratio": masked_sum(ratio.detach(), mask) / n_tok,
               "advantage_mean": advantages.detach().float().mean()}
    if not clip:  # M2PO's loss has no clip: nothing to report
        return metrics
    positive, negative = (adv > 0) & mask, (adv < 0) & mask
    clipped_pos, clipped_neg = (ratio > 1.0 + eps_high) & positive, (ratio < 1.0 - eps_low) & negative
    return {**metrics, "clip_fraction": (clipped_pos | clipped_neg).sum().float() / n_tok,
            # where the clip binds, by the sign of the advantage: a stale reference pushes A > 0 tokens over
            # 1 + eps first (docs/method.md §3.5); shares of the A > 0 (A < 0) tokens
            "clip_fraction_pos": clipped_pos.sum().float() / positive.sum().clamp(min=1),
            "clip_fraction_neg": clipped_neg.sum().float() / negative.sum().clamp(min=1)}
