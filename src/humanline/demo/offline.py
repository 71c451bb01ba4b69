"""Offline data for the demo: completions sampled from a *different* policy than the one being aligned
(the weak checkpoint, or another temperature), scored with the task's reward and stored as scored groups
`{"prompt": [...], "completions": [...], "scores": [...], "id": ...}` in JSONL. The data layer turns groups
into DPO pairs or KTO unpaired examples.

Also the held-out evaluation used by the demo: mean reward of samples at temperature 1.

Sampling uses `humanline.rollout.generate` when that module is available and falls back to a minimal
left-padded `model.generate` otherwise (same inputs, same outputs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from humanline.demo.tasks import DemoTask, Record, write_jsonl


@dataclass(frozen=True)
class Samples:
    """`texts[i * n + j]` is the j-th completion of prompt i (decoded, special tokens removed)."""

    texts: list[str]
    n: int


def _prompt_ids(tokenizer, prompt: list[dict]) -> list[int]:
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"])


@torch.no_grad()
def sample(
    model, tokenizer, prompts: list[list[dict]], *, n: int = 1, temperature: float = 1.0, max_new_tokens: int = 8,
    seed: int = 0, batch_size: int = 256,
) -> Samples:
    """Sample `n` completions per chat prompt by ancestral sampling at `temperature` (no top-k / top-p).

    Seeded through a forked RNG, so the caller's global torch RNG state is unchanged and the same seed
    gives the same samples for the same model.
    """
    texts = _rollout_texts(model, tokenizer, prompts, n, temperature, max_new_tokens, seed, batch_size)
    if texts is not None:
        return Samples(texts, n)
    texts = []
    expanded = [p for p in prompts for _ in range(n)]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(expanded), batch_size):
            batch = expanded[start : start + batch_size]
            texts += _generate_batch(model, tokenizer, batch, temperature, max_new_tokens)
    return Samples(texts, n)


def _rollout_texts(model, tokenizer, prompts, n, temperature, max_new_tokens, seed, batch_size) -> list[str] | None:
    """Completions from the shared `humanline.rollout.generate`, flattened prompt-major; None if unavailable."""
    try:
        from humanline.rollout import GenerationConfig, generate

        config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, n=n, seed=seed,
                                  batch_size=max(1, batch_size // n))
        rollout = generate(model, tokenizer, prompts, config)
    except ImportError:  # the rollout module (or one it imports) is not there: use the local sampler
        return None
    return [text for row in rollout.texts for text in row]


def _generate_batch(model, tokenizer, prompts, temperature: float, max_new_tokens: int) -> list[str]:
    encoded = [_prompt_ids(tokenizer, p) for p in prompts]
    width = max(len(ids) for ids in encoded)
    pad = tokenizer.pad_token_id
    # Left padding so every prompt ends at the same position and generation continues from there.
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
        max_new_tokens=max_new_tokens, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
    )
    model.train(was_training)
    return tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)


def score(task: DemoTask, records: list[Record], samples: Samples) -> list[float]:
    """Task reward of every sample; `records[i]` is the prompt record of `samples.texts[i*n:(i+1)*n]`."""
    expanded = [r for r in records for _ in range(samples.n)]
    metadata = {}
    if expanded and "answer" in expanded[0]:
        metadata["answer"] = [r["answer"] for r in expanded]
    return task.reward([r["prompt"] for r in expanded], samples.texts, **metadata)


def mean_sample_reward(model, tokenizer, task: DemoTask, records: list[Record], *, n: int = 4,
                       temperature: float = 1.0, max_new_tokens: int = 8, seed: int = 0) -> float:
    """Mean task reward of `n` samples per held-out record at `temperature` (the demo's metric)."""
    samples = sample(model, tokenizer, [r["prompt"] for r in records], n=n, temperature=temperature,
                     max_new_tokens=max_new_tokens, seed=seed)
    rewards = score(task, records, samples)
    return sum(rewards) / max(1, len(rewards))


def scored_groups(model, tokenizer, task: DemoTask, records: list[Record], *, n: int = 8, temperature: float = 1.0,
                  max_new_tokens: int = 8, seed: int = 0) -> list[Record]:
    """Sample `n` completions per record from `model` and score them: one scored-group record per prompt.

    Completions are plain strings (the assistant's text); `id` and `answer` (if any) are carried over.
    """
    samples = sample(model, tokenizer, [r["prompt"] for r in records], n=n, temperature=temperature,
                     max_new_tokens=max_new_tokens, seed=seed)
    scores = score(task, records, samples)
    groups = []
    for i, record in enumerate(records):
        group = {
            "prompt": record["prompt"],
            "completions": samples.texts[i * n : (i + 1) * n],
            "scores": scores[i * n : (i + 1) * n],
            "id": record["id"],
        }
        if "answer" in record:
            group["answer"] = record["answer"]
        groups.append(group)
    return groups


def write_offline_groups(
    model, tokenizer, task: DemoTask, path: str | os.PathLike, *, n: int = 8, temperature: float = 1.0,
    max_new_tokens: int = 8, seed: int = 0, records: list[Record] | None = None,
) -> Path:
    """Sample scored groups for `records` (default: the task's train prompts) and write them as JSONL."""
    groups = scored_groups(model, tokenizer, task, task.train if records is None else records, n=n,
                           temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    return write_jsonl(groups, path)
