"""Sampling completions from the policy being trained (or evaluated).

The backend sits behind a two-line protocol (`RolloutBackend.generate`) so that a vLLM backend can be added
later without touching the trainer. The shipped backend, `HFGenerateBackend`, decodes plain causal LMs
(Llama / Mistral / Qwen2 blocks) on the CPU with `humanline.sampling.decode`: an in-place preallocated KV cache, each
prompt prefilled once for its n samples, finished rows compacted out of the batch (measured in
benchmarks/rollout_speed.py and BENCHMARKS.md). Any other model, or a model on an accelerator, goes through
`model.generate` (one debug log line says why) with left padding and a static KV cache (preallocated once per
call; on CUDA transformers then compiles the decoding step, and prompt widths are rounded up to a multiple of
64 there so a few shapes repeat). A dynamic cache grows by concatenation every token, about 4x slower than the
static one on a GPU (BENCHMARKS.md, rollouts). Both paths cut completions and
apply stop strings the same way, and greedy decoding gives the same tokens (tests/online/test_decode.py).
`decoder: generate` (`rollout.decoder` in a config) sends every call through `model.generate`.

On-policy means sampling from the very weights the optimizer updates. Under accelerate/DDP the wrapped module
shares its parameters with the unwrapped one, so we unwrap and call `generate` on it. Under FSDP2 each rank only
holds a shard: the caller gathers the whole model around the call (`humanline.devices.fsdp.full_weights`, as
`sampler.Sampler.generate` and the held-out evaluation do); generation itself then makes no collective call.

Sampling is from the unmodified model distribution at the given temperature / top-p: the model's own
`generation_config` defaults that would truncate or reshape it (top_k=50, repetition penalty, ...) are
overridden, because on-policy objectives assume the samples come from pi_theta.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from humanline.data.tokenization import encode_prompt
from humanline.errors import UserError
from humanline.model.head import PAD_MULTIPLE, eval_mode
from humanline.sampling import decode

log = logging.getLogger(__name__)

DECODERS = ("auto", "generate")  # GenerationConfig.decoder / rollout.decoder


@dataclass
class GenerationConfig:
    """How to sample completions."""

    max_new_tokens: int = 64  # completion length cap in tokens (the eos/end token counts)
    temperature: float = 1.0  # 0 means greedy decoding; > 0 samples at this temperature
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1.0 samples from the full distribution
    n: int = 1  # completions per prompt (a GRPO group)
    stop: list[str] = field(default_factory=list)  # stop strings; the completion ends after the first match
    batch_size: int = 16  # prompts per `generate` call (each call decodes batch_size * n sequences)
    seed: int | None = None  # seeds sampling without touching the caller's RNG; None uses the global RNG
    cache: str = "static"  # KV cache: static (preallocated; compiled decoding on CUDA) | dynamic (grows per token)
    decoder: str = "auto"  # auto: `humanline.sampling.decode` where it applies, else model.generate | generate: always
    # model.generate. Both sample the same distribution but consume random numbers differently, so a seed gives
    # other samples under each: `generate` reproduces samples drawn before the fast loop existed.

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> UserError:
            return UserError(f"generation.{name}: expected {expected}, got {getattr(self, name)!r}")

        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature < float("inf"):
            raise bad("temperature", "a finite number >= 0 (0 = greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "a number in (0, 1]")
        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "an integer >= 1")
        if self.temperature == 0 and self.n > 1:
            raise bad("n", "1 with temperature 0 (greedy decoding gives one completion per prompt; set "
                           "temperature > 0 to sample a group)")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise bad("batch_size", "an integer >= 1")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "a list of non-empty strings")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad("seed", "an integer or null")
        if self.cache not in ("static", "dynamic"):
            raise bad("cache", "static | dynamic")
        if self.decoder not in DECODERS:
            raise bad("decoder", " | ".join(DECODERS))
        self.stop = list(self.stop)


@dataclass
class Rollout:
    """Completions for a list of prompts, `n` per prompt, in prompt order.

    completion_ids[i][j]: token ids of completion j of prompt i, including the eos token when one was generated,
    without padding, cut right after the token that completed a stop string. texts[i][j] is its decoding
    without special tokens (a matched stop string is kept at its end). finish_reasons[i][j] is "eos", "stop"
    or "length" (hit max_new_tokens). logprobs[i][j][t]: the log-probability of token t of that completion under
    the distribution it was drawn from (the sampler's weights and dtype, the temperature and top-p: the
    behaviour policy of docs/method.md §3.6); empty when the engine did not record them.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[list[int]]]
    texts: list[list[str]]
    num_generated_tokens: int
    seconds: float
    finish_reasons: list[list[str]] = field(default_factory=list)
    logprobs: list[list[list[float]]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens kept (up to eos / stop) per second of the whole call."""
        return self.num_generated_tokens / self.seconds if self.seconds > 0 else 0.0


class RolloutBackend(Protocol):
    """Anything that turns tokenised prompts into a `Rollout` sampled from `model`."""

    def generate(
        self, model: Any, tokenizer: Any, prompt_token_ids: list[list[int]], cfg: GenerationConfig
    ) -> Rollout: ...


def _stop_window(stops: Sequence[str]) -> int:
    """Tokens of tail to decode when looking for a stop string: a stop string of c characters spans at most c
    tokens, and the margin keeps the window's first token (whose decoding may lose a leading space) out of any
    match that ends at the newest token."""
    return max(len(s) for s in stops) + 8


def _tails_contain(tokenizer: Any, stops: Sequence[str], tails: list[list[int]]) -> list[bool]:
    """Whether each decoded tail (special tokens skipped) contains a stop string: matching is on decoded text, not
    on token strings, so a stop string is found however the tokenizer split it."""
    texts = tokenizer.batch_decode(tails, skip_special_tokens=True)
    return [any(s in t for s in stops) for t in texts]


class _StopOnText(StoppingCriteria):
    """Stopping criterion for `generate`: a sequence is done once its decoded completion's tail window contains a
    stop string."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_len: int):
        self.tokenizer, self.stops, self.prompt_len = tokenizer, list(stops), prompt_len
        self.window = _stop_window(stops)

    def __call__(self, input_ids: torch.Tensor, scores: Any = None, **kwargs: Any) -> torch.Tensor:
        tails = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :].tolist()
        done = _tails_contain(self.tokenizer, self.stops, tails)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def eos_ids_of(model: Any, tokenizer: Any) -> list[int]:
    """All token ids that end a completion: the model's generation_config eos (may be a list) and the tokenizer's."""
    ids: list[int] = []
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


