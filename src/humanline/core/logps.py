"""The one place that turns logits into per-token log-probabilities.

Everything that needs `log pi(y_t | x, y_<t)` (policy, reference, lookahead, diagnostics) goes through one of:

- `linear_logps` (hidden states of the positions that predict completion tokens and the output projection;
  used by `humanline.forward`): projection, log-softmax and gather fused in row chunks with a hand-written
  backward, so no `(n, V)` logits tensor is ever materialised or saved for backward;
- `selected_logps` (logits rows already aligned with their target tokens);
- `token_logps` (a full `(B, L, V)` logits tensor, shifted here),

so the numerics are decided here once: matmuls in the weights' (or autocast's) dtype, every softmax in float32.
"""

from __future__ import annotations

import torch

# Rows per chunk when the full-vocabulary softmax is computed in a loop. A (rows, V) float32 buffer of
# 4096 x 49k is ~800 MB; 1024 rows keeps the transient under ~200 MB for a 49k vocabulary.
_CHUNK_ROWS = 1024
# `linear_logps` sizes its chunks by bytes instead: (rows, V) float32 logits of at most this many bytes
# (~440 rows of a 152k vocabulary, ~1,360 of a 49k one), a few such buffers alive at a time.
_CHUNK_BYTES = 256 * 2**20


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


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output projection runs in: autocast's when it is on (as `nn.Linear` would), else the
    promotion of the two inputs."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


class _LinearLogps(torch.autograd.Function):
    """`log_softmax(hidden @ weight.T + bias)[i, targets[i]]` per row, computed and differentiated in row chunks.

    Forward keeps only the row logsumexps `(n,)`; backward recomputes each chunk's logits and uses
    d logp_i / d z_i = onehot(target_i) - softmax(z_i), so memory is O(chunk x V), never O(n x V).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype, rows):
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # softmax dtype: float32, or float64 for float64 inputs
        out = torch.empty(hidden.shape[0], device=hidden.device, dtype=acc)
        lse = torch.empty_like(out)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], rows):
                z = torch.nn.functional.linear(hidden[s : s + rows].to(dtype), w, b).to(acc)
                lse[s : s + rows] = torch.logsumexp(z, dim=-1)
                out[s : s + rows] = z.gather(-1, targets[s : s + rows, None]).squeeze(-1) - lse[s : s + rows]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.dtype, ctx.rows = dtype, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        dtype, rows = ctx.dtype, ctx.rows
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        grad_h = torch.empty_like(hidden) if need_h else None
        # Accumulate across chunks in float32 even for half weights: many small bf16 sums would lose the tail.
        acc = lse.dtype
        grad_w = torch.zeros(weight.shape, device=weight.device, dtype=acc) if need_w else None
        grad_b = torch.zeros(weight.shape[0], device=weight.device, dtype=acc) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], rows):
                h = hidden[s : s + rows].to(dtype)
                z = torch.nn.functional.linear(h, w, b).to(lse.dtype)
                go = grad_out[s : s + rows, None].to(lse.dtype)
                g = torch.exp(z.sub_(lse[s : s + rows, None])).mul_(-go)
                g.scatter_add_(-1, targets[s : s + rows, None], go)
                gd = g.to(dtype)
                if need_h:
                    grad_h[s : s + rows] = gd @ w
                if need_w:
                    grad_w.add_(gd.t() @ h)
                if need_b:
                    grad_b.add_(g.sum(0))
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None


def linear_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities of `targets` under the output projection of `hidden`: `(n, H), (V, H), (n,) -> (n,)`.

    Equal to `selected_logps(hidden @ weight.T + bias, targets)` (float32 result), with the gradient of
    `hidden`, `weight` and `bias`, but the `(n, V)` logits exist only one chunk of rows at a time, in the
    forward and again in the backward (a fused linear-cross-entropy, in plain PyTorch so it runs anywhere).
    """
    if (hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]
            or targets.shape != hidden.shape[:1]):
        raise ValueError(f"linear_logps: expected hidden (n, H), weight (V, H), targets (n,); got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    rows = max(1, _CHUNK_BYTES // (4 * weight.shape[0]))
    return _LinearLogps.apply(hidden, weight, bias, targets, _matmul_dtype(hidden, weight), rows)


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
