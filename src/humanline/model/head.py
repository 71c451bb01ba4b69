"""One call of a model that returns the log-probs of chosen positions, and what every layout shares.

`fused_forward` runs the model with its output layer swapped, for the one call, for a scoring head that
returns `linear_logps` of the kept positions instead of logits (see `humanline.model.forward`, which chooses the
layout, and `humanline.model.prefix`, the shared-prompt layout). Kept apart from both so that neither imports
the other's internals. Layouts are index arithmetic done on the host (numpy, from the copy of the batch
collation made) and moved in one copy (`host_ints`); the device only gathers, and the model gets its attention
mask prepared (`mask_style`), so no step of a layout waits for the device.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from humanline.core.logps import linear_logps

PAD_MULTIPLE = 64  # row widths on accelerators (CUDA, ...) are rounded up to this; CPU widths are exact


@dataclass
class RowLayout:
    """How an `(N, L)` right-padded part is fed to the model, and where its scored log-probs go.

    `input_ids`: `(R, M)` model input; `keep`: `(n,)` flat positions (row-major in `(R, M)`) whose hidden
    states predict a scored token; `attention_mask` (padded layout) or `position_ids` (packed layout), `(R, M)`;
    `mask4d`: the prepared `(R, 1, M, M)` attention (`prepared_mask`), or None to let the model build it;
    `targets`: `(n,)` the scored tokens in the order of `keep`; `scatter`: `(n,)` their flat indices into the
    `(N, L - 1)` output. All on the model's device, built from host-side indices (`host_ints`).
    """

    input_ids: torch.Tensor
    keep: torch.Tensor
    targets: torch.Tensor
    scatter: torch.Tensor
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    mask4d: torch.Tensor | None = None

    def model_inputs(self) -> dict:
        inputs = {"input_ids": self.input_ids, "use_cache": False}
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids  # without mask4d: positions delimit the sequences
        if self.mask4d is not None:
            inputs["attention_mask"] = self.mask4d
        elif self.position_ids is None:
            inputs["attention_mask"] = self.attention_mask
        return inputs


def host_ints(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Host-side integer arrays as int64 tensors on `device`, through one copy: from pinned memory and
    without blocking the host on an accelerator (on the CPU, no copy at all)."""
    flat = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]) if arrays else \
        np.zeros(0, dtype=np.int64)
    moved = torch.from_numpy(flat)
    if device.type != "cpu":
        moved = moved.pin_memory().to(device, non_blocking=True)
    pieces = moved.split([int(np.size(a)) for a in arrays])
    return [p.view(np.shape(a)) for p, a in zip(pieces, arrays)]


def mask_style(model) -> torch.dtype | None:
    """How a prepared 4D attention mask must look for `model`: bool for SDPA (true = attend), the weights'
    float dtype for eager attention (added to the scores), None for other implementations (flash, flex), which
    then build their own. A prepared mask spares transformers' mask builder its host read of the mask (it
    checks whether the mask can be skipped, which is a device sync per forward)."""
    inner = getattr(model, "module", model)
    config = getattr(inner, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl == "sdpa":
        return torch.bool
    if impl == "eager":
        param = next(iter(model.parameters()), None)
        return param.dtype if param is not None and param.is_floating_point() else torch.float32
    return None


def prepared_mask(allowed: torch.Tensor, style: torch.dtype | None) -> torch.Tensor | None:
    """`(R, Q, K)` bool (true: query may attend key) as the model's `(R, 1, Q, K)` attention mask, or None."""
    if style is None:
        return None
    if style == torch.bool:
        return allowed[:, None]
    return torch.zeros(allowed.shape, dtype=style, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(style).min)[:, None]


def causal(q: int, k: int, device, offset: int = 0) -> torch.Tensor:
    """`(q, k)` bool: query i may attend key j <= i + offset."""
    return torch.ones(q, k, dtype=torch.bool, device=device).tril(offset)


def padded_mask(attention_mask: torch.Tensor, style: torch.dtype | None) -> torch.Tensor | None:
    """The causal mask of right-padded rows `(R, M)`: real keys up to the query; every query attends itself,
    so no row of the mask is empty (padding queries are never read)."""
    if style is None:
        return None
    width = attention_mask.shape[1]
    allowed = causal(width, width, attention_mask.device)[None] & attention_mask.bool()[:, None, :]
    return prepared_mask(allowed | torch.eye(width, dtype=torch.bool, device=attention_mask.device), style)


def padded_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, scored, *, multiple: int = 1,
                  style: torch.dtype | None = None) -> RowLayout:
    """The batch as it is (rows right-padded to a multiple of `multiple` columns), only the scored positions'
    hidden states kept. `scored`: `(N, L - 1)` bool on the host (numpy, or a CPU tensor)."""
    n, length = input_ids.shape
    width = length + -length % multiple
    grid = np.zeros((n, width), dtype=bool)
    grid[:, : length - 1] = np.asarray(scored, dtype=bool)  # position t predicts token t + 1
    rows, cols = np.nonzero(grid)
    keep, target_index, scatter = host_ints([rows * width + cols, rows * length + cols + 1,
                                             rows * (length - 1) + cols], input_ids.device)
    pad = width - length
    ids = torch.nn.functional.pad(input_ids, (0, pad)) if pad else input_ids
    attention = torch.nn.functional.pad(attention_mask, (0, pad)) if pad else attention_mask
    return RowLayout(ids, keep, input_ids.reshape(-1).index_select(0, target_index), scatter,
                     attention_mask=attention, mask4d=padded_mask(attention, style))