class _Warp(LogitsProcessor):
    """The last logits processor of `generate`: temperature and top-p by `decode.scores` (the rule of transformers'
    own warpers, which are then left neutral), and the log-probability of each chosen token under the result.

    Call t sees the tokens chosen at calls < t, so it records the log-probability of the token chosen at call t - 1
    (row-wise, from the previous call's scores); `finish` adds the last one. Rows that ended keep receiving pad
    tokens: their extra entries are cut with the completion (`_assemble`)."""

    def __init__(self, temperature: float, top_p: float):
        self.temperature, self.top_p = temperature, top_p
        self.previous: torch.Tensor | None = None  # (rows, V) log-softmax of the last call's scores
        self.logps: list[torch.Tensor] = []  # (rows,) per generated token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.finish(input_ids)
        processed = decode.scores(scores, self.temperature, self.top_p)
        self.previous = processed.log_softmax(-1)
        return processed

    def finish(self, input_ids: torch.Tensor) -> None:
        """Record the log-probability of the newest token of `input_ids` (rows, L) under the last call's scores."""
        if self.previous is not None:
            self.logps.append(self.previous.gather(1, input_ids[:, -1:])[:, 0])
            self.previous = None

    def rows(self) -> list[list[float]]:
        return torch.stack(self.logps, 1).tolist() if self.logps else []


