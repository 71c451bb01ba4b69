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
  `position_ids` and a block-diagonal causal mask (prepared here for SDPA and eager attention, else built by
  transformers from the positions), so a token attends only to its own sequence. The backbone then runs on
  real tokens only.
- Nothing is read back from the device: every layout is decided and indexed from the host's copy of the
  batch (`host_rows`, kept by `humanline.data.collate.to_device`).
- Shared prompts (`humanline.model.prefix`): rows repeating a prompt (a GRPO group, a DPO pair) run it once, with a
  key/value cache expanded to the rows, then only their own tokens; taken where its cost rule says it pays.
- On accelerators the row width is rounded up to a multiple of `PAD_MULTIPLE` (64): attention kernels pay a
  set-up cost for every new shape (milliseconds per call on a GPU), and a handful of widths repeat.

Both are checked once per model object against the plain padded forward (`humanline.model.capabilities`); a model that
does not allow them (a LoRA-wrapped or soft-capped output layer, a model ignoring `position_ids`) runs the
plain way, which computes the same numbers; `forward_path(model)` says which path a model took and why
(and why prompts were not shared, e.g. gradient checkpointing or no repeated prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from humanline.core.logps import token_logps
from humanline.devices.fsdp import is_sharded
from humanline.model import prefix as shared_prompts
from humanline.model.capabilities import capabilities
from humanline.model.head import (
    PAD_MULTIPLE,
    RowLayout,
    causal,
    eval_mode,
    fused_forward,
    host_ints,
    padded_layout,
    prepared_mask,
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


@dataclass
class HostRows:
    """What the host knows of a part's rows, without reading the device: `input_ids` `(N, L)`, `lengths` `(N,)`
    real tokens per row, `scored` `(N, L - 1)` bool (position t predicts scored token t + 1), `right_padded`.
    `starts`, `counts`: each row's first scored position and number of scored tokens (numpy arrays)."""

    input_ids: np.ndarray
    lengths: np.ndarray
    scored: np.ndarray
    right_padded: bool

    @property
    def starts(self) -> np.ndarray:
        return self.scored.argmax(1) if self.scored.size else np.zeros(len(self.lengths), dtype=np.int64)

    @property
    def counts(self) -> np.ndarray:
        return self.scored.sum(1)


def host_rows(batch: dict, part: str = "main") -> HostRows:
    """`part`'s `HostRows`, from the host copies `humanline.data.collate.to_device` keeps in `batch["host"]`;
    a batch that did not come through it is read back from its tensors (one device sync)."""
    prefix = PARTS[part]
    keys = [f"{prefix}{k}" for k in ("input_ids", "attention_mask", "completion_mask")]
    host = batch.get("host") or {}
    if all(k in host for k in keys):
        ids, attention, completion = (host[k].numpy() for k in keys)
    else:
        ids, attention, completion = (batch[k].cpu().numpy() for k in keys)
    attention = attention.astype(bool)
    lengths = attention.sum(1)
    right_padded = bool((np.cumprod(attention, axis=1).sum(1) == lengths).all())
    return HostRows(ids, lengths, completion[:, 1:].astype(bool), right_padded)


def packed_layout(input_ids: torch.Tensor, scored, lengths, hidden_size: int | None = None, *,
                  multiple: int = 1, style: torch.dtype | None = None) -> RowLayout | None:
    """Sequences of `lengths` real tokens (right-padded rows of `input_ids`) packed several per row, first-fit
    decreasing, at the row capacity `_choose_rows` finds cheapest; rows `multiple`-aligned. None when packing
    saves nothing. `scored`: `(N, L - 1)` bool on the host. Every index is computed on the host (numpy) and
    moved in one copy; the device only gathers token ids.

    Example: lengths [5, 2, 3], L = 5 (capacity 5) -> rows [[0], [2, 1]], M = 5: the (3, 5) batch becomes
    (2, 5), and row 1 holds sequence 2 at positions 0..2 and sequence 1 at positions 0..1 (ids [0, 1, 2, 0, 1]).
    """
    n_seq, length = input_ids.shape
    lengths = [int(n) for n in lengths]
    chosen = _choose_rows(lengths, length, hidden_size)
    if chosen is None:
        return None
    rows, width = chosen
    width += -width % multiple
    dst_start, src_start = [0] * n_seq, [0] * n_seq
    for r, row in enumerate(rows):
        offset = r * width
        for i in row:
            dst_start[i], src_start[i] = offset, i * length
            offset += lengths[i]
    lens = np.asarray(lengths, dtype=np.int64)
    pos = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    dst = np.repeat(np.asarray(dst_start), lens) + pos
    src = np.repeat(np.asarray(src_start), lens) + pos
    slots = len(rows) * width
    gather = np.full(slots, n_seq * length)  # padding slots read the appended 0
    gather[dst] = src
    positions = np.zeros(slots, dtype=np.int64)
    positions[dst] = pos  # padding keeps position 0, and a segment of its own (below)
    segment = np.arange(slots) + n_seq
    segment[dst] = np.repeat(np.arange(n_seq), lens)
    keep_src = np.pad(np.asarray(scored, dtype=bool), ((0, 0), (0, 1))).reshape(-1)[src]
    order = np.argsort(dst[keep_src], kind="stable")  # the head reads kept hidden states in row-major order
    keep, kept_src = dst[keep_src][order], src[keep_src][order]
    scatter = (kept_src // length) * (length - 1) + kept_src % length
    gather, positions, segment, keep, target_index, scatter = host_ints(
        [gather, positions, segment, keep, kept_src + 1, scatter], input_ids.device)
    flat = torch.cat([input_ids.reshape(-1), input_ids.new_zeros(1)])
    segment = segment.view(len(rows), width)
    mask4d = None
    if style is not None:  # a token attends the earlier tokens of its own sequence
        same = segment[:, :, None] == segment[:, None, :]
        mask4d = prepared_mask(same & causal(width, width, input_ids.device)[None], style)
    return RowLayout(flat.index_select(0, gather).view(len(rows), width), keep,
                     flat.index_select(0, target_index), scatter, position_ids=positions.view(len(rows), width),
                     mask4d=mask4d)


def part_logps(model, batch: dict, part: str = "main") -> torch.Tensor:
    """`(N, L - 1)` log-probs of `part`'s completion tokens under `model` (0 elsewhere), float32.

    `batch` rows must be right-padded (collated by `humanline.data.collate`). Positions and order of the
    result do not depend on the layout chosen (packed, padded, shared prompts, or the full-logits fallback).
    Layouts are decided and built from the host's copy of the batch (`host_rows`): nothing is read back.
    """
    prefix = PARTS[part]
    input_ids = batch[f"{prefix}input_ids"]
    attention_mask = batch[f"{prefix}attention_mask"]
    n_seq, length = input_ids.shape
    rows = host_rows(batch, part)
    nothing = not rows.scored.any()
    in_step = is_sharded(model) or hasattr(model, "module")  # FSDP, or a DDP wrapper: processes meet in the model
    if nothing and not in_step:
        return torch.zeros(n_seq, length - 1, device=input_ids.device)
    caps = capabilities(model, input_ids, rows.lengths.tolist())  # FSDP: probed at the first batch, even empty
    if nothing:
        return _nothing_scored(model, input_ids)
    if not caps.fused:
        return full_logits_logps(model, input_ids, attention_mask, batch[f"{prefix}completion_mask"].bool(), rows)
    multiple = 1 if input_ids.device.type == "cpu" else PAD_MULTIPLE
    shared = shared_prompts.logps(model, caps, input_ids, rows, multiple) if rows.right_padded else None
    if shared is not None:  # rows repeating a prompt: it runs once (humanline.model.prefix)
        return _to_rows(shared[0], shared[1], n_seq, length)
    layout = None
    if caps.pack and rows.right_padded:
        layout = packed_layout(input_ids, rows.scored, rows.lengths, caps.hidden_size, multiple=multiple,
                               style=caps.mask)
    layout = layout or padded_layout(input_ids, attention_mask, rows.scored, multiple=multiple, style=caps.mask)
    logps = fused_forward(model, layout.model_inputs(), layout.keep, layout.targets)
    return _to_rows(logps, layout.scatter, n_seq, length)


def _nothing_scored(model, input_ids: torch.Tensor) -> torch.Tensor:
    """`(N, L - 1)` zeros for a batch without scored tokens, from a model that still runs once, on one token
    per row, joined to the result with weight 0: the processes of an FSDP model gather and reduce every layer
    together (forward and backward), a DDP wrapper's reduce the gradients in the backward, so no process may
    skip a forward or backward the others make."""
    zeros = torch.zeros(input_ids.shape[0], input_ids.shape[1] - 1, device=input_ids.device)
    logits = model(input_ids=input_ids[:, :1], use_cache=False).logits
    return zeros + 0.0 * logits.float().sum()


def _to_rows(logps: torch.Tensor, scatter: torch.Tensor, n_seq: int, length: int) -> torch.Tensor:
    """`(n,)` log-probs into their `(N, L - 1)` slots. The index gets a storage of its own where autograd keeps
    it for backward: a view would keep every index array of the layout (one buffer on the device) alive."""
    if logps.requires_grad:
        scatter = scatter.clone()
    return logps.new_zeros(n_seq * (length - 1)).index_put((scatter,), logps).view(n_seq, length - 1)


def full_logits_logps(model, input_ids, attention_mask, mask, rows: HostRows | None = None) -> torch.Tensor:
    """The plain path: logits of every position from the first completion token on, then `token_logps`."""
    length = input_ids.shape[1]
    if rows is None:
        first = int(mask.float().argmax(dim=1)[mask.any(dim=1)].min())  # earliest completion token
    else:  # scored position t is completion token t + 1
        first = int(rows.starts[rows.counts > 0].min()) + 1
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
    width = max(batch[f"{PARTS[p]}input_ids"].shape[1] for p in parts)

    def stack(source: dict) -> dict:  # right padding extended to the widest part, rows one after the other
        return {k: torch.cat([torch.nn.functional.pad(source[f"{PARTS[p]}{k}"],
                                                      (0, width - source[f"{PARTS[p]}{k}"].shape[1]))
                              for p in parts]) for k in keys}

    stacked = stack(batch)
    if all(f"{PARTS[p]}{k}" in batch.get("host", {}) for p in parts for k in keys):
        stacked["host"] = stack(batch["host"])  # the host's copy, stacked alike (no device read)
    logps = part_logps(model, stacked).detach()
    out, start = {}, 0
    for part in parts:
        ids = batch[f"{PARTS[part]}input_ids"]
        out[part] = logps[start: start + ids.shape[0], : ids.shape[1] - 1]
        start += ids.shape[0]
    return out
