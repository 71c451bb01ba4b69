"""Shared-prompt ("prefix") layout: rows that repeat a prompt run it through the model once.

In GRPO every group holds n completions of one prompt, and a DPO pair two; the plain layouts recompute the
prompt's hidden states for every row. Here, per distinct prompt, the tokens before the first scored
position go through the model once (`use_cache=True`, right-padded to the longest distinct prompt); the
key/value cache is then indexed per row (`group`, one entry per row: autograd sums the rows' gradients
into the shared prompt) and the rest of each row runs on top of it, with an attention mask covering
[its prompt (padding off) | its own tokens] and position ids continuing from its prompt's length.

The completion log-probs equal the plain forward's (float tolerance) and so do the parameter gradients;
`humanline.model.forward` checks that once per model on real rows (`probe`) and otherwise runs its usual layout.
Only transformers' plain `DynamicLayer` key/value caches qualify (sliding-window and recurrent layers would
see the prompt padding), and a call falls back (with the reason recorded) under gradient checkpointing
(transformers drops the cache there), behind a DDP wrapper with gradients (two forwards before one backward),
on an FSDP-sharded model (its ranks must forward in step, and whether the layout pays depends on the rows),
or when the shared part is too small for the second forward to pay (`pays`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from humanline.devices.fsdp import is_sharded
from humanline.model.head import (
    PROBE_ERRORS,
    causal,
    eval_mode,
    forward_eps,
    fused_forward,
    host_ints,
    padded_layout,
    prepared_mask,
)

# An allowance, in tokens, for the fixed costs of the second forward (an estimate, not measured on its own;
# MIN_GAIN adds the margin). Measured end to end (benchmarks/prefix_forward.py, SmolLM2-135M, CPU): 4 prompts
# x 8 completions, ~2x fewer tokens -> 1.8-2.3x; DPO-shaped pairs, ~1.4x fewer tokens -> 1.26x.
CALL_OVERHEAD_TOKENS = 16
# On an accelerator a forward's fixed cost is its kernel launches, not its tokens: a 24-layer model launches
# ~15 kernels per layer forward and ~30 backward, ~5 us each, i.e. ~5 ms, while a token of a 0.5 B model costs
# ~10 us of forward + backward at a realistic 40 % of a large GPU's bf16 peak: ~500 tokens. Twice that for the key /
# value cache's expansion and the Python around a second call (an estimate; `benchmarks/gpu_profile.py` measures
# the fixed cost of a call in tokens).
ACCELERATOR_CALL_OVERHEAD_TOKENS = 1024
ENABLED = True  # False: every batch takes the other layouts (benchmarks compare both on one model)
MIN_GAIN = 0.85  # the prefix layout must cost at most this fraction of the plain one


def call_overhead_tokens(device: torch.device) -> int:
    """The fixed cost of a second forward on `device`, in tokens (`CALL_OVERHEAD_TOKENS` on the CPU)."""
    return CALL_OVERHEAD_TOKENS if device.type == "cpu" else ACCELERATOR_CALL_OVERHEAD_TOKENS


@dataclass
class PrefixLayout:
    """`prompt_ids`, `prompt_mask`: `(G, S)` the distinct prompts, right-padded; `group`: `(R,)` the prompt
    of each model row; `input_ids`, `position_ids`: `(R, W)` each row's tokens after its prompt;
    `attention_mask`: `(R, S + W)`; `keep`, `targets`, `scatter`: as in `humanline.model.head.RowLayout`;
    `prompt_mask4d`, `mask4d`: the prepared attention of the two forwards (`head.prepared_mask`) or None."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    group: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor
    targets: torch.Tensor
    scatter: torch.Tensor
    prompt_mask4d: torch.Tensor | None = None
    mask4d: torch.Tensor | None = None


def shared_prompts(input_ids, starts, rows: list[int]) -> tuple[list[int], list[int]]:
    """(group of each of `rows`, prompt length of each group): rows whose first `starts[i]` tokens are equal
    share a group. `starts[i]`: row i's first scored position (its prompt minus the last token, which is
    run with the row since its logits predict the first completion token). `input_ids`: the host's `(N, L)`
    (numpy, or a CPU tensor)."""
    host = np.asarray(input_ids)
    index: dict[bytes, int] = {}
    group, sizes = [], []
    for i in rows:
        key = host[i, : int(starts[i])].tobytes()
        if key not in index:
            index[key] = len(sizes)
            sizes.append(int(starts[i]))
        group.append(index[key])
    return group, sizes


def cost(rows: int, width: int, hidden_size: int | None, context: int = 0) -> float:
    """`rows` x `width` tokens attending over `context` + `width` keys (see `forward._layout_cost`)."""
    attention = (context + width) / (6.0 * hidden_size) if hidden_size else 0.0
    return rows * width * (1.0 + attention)


