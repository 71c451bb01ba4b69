"""Load a dataset into typed records with every problem reported by file, line and field.

    result = load_records("prefs.jsonl")              # detects the format; raises on any invalid record
    result = load_records("prefs.jsonl", skip_invalid=True)   # drops them; result.problems says why
    train, held_out = split_records(result.records, 0.1, seed=0)   # by prompt id

Problem policy: `strict` stops at the first problem; the default validates everything and raises one
`UserError` that counts the invalid records and quotes the first few; `skip_invalid` keeps the valid ones.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from humanline.data.records import KINDS, Location, Problem
from humanline.data.sources import RawRow, read_source
from humanline.data.validate import FieldError, build_record, detect_kind
from humanline.errors import UserError

_SPLIT = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[\s*(\d+%?)?\s*:\s*(\d+%?)?\s*\])?$")
_SHOWN_PROBLEMS = 5


@dataclass
class LoadResult:
    """`records` of one format `kind`; `problems` of invalid records; `skipped` = how many were dropped."""

    records: list
    kind: str
    problems: list[Problem] = field(default_factory=list)
    skipped: int = 0


def load_records(
    source: Any,
    *,
    kind: str | None = None,
    split: str = "train",
    shuffle: bool = False,
    seed: int = 0,
    strict: bool = False,
    skip_invalid: bool = False,
    skip_hint: str | None = "skip_invalid=True",
) -> LoadResult:
    """Read `source` (a .jsonl/.json/.parquet/.csv file, a `datasets` folder or a hub name) as records.

    Args:
        kind: "pairwise", "unpaired", "groups", "prompts", or None to detect from the columns.
        split: a split name, optionally sliced: "train", "test", "train[:90%]", "train[100:200]". A single
            file is the split "train"; slices select by file order, before shuffling.
        shuffle, seed: shuffle the records with `random.Random(seed)`.
        strict: raise at the first problem. skip_invalid: drop invalid records instead of raising.
        skip_hint: how the caller's user drops invalid records (a config field, a flag), named in the error;
            None where the caller has no such option.
    """
    rows = read_rows(source, split)
    result = validate_rows(rows, kind=kind, name=str(source), strict=strict, skip_invalid=skip_invalid,
                           skip_hint=skip_hint)
    if shuffle:
        random.Random(seed).shuffle(result.records)
    return result


def read_rows(source: Any, split: str = "train") -> list[RawRow]:
    """The raw rows of `source` for `split` (with its slice applied), not yet validated."""
    name, start, stop = parse_split(split)
    rows = read_source(str(source), name)
    n = len(rows)
    return rows[_bound(start, n, 0) : _bound(stop, n, n)]


def parse_split(split: str) -> tuple[str, str | None, str | None]:
    """`"train[10%:90%]" -> ("train", "10%", "90%")`; bounds are row counts or percentages."""
    match = _SPLIT.match(str(split).strip())
    if not match:
        raise UserError(f"split {split!r}: expected NAME or NAME[START:END] with row counts or percentages, "
                        f"e.g. 'train', 'train[:90%]', 'train[90%:]', 'test[:500]'")
    for bound in match.group(2, 3):
        if bound and bound.endswith("%") and int(bound[:-1]) > 100:
            raise UserError(f"split {split!r}: percentage {bound} is over 100%")
    return match.group(1), match.group(2), match.group(3)


def _bound(spec: str | None, n: int, default: int) -> int:
    if spec is None:
        return default
    # Floor for percentages, so 'train[:90%]' and 'train[90%:]' are exact complements.
    return n * int(spec[:-1]) // 100 if spec.endswith("%") else min(int(spec), n)


def parse_rows(rows: Iterable[Any], *, kind: str | None = None, name: str = "<rows>", strict: bool = False,
               skip_invalid: bool = False) -> LoadResult:
    """Validate in-memory rows (dicts as they would appear in a JSONL file); rows are numbered from 0."""
    raw = [RawRow(Location(name, i, "row"), row) for i, row in enumerate(rows)]
    return validate_rows(raw, kind=kind, name=name, strict=strict, skip_invalid=skip_invalid)


def validate_rows(rows: list[RawRow], *, kind: str | None, name: str, strict: bool = False,
                  skip_invalid: bool = False, allow_empty: bool = False,
                  skip_hint: str | None = "skip_invalid=True") -> LoadResult:
    """Build a record from every row; see the module docstring for the problem policy (`skip_hint`: as for
    `load_records`).

    `allow_empty` returns an empty result instead of raising when no row is valid (for `data check`).
    """
    if not rows:
        if allow_empty:
            return LoadResult([], kind or "unknown")
        raise UserError(f"{name}: no records")
    kind = _resolve_kind(rows, kind)
    records, problems = [], []
    for row in rows:
        record, problem = _build(row, kind)
        if problem is None:
            records.append(record)
        elif strict:
            raise UserError(str(problem))
        else:
            problems.append(problem)
    if problems and not skip_invalid:
        # skipping every record would leave nothing: then the format is the likelier mistake
        hint = (f", or drop them with {skip_hint}" if skip_hint and records else
                f" (every one is: is the file {kind} records?)" if not records else "")
        raise UserError(summarize(problems, len(rows), kind, name) + f"; fix them{hint}", details=listing(problems))
    if not records and not allow_empty:
        raise UserError(f"{name}: no valid records; " + summarize(problems, len(rows), kind, name),
                        details=listing(problems))
    return LoadResult(records, kind, problems, skipped=len(problems))


def _build(row: RawRow, kind: str) -> tuple[Any, Problem | None]:
    """`(record, None)` for a valid row, `(None, problem)` otherwise."""
    if row.parse_error is not None:
        return None, Problem.at(row.location, row.parse_field, row.parse_error)
    try:
        record = build_record(row.value, kind)
    except FieldError as exc:
        return None, Problem.at(row.location, exc.field, exc.message)
    record.source = row.location
    return record, None


def summarize(problems: list[Problem], total: int, kind: str, name: str) -> str:
    """One line: the first problem, where it is, and how many records are invalid (`listing` has the first few)."""
    return f"{problems[0]} ({len(problems)} of {total} records are invalid, {kind} format)"


def listing(problems: list[Problem]) -> str:
    """The first few problems, one per line (what `--debug` adds to the one-line error)."""
    more = [f"  ... and {len(problems) - _SHOWN_PROBLEMS} more"] if len(problems) > _SHOWN_PROBLEMS else []
    return "\n".join([f"  {p}" for p in problems[:_SHOWN_PROBLEMS]] + more)


def _resolve_kind(rows: list[RawRow], kind: str | None) -> str:
    if kind is not None:
        if kind not in KINDS:
            raise UserError(f"data format {kind!r}: expected one of {', '.join(KINDS)}")
        return kind
    votes = Counter()
    for row in rows[:100]:
        if isinstance(row.value, dict):
            votes[detect_kind(row.value)] += 1
    votes.pop(None, None)
    if votes:
        return votes.most_common(1)[0][0]  # ties go to the format seen first
    first = next((r for r in rows if isinstance(r.value, dict)), None)
    if first is None:
        raise UserError(f"{rows[0].location}: cannot tell the format: no row is a JSON object "
                        f"({rows[0].parse_error or 'first row: ' + type(rows[0].value).__name__})")
    columns = ", ".join(map(str, first.value)) or "none"
    raise UserError(f"{first.location}: cannot tell the format from the columns ({columns}): expected "
                    f"'chosen'+'rejected' (pairwise), 'completion'+'label' (unpaired), 'completions'+'scores' "
                    f"(groups) or 'prompt' alone (prompts)")


def split_records(records: list, eval_fraction: float, seed: int = 0) -> tuple[list, list]:
    """Split records into (train, eval) by prompt id, so all completions of a prompt land on one side.

    About `eval_fraction` of the distinct prompt ids (rounded, at least one when the fraction is positive and
    there are two or more ids, never all of them) go to eval; each side keeps the original record order.
    """
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval_fraction: expected a number in [0, 1), got {eval_fraction}")
    ids = list(dict.fromkeys(r.prompt_id for r in records))
    n_eval = round(len(ids) * eval_fraction)
    if eval_fraction > 0 and len(ids) > 1:
        n_eval = max(n_eval, 1)
    n_eval = min(n_eval, max(len(ids) - 1, 0))
    order = ids[:]
    random.Random(seed).shuffle(order)
    held_out = set(order[:n_eval])
    return [r for r in records if r.prompt_id not in held_out], [r for r in records if r.prompt_id in held_out]


SKIP_HINTS = dict.fromkeys(("data.train", "data.eval"), "data.skip_invalid: true (--data.skip_invalid=true)")


def load_named(field_name: str, path: str, **kwargs) -> LoadResult:
    """`load_records` of the config field `field_name`'s `path`, with the field in every error (a missing file's
    message names only the path)."""
    try:  # data.skip_invalid applies to the offline data only
        return load_records(path, skip_hint=SKIP_HINTS.get(field_name), **kwargs)
    except UserError as exc:
        if field_name in str(exc):
            raise
        raise UserError(f"{field_name}: {exc}") from exc
