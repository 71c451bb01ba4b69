"""What `humanline data check` reports about valid records: lengths, labels, and token-limit truncation.

Plain functions over records (and a tokenizer object, for token counts); printing is the command's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from humanline.data.records import Problem, prompt_text
from humanline.data.tokenization import encode_completion, encode_prompt, fit_lengths, no_room_problem


def completions_by_name(kind: str, record) -> dict[str, list]:
    """A record's completions by the name they are reported under (chosen / rejected / completion)."""
    if kind == "pairwise":
        return {"chosen": [record.chosen], "rejected": [record.rejected]}
    if kind == "unpaired":
        return {"completion": [record.completion]}
    if kind == "groups":
        return {"completion": list(record.completions)}
    return {}


def char_lengths(kind: str, records: list) -> dict[str, list[int]]:
    """Characters of every prompt and completion (message contents joined), by name."""
    lengths: dict[str, list[int]] = {"prompt": [len(prompt_text(r.prompt)) for r in records]}
    for record in records:
        for name, items in completions_by_name(kind, record).items():
            lengths.setdefault(name, []).extend(len(prompt_text(c)) for c in items)
    return lengths


def label_summary(kind: str, records: list) -> str:
    """One line on the labels: desirable counts, group sizes and scores, answers, or distinct prompts."""
    if kind == "unpaired":
        good = sum(r.desirable for r in records)
        return f"labels: {good} desirable, {len(records) - good} undesirable"
    if kind == "groups":
        sizes = [len(r.completions) for r in records]
        scores = [s for r in records for s in r.scores]
        return f"groups: {len(records)}, sizes {min(sizes)}..{max(sizes)}, scores {min(scores):.4g}..{max(scores):.4g}"
    if kind == "prompts":
        return f"prompts with a reference answer: {sum(r.answer is not None for r in records)}"
    return f"distinct prompts: {len({r.prompt_id for r in records})}"


@dataclass
class TokenCounts:
    """Token lengths by name; with limits, how many records are truncated and which leave no room at all."""

    lengths: dict[str, list[int]] = field(default_factory=lambda: {"prompt": []})
    truncated: int = 0
    problems: list[Problem] = field(default_factory=list)


def token_counts(kind: str, records: list, tokenizer, *, max_prompt_length: int | None = None,
                 max_length: int | None = None) -> TokenCounts:
    """Tokens of every prompt and completion as training encodes them, and truncation under the limits."""
    counts = TokenCounts()
    limited = max_length is not None or max_prompt_length is not None
    for record in records:
        prompt_ids = encode_prompt(tokenizer, record.prompt)
        counts.lengths["prompt"].append(len(prompt_ids))
        all_ids = []
        for name, items in completions_by_name(kind, record).items():
            ids = [encode_completion(tokenizer, record.prompt, c, prompt_ids=prompt_ids) for c in items]
            counts.lengths.setdefault(name, []).extend(len(i) for i in ids)
            all_ids += ids
        if limited and all_ids:
            fitted = fit_lengths(prompt_ids, all_ids, max_prompt_length=max_prompt_length, max_length=max_length)
            if fitted is None:
                counts.problems.append(no_room_problem(record, len(prompt_ids), max_prompt_length, max_length))
            else:
                counts.truncated += fitted[2]
    return counts
