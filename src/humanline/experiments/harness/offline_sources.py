"""Where offline data comes from: the base policy (the paper's main setting) or sources off-policy from the start.

    base       samples of the base policy at the data temperature
    hot        samples of the base policy at HOT_TEMPERATURE (worse text: lower log-prob under the reference)
    prompted   samples of the base policy under another system prompt (TERSE_SYSTEM), kept under the task's prompt
    reference  the task's reference answers written as completions in the prompt's answer format, in short
               human-like sentences: the prompt's own answer and answers of other prompts (mostly wrong)
    mix:base=0.5,reference=0.5   each group's completions drawn from several sources, in these proportions

Every completion is scored by the task's reward with the prompt's metadata, exactly as the sampler scores online
samples (`score_groups`), so the data layer's conversions make DPO pairs, KTO labels and GRPO groups from them
as from any groups file. The paper measures such data by its mean token log-prob under the reference
(`humanline inspect data`); the reproduction records it next to the data.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable, Sequence

from humanline.data import reasoning_gym
from humanline.errors import UserError
from humanline.sampling.rollout import GenerationConfig

SOURCES = ("base", "hot", "prompted", "reference")
HOT_TEMPERATURE = 1.5
TERSE_SYSTEM = "Be terse: reply with the final answer only, in the format the question asks for."
REFERENCE_TEMPLATES = ("{answer}", "The answer is {answer}.", "So the result is {answer}.",
                       "Let me work it out. Final answer: {answer}")


def parse_offline_source(text: str, flag: str = "--offline-source") -> list[tuple[str, float]]:
    """`[(source, share), ...]` with shares summing to 1: "base" -> [("base", 1.0)]; "mix:a=1,b=3" -> 0.25 / 0.75."""
    allowed = f"{' | '.join(SOURCES)} | mix:SOURCE=WEIGHT,..."
    if text in SOURCES:
        return [(text, 1.0)]
    if not isinstance(text, str) or not text.startswith("mix:"):
        raise UserError(f"{flag}: expected {allowed}, got {text!r}")
    weights: dict[str, float] = {}
    for part in text[len("mix:"):].split(","):
        name, eq, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not eq or name not in SOURCES or name in weights or not weight > 0:
            raise UserError(f"{flag}: '{part}' in {text!r}: expected SOURCE=WEIGHT, a source of {', '.join(SOURCES)} "
                            f"(each once) and a weight > 0")
        weights[name] = weight
    total = sum(weights.values())
    return [(name, w / total) for name, w in weights.items()]


def shares(mix: Sequence[tuple[str, float]], n: int) -> dict[str, int]:
    """How many of a group's `n` completions each source gives: floor of share x n, then the remainders largest
    first (ties to the source named first). mix [("base", .5), ("reference", .5)], n 5 -> base 3, reference 2."""
    exact = [(name, share * n) for name, share in mix]
    counts = {name: int(x) for name, x in exact}
    left = n - sum(counts.values())
    for name, _ in sorted(exact, key=lambda item: -(item[1] - int(item[1])))[:left]:
        counts[name] += 1
    return counts


def answer_format(record: dict) -> str:
    """The answer format a prompt asks for: a reasoning-gym prompt's own, else \\boxed{} (the sums task)."""
    info = (record.get("metadata") or {}).get(reasoning_gym.METADATA_KEY) or {}
    return info.get("format", "boxed")


def reference_completions(records: list[dict], n: int, seed: int) -> list[list[str]]:
    """Per record, `n` completions written from reference answers: its own first, then answers of other records
    (another value than its own where the pool has one), each in a template of REFERENCE_TEMPLATES."""
    rng = random.Random(f"reference-{seed}")
    answers = [str(r["answer"]) for r in records if r.get("answer") is not None]
    if len(answers) != len(records):
        raise UserError("offline source 'reference': every prompt needs a reference answer ('answer')")
    out = []
    for record in records:
        own, fmt = str(record["answer"]), answer_format(record)
        others = [a for a in answers if a != own] or [own]
        picked = [own] + [rng.choice(others) for _ in range(n - 1)]
        out.append([rng.choice(REFERENCE_TEMPLATES).format(answer=reasoning_gym.answer_completion(a, fmt))
                    for a in picked])
    return out


def prompted(prompt: Any, system: str = TERSE_SYSTEM) -> list[dict]:
    """`prompt` under another system prompt (a string prompt becomes a user turn after it)."""
    if isinstance(prompt, str):
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    turns = [m for m in prompt if m.get("role") != "system"]
    return [{"role": "system", "content": system}, *turns]


def score_groups(reward_fn: Callable, records: list[dict], completions: list[list[str]]) -> list[list[float]]:
    """Each record's completions scored by `reward_fn` with its `answer` and metadata (as the sampler does)."""
    out = []
    for record, texts in zip(records, completions):
        metadata = {"answer": [record.get("answer")] * len(texts)}
        metadata.update({k: [v] * len(texts) for k, v in (record.get("metadata") or {}).items()})
        out.append([float(s) for s in reward_fn([record["prompt"]] * len(texts), list(texts), **metadata)])
    return out


def offline_groups(model, tokenizer, records: list[dict], source: str, gen: GenerationConfig,
                   reward_fn: Callable, generate: Callable) -> tuple[list[dict], dict]:
    """Groups `{id, prompt, completions, scores, answer}` (and `sources` for a mixture) of `gen.n` completions
    per record from `source` (the grammar above), and `{"tokens", "generation_seconds", "temperatures"}` of the
    sampling (`temperatures`: the temperature each sampled source drew at; the reference samples nothing).
    `generate(model, tokenizer, prompts, gen)` is `humanline.sampling.rollout.generate` (passed in: the caller
    picks the backend)."""
    counts = shares(parse_offline_source(source), gen.n)
    parts: list[list[list[str]]] = []
    names: list[str] = []
    tokens, seconds, temperatures = 0, 0.0, {}
    for name, count in counts.items():
        if count == 0:
            continue
        if name == "reference":
            parts.append(reference_completions(records, count, gen.seed))
        else:
            temperature = HOT_TEMPERATURE if name == "hot" else gen.temperature
            prompts = [prompted(r["prompt"]) if name == "prompted" else r["prompt"] for r in records]
            seed = None if gen.seed is None else gen.seed + 7919 * SOURCES.index(name)  # base: the seed as given
            sub = dataclasses.replace(gen, n=count, temperature=temperature, seed=seed)
            start = time.perf_counter()
            rollout = generate(model, tokenizer, prompts, sub)
            seconds += time.perf_counter() - start
            parts.append([list(texts) for texts in rollout.texts])
            tokens += rollout.num_generated_tokens
            temperatures[name] = temperature
        names.append(name)
    completions = [[c for part in parts for c in part[i]] for i in range(len(records))]
    labels = [name for name, part in zip(names, parts) for _ in part[0]] if records else []
    scores = score_groups(reward_fn, records, completions)
    groups = [{"id": r["id"], "prompt": r["prompt"], "completions": c, "scores": s, "answer": r.get("answer")}
              for r, c, s in zip(records, completions, scores)]
    if len(names) > 1:  # a mixture: which source wrote each completion
        for group in groups:
            group["sources"] = labels
    return groups, {"tokens": tokens, "generation_seconds": seconds, "temperatures": temperatures}