def pays(lengths, starts, rows: list[int], group: list[int], sizes: list[int], hidden_size: int | None,
         overhead: int = CALL_OVERHEAD_TOKENS) -> bool:
    """Whether the two forwards of the prefix layout, plus `overhead` tokens for the second call, cost less
    than `MIN_GAIN` of packing every row's tokens."""
    if len(sizes) == len(rows):
        return False
    plain = sum(cost(1, int(lengths[i]), hidden_size) for i in rows)
    prompt = max(sizes)
    width = max(int(lengths[i]) - int(starts[i]) for i in rows)
    prefix = cost(len(sizes), prompt, hidden_size) + cost(len(rows), width, hidden_size, prompt)
    return prefix + overhead < MIN_GAIN * plain


def prefix_layout(input_ids: torch.Tensor, scored, lengths, starts, rows: list[int], group: list[int],
                  sizes: list[int], multiple: int = 1, style: torch.dtype | None = None) -> PrefixLayout:
    """The layout of `rows` (right-padded rows of `input_ids` with scored tokens) grouped as `shared_prompts`
    found. Output slots are flat indices into the `(N, L - 1)` result, as for the other layouts. `multiple`:
    both widths rounded up to it (accelerators: `head.PAD_MULTIPLE`); extra columns are masked padding.
    `scored` `(N, L - 1)`, `lengths`, `starts`: the host's (numpy or lists); indices are built there and moved
    in one copy, the device only gathers token ids. `style`: prepared attention masks (`head.mask_style`).

    Example: rows [a b c d e], [a b f g] with scored positions 2..3 and 2 (first scored position 2): one
    prompt [a b]; model rows [c d e] at positions 2..4 and [f g 0] at 2..4 (last column padding), keep
    [T T F] and [T F F] (flat positions 0, 1, 3), targets [d e g].
    """
    n_seq, length = input_ids.shape
    prompt, width = max(sizes), max(int(lengths[i]) - int(starts[i]) for i in rows)
    prompt, width = prompt + -prompt % multiple, width + -width % multiple
    row_idx = np.asarray(rows)
    start = np.asarray([int(starts[i]) for i in rows])
    group_a = np.asarray(group)
    first: dict[int, int] = {}
    for i, g in zip(rows, group):
        first.setdefault(g, i)
    first_row = np.asarray([first[g] for g in range(len(sizes))])  # each group's prompt holder
    cols = np.arange(prompt)
    prompt_mask = cols[None] < np.asarray(sizes)[:, None]
    sentinel = n_seq * length  # reads the appended 0
    prompt_gather = np.where(prompt_mask, first_row[:, None] * length + np.minimum(cols, length - 1), sentinel)
    j = np.arange(width)
    src = np.minimum(start[:, None] + j[None], length - 1)  # (R, W) column in the original row
    real = j[None] < (np.asarray([int(lengths[i]) for i in rows]) - start)[:, None]
    keep_grid = np.pad(np.asarray(scored, dtype=bool)[row_idx], ((0, 0), (0, 1)))[np.arange(len(rows))[:, None],
                                                                                 src] & real
    r, c = np.nonzero(keep_grid)
    kept_src = src[r, c]
    attention = np.concatenate([prompt_mask[group_a], real], axis=1)
    (prompt_gather, prompt_mask, group_t, gather, positions, attention, keep, target_index, scatter) = host_ints(
        [prompt_gather, prompt_mask, group_a, np.where(real, row_idx[:, None] * length + src, sentinel),
         start[:, None] + j[None], attention, r * width + c, row_idx[r] * length + kept_src + 1,
         row_idx[r] * (length - 1) + kept_src], input_ids.device)
    flat = torch.cat([input_ids.reshape(-1), input_ids.new_zeros(1)])
    layout = PrefixLayout(flat[prompt_gather], prompt_mask, group_t, flat[gather], positions, attention, keep,
                          flat.index_select(0, target_index), scatter)  # integer gathers of (G, S) and (R, W)
    if style is not None:
        device, own = input_ids.device, attention[:, prompt:].bool()
        on_prompt = causal(prompt, prompt, device)[None] & prompt_mask.bool()[:, None, :]
        layout.prompt_mask4d = prepared_mask(on_prompt | torch.eye(prompt, dtype=torch.bool, device=device), style)
        rows_own = (causal(width, width, device)[None] & own[:, None, :]) | torch.eye(width, dtype=torch.bool,
                                                                                      device=device)
        on_rows = torch.cat([prompt_mask.bool()[group_t][:, None, :].expand(-1, width, -1), rows_own], dim=2)
        layout.mask4d = prepared_mask(on_rows, style)
    return layout


