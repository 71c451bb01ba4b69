"""A decoding loop for plain causal LMs (Llama / Mistral / Qwen2 blocks) that is fast on the CPU.

`HFGenerateBackend` uses it instead of `model.generate` where it applies (`unsupported` says when not). What it
does differently from `generate`, each measured in benchmarks/rollout_speed.py (BENCHMARKS.md):

- The KV cache is preallocated once per call, (rows, kv heads, prompt width + max_new_tokens, head dim) per layer,
  and each step writes its key/value column in place (no per-token concatenation).
- Each distinct prompt is prefilled once and its cache copied to its n samples (`generate` prefills n copies).
- Rows that ended (eos, stop string, length) leave the batch: once enough have, the cache and the bookkeeping are
  compacted to the live rows, so the matrix products shrink as completions finish.
- Stop strings are checked on the decoded tail of the live rows only, as `_StopOnText` does for `generate`.
- Decode-step attention groups the query heads that share a key/value head as extra query rows of one batched
  matrix product (no repeat of the cache for grouped-query attention); at one query token per row, two
  `matmul`s and a softmax cost less than the fused SDPA kernel on the CPU.
- A draw is one uniform number per row against the cumulative probabilities (inverse CDF): `torch.multinomial`
  draws an exponential variate per vocabulary entry, a quarter of a batch-256 step on the CPU.

The layers' own modules (norms, projections, MLP, rotary embedding, lm_head) are called, so their weights, hooks
and adapters (LoRA) are the ones `generate` would use; only the attention arithmetic around them is ours.
Sampling draws from softmax(logits / T) restricted to top-p, the distribution the `generate` path draws from (to
float32 resolution, 2^-24, see `draw`), with other random numbers; greedy is the argmax of the raw logits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
COMPACT_FRACTION = 0.125  # compact once this share of the batch's rows has ended


def causal_core(model: Any) -> Any:
    """The `*ForCausalLM` module under PEFT wrappers (its `.model` holds the decoder layers)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def unsupported(model: Any, max_len: int) -> str | None:
    """Why the fast loop cannot run this model (None when it can); `max_len` = prompt width + new tokens."""
    core = causal_core(model)
    config = getattr(core, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    device = next(core.parameters()).device
    if device.type != "cpu":
        return f"the fast loop is measured on the CPU only (model on {device.type})"
    body = getattr(core, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if body is None or not all(hasattr(body, a) for a in needed) or not hasattr(core, "lm_head"):
        return "the model does not have the plain embed/layers/norm/rotary/lm_head structure"
    for layer in body.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None or not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return "a decoder layer lacks q/k/v/o projections"
        if any(hasattr(attn, a) for a in ("q_norm", "k_norm", "sinks")):
            return "attention has q/k norms or sinks"
        if not all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "mlp")):
            return "a decoder layer is not norm-attention-norm-MLP"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and max_len > window:
        return f"sequences of {max_len} tokens exceed the sliding window {window}"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    return None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, heads, L, d) with cos/sin (B, L, d): x * cos + (x with halves swapped, first
    negated) * sin."""
    half = x.shape[-1] // 2
    swapped = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + swapped * sin.unsqueeze(1)


class _Stepper:
    """Runs the decoder layers over a preallocated cache: `prefill` once, then `step` per token."""

    def __init__(self, model: Any):
        self.core = causal_core(model)
        self.body = self.core.model
        cfg = self.core.config
        attn = self.body.layers[0].self_attn
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // self.heads
        self.group = self.heads // self.kv_heads

    def _project(self, attn: Any, x: torch.Tensor, pos: torch.Tensor, cos_sin) -> tuple:
        b, length = x.shape[:2]
        q = attn.q_proj(x).view(b, length, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, length, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos_sin
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor, n: int, total: int) -> torch.Tensor:
        """Run the left-padded prompts `ids` (P, W) once, allocate the cache for P * n rows of `total` columns and
        fill its first W columns (each prompt's keys/values copied to its n rows). Returns last-position logits
        (P, V)."""
        p, width = ids.shape
        self.pos = (valid.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
        # pads see themselves
        mask = (causal & valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=ids.device)
        mask = mask[:, None]  # (P, 1, W, W)
        h = self.body.embed_tokens(ids)
        cos_sin = self.body.rotary_emb(h, self.pos)
        rows = p * n
        shape = (rows, self.kv_heads, total, self.head_dim)
        self.keys = [h.new_empty(shape) for _ in self.body.layers]
        self.values = [h.new_empty(shape) for _ in self.body.layers]
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q, k, v = self._project(attn, x, self.pos, cos_sin)
            self.keys[i][:, :, :width] = k.repeat_interleave(n, 0)
            self.values[i][:, :, :width] = v.repeat_interleave(n, 0)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scaling,
                                                 enable_gqa=self.group > 1)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(p, width, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        logits = self.core.lm_head(self.body.norm(h[:, -1:]))[:, 0]
        self.valid = torch.zeros(rows, total, dtype=torch.bool, device=ids.device)
        self.valid[:, :width] = valid.repeat_interleave(n, 0)
        self.next_pos = (self.pos[:, -1] + 1).repeat_interleave(n, 0)  # the next token's position per row
        self.filled = width
        return logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per live row (R,), write its key/value in the next cache column; logits (R, V)."""
        rows, col = tokens.shape[0], self.filled
        self.valid[:, col] = True
        h = self.body.embed_tokens(tokens[:, None])
        pos = self.next_pos[:, None]
        cos_sin = self.body.rotary_emb(h, pos)
        # Grouped-query decode: the `group` query heads of one kv head are `group` query rows against its cache.
        # Padding columns get -inf; every row's own new column is valid, so no softmax row is empty.
        bias = torch.zeros(self.valid[:, : col + 1].shape, dtype=h.dtype, device=h.device)
        bias = bias.masked_fill_(~self.valid[:, : col + 1], float("-inf"))[:, None, None, :]
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            q, k, v = self._project(attn, layer.input_layernorm(h), pos, cos_sin)
            self.keys[i][:, :, col : col + 1] = k
            self.values[i][:, :, col : col + 1] = v
            q = q.reshape(rows, self.kv_heads, self.group, self.head_dim)
            weights = torch.matmul(q, self.keys[i][:, :, : col + 1].transpose(-1, -2)).mul_(attn.scaling)
            out = torch.matmul(weights.add_(bias).softmax(-1), self.values[i][:, :, : col + 1])
            h = h + attn.o_proj(out.reshape(rows, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        self.filled += 1
        self.next_pos = self.next_pos + 1
        return self.core.lm_head(self.body.norm(h))[:, 0]

    def keep(self, index: torch.Tensor) -> None:
        """Compact the batch to the rows in `index` (copies only the filled cache columns)."""
        used = self.filled
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_empty((len(index), *old.shape[1:]))
                new[:, :, :used] = old[index, :, :used]
                store[i] = new
        self.valid = self.valid[index]
        self.next_pos = self.next_pos[index]


def scores(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The float32 scores a sample is drawn from (softmax of them): logits / T, -inf outside the top-p set.

    Top-p keeps, in ascending probability order, every token whose cumulative probability (itself included)
    exceeds 1 - top_p, and always the most probable token (the rule `generate`'s top-p warper applies)."""
    out = logits.float()
    if temperature != 1.0:
        out = out / temperature
    if top_p < 1.0:
        ordered, order = out.sort(dim=-1)
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False
        out = out.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return out


def draw(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token of each row of `probs` (R, V) whose cumulative-probability interval holds `uniform` (R,) in [0, 1)
    scaled by the row's total: token i for c[i-1] <= u * total < c[i], so P(i) = probs[i] / total.

    The CPU's float32 cumsum accumulates in double and rounds each partial sum once, so every interval is exact
    to 2^-24 of the total. A token of probability 0 has an empty interval and is never drawn; u * total is kept
    below the total, so rounding cannot run past the last token."""
    cdf = probs.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.minimum(uniform[:, None].to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True)[:, 0]


def choose(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Next token per row and its float32 log-probability under the distribution it was drawn from: the argmax of
    the logits for temperature 0 (a point mass: log-probability 0), else a draw from softmax(`scores`) (`draw`),
    whose log-probability is `scores` at the token minus their log-sum-exp (temperature and top-p included)."""
    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    processed = scores(logits, temperature, top_p)
    tokens = draw(processed.softmax(-1), torch.rand(processed.shape[0], device=processed.device))
    return tokens, processed.gather(1, tokens[:, None])[:, 0] - processed.logsumexp(-1)


def decode(
    model: Any,
    prompts: list[list[int]],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: list[int],
    pad_id: int,
    stopped: Callable[[list[list[int]]], list[bool]] | None = None,
    compact_fraction: float | None = None,
    trace: list | None = None,
    logps: list | None = None,
) -> list[list[int]]:
    """Generated tokens for each prompt's n samples (prompt-major rows), each up to and including the token that
    ended it (eos, or the one completing a stop string per `stopped`), at most `max_new_tokens`.

    `stopped(tails)` says, for each live row's generated tokens, whether it contains a stop string.
    `compact_fraction`: compact the batch once this share of its rows has ended (default `COMPACT_FRACTION`;
    above 1 never). `trace` (tests, diagnostics): gets (output row of each batch row, logits) per step. `logps`
    (a list): gets one list per output row, the log-probability of each of its tokens under the distribution it
    was drawn from (`choose`)."""
    compact_fraction = COMPACT_FRACTION if compact_fraction is None else compact_fraction
    device = next(causal_core(model).parameters()).device
    ids, valid = left_padded(prompts, pad_id)
    stepper = _Stepper(model)
    logits = stepper.prefill(ids.to(device), valid.to(device), n, ids.shape[1] + max_new_tokens)
    logits = logits.repeat_interleave(n, 0)
    out: list[list[int]] = [[] for _ in range(len(prompts) * n)]
    token_logps: list[list[float]] = [[] for _ in out]
    live = list(range(len(out)))  # output row of each batch row
    ended = [False] * len(live)  # batch rows that ended but are still in the batch
    eos = set(eos_ids)
    for t in range(max_new_tokens):
        if trace is not None:
            trace.append((list(live), logits.detach().clone()))
        tokens, chosen_logps = choose(logits, temperature, top_p)
        if logps is not None:  # before `append_tokens` marks this step's enders: their last token counts
            for b, lp in enumerate(chosen_logps.tolist()):
                if not ended[b]:
                    token_logps[live[b]].append(lp)
        append_tokens(out, live, ended, tokens.tolist(), eos, stopped)
        if t == max_new_tokens - 1 or all(ended):
            break
        done = sum(ended)
        if done and done >= compact_fraction * len(live):  # the ended rows leave the batch
            keep = [b for b, e in enumerate(ended) if not e]
            index = torch.tensor(keep, dtype=torch.long, device=device)
            stepper.keep(index)
            tokens = tokens[index]
            live = [live[b] for b in keep]
            ended = [False] * len(live)
        logits = stepper.step(tokens)
    if logps is not None:
        logps.extend(token_logps)
    return out


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one left-padded batch: ids (P, W) and the bool mask of real tokens (P, W), W the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            valid[i, width - len(p):] = True
    return ids, valid


def append_tokens(out: list[list[int]], live: list[int], ended: list[bool], new: list[int], eos: set[int],
                  stopped: Callable[[list[list[int]]], list[bool]] | None) -> None:
    """One step's bookkeeping, in place: each batch row still going gets its token `new[b]` appended to its
    output row `out[live[b]]`; it ends (`ended[b]`) on an eos token, or when `stopped` finds a stop string in the
    tokens it has generated. Rows already ended are left as they are."""
    check = []
    for b, (row, tok) in enumerate(zip(live, new)):
        if ended[b]:
            continue
        out[row].append(tok)
        if tok in eos:
            ended[b] = True
        else:
            check.append(b)
    if stopped is not None and check:
        for b, hit in zip(check, stopped([out[live[b]] for b in check])):
            ended[b] = ended[b] or hit
