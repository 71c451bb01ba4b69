"""Forward passes of a collated batch: per-token log-probs of its completion tokens.

A collated batch (see `humanline.data.tokenization`) has a main part (`input_ids`, `attention_mask`,
`completion_mask`) and, for KTO, a mismatched "kl" part (`kl_input_ids`, ...). The log-probs themselves come
from `humanline.core.logps` (the one place that normalises logits); this module decides which positions go
through the model and the vocabulary projection:

- Fused output head: for the duration of one forward, the model's output layer (`get_output_embeddings()`,
  a plain `nn.Linear`) computes `linear_logps` of the positions that predict a scored token instead of
  logits. No `(N, T, V)` or `(n, V)` logits tensor is built or saved for backward, the model still runs
  through its own (and any DDP / FSDP wrapper's) forward, and nothing depends on the transformers version's
  `logits_to_keep` semantics (any release this package supports).
- Packing: right-padded rows are re-laid out without padding, several sequences per row, each with its own
  `position_ids` (transformers then builds a block-diagonal causal mask, so a token attends only to its own
  sequence). The backbone then runs on real tokens only.
- Shared prompts (`humanline.prefix`): rows repeating a prompt (a GRPO group, a DPO pair) run it once, with a
  key/value cache expanded to the rows, then only their own tokens; taken where its cost rule says it pays.
- On accelerators the row width is rounded up to a multiple of `PAD_MULTIPLE` (64): attention kernels pay a
  set-up cost for every new shape (measured ~2 ms per call on an H100), and a handful of widths repeat.

Both are checked once per model object against the plain padded forward (`_capabilities`); a model that
does not allow them (a LoRA-wrapped or soft-capped output layer, a model ignoring `position_ids`) runs the
plain way, which computes the same numbers; `forward_path(model)` says which path a model took and why
(and why prompts were not shared, e.g. gradient checkpointing or no repeated prompt).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from humanline import prefix as shared_prompts
from humanline.core.logps import token_logps
from humanline.fsdp import is_sharded
from humanline.model_call import (
    PAD_MULTIPLE, PROBE_ERRORS, RowLayout, eval_mode, forward_eps, fused_forward, output_layer, padded_layout,
)

PARTS = {"main": "", "kl": "kl_"}


def parts_of(batch: dict) -> list[str]:
    """The sequence parts present in `batch`: always "main", plus "kl" for KTO."""
    return [part for part, prefix in PARTS.items() if f"{prefix}input_ids" in batch]


def completion_mask(batch: dict, part: str = "main") -> torch.Tensor:
    """`(N, L - 1)` bool mask of the completion tokens whose log-probs `part_logps` returns."""
    return batch[f"{PARTS[part]}completion_mask"][:, 1:].bool()


def _first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Sequence indices per row: longest first, each into the first row with room (rows hold `capacity`)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def _layout_cost(rows: int, width: int, hidden_size: int | None) -> float:
    """Relative forward cost of `rows` x `width` tokens: the per-token matmuls (~12 d^2 per layer for a
    Llama-like block) plus attention over the row (~2 d x width), i.e. rows x width x (1 + width / 6d)."""
    return rows * width * (1.0 + width / (6.0 * hidden_size)) if hidden_size else float(rows * width)


def _choose_rows(lengths: list[int], length: int, hidden_size: int | None) -> tuple[list[list[int]], int] | None:
    """The cheapest packing of `lengths` over row capacities L, 2L, 4L, ... (only L when the hidden size is
    unknown: rows never grow past the padded width, so attention can never get dearer). None: padding wins."""
    best, best_cost = None, _layout_cost(len(lengths), length, hidden_size)
    capacity, total = length, sum(lengths)
    while True:
        rows = _first_fit_decreasing(lengths, capacity)
        width = max(sum(lengths[i] for i in row) for row in rows)
        cost = _layout_cost(len(rows), width, hidden_size)
        if cost < best_cost:
            best, best_cost = (rows, width), cost
        if hidden_size is None or capacity >= total:
            return best
        capacity *= 2


def packed_layout(input_ids: torch.Tensor, scored: torch.Tensor, lengths: list[int],
                  hidden_size: int | None = None) -> RowLayout | None:
    """Sequences of `lengths` real tokens (right-padded rows of `input_ids`) packed several per row, first-fit
    decreasing, at the row capacity `_choose_rows` finds cheapest. None when packing saves nothing.

    Example: lengths [5, 2, 3], L = 5 (capacity 5) -> rows [[0], [2, 1]], M = 5: the (3, 5) batch becomes
    (2, 5), and row 1 holds sequence 2 at positions 0..2 and sequence 1 at positions 0..1 (ids [0, 1, 2, 0, 1]).
    """
    n_seq, length = input_ids.shape
    chosen = _choose_rows(lengths, length, hidden_size)
    if chosen is None:
        return None
    rows, width = chosen
    dst_start, src_start = [0] * n_seq, [0] * n_seq
    for r, row in enumerate(rows):
        offset = r * width
        for i in row:
            dst_start[i], src_start[i] = offset, i * length
            offset += lengths[i]
    lens = torch.tensor(lengths)
    pos = torch.arange(int(lens.sum())) - torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)
    device = input_ids.device
    dst = (torch.repeat_interleave(torch.tensor(dst_start), lens) + pos).to(device)
    src = (torch.repeat_interleave(torch.tensor(src_start), lens) + pos).to(device)
    pos = pos.to(device)
    packed_ids = input_ids.new_zeros(len(rows) * width)
    packed_ids[dst] = input_ids.reshape(-1)[src]
    # Padding keeps position 0: a run of zeros makes each padding token a sequence of its own.
    position_ids = torch.zeros_like(packed_ids).index_put_((dst,), pos)
    keep_src = torch.nn.functional.pad(scored, (0, 1)).reshape(-1)[src]  # per real token, in `src` order
    order = torch.argsort(dst[keep_src])  # the model returns kept logits in packed row-major order
    kept_src = src[keep_src][order]
    keep = torch.zeros(len(rows) * width, dtype=torch.bool, device=device)
    keep[dst[keep_src]] = True
    scatter = (kept_src // length) * (length - 1) + kept_src % length
    return RowLayout(packed_ids.view(len(rows), width), keep.view(len(rows), width),
                  input_ids.reshape(-1)[kept_src + 1], scatter, position_ids=position_ids.view(len(rows), width))


def pad_width(layout: RowLayout, multiple: int) -> RowLayout:
    """`layout` with its rows right-padded to a multiple of `multiple` columns (padding is never kept, and
    attends to nothing: attention mask 0, or position 0 = a sequence of its own when packed)."""
    extra = -layout.input_ids.shape[1] % multiple
    if not extra:
        return layout

    def pad(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.nn.functional.pad(t, (0, extra))

    return RowLayout(pad(layout.input_ids), pad(layout.keep), layout.targets, layout.scatter,
                  attention_mask=pad(layout.attention_mask), position_ids=pad(layout.position_ids))


def part_logps(model, batch: dict, part: str = "main") -> torch.Tensor:
    """`(N, L - 1)` log-probs of `part`'s completion tokens under `model` (0 elsewhere), float32.

    `batch` rows must be right-padded (collated by `humanline.data.collate`). Positions and order of the
    result do not depend on the layout chosen (packed, padded, or the plain full-logits fallback).
    """
    prefix = PARTS[part]
    input_ids = batch[f"{prefix}input_ids"]
    attention_mask = batch[f"{prefix}attention_mask"]
    scored = batch[f"{prefix}completion_mask"][:, 1:].bool()
    n_seq, length = input_ids.shape
    # One host sync per forward: row lengths, their right-padded form (equal iff right-padded), scored counts.
    lengths, prefix_lengths, counts, starts = torch.stack(
        [attention_mask.sum(1), attention_mask.cumprod(1).sum(1), scored.sum(1), scored.long().argmax(1)]).tolist()
    in_step = is_sharded(model) or hasattr(model, "module")  # FSDP, or a DDP wrapper: processes meet in the model
    if not any(counts) and not in_step:
        return torch.zeros(n_seq, length - 1, device=input_ids.device)
    caps = _capabilities(model, input_ids, lengths)  # FSDP: probed at the first batch, even an empty one
    if not any(counts):
        return _nothing_scored(model, input_ids)
    if not caps.fused:
        return full_logits_logps(model, input_ids, attention_mask, batch[f"{prefix}completion_mask"].bool())
    shared = None if lengths != prefix_lengths else shared_prompts.logps(model, caps, input_ids, scored, lengths,
                                                                          starts, counts)
    if shared is not None:  # rows repeating a prompt: it runs once (humanline.prefix)
        return shared[0].new_zeros(n_seq * (length - 1)).index_put((shared[1],), shared[0]).view(n_seq, length - 1)
    layout = None
    if caps.pack and lengths == prefix_lengths:
        layout = packed_layout(input_ids, scored, lengths, caps.hidden_size)
    layout = layout or padded_layout(input_ids, attention_mask, scored)
    if input_ids.device.type != "cpu":
        layout = pad_width(layout, PAD_MULTIPLE)
    logps = fused_forward(model, layout.model_inputs(), layout.keep, layout.targets)
    return logps.new_zeros(n_seq * (length - 1)).index_put((layout.scatter,), logps).view(n_seq, length - 1)


def _nothing_scored(model, input_ids: torch.Tensor) -> torch.Tensor:
    """`(N, L - 1)` zeros for a batch without scored tokens, from a model that still runs once, on one token
    per row, joined to the result with weight 0: the processes of an FSDP model gather and reduce every layer
    together (forward and backward), a DDP wrapper's reduce the gradients in the backward, so no process may
    skip a forward or backward the others make."""
    zeros = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=input_ids.device)
    logits = model(input_ids=input_ids[:, :1], use_cache=False).logits
    return zeros + 0.0 * logits.float().sum()


def full_logits_logps(model, input_ids, attention_mask, mask) -> torch.Tensor:
    """The plain path: logits of every position from the first completion token on, then `token_logps`."""
    length = input_ids.shape[1]
    first = int(mask.float().argmax(dim=1)[mask.any(dim=1)].min())  # earliest completion token
    keep = length - max(first - 1, 0)  # logits at position first-1 predict token `first`
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep, use_cache=False).logits
    start = length - logits.shape[1]
    logps, _ = token_logps(logits, input_ids[:, start:], mask[:, start:])
    if start > 0:  # left-pad back to (N, L - 1) so every caller sees one layout
        logps = torch.nn.functional.pad(logps, (start, 0))
    return logps.float()


@torch.no_grad()
def batch_logps_no_grad(model, batch: dict) -> dict[str, torch.Tensor]:
    """Log-probs of every part of `batch`, without gradient, in eval mode (reference and lookahead passes).

    Several parts (KTO: main and mismatched) go through one forward: their rows are stacked (right padding
    extended to the wider part), so packing has more sequences to combine and the model runs once.
    """
    with eval_mode(model):
        return _parts_logps(model, batch)


def _parts_logps(model, batch: dict) -> dict[str, torch.Tensor]:
    parts = parts_of(batch)
    if len(parts) == 1:
        return {parts[0]: part_logps(model, batch, parts[0]).detach()}
    keys = ("input_ids", "attention_mask", "completion_mask")
    tensors = [[batch[f"{PARTS[p]}{k}"] for k in keys] for p in parts]
    width = max(t[0].shape[1] for t in tensors)
    stacked = {k: torch.cat([torch.nn.functional.pad(t[i], (0, width - t[i].shape[1])) for t in tensors])
               for i, k in enumerate(keys)}
    logps = part_logps(model, stacked).detach()
    out, start = {}, 0
    for part, (ids, _, _) in zip(parts, tensors):
        out[part] = logps[start: start + ids.shape[0], : ids.shape[1] - 1]
        start += ids.shape[0]
    return out


# ------------------------------------------------------------------ capability check


@dataclass
class Capabilities:
    fused: bool  # the output layer can be swapped for `linear_logps` (a plain Linear whose output is the logits)
    pack: bool  # isolates packed sequences delimited by `position_ids` (with attention_mask None)
    hidden_size: int | None = None  # for the packing cost model (None: rows never wider than the batch)
    reason: str | None = None  # why a fast path is off
    prefix: bool | None = None  # shared prompts run once (`humanline.prefix`); None: not probed yet
    prefix_used: bool = False
    prefix_reason: str | None = None  # the first reason a batch did not use it


_CAPABILITIES: "weakref.WeakKeyDictionary[torch.nn.Module, Capabilities]" = weakref.WeakKeyDictionary()


def forward_path(model) -> str | None:
    """How `part_logps` runs `model`, with the reason when a fast path is off; None before its first batch."""
    caps = _CAPABILITIES.get(model)
    if caps is None:
        return None
    path = "fused output head" + (", packed rows" if caps.pack else "") if caps.fused else "full logits"
    path += ", shared prompts once" if caps.prefix_used else ""
    notes = [n for n in (caps.reason, None if caps.prefix_used else caps.prefix_reason and
                         f"prompts not shared: {caps.prefix_reason}") if n]
    return path + (f" ({'; '.join(notes)})" if notes else "")


def _capabilities(model, input_ids: torch.Tensor, lengths: list[int]) -> Capabilities:
    """Check once per model, on two short sequences from the first batch, that the fused and packed
    forwards reproduce the plain padded forward (models that ignore `position_ids`, post-process their
    logits or have a wrapped output layer are then run the plain way)."""
    if model in _CAPABILITIES:
        return _CAPABILITIES[model]
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
    _CAPABILITIES[model] = caps
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
    keep = torch.zeros(1, len(b), dtype=torch.bool, device=b.device)
    keep[0, 1:-1:2] = True  # every other position predicting a token of b
    try:
        fused = fused_forward(model, {"input_ids": b[None], "attention_mask": torch.ones_like(b)[None],
                                      "use_cache": False}, keep, b[2::2])
    except PROBE_ERRORS as exc:
        return Capabilities(False, False, reason=f"the fused output head failed ({type(exc).__name__})")
    if not torch.allclose(fused, alone[1::2], rtol=0, atol=tol):
        return Capabilities(False, False, reason="the model post-processes its logits (e.g. soft-capping)")

    def packed_after(first: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([first, b])[None]
        positions = torch.cat([torch.arange(len(first)), torch.arange(len(b))]).to(b.device)[None]
        keep = torch.zeros_like(ids, dtype=torch.bool)
        keep[0, len(first): -1] = True
        return fused_forward(model, {"input_ids": ids, "position_ids": positions, "use_cache": False}, keep, b[1:])

    other = (a + 1) % (int(torch.maximum(a.max(), b.max())) + 1)  # same length, different tokens
    try:
        packed, packed_other = packed_after(a), packed_after(other)
    except PROBE_ERRORS as exc:
        return Capabilities(True, False, reason=f"packed rows failed ({type(exc).__name__})")
    isolated = not torch.equal(other, a) and torch.allclose(packed, packed_other, atol=tol, rtol=0)
    positioned = torch.allclose(packed, alone, atol=tol, rtol=0)
    if isolated and positioned:
        return Capabilities(True, True)
    return Capabilities(True, False, reason="the model does not isolate sequences packed by position_ids")


def model_hidden_size(model) -> int | None:
    inner = getattr(model, "module", model)  # DDP / FSDP wrappers
    config = getattr(inner, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    size = getattr(config, "hidden_size", None)
    return size if isinstance(size, int) and size > 0 else None
