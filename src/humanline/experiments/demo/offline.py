"""Offline data for the demo: completions sampled from a *different* policy than the one being aligned
(the weak checkpoint, or another temperature), scored with the task's reward and stored as scored groups
`{"prompt": [...], "completions": [...], "scores": [...], "id": ...}` in JSONL. The data layer turns groups
into DPO pairs or KTO unpaired examples.

Also the held-out evaluation used by the demo: mean reward of samples at temperature 1.

Every sample of the demo (offline data, online buffers, evaluation) is drawn by transformers' `generate`
(`DECODER`): the demo tables (README.md, docs/results.md) were measured so, and `humanline.sampling.decode`, the fast
loop that runs use by default, samples the same distribution with other random draws, which would move every
number by a seed's worth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from humanline.experiments.demo.tasks import DemoTask, Record
from humanline.files import write_jsonl
from humanline.sampling.rollout import GenerationConfig, generate

DECODER = "generate"  # GenerationConfig.decoder of every demo sample (module docstring)


@dataclass(frozen=True)
class Samples:
    """`texts[i * n + j]` is the j-th completion of prompt i (decoded, special tokens removed)."""

    texts: list[str]
    n: int


def sample(
    model, tokenizer, prompts: list[list[dict]], *, n: int = 1, temperature: float = 1.0, max_new_tokens: int = 8,
    seed: int = 0, batch_size: int = 256,
) -> Samples:
    """Sample `n` completions per chat prompt by ancestral sampling at `temperature` (no top-k / top-p), through
    `humanline.sampling.rollout.generate` with the demo's `DECODER`.

    Seeded without touching the caller's global torch RNG: the same seed gives the same samples for the same model.
    """
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature, n=n, seed=seed,
                              batch_size=max(1, batch_size // n), decoder=DECODER)
    rollout = generate(model, tokenizer, prompts, config)
    return Samples([text for row in rollout.texts for text in row], n)


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
    return write_jsonl(path, groups)
