"""`inspect data`: how likely is an offline dataset under the reference model?

The paper reports that the average token log-probability of the offline data under the reference is a good
proxy for data quality (data in the bottom quartile trains clearly worse). This module scores every
completion of a dataset and summarises the scores; it knows nothing about the command line.

Units: a *completion* is scored by its average token log-prob (completion tokens as training sees them,
end-of-turn tokens of the chat template included). A *record* (a pair, an unpaired example, a group) is
scored by the mean of its completions' scores; quartiles, ranking and the filter are per record, because a
record is what training consumes and what the filter keeps or drops (filtering one side of a pair would
destroy the pair). Per-completion statistics are reported beside them, split by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from humanline.data.records import kind_of, prompt_text
from humanline.errors import UserError


@dataclass(frozen=True)
class Item:
    """One completion to score: `record` indexes the dataset, `side` says which completion of it this is."""

    record: int
    side: str
    prompt: Any
    completion: Any


def completion_items(records: list) -> list[Item]:
    """Every completion of `records` with its side.

    Sides: pairwise "chosen" / "rejected"; unpaired "desirable" / "undesirable"; groups "above_mean" /
    "below_mean" / "at_mean" by the completion's score relative to its group's mean (the rule that
    `groups_to_unpaired` uses to label KTO data).
    """
    items: list[Item] = []
    for index, record in enumerate(records):
        kind = kind_of(record)
        if kind == "pairwise":
            items += [Item(index, "chosen", record.prompt, record.chosen),
                      Item(index, "rejected", record.prompt, record.rejected)]
        elif kind == "unpaired":
            side = "desirable" if record.desirable else "undesirable"
            items.append(Item(index, side, record.prompt, record.completion))
        elif kind == "groups":
            mean = sum(record.scores) / len(record.scores)
            for completion, score in zip(record.completions, record.scores):
                side = ("at_mean" if math.isclose(score, mean, rel_tol=1e-9, abs_tol=1e-12)
                        else "above_mean" if score > mean else "below_mean")
                items.append(Item(index, side, record.prompt, completion))
        else:
            where = f"{record.source}: " if record.source else ""
            raise UserError(f"{where}a prompts-only dataset has no completions to score; expected pairwise, "
                            f"unpaired or groups records")
    return items


def quartile_summary(values: np.ndarray) -> dict[str, float]:
    """Count, mean, min, max and the quartile thresholds q25 / q50 / q75 of the finite `values`.

    Quantiles use linear interpolation between order statistics (numpy's default): for [1, 2, 3, 4, 5],
    q25 = 2, q50 = 3, q75 = 4.
    """
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"count": 0}
    q25, q50, q75 = np.quantile(finite, [0.25, 0.5, 0.75])
    return {"count": int(finite.size), "mean": float(finite.mean()), "min": float(finite.min()),
            "q25": float(q25), "q50": float(q50), "q75": float(q75), "max": float(finite.max())}


def quartile_of(value: float, summary: dict[str, float]) -> int | None:
    """1 (bottom) .. 4 (top): the first quartile whose upper threshold is >= `value`; None for NaN."""
    if not math.isfinite(value):
        return None
    for number, key in ((1, "q25"), (2, "q50"), (3, "q75")):
        if value <= summary[key]:
            return number
    return 4


def bottom_share(values: np.ndarray, threshold: float) -> float:
    """Share of the finite `values` at or below `threshold` (the bottom quartile when it is q25).

    Ties at the threshold count as inside, so the share can exceed 25%: [1, 1, 1, 1, 5] has q25 = 1 and a
    bottom-quartile share of 4 / 5 = 0.8.
    """
    finite = values[np.isfinite(values)]
    return float((finite <= threshold).mean()) if finite.size else float("nan")


def record_scores(num_records: int, items: list[Item], item_scores: np.ndarray) -> np.ndarray:
    """`(num_records,)` mean of each record's finite completion scores (NaN for a record with none)."""
    totals = np.zeros(num_records)
    counts = np.zeros(num_records)
    for item, score in zip(items, item_scores):
        if math.isfinite(score):
            totals[item.record] += score
            counts[item.record] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, totals / np.maximum(counts, 1), np.nan)


def filter_records(records: list, scores: np.ndarray, quantile: float) -> tuple[list, float]:
    """Records whose score is at or above the `quantile` of the finite scores, in their original order.

    Returns `(kept, threshold)`. Records without a finite score are dropped. Example: scores [5, 1, 4, 2, 3]
    and quantile 0.5 give the threshold 3 and keep the records scored 5, 4 and 3.
    """
    if not 0.0 < quantile < 1.0:
        raise UserError(f"--filter-below: expected a quantile strictly between 0 and 1 (0.25 drops the bottom "
                        f"quartile), got {quantile}")
    finite = scores[np.isfinite(scores)]
    if finite.size == 0:
        raise UserError("--filter-below: no record has a score (every completion is empty)")
    threshold = float(np.quantile(finite, quantile))
    kept = [r for r, s in zip(records, scores) if math.isfinite(s) and s >= threshold]
    return kept, threshold


def side_summary(items: list[Item], item_scores: np.ndarray, threshold: float) -> dict[str, dict]:
    """Per side: count, mean score and the share at or below `threshold` (the completion-level q25)."""
    out: dict[str, dict] = {}
    for side in dict.fromkeys(item.side for item in items):
        values = np.array([s for item, s in zip(items, item_scores) if item.side == side])
        finite = values[np.isfinite(values)]
        out[side] = {"count": int(values.size), "mean": float(finite.mean()) if finite.size else None,
                     "bottom_quartile_share": bottom_share(values, threshold)}
    return out


def ranked_records(records: list, items: list[Item], item_scores: np.ndarray, item_tokens: np.ndarray,
                   scores: np.ndarray, summary: dict[str, float], preview: int = 80) -> list[dict]:
    """One JSON-ready entry per record, lowest score first (records without a score last)."""
    per_record: list[list[dict]] = [[] for _ in records]
    for item, score, tokens in zip(items, item_scores, item_tokens):
        per_record[item.record].append({"side": item.side, "mean_logp": _num(score), "tokens": int(tokens)})
    order = sorted(range(len(records)), key=lambda i: (not math.isfinite(scores[i]), scores[i]))
    out = []
    for rank, index in enumerate(order, start=1):
        record = records[index]
        out.append({"rank": rank, "index": index, "prompt_id": record.prompt_id,
                    "source": str(record.source) if record.source else None, "score": _num(scores[index]),
                    "quartile": quartile_of(float(scores[index]), summary) if summary.get("count") else None,
                    "prompt": prompt_text(record.prompt)[:preview], "completions": per_record[index]})
    return out


def _num(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
