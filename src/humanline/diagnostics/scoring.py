"""Sequence log-probabilities of (prompt, completion) token sequences under a model, for the diagnostics.

    model, tokenizer = load_scoring_model("runs/dpo")              # or "tiny", a folder, FOLDER/FILE.gguf
    scores = score_sequences(model, prompt_ids, completion_ids, pad_id=tokenizer.pad_token_id)
    scores.mean_logps                                              # (N,) average token log-prob

Batches are formed from length-sorted sequences (little padding) and scored without gradient through
`humanline.model.forward.part_logps`, the one place that shifts labels.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from humanline.data.collate import pad_sequences
from humanline.errors import UserError
from humanline.model.forward import completion_mask, part_logps
from humanline.model.loading import load_model, load_tokenizer, model_config_for


@dataclass
class SequenceScores:
    """Per-sequence sums of completion-token log-probs `(N,)` float64 and token counts `(N,)` long."""

    sum_logps: torch.Tensor
    num_tokens: torch.Tensor

    @property
    def mean_logps(self) -> torch.Tensor:
        """`(N,)` average token log-prob; NaN for an empty completion (nothing to average)."""
        counts = self.num_tokens.double()
        return torch.where(counts > 0, self.sum_logps / counts.clamp(min=1), torch.full_like(counts, float("nan")))


def load_scoring_model(spec: str, gguf_file: str | None = None, device: str | None = None) -> tuple[Any, Any]:
    """`(model, tokenizer)` for `spec` (`humanline.model.loading.model_config_for`), in eval mode, on `device`
    (default: CUDA if any)."""
    cfg = model_config_for(spec, gguf_file)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer)
    model.eval()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device), tokenizer


def check_same_vocabulary(reference: Any, other: Any, names: tuple[str, str]) -> None:
    """Raise `UserError` unless two tokenizers map the same strings to the same ids (ratios need one vocabulary)."""
    if len(reference) != len(other) or reference.get_vocab() != other.get_vocab():
        raise UserError(f"models '{names[0]}' and '{names[1]}' have different vocabularies ({len(reference)} vs "
                        f"{len(other)} tokens): log-ratios need one tokenizer; use models of one family")


def cut_after_eos(ids: list[int], eos_ids: set[int]) -> list[int]:
    """Keep `ids` up to and including the first end token: what a sampler would have produced.

    Chat templates add tokens after the end-of-turn token (ChatML adds a newline) that generation never
    samples; dropping them puts dataset completions and sampled completions on the same footing.
    """
    for t, token in enumerate(ids):
        if token in eos_ids:
            return ids[: t + 1]
    return ids


def eos_ids_of(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a completion: the model's generation-config eos (may be a list) and the tokenizer's."""
    ids: set[int] = set()
    for value in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        for i in value if isinstance(value, (list, tuple)) else [value]:
            if i is not None:
                ids.add(int(i))
    return ids


@torch.no_grad()
def score_sequences(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    *,
    pad_id: int,
    batch_size: int = 16,
    desc: str | None = None,
    progress: bool = True,
) -> SequenceScores:
    """Sum and count of `log pi(y_t | x, y_<t)` over each completion's tokens, in input order.

    Args:
        prompts, completions: N token-id lists each (a completion may be empty: sum 0, count 0).
        batch_size: sequences per forward pass; sequences are sorted by length, longest first, so padding
            is small and an out-of-memory error shows up on the first batch.
        desc: progress-bar label (tqdm, on stderr, a terminal only: a log file gets no bar); `progress=False`
            hides it.
    """
    from tqdm.auto import tqdm


    if len(prompts) != len(completions):
        raise ValueError(f"score_sequences: {len(prompts)} prompts but {len(completions)} completions")
    if batch_size < 1:
        raise UserError(f"--batch-size: expected an integer >= 1, got {batch_size}")
    n = len(prompts)
    sums = torch.zeros(n, dtype=torch.float64)
    counts = torch.tensor([len(c) for c in completions], dtype=torch.long)
    order = sorted((i for i in range(n) if completions[i]), key=lambda i: -(len(prompts[i]) + len(completions[i])))
    device = next(model.parameters()).device
    starts = range(0, len(order), batch_size)
    bar = progress and bool(order) and sys.stderr.isatty()
    for start in tqdm(starts, desc=desc, disable=not bar, file=sys.stderr, unit="batch"):
        rows = order[start : start + batch_size]
        batch = pad_sequences([prompts[i] for i in rows], [completions[i] for i in rows], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        logps = part_logps(model, batch).double()
        mask = completion_mask(batch)
        sums[rows] = (logps * mask).sum(dim=1).cpu()
    return SequenceScores(sums, counts)
