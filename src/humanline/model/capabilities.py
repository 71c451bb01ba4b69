"""Which fast paths of `humanline.model.forward` a model allows, checked once per model object.

The fused output head and packed rows (with prepared attention masks where the attention implementation takes
them) are compared, on two short sequences, with the plain padded forward: a model whose output layer is not a
plain `nn.Linear` (LoRA-wrapped, soft-capped logits) or that ignores `position_ids` then runs the plain way,
which computes the same numbers. The result (`Capabilities`) is kept per model object; `forward_path(model)`
says which path a model took and why (and why prompts were not shared, which `humanline.model.prefix` records).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from humanline.devices.fsdp import is_sharded
from humanline.model.head import (
    PROBE_ERRORS,
    RowLayout,
    causal,
    eval_mode,
    forward_eps,
    fused_forward,
    host_ints,
    mask_style,
    output_layer,
    padded_layout,
    prepared_mask,
)


@dataclass
class Capabilities:
    fused: bool  # the output layer can be swapped for `linear_logps` (a plain Linear whose output is the logits)
    pack: bool  # isolates packed sequences delimited by `position_ids` (with attention_mask None or prepared)
    hidden_size: int | None = None  # for the packing cost model (None: rows never wider than the batch)
    reason: str | None = None  # why a fast path is off
    prefix: bool | None = None  # shared prompts run once (`humanline.model.prefix`); None: not probed yet
    prefix_used: bool = False
    prefix_reason: str | None = None  # the first reason a batch did not use it
    mask: torch.dtype | None = None  # prepared 4D attention masks (`head.mask_style`), None: the model's own


CAPABILITIES: "weakref.WeakKeyDictionary[torch.nn.Module, Capabilities]" = weakref.WeakKeyDictionary()


def forward_path(model) -> str | None:
    """How `part_logps` runs `model`, with the reason when a fast path is off; None before its first batch."""
    caps = CAPABILITIES.get(model)
    if caps is None:
        return None
    path = "fused output head" + (", packed rows" if caps.pack else "") if caps.fused else "full logits"
    path += ", shared prompts once" if caps.prefix_used else ""
    notes = [n for n in (caps.reason, None if caps.prefix_used else caps.prefix_reason and
                         f"prompts not shared: {caps.prefix_reason}") if n]
    return path + (f" ({'; '.join(notes)})" if notes else "")


def capabilities(model, input_ids: torch.Tensor, lengths: list[int]) -> Capabilities:
    """Check once per model, on two short sequences from the first batch, that the fused and packed
    forwards (with prepared attention masks where the attention implementation takes them) reproduce the
    plain padded forward (models that ignore `position_ids`, post-process their logits or have a wrapped
    output layer are then run the plain way)."""
    if model in CAPABILITIES:
        return CAPABILITIES[model]
    rows = [i for i, n in enumerate(lengths) if n >= 4][:2]
    if is_sharded(model):  # FSDP ranks run the probe's forwards together: on the same two rows, at the first batch
        a, b = _fixed_probe_rows(model, input_ids.device)
    elif len(rows) < 2:  # nothing to probe with yet: decide on a later batch
        return Capabilities(fused=False, pack=False)
    else:
        a, b = (input_ids[i, : min(lengths[i], 12)] for i in rows)
    with eval_mode(model), torch.no_grad():  # dropout (if any) would make the comparison meaningless
        caps = _probe(model, a, b)
    caps.hidden_size = model_hidden_size(model)
    CAPABILITIES[model] = caps
    return caps


def _fixed_probe_rows(model, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of 12 and 10 token ids that depend on the model only (its vocabulary size)."""
    inner = getattr(model, "module", model)
    vocab = int(getattr(getattr(inner, "config", None), "vocab_size", 0) or 16)
    a = (torch.arange(12, device=device) * 7 + 5) % vocab
    return a, (torch.arange(10, device=device) * 3 + 11) % vocab


def _probe(model, a: torch.Tensor, b: torch.Tensor) -> Capabilities:
    head = output_layer(model)
    if not isinstance(head, torch.nn.Linear):
        return Capabilities(False, False, reason=f"the output layer is {type(head).__name__}, not a plain Linear")
    raw = model(input_ids=b[None], attention_mask=torch.ones_like(b)[None], use_cache=False).logits[0]
    alone = raw[:-1].float().log_softmax(-1).gather(-1, b[1:, None]).squeeze(-1)  # (len(b) - 1,)
    tol = min(1e3 * forward_eps(model, raw), 0.02) * (float(raw.abs().max()) + 1.0)
    scored = np.zeros((1, len(b) - 1), dtype=bool)
    scored[0, 1::2] = True  # every other position predicting a token of b
    style, failed = mask_style(model), None
    for candidate in dict.fromkeys([style, None]):  # a prepared mask if the model takes one, else its own
        try:
            layout = padded_layout(b[None], torch.ones_like(b)[None], scored, style=candidate)
            fused = fused_forward(model, layout.model_inputs(), layout.keep, layout.targets)
        except PROBE_ERRORS as exc:
            failed = Capabilities(False, False, reason=f"the fused output head failed ({type(exc).__name__})")
            continue
        if torch.allclose(fused, alone[1::2], rtol=0, atol=tol):
            return _probe_packing(model, a, b, alone, tol, candidate)
        failed = Capabilities(False, False, reason="the model post-processes its logits (e.g. soft-capping)")
    return failed


def _probe_packing(model, a, b, alone, tol, style) -> Capabilities:
    def packed_after(first: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([first, b])[None]
        lengths = [len(first), len(b)]
        layout = RowLayout(ids, *host_ints([np.arange(len(first), len(ids[0]) - 1)], ids.device),
                           b[1:], torch.zeros(0), position_ids=torch.cat(
                               [torch.arange(n, device=b.device) for n in lengths])[None])
        if style is not None:
            segment = torch.tensor([0] * len(first) + [1] * len(b), device=b.device)
            layout.mask4d = prepared_mask(((segment[:, None] == segment[None]) &
                                           causal(len(segment), len(segment), b.device))[None], style)
        return fused_forward(model, layout.model_inputs(), layout.keep, layout.targets)

    other = (a + 1) % (int(torch.maximum(a.max(), b.max())) + 1)  # same length, different tokens
    try:
        packed, packed_other = packed_after(a), packed_after(other)
    except PROBE_ERRORS as exc:
        return Capabilities(True, False, reason=f"packed rows failed ({type(exc).__name__})", mask=style)
    isolated = not torch.equal(other, a) and torch.allclose(packed, packed_other, atol=tol, rtol=0)
    positioned = torch.allclose(packed, alone, atol=tol, rtol=0)
    if isolated and positioned:
        return Capabilities(True, True, mask=style)
    return Capabilities(True, False, reason="the model does not isolate sequences packed by position_ids", mask=style)


def model_hidden_size(model) -> int | None:
    inner = getattr(model, "module", model)  # DDP / FSDP wrappers
    config = getattr(inner, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    size = getattr(config, "hidden_size", None)
    return size if isinstance(size, int) and size > 0 else None
