"""A collapsed run: one that reached its end with a policy that stopped learning. `humanline train` says so on its
last line and exits with code 5 (`train.allow_collapse`: 0), and `humanline report` says it in report.md.

Read from what the run logged (its `metrics.jsonl` rows) and, for the weights, from the end of the run (`end`,
which `humanline.training.collapse_watch` writes into `run_info.json`); nothing here reads the device. A run is
collapsed when any of these holds (docs/usage.md, "Exit codes", states the same bounds):

- its last steps trained on nothing, `EMPTY_TAIL_SHARE` of its steps or more in a row (at least
  `EMPTY_TAIL_MIN`), after steps that did train: every group dropped, or updates skipped, to the end;
- its last held-out score (`eval/reward_mean`, else `eval/pass@1`) is exactly 0 after an earlier one of at least
  `SCORE_FLOOR`;
- its held-out loss, or its training loss (the mean of its last `LOSS_WINDOW` finite values), ends above
  `first + LOSS_MARGIN * max(1, |first|)`, `first` the run's first value (DPO from log 2 = 0.69: above 10.7);
- its trainable weights changed by less than 1e-9 of their size over the updates of its last segment (a learning
  rate below what the weights' precision can register: an update of 1e-30 leaves a float32 weight as it was).

A run in which no step trained at all is not collapsed but empty (exit code 4, `humanline train`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

EMPTY_TAIL_SHARE = 0.25  # of the run's steps: this many at the end trained on nothing, in a row
EMPTY_TAIL_MIN = 3  # ... and at least this many
SCORE_FLOOR = 0.05  # a held-out score at least this, later exactly 0: the policy lost what it had
LOSS_MARGIN = 10.0  # a loss that ends above first + LOSS_MARGIN * max(1, |first|) has exploded
LOSS_WINDOW = 3  # the training loss is judged on the mean of its last this many finite values


def collapse_reasons(rows: list[dict], end: dict | None = None) -> list[str]:
    """Why the run of `rows` (its metrics.jsonl) collapsed, one short phrase per criterion met (empty: it did not).
    `end`: what the run's end recorded (`weights_moved`, `updates`; None: nothing recorded)."""
    steps = [r for r in rows if "time/step" in r]
    reasons = [r for r in (_empty_tail(steps), _lost_score(rows), _exploded(rows, "eval/loss", "held-out loss", 1),
                           _exploded(steps, "loss", "training loss", LOSS_WINDOW)) if r]
    if end and end.get("weights_moved") is False:
        lrs = [r["lr"] for r in steps if _number(r.get("lr"))]
        lr = f" at lr {lrs[-1]:g}" if lrs else ""
        reasons.append(f"the weights did not move in {end.get('updates')} updates{lr} (an lr too small for them)")
    return reasons


def read_rows(path: Path) -> list[dict]:
    """The JSON object lines of a metrics.jsonl (a torn or foreign line is skipped; a missing file: none)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and _number(row.get("step")):
            rows.append(row)
    return rows


def _empty_tail(steps: list[dict]) -> str | None:
    """The steps at the end that trained on nothing (their `skipped_steps` count grew), when they are many."""
    counts = [int(r["skipped_steps"]) if _number(r.get("skipped_steps")) else 0 for r in steps]
    empty = [now > before for before, now in zip([0, *counts], counts)]
    tail = len(empty) - next((i + 1 for i in range(len(empty) - 1, -1, -1) if not empty[i]), 0)
    bound = max(EMPTY_TAIL_MIN, math.ceil(EMPTY_TAIL_SHARE * len(steps)))
    if tail < bound or tail == len(steps):  # every step empty: nothing trained at all (exit code 4)
        return None
    return f"the last {tail} of {len(steps)} steps trained on nothing (every group dropped or the update skipped)"


def _lost_score(rows: list[dict]) -> str | None:
    for key in ("eval/reward_mean", "eval/pass@1"):
        scores = [(r["step"], r[key]) for r in rows if _number(r.get(key))]
        if scores:
            best = max(scores[:-1], key=lambda s: s[1], default=None)
            step, last = scores[-1]
            if best is not None and best[1] >= SCORE_FLOOR and last == 0:
                return f"{key} {best[1]:.3g} at step {best[0]:g}, then 0 at step {step:g}"
            return None
    return None


def _exploded(rows: list[dict], key: str, name: str, window: int) -> str | None:
    values = [r[key] for r in rows if _number(r.get(key))]
    if len(values) < 2:
        return None
    first, last = values[0], sum(values[-window:]) / len(values[-window:])
    bound = first + LOSS_MARGIN * max(1.0, abs(first))
    return f"{name} {first:.3g} -> {last:.3g} (past {bound:.3g})" if last > bound else None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