def _sampling_kwargs(model: Any, cfg: GenerationConfig) -> dict[str, Any]:
    """Keyword arguments for `generate` that sample exactly softmax(logits / T) restricted to top-p (the warping is
    `_Warp`'s, a logits processor passed beside these: transformers' warpers stay neutral).

    The model's generation_config fills every field we leave unset (transformers' own default is top_k=50),
    so the fields that would distort the policy distribution are set to their neutral values explicitly.
    """
    if cfg.temperature == 0:
        return {"do_sample": False}
    kwargs: dict[str, Any] = {
        "do_sample": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "typical_p": 1.0,
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
        "epsilon_cutoff": 0.0,
        "eta_cutoff": 0.0,
    }
    if getattr(model.generation_config, "min_p", None) is not None:
        kwargs["min_p"] = 0.0
    return kwargs


def cut_completion(row: list[int], eos_ids: set[int], tokenizer: Any, stops: list[str]) -> tuple[list[int], str]:
    """Trim one generated row (no prompt) to its completion and say why it ended.

    After a sequence finishes `generate` fills it with pad ids (which may equal eos), so everything after the
    first eos or the stop-string match is padding. The stop cut is the shortest prefix whose decoding contains
    a stop string; containment only grows with the prefix, hence the binary search.
    """
    first_eos = next((t for t, tok in enumerate(row) if tok in eos_ids), None)
    body = row if first_eos is None else row[:first_eos]
    if stops and any(s in tokenizer.decode(body, skip_special_tokens=True) for s in stops):
        lo, hi = 1, len(body)
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in tokenizer.decode(body[:mid], skip_special_tokens=True) for s in stops):
                hi = mid
            else:
                lo = mid + 1
        return body[:lo], "stop"
    if first_eos is not None:
        return row[: first_eos + 1], "eos"
    return row, "length"


def _left_pad(batch: list[list[int]], pad_id: int, device: Any, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) input ids left-padded with `pad_id` and the matching attention mask; L is rounded up to a
    multiple of `multiple`."""
    width = max(len(p) for p in batch)
    width += -width % multiple
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        if p:
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Run the block with a seeded RNG and restore the caller's RNG state afterwards (no-op for seed=None)."""
    if seed is None:
        yield
        return
    accel = device.type if device.type not in ("cpu", "meta") else None
    devices = [device.index or 0] if accel else []
    with torch.random.fork_rng(devices=devices, device_type=accel or "cuda"):
        torch.manual_seed(seed)  # seeds the CPU and every accelerator generator (restored on exit for ours)
        yield


def unwrap(model: Any, accelerator: Any = None) -> Any:
    """The module whose parameters are trained: accelerate/DDP wrappers share their parameters with it."""
    if accelerator is not None:
        return accelerator.unwrap_model(model)
    return getattr(model, "module", model)


