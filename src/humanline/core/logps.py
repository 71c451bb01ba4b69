"""The one place that turns logits into per-token log-probabilities.

Everything that needs `log pi(y_t | x, y_<t)` (policy, reference, lookahead, diagnostics) goes through
`selected_logps` (logits rows already aligned with their target tokens; used by `humanline.forward`, which
projects only the positions that predict completion tokens) or `token_logps` (a full `(B, L, V)` logits
tensor, shifted here), so the numerics are decided here once.
"""

from __future__ import annotations

import torch

# Rows per chunk when the full-vocabulary softmax is computed in a loop. A (rows, V) float32 buffer of
# 4096 x 49k is ~800 MB; 1024 rows keeps the transient under ~200 MB for a 49k vocabulary.
_CHUNK_ROWS = 1024


def selected_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of `targets` under `logits`, row by row: `(n, V), (n,) -> (n,)` (float32 for half logits).

    `logits[i]` are the logits of the position that predicts `targets[i]`. The selected logit minus the row's
    logsumexp is computed in row chunks, so no full-vocabulary log-softmax tensor is ever materialised; in
    half precision each chunk is upcast to float32 first, so bf16 logits do not lose the small differences
    between large logits.
    """
    pieces = []
    for start in range(0, logits.shape[0], _CHUNK_ROWS):
        chunk = logits[start : start + _CHUNK_ROWS]
        if chunk.dtype in (torch.float16, torch.bfloat16):
            chunk = chunk.float()
        idx = targets[start : start + _CHUNK_ROWS, None]
        pieces.append(chunk.gather(-1, idx).squeeze(-1) - torch.logsumexp(chunk, dim=-1))
    if not pieces:
        return logits.new_zeros(0, dtype=torch.promote_types(logits.dtype, torch.float32))
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


def token_logps(
    logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probabilities of `labels` under `logits`, with the causal shift applied.

    Args:
        logits: `(B, L, V)` model outputs for the input sequence `labels`.
        labels: `(B, L)` the input token ids (the same tensor that was fed to the model).
        mask: `(B, L)` bool, true on tokens whose log-prob is wanted (completion tokens), in input positions.

    Returns:
        `(logps, mask)`, both `(B, L - 1)`: `logps[b, t] = log p(labels[b, t + 1] | labels[b, :t + 1])`, set to
        0 where `mask[b, t + 1]` is false, and the shifted mask.

    Only the rows of wanted tokens are gathered out of `logits` (prompt and padding rows are never copied,
    normalised or reached by the gradient, so inf/nan logits there are inert), then `selected_logps`.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2] or mask.shape != labels.shape:
        raise ValueError(
            f"token_logps: expected logits (B, L, V) with labels and mask (B, L); got "
            f"{tuple(logits.shape)}, {tuple(labels.shape)}, {tuple(mask.shape)}"
        )
    shifted_mask = mask[:, 1:].bool()
    # Boolean indexing copies only the wanted rows; padding ids (even -100) at unwanted positions are never read.
    rows = selected_logps(logits[:, :-1][shifted_mask], labels[:, 1:][shifted_mask])
    logps = torch.zeros(shifted_mask.shape, dtype=rows.dtype, device=logits.device)
    return logps.masked_scatter(shifted_mask, rows), shifted_mask


def sequence_logps(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of token log-probs per sequence: `(B, T) -> (B,)`, masked tokens only."""
    return masked_sum(logps, mask, dim=-1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is true. Masked-out entries may hold inf/nan: they are replaced, not
    multiplied, so they cannot leak into the result or its gradient."""
    filled = values.masked_fill(~mask.bool(), 0.0)
    return filled.sum() if dim is None else filled.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over true entries of `mask` (0 where a row has none)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)
