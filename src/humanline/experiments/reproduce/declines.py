"""Runs whose held-out score peaked and fell: a final score alone hides a run that was better half-way (online DPO
can peak and fall, docs/results.md), so `humanline reproduce` names them under its table."""

from __future__ import annotations

import math

FALL_SE = 2.0  # a run fell when its last evaluation lies more than this many standard errors under its best


def fell(run: dict) -> dict | None:
    """The run's peak and its fall, when its held-out curve ended more than `FALL_SE` standard errors under its
    best earlier evaluation (the two evaluations' errors combined as if independent: they score the same prompts,
    so this errs toward saying nothing); None when it did not fall."""
    curve = run.get("curve") or []
    if len(curve) < 2:
        return None
    best, last = max(curve[:-1], key=lambda p: p["pass@1"]), curve[-1]
    drop = best["pass@1"] - last["pass@1"]
    se = math.hypot(best.get("stderr") or 0.0, last.get("stderr") or 0.0)
    if drop <= 0 or drop <= FALL_SE * se:
        return None
    return {"best": best, "last": last, "drop": drop, "se": se}


def fallen_table(rows: list[dict]) -> list[str]:
    """One line per run, of any objective, whose held-out score peaked and fell (`fell`): a final score alone
    would hide it. Nothing when none fell."""
    lines = []
    for r in rows:
        for run in r["runs"]:
            f = fell(run)
            if f:
                b, last = f["best"], f["last"]
                size = f"{f['drop'] / f['se']:.1f} se" if f["se"] else "every answer alike at both"
                lines.append(f"- {r['objective']} {r['regime']} seed {run['seed']}: {b['pass@1']:.3f} at step "
                             f"{b['step']}, {last['pass@1']:.3f} at step {last['step']} (-{f['drop']:.3f}, {size})")
    if not lines:
        return []
    return [f"\nRuns whose held-out score peaked and fell (the last evaluation more than {FALL_SE:g} standard errors "
            "under the best before it; judge these by the whole curve, not the final score):\n", *lines]
