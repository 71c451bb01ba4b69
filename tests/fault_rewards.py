"""Rewards that fail on purpose for `tests/test_online_faults.py`, loaded as `tests/fault_rewards.py:NAME`.

Prompts whose row carries `"flaky": true` (a metadata column, passed to rewards as the `flaky` keyword) fail;
the others get varied scores so that groups are not degenerate.
"""

from __future__ import annotations

import math


def _score(text: str) -> float:
    return (len(text) % 4) / 3


def raises(prompts, completions, flaky=None, **_):
    """Raises for any batch that holds a flaky prompt (as a reward server that times out on it would)."""
    flaky = flaky or [None] * len(completions)
    if any(flaky):
        raise RuntimeError("reward server timed out")
    return [_score(c) for c in completions]


def nan(prompts, completions, flaky=None, **_):
    """NaN for the completions of flaky prompts."""
    flaky = flaky or [None] * len(completions)
    return [math.nan if f else _score(c) for c, f in zip(completions, flaky)]


def one_score(prompts, completions, **_):
    """Breaks the protocol: one score for the whole batch."""
    return [0.5]


def constant(prompts, completions, **_):
    """The same score for every completion: every group is degenerate, so every step trains on nothing."""
    return [1.0 for _ in completions]


def flat_on_rank_1(prompts, completions, **_):
    """Process 1 (the `RANK` its launcher sets) scores everything 0, so every group it samples is dropped;
    process 0 scores the i-th completion (i mod 4) / 3, so none of its groups of 4 is: the processes of a run
    then hold different numbers of micro-batches at every step."""
    import os

    if os.environ.get("RANK") == "1":
        return [0.0] * len(completions)
    return [(i % 4) / 3 for i in range(len(completions))]