def output_layer(model) -> torch.nn.Module | None:
    """The model's vocabulary projection (through DDP-style `.module` wrappers), or None if it has none."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    return get() if callable(get) else None


@contextlib.contextmanager
def _scoring_head(head: torch.nn.Linear, keep: torch.Tensor, targets: torch.Tensor):
    """Within the block, `head(hidden)` returns `linear_logps` of the kept rows of `hidden.view(-1, H)`:
    `(R, M, H) -> (n,)` (an index_select: no data-dependent shape, no host read).

    The instance attribute shadows `Linear.forward` only; `head(...)` still runs its hooks (FSDP
    unsharding, ...), and the weight is used inside the model's forward, where wrappers expect it.
    """
    compiled = bool(getattr(head, COMPILE_ATTRIBUTE, False))

    def scoring_forward(hidden: torch.Tensor) -> torch.Tensor:
        # autograd keeps the index for backward: a copy of its own, not a view that would keep every index
        # array of the layout (moved to the device as one buffer) alive until then
        index = keep.clone() if hidden.requires_grad else keep
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
        return linear_logps(rows, head.weight, targets, head.bias, compiled=compiled)

    head.forward = scoring_forward
    try:
        yield
    finally:
        del head.forward


def fused_forward(model, inputs: dict, keep: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`(n,)` float32 log-probs of `targets` at the positions `keep` of one forward of `model` on `(R, M)` rows:
    `(n,)` flat row-major positions, or an `(R, M)` bool mask (turned into positions here: a host read, for
    probes and tests; the training layouts pass positions)."""
    if keep.dtype == torch.bool:
        keep = keep.reshape(-1).nonzero().squeeze(1)
    with _scoring_head(output_layer(model), keep, targets):
        out = model(**inputs).logits
    if out.dim() != 1 or out.shape[0] != targets.shape[0]:
        raise RuntimeError(f"fused output head: the model returned shape {tuple(out.shape)}, expected "
                           f"({targets.shape[0]},); it post-processes its logits (checked by "
                           f"humanline.model.capabilities)")
    return out.float()


COMPILE_ATTRIBUTE = "humanline_compile"  # set on an output layer: its scoring head runs `torch.compile`d math


def compile_output_head(model, on: bool = True) -> None:
    """`train.compile`: the fused head of `model` (and of copies made from it later) compiles its per-slice
    softmax math. A flag on the output layer, so reference snapshots (`copy.deepcopy`) inherit it."""
    head = output_layer(model)
    if head is not None:
        setattr(head, COMPILE_ATTRIBUTE, on)


@contextlib.contextmanager
def eval_mode(model):
    """Eval mode for the block (no dropout; transformers skips gradient checkpointing, which a pass without
    gradient does not need); every submodule's own mode is restored after, since a caller may keep some
    parts, e.g. a frozen backbone, in eval mode while training."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


# What a model that cannot take a layout raises (probes turn these into a reason, not a crash).
PROBE_ERRORS = (TypeError, ValueError, IndexError, RuntimeError, AttributeError)


def forward_eps(model, logits: torch.Tensor) -> float:
    """Machine epsilon of the coarsest dtype in the forward: logits, weights, or an active autocast."""
    dtypes = [logits.dtype]
    param = next(iter(model.parameters()), None)
    if param is not None:
        dtypes.append(param.dtype)
        if torch.is_autocast_enabled(param.device.type):
            dtypes.append(torch.get_autocast_dtype(param.device.type))
    return max(torch.finfo(d).eps for d in dtypes if d.is_floating_point)