@dataclass
class HFGenerateBackend:
    """`RolloutBackend` on `transformers` `model.generate`: batched, left-padded, KV cache, n samples per prompt.

    Reproducibility: with `cfg.seed` set, the same model, prompts and batch_size give the same samples (the
    seed is set once per call, so batch composition matters). Under DDP pass a per-rank seed if ranks must
    not draw identical noise. FSDP2: see the module docstring (gather the whole model around the call).
    """

    accelerator: Any = None
    progress: Any = None  # called with each batch's number of prompts once it is sampled (`humanline eval`'s bar)

    def generate(
        self, model: Any, tokenizer: Any, prompt_token_ids: list[list[int]], cfg: GenerationConfig
    ) -> Rollout:
        model = unwrap(model, self.accelerator)
        start = time.perf_counter()
        eos_ids = eos_ids_of(model, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        device = next(model.parameters()).device
        rows: list[list[int]] = []
        logps: list[list[float]] = []  # per row, the log-probability of each generated token
        fast = cfg.decoder == "auto"  # humanline.sampling.decode for each batch it applies to
        with eval_mode(model), torch.no_grad(), _seeded(cfg.seed, device):
            for b in range(0, len(prompt_token_ids), cfg.batch_size):
                batch = prompt_token_ids[b : b + cfg.batch_size]
                input_ids, attention_mask = _left_pad(batch, pad_id, device,
                                                      1 if device.type == "cpu" else PAD_MULTIPLE)
                why = decode.unsupported(model, input_ids.shape[1] + cfg.max_new_tokens) if fast else "off"
                if why is None:
                    rows.extend(self._fast(model, tokenizer, batch, cfg, eos_ids, pad_id, logps))
                    self.progress and self.progress(len(batch))
                    continue
                if fast:
                    log.debug("rollout: model.generate instead of humanline.sampling.decode: %s", why)
                stop_text = [_StopOnText(tokenizer, cfg.stop, input_ids.shape[1])] if cfg.stop else []
                warp = _Warp(float(cfg.temperature), float(cfg.top_p)) if cfg.temperature else None
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=cfg.max_new_tokens,
                    num_return_sequences=cfg.n,
                    eos_token_id=eos_ids,
                    pad_token_id=pad_id,
                    use_cache=True,
                    cache_implementation=cfg.cache,
                    stopping_criteria=StoppingCriteriaList(stop_text),
                    logits_processor=LogitsProcessorList([warp] if warp else []),
                    **_sampling_kwargs(model, cfg),
                )
                generated = out[:, input_ids.shape[1] :]
                rows.extend(generated.tolist())
                if warp is not None:
                    warp.finish(out)
                logps.extend(warp.rows() if warp else [[0.0] * generated.shape[1]] * generated.shape[0])
                self.progress and self.progress(len(batch))
        return _assemble(prompt_token_ids, rows, cfg, tokenizer, set(eos_ids), time.perf_counter() - start, logps)


    @staticmethod
    def _fast(model, tokenizer, batch, cfg, eos_ids, pad_id, logps: list) -> list[list[int]]:
        """The generated rows of one batch from `sampling.decode` (same row order and stop rule as `generate`);
        their tokens' log-probabilities are appended to `logps`."""
        stopped = None
        if cfg.stop:
            window = _stop_window(cfg.stop)
            stopped = lambda rows: _tails_contain(tokenizer, cfg.stop, [r[-window:] for r in rows])  # noqa: E731
        return decode.decode(model, batch, n=cfg.n, max_new_tokens=cfg.max_new_tokens,
                             temperature=float(cfg.temperature), top_p=float(cfg.top_p), eos_ids=eos_ids,
                             pad_id=pad_id, stopped=stopped, logps=logps)


def _assemble(prompts, rows, cfg, tokenizer, eos_ids, seconds, logps: list[list[float]]) -> Rollout:
    """Group the flat generated rows (prompt-major, n per prompt) and their tokens' log-probabilities into a
    `Rollout`; each completion keeps the log-probabilities of the tokens it kept (`cut_completion`)."""
    completion_ids, texts, reasons, logprobs = [], [], [], []
    for i in range(len(prompts)):
        cut = [cut_completion(rows[i * cfg.n + j], eos_ids, tokenizer, cfg.stop) for j in range(cfg.n)]
        completion_ids.append([ids for ids, _ in cut])
        reasons.append([why for _, why in cut])
        logprobs.append([list(logps[i * cfg.n + j][:len(ids)]) for j, (ids, _) in enumerate(cut)])
        texts.append(tokenizer.batch_decode([ids for ids, _ in cut], skip_special_tokens=True))
    total = sum(len(c) for group in completion_ids for c in group)
    return Rollout([list(p) for p in prompts], completion_ids, texts, total, seconds, reasons, logprobs)


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    cfg: GenerationConfig,
    backend: RolloutBackend | None = None,
) -> Rollout:
    """Encode `prompts` (strings or chat-message lists) and sample `cfg.n` completions for each."""
    token_ids = [encode_prompt(tokenizer, p) for p in prompts]
    return (backend or HFGenerateBackend()).generate(model, tokenizer, token_ids, cfg)
