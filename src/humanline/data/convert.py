"""Conversions between feedback formats (docs/method.md §5), and writing records in the canonical JSONL format.

    groups -> pairs      best vs worst of each group (or all pairs), kept when the score gap exceeds a threshold
    groups -> unpaired   desirable above the group mean, or at/above a fixed threshold, or best and worst only
    pairs  -> unpaired   chosen desirable, rejected undesirable
    pairs  -> groups     a group of two scored 1 and 0

The KTO mismatched pairs for the KL reference point are built per micro-batch by `collate_kto`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Callable

from humanline.data.records import GroupRecord, PairRecord, UnpairedRecord, kind_of
from humanline.errors import UserError

PAIR_MODES = ("best_worst", "all_pairs")
UNPAIRED_RULES = ("mean", "threshold", "best_worst")


def pair_choices(scores: list[float], same: Callable[[int, int], bool], *, threshold: float = 0.01,
                 mode: str = "best_worst") -> tuple[list[tuple[int, int]], int]:
    """Which completions of one scored group become preference pairs: `[(chosen, rejected)]` indices.

    `best_worst`: the highest against the lowest score (first on ties), kept when `best - worst > threshold`
    (HALOs' online DPO rule). `all_pairs`: every two completions whose scores differ by more than
    `threshold`, the higher one chosen. `same(i, j)`: completions i and j are identical (never paired).
    Returns `(pairs, dropped)`, dropped counting candidate pairs not kept (one per group for best_worst).
    The one rule for offline conversions and online unit building.
    """
    if mode not in PAIR_MODES:
        raise UserError(f"pair mode {mode!r}: expected one of {', '.join(PAIR_MODES)}")
    if mode == "best_worst":
        order = range(len(scores))
        candidates = [(max(order, key=scores.__getitem__), min(order, key=scores.__getitem__))]
    else:
        candidates = [(i, j) if scores[i] >= scores[j] else (j, i) for i, j in combinations(range(len(scores)), 2)]
    kept = [(w, l) for w, l in candidates if scores[w] - scores[l] > threshold and not same(w, l)]
    return kept, len(candidates) - len(kept)


def unpaired_labels(scores: list[float], *, rule: str = "mean", threshold: float | None = None
                    ) -> list[tuple[int, bool]]:
    """Which completions of one scored group become KTO examples: `[(index, desirable)]`.

    `mean`: desirable when the score is above the group's mean, undesirable below it; completions scoring
    exactly the mean carry no signal and are left out (so is every completion of a group whose scores are all
    equal: labelling an all-correct group undesirable would be wrong). `threshold`: desirable when
    `score >= threshold`, undesirable otherwise; nothing is left out. `best_worst`: the highest score desirable
    and the lowest undesirable (first on ties), the rest left out, nothing when all scores are equal: a DPO
    pair split in two, balanced whatever the share of good completions (the paper's KTO data are its DPO pairs
    split this way). The one rule for offline conversions and online unit building.
    """
    if rule not in UNPAIRED_RULES:
        raise UserError(f"unpaired rule {rule!r}: expected one of {', '.join(UNPAIRED_RULES)}")
    if rule == "threshold":
        if threshold is None or not math.isfinite(threshold):
            raise UserError(f"unpaired rule 'threshold' needs a finite threshold, got {threshold}")
        return [(i, s >= threshold) for i, s in enumerate(scores)]
    if rule == "best_worst":
        best, worst = scores.index(max(scores)), scores.index(min(scores))
        return [] if math.isclose(scores[best], scores[worst], rel_tol=1e-9, abs_tol=1e-12) else [(best, True),
                                                                                                   (worst, False)]
    mean = sum(scores) / len(scores)
    return [(i, s > mean) for i, s in enumerate(scores) if not math.isclose(s, mean, rel_tol=1e-9, abs_tol=1e-12)]


def groups_to_pairs(
    groups: list[GroupRecord], *, threshold: float = 0.01, mode: str = "best_worst"
) -> tuple[list[PairRecord], int]:
    """Preference pairs from scored groups (`pair_choices`). Returns `(pairs, dropped)`: dropped counts
    groups (best_worst) or candidate pairs (all_pairs) not kept."""
    pairs, dropped = [], 0
    for group in groups:
        c = group.completions
        kept, lost = pair_choices(group.scores, lambda i, j: c[i] == c[j], threshold=threshold, mode=mode)
        pairs += [PairRecord(group.prompt, c[w], c[l], group.prompt_id, source=group.source) for w, l in kept]
        dropped += lost
    return pairs, dropped


def groups_to_unpaired(
    groups: list[GroupRecord], *, rule: str = "mean", threshold: float | None = None
) -> list[UnpairedRecord]:
    """Unpaired feedback from scored groups (`unpaired_labels`). The number of completions left out is
    `sum(len(g.completions) for g in groups) - len(result)`."""
    return [UnpairedRecord(group.prompt, group.completions[i], desirable, group.prompt_id, source=group.source)
            for group in groups
            for i, desirable in unpaired_labels(group.scores, rule=rule, threshold=threshold)]


def pairs_to_unpaired(pairs: list[PairRecord]) -> list[UnpairedRecord]:
    """Two unpaired records per pair (chosen desirable, rejected undesirable); exact repeats appear once."""
    out, seen = [], set()
    for pair in pairs:
        for completion, desirable in ((pair.chosen, True), (pair.rejected, False)):
            key = (pair.prompt_id, json.dumps(completion, sort_keys=True), desirable)
            if key not in seen:
                seen.add(key)
                out.append(UnpairedRecord(pair.prompt, completion, desirable, pair.prompt_id, source=pair.source))
    return out


def pairs_to_groups(pairs: list[PairRecord]) -> list[GroupRecord]:
    """A group of two per pair, chosen scored 1.0 and rejected 0.0 (GRPO on preference pairs)."""
    return [GroupRecord(p.prompt, [p.chosen, p.rejected], [1.0, 0.0], p.prompt_id, source=p.source) for p in pairs]


# ------------------------------------------------------------------ the one conversion table


@dataclass(frozen=True)
class ConvertOptions:
    """How scored groups are cut: the `DataConfig` fields of the same names (a `DataConfig` serves as is)."""

    pair_threshold: float = 0.01  # groups -> pairwise: minimum score gap
    pair_mode: str = "best_worst"  # PAIR_MODES
    unpaired_rule: str = "mean"  # UNPAIRED_RULES
    unpaired_threshold: float | None = None  # unpaired_rule=threshold: desirable when score >= this


def _groups_to_pairwise(records: list, o: ConvertOptions) -> tuple[list, str]:
    pairs, dropped = groups_to_pairs(records, threshold=o.pair_threshold, mode=o.pair_mode)
    unit = "groups" if o.pair_mode == "best_worst" else "candidate pairs"
    return pairs, f"dropped {dropped} {unit} with a score gap <= {o.pair_threshold}"


def _groups_to_unpaired(records: list, o: ConvertOptions) -> tuple[list, str]:
    unpaired = groups_to_unpaired(records, rule=o.unpaired_rule, threshold=o.unpaired_threshold)
    dropped = sum(len(g.completions) for g in records) - len(unpaired)
    mean = f"; dropped {dropped} completions scoring exactly their group mean" if o.unpaired_rule == "mean" else ""
    return unpaired, f"rule {o.unpaired_rule}{mean}"


# (source format, target format) -> f(records, options) -> (records, note for the log)
CONVERSIONS: dict[tuple[str, str], Callable[[list, ConvertOptions], tuple[list, str]]] = {
    ("groups", "pairwise"): _groups_to_pairwise,
    ("groups", "unpaired"): _groups_to_unpaired,
    ("pairwise", "unpaired"): lambda records, o: (pairs_to_unpaired(records), ""),
    ("pairwise", "groups"): lambda records, o: (pairs_to_groups(records), "chosen scored 1, rejected 0"),
}


def convert_records(records: list, source: str, target: str, options: ConvertOptions) -> tuple[list, str]:
    """`records` of format `source` as format `target` (`CONVERSIONS`), and a note on what was dropped ("" for
    none). A pair of formats with no conversion raises `UserError` listing the supported ones."""
    if source == target:
        return records, ""
    if (source, target) not in CONVERSIONS:
        supported = ", ".join(f"{a}->{b}" for a, b in CONVERSIONS)
        raise UserError(f"cannot convert {source} records to {target} (supported: {supported})")
    return CONVERSIONS[source, target](records, options)


def sources_of(target: str) -> list[str]:
    """The formats that convert to `target`."""
    return [a for a, b in CONVERSIONS if b == target]


def to_row(record) -> dict:
    """The canonical JSON object of a record (what `load_records` reads back into an equal record)."""
    kind = kind_of(record)
    row = {"prompt_id": record.prompt_id, "prompt": record.prompt}
    if kind == "pairwise":
        row.update(chosen=record.chosen, rejected=record.rejected)
    elif kind == "unpaired":
        row.update(completion=record.completion, label=record.desirable)
    elif kind == "groups":
        row.update(completions=record.completions, scores=record.scores)
    else:
        if record.answer is not None:
            row["answer"] = record.answer
        if record.metadata:
            row["metadata"] = record.metadata
    return row


def write_records(records: list, path: str | Path) -> int:
    """Write records of one format to a JSONL file (parent folders are created); returns the count."""
    path = Path(path)
    if path.suffix.lower() != ".jsonl":
        raise UserError(f"{path}: records are written as JSON Lines; name the output *.jsonl")
    kinds = {kind_of(r) for r in records}
    if len(kinds) > 1:
        raise UserError(f"{path}: cannot write a mix of formats ({', '.join(sorted(kinds))}) to one file")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(to_row(record), ensure_ascii=False, allow_nan=False, default=str) + "\n")
    return len(records)
