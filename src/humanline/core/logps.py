"""The one place that turns logits into per-token log-probabilities.

Everything that needs `log pi(y_t | x, y_<t)` (policy, reference, lookahead, diagnostics) goes through one of:

- `linear_logps` (hidden states of the positions that predict completion tokens and the output projection;
  used by `humanline.model.forward`): projection, log-softmax and gather fused in vocabulary slices with a
  hand-written backward, so no `(n, V)` logits tensor is ever materialised or saved for backward;
- `selected_logps` (logits rows already aligned with their target tokens);
- `token_logps` (a full `(B, L, V)` logits tensor, shifted here),

so the numerics are decided here once: matmuls in the weights' (or autocast's) dtype, every softmax in float32.
"""

from __future__ import annotations

import torch

# Rows per chunk when the full-vocabulary softmax is computed in a loop. A (rows, V) float32 buffer of
# 4096 x 49k is ~800 MB; 1024 rows keeps the transient under ~200 MB for a 49k vocabulary.
_CHUNK_ROWS = 1024
# `linear_logps` works in vocabulary slices of (n, cols) float32 logits of at most this many bytes on the CPU
# (caches, not memory, bound it there); on a GPU the budget grows with the device (`chunk_bytes`): fewer and
# larger matmuls, a few such buffers alive at a time.
_CHUNK_BYTES = 256 * 2**20
_GPU_CHUNK_BYTES = (256 * 2**20, 2**30)  # at least, at most; 1/64 of the device's memory in between


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


def chunk_bytes(device: torch.device) -> int:
    """The float32 bytes of one `(n, cols)` vocabulary slice of `linear_logps` on `device` (module constants)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory  # a property: no device round trip
        low, high = _GPU_CHUNK_BYTES
        return int(min(high, max(low, total // 64)))
    return _CHUNK_BYTES


# ------------------------------------------------------------------ the per-slice math
# z: (n, cols) logits of one vocabulary slice in the matmul dtype; idx: (n,) each row's target column in the
# slice, clamped into it; inside: (n,) whether the target lies in the slice. Softmax statistics in float32
# (float64 for float64 inputs). The eager forms avoid a float32 copy of z: the first op reading z writes
# float32 by type promotion, later ops work in place; `torch.compile` fuses the plain forms into one pass.


def _slice_stats_eager(z: torch.Tensor, idx: torch.Tensor, inside: torch.Tensor, acc: torch.dtype):
    """`(logsumexp of the row in the slice, target logit or 0)`, both `(n,)` in `acc`."""
    m = z.amax(dim=-1, keepdim=True).to(acc)  # exact in z's dtype; -inf only for a row of -inf logits
    m = m.masked_fill(~torch.isfinite(m), 0.0)
    e = torch.sub(z, m).exp_()  # (n, cols) in acc, from z without a copy of z
    lse = e.sum(dim=-1).log_().add_(m.squeeze(-1))
    return lse, torch.where(inside, z.gather(1, idx[:, None]).squeeze(1).to(acc), 0.0)


def _slice_stats_plain(z: torch.Tensor, idx: torch.Tensor, inside: torch.Tensor, acc: torch.dtype):
    zf = z.to(acc)
    return torch.logsumexp(zf, dim=-1), torch.where(inside, zf.gather(1, idx[:, None]).squeeze(1), 0.0)


def _slice_grad_eager(z, lse, go, idx, inside):
    """`d logp / d z` times the incoming gradient, `(n, cols)` in `lse.dtype`: go * (onehot - softmax)."""
    g = torch.sub(z, lse[:, None]).exp_().mul_(-go[:, None])
    return g.scatter_add_(1, idx[:, None], torch.where(inside, go, 0.0)[:, None])


def _slice_grad_plain(z, lse, go, idx, inside):
    g = torch.exp(z.to(lse.dtype) - lse[:, None]) * -go[:, None]
    return g.scatter_add(1, idx[:, None], torch.where(inside, go, 0.0)[:, None])


_COMPILED: dict[str, object] = {}


def _math(compiled: bool):
    """The slice functions: eager, or `torch.compile`d once per process (dynamic shapes: n and cols vary)."""
    if not compiled:
        return _slice_stats_eager, _slice_grad_eager
    if not _COMPILED:
        _COMPILED["stats"] = torch.compile(_slice_stats_plain, dynamic=True)
        _COMPILED["grad"] = torch.compile(_slice_grad_plain, dynamic=True)
    return _COMPILED["stats"], _COMPILED["grad"]


def _slices(vocab: int, cols: int, targets: torch.Tensor):
    """`(v0, v1, idx, inside)` of each vocabulary slice: the targets' columns in it, without a host read."""
    for v0 in range(0, vocab, cols):
        v1 = min(vocab, v0 + cols)
        local = targets - v0
        inside = (local >= 0) & (local < v1 - v0)
        yield v0, v1, local.clamp(0, v1 - v0 - 1), inside