def plain_kv_cache(cache) -> str | None:
    """None if `cache` is transformers' cache of plain key/value layers, else why it is not usable."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return "transformers has no DynamicLayer cache"
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return f"the model's cache is not plain key/value layers ({type(cache).__name__})"
    return None


def _returned_cache(out):
    for name in ("cache", "past_key_values"):  # the field was renamed in transformers 5.x
        cache = getattr(out, name, None)
        if cache is not None:
            return name, cache
    raise RuntimeError("the model returned no key/value cache")


def run(model, layout: PrefixLayout) -> torch.Tensor:
    """`(n,)` log-probs of `layout.targets`: the prompts once, then every row on its prompt's expanded cache."""
    prompt_mask = layout.prompt_mask if layout.prompt_mask4d is None else layout.prompt_mask4d
    out = model(input_ids=layout.prompt_ids, attention_mask=prompt_mask, use_cache=True, logits_to_keep=1)
    name, cache = _returned_cache(out)
    why = plain_kv_cache(cache)
    if why:
        raise RuntimeError(why)
    for layer in cache.layers:  # (G, heads, S, d) -> (R, heads, S, d); backward sums over each group's rows
        layer.batch_select_indices(layout.group)
    mask = layout.attention_mask if layout.mask4d is None else layout.mask4d
    inputs = {"input_ids": layout.input_ids, "attention_mask": mask, "position_ids": layout.position_ids,
              name: cache, "use_cache": True}
    return fused_forward(model, inputs, layout.keep, layout.targets)


def blocked(model) -> str | None:
    """Why this call cannot use the prefix layout, or None."""
    if is_sharded(model):  # whether it pays depends on each rank's rows; FSDP ranks must forward in step
        return "sharded processes (FSDP, ZeRO-3) run forwards in step, and this layout's count depends on the rows"
    if not torch.is_grad_enabled():
        return None
    if hasattr(model, "module") or any(type(m).__name__.startswith("FSDP") for m in model.modules()):
        return "a DDP / FSDP wrapper would see two forwards before one backward"
    if model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return "gradient checkpointing drops the key/value cache"
    return None


def logps(model, caps, input_ids: torch.Tensor, host, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(logps, scatter)` of the batch through the prefix layout, or None (the reason kept in `caps`) when it
    does not apply: no repeated prompt, too little shared, a model or call that does not allow it. `host`: the
    batch part's `forward.HostRows` (the decision reads the host's copy of the ids, never the device)."""
    if not ENABLED:
        return None
    lengths, starts, counts = host.lengths, host.starts, host.counts
    rows = [i for i, c in enumerate(counts) if c]
    if any(starts[i] < 1 for i in rows):
        return _off(caps, "a row has no prompt token before its first scored token")
    group, sizes = shared_prompts(host.input_ids, starts, rows)
    if len(sizes) == len(rows):
        return _off(caps, "no two rows share a prompt")
    if not pays(lengths, starts, rows, group, sizes, caps.hidden_size, call_overhead_tokens(input_ids.device)):
        return _off(caps, "the shared prompts are too short to pay for a second forward")
    why = blocked(model)
    if why:
        return _off(caps, why)
    if caps.prefix is None:
        caps.prefix, caps.prefix_reason = probe(model, input_ids, host.scored, lengths, starts, rows, group,
                                                caps.mask)
    if not caps.prefix:
        return None
    layout = prefix_layout(input_ids, host.scored, lengths, starts, rows, group, sizes, multiple, caps.mask)
    caps.prefix_used = True
    return run(model, layout), layout.scatter


def _off(caps, reason: str) -> None:
    if caps.prefix_reason is None:
        caps.prefix_reason = reason
    return None


def probe(model, input_ids, scored, lengths, starts, rows, group, style=None) -> tuple[bool, str | None]:
    """Once per model: two rows sharing a prompt (and one other, if any) through the prefix layout and the
    padded layout must give the same log-probs (`scored`, `lengths`, `starts`: the host's)."""
    shared = [r for r, g in zip(rows, group) if group.count(g) > 1]
    pick = shared[:1] + [r for r, g in zip(rows, group) if g == group[rows.index(shared[0])]][1:2]
    pick += [r for r, g in zip(rows, group) if g != group[rows.index(shared[0])]][:1]
    width = max(int(lengths[i]) for i in pick)
    ids, mask = input_ids[pick, :width], np.asarray(scored, dtype=bool)[pick, : width - 1]
    sub_lengths = [int(lengths[i]) for i in pick]
    attn = (torch.arange(width, device=ids.device)[None] < torch.tensor(sub_lengths, device=ids.device)[:, None])
    sub_starts = [int(starts[i]) for i in pick]
    g, sizes = shared_prompts(ids.cpu(), sub_starts, list(range(len(pick))))
    with eval_mode(model), torch.no_grad():
        plain = padded_layout(ids, attn.long(), mask, style=style)
        expected = fused_forward(model, plain.model_inputs(), plain.keep, plain.targets)
        try:
            layout = prefix_layout(ids, mask, sub_lengths, sub_starts, list(range(len(pick))), g, sizes, 1, style)
            got = run(model, layout)
        except PROBE_ERRORS as exc:
            return False, f"the prefix forward failed ({type(exc).__name__}: {str(exc)[:80]})"
    tol = min(1e3 * forward_eps(model, expected), 0.02) * (1.0 + float(expected.abs().max()))
    size = mask.size
    expected = expected.new_zeros(size).index_put((plain.scatter,), expected)
    got = got.new_zeros(size).index_put((layout.scatter,), got) if got.shape == plain.targets.shape else None
    if got is None or not torch.allclose(got, expected, rtol=0, atol=tol):
        return False, "the prefix forward does not reproduce the plain one"
    return True, None
