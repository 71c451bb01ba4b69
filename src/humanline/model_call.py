"""One call of a model that returns the log-probs of chosen positions, and what every layout shares.

`fused_forward` runs the model with its output layer swapped, for the one call, for a scoring head that
returns `linear_logps` of the kept positions instead of logits (see `humanline.forward`, which chooses the
layout, and `humanline.prefix`, the shared-prompt layout). Kept apart from both so that neither imports
the other's internals.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from humanline.core.logps import linear_logps

PAD_MULTIPLE = 64  # row widths on accelerators (CUDA, ...) are rounded up to this; CPU widths are exact


@dataclass
class RowLayout:
    """How an `(N, L)` right-padded part is fed to the model, and where its scored log-probs go.

    `input_ids`, `keep`: `(R, M)` model input and the positions whose logits are needed (they predict a
    scored token); `attention_mask` (padded layout) or `position_ids` (packed layout), `(R, M)`;
    `targets`: `(n,)` the scored tokens in the row-major order of `keep`; `scatter`: `(n,)` their flat
    indices into the `(N, L - 1)` output.
    """

    input_ids: torch.Tensor
    keep: torch.Tensor
    targets: torch.Tensor
    scatter: torch.Tensor
    attention_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None

    def model_inputs(self) -> dict:
        inputs = {"input_ids": self.input_ids, "use_cache": False}
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids  # attention_mask None: positions delimit the sequences
        else:
            inputs["attention_mask"] = self.attention_mask
        return inputs


def padded_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, scored: torch.Tensor) -> RowLayout:
    """The batch as it is, with only the scored positions' logits kept. `scored`: `(N, L - 1)` bool."""
    keep = torch.nn.functional.pad(scored, (0, 1))  # position t predicts token t + 1
    return RowLayout(input_ids, keep, input_ids[:, 1:][scored], scored.reshape(-1).nonzero().squeeze(1),
                  attention_mask=attention_mask)


def output_layer(model) -> torch.nn.Module | None:
    """The model's vocabulary projection (through DDP-style `.module` wrappers), or None if it has none."""
    inner = getattr(model, "module", model)
    get = getattr(inner, "get_output_embeddings", None)
    return get() if callable(get) else None


@contextlib.contextmanager
def _scoring_head(head: torch.nn.Linear, keep: torch.Tensor, targets: torch.Tensor):
    """Within the block, `head(hidden)` returns `linear_logps(hidden[keep], ...)`: `(R, M, H) -> (n,)`.

    The instance attribute shadows `Linear.forward` only; `head(...)` still runs its hooks (FSDP
    unsharding, ...), and the weight is used inside the model's forward, where wrappers expect it.
    """
    def scoring_forward(hidden: torch.Tensor) -> torch.Tensor:
        return linear_logps(hidden[keep], head.weight, targets, head.bias)

    head.forward = scoring_forward
    try:
        yield
    finally:
        del head.forward


def fused_forward(model, inputs: dict, keep: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`(n,)` float32 log-probs of `targets` at the `(R, M)` positions `keep` of one forward of `model`."""
    with _scoring_head(output_layer(model), keep, targets):
        out = model(**inputs).logits
    if out.dim() != 1 or out.shape[0] != targets.shape[0]:
        raise RuntimeError(f"fused output head: the model returned shape {tuple(out.shape)}, expected "
                           f"({targets.shape[0]},); it post-processes its logits (checked by _capabilities)")
    return out.float()


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