class _LinearLogps(torch.autograd.Function):
    """`log_softmax(hidden @ weight.T + bias)[i, targets[i]]` per row, in slices of the vocabulary.

    Forward keeps only the row logsumexps `(n,)`: per slice, its logits `(n, cols)`, their logsumexp (combined
    across slices in float32) and the target logits. Backward recomputes each slice's logits and uses
    d logp_i / d z_i = onehot(target_i) - softmax(z_i): the slice's rows of grad_weight are one matmul over all
    n rows, written in place (no `(V, H)` temporary, no accumulation across chunks), grad_hidden accumulates
    `(n, H)` per slice. Memory is O(n x cols), never O(n x V).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dtype, cols, compiled):
        stats, _ = _math(compiled)
        acc = torch.promote_types(dtype, torch.float32)  # softmax dtype: float32, or float64 for float64 inputs
        n = hidden.shape[0]
        lse = torch.full((n,), -torch.inf, device=hidden.device, dtype=acc)
        picked = torch.zeros(n, device=hidden.device, dtype=acc)
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(dtype)
            for v0, v1, idx, inside in _slices(weight.shape[0], cols, targets):
                b = None if bias is None else bias[v0:v1].to(dtype)
                z = torch.nn.functional.linear(h, weight[v0:v1].to(dtype), b)
                slice_lse, slice_target = stats(z, idx, inside, acc)
                lse = torch.logaddexp(lse, slice_lse)
                picked = picked + slice_target
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.dtype, ctx.cols, ctx.compiled = dtype, cols, compiled
        return picked - lse

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        dtype, cols = ctx.dtype, ctx.cols
        _, grad_of = _math(ctx.compiled)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = lse.dtype
        go = grad_out.to(acc)
        grad_h = torch.zeros(hidden.shape, device=hidden.device, dtype=acc) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b else None
        with torch.autocast(hidden.device.type, enabled=False):
            h = hidden.to(dtype)
            for v0, v1, idx, inside in _slices(weight.shape[0], cols, targets):
                w = weight[v0:v1].to(dtype)
                z = torch.nn.functional.linear(h, w, None if bias is None else bias[v0:v1].to(dtype))
                g = grad_of(z, lse, go, idx, inside)  # (n, cols) in acc
                if need_b:
                    grad_b[v0:v1] = g.sum(0)
                gd = g.to(dtype)
                if need_h:  # float32 accumulation: a sum of bf16 slices would lose the tail
                    if gd.dtype == acc:
                        grad_h.addmm_(gd, w)
                    else:
                        grad_h += gd @ w
                if need_w:
                    if grad_w.dtype == dtype:
                        torch.mm(gd.t(), h, out=grad_w[v0:v1])
                    else:
                        grad_w[v0:v1] = gd.t() @ h
        grad_h = None if grad_h is None else grad_h.to(hidden.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def linear_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                 bias: torch.Tensor | None = None, *, compiled: bool = False) -> torch.Tensor:
    """Log-probabilities of `targets` under the output projection of `hidden`: `(n, H), (V, H), (n,) -> (n,)`.

    Equal to `selected_logps(hidden @ weight.T + bias, targets)` (float32 result), with the gradient of
    `hidden`, `weight` and `bias`, but the `(n, V)` logits exist only one vocabulary slice at a time, in the
    forward and again in the backward (a fused linear-cross-entropy, in plain PyTorch so it runs anywhere).
    `compiled`: the per-slice softmax math through `torch.compile` (one fused kernel per pass on a GPU).
    Slices hold `chunk_bytes(device)` of float32 logits; no value is read back to the host.
    """
    if (hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]
            or targets.shape != hidden.shape[:1]):
        raise ValueError(f"linear_logps: expected hidden (n, H), weight (V, H), targets (n,); got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    cols = max(1, chunk_bytes(hidden.device) // (4 * max(1, hidden.shape[0])))
    return _LinearLogps.apply(hidden, weight, bias, targets, _matmul_dtype(hidden, weight), cols, compiled)


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
