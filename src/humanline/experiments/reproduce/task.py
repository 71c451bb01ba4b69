"""The reproduction's task: sums of two numbers, answered in one line and checked by math-verify.

SmolLM2-135M-Instruct answers "What is 89 + 42?" at temperature 1 correctly about one time in six: it often
rambles, decomposes wrongly or never states a number (measured in docs/experiments.md, 2026-11-25). Three
kinds of sums, in equal shares, spread the difficulty so that groups of samples mix right and wrong answers:

    small   a, b in 1..25           base pass@1 ~0.30
    2d1d    a in 10..99, b in 1..9  ~0.09
    2d2d    a, b in 10..99          ~0.11

Each prompt is the system line "Answer in one line." and the question with the instruction to box the answer;
sampling stops at the end of the first line (`STOP`). Train and held-out prompts are distinct sums, drawn
without replacement from one seeded stream, so no held-out sum is ever trained on.
"""

from __future__ import annotations

import random

SYSTEM = "Answer in one line."
INSTRUCTION = "Put the final answer in \\boxed{}."
STOP = ["\n"]  # one line: the answer ends at its first newline
KINDS = {"small": ((1, 25), (1, 25)), "2d1d": ((10, 99), (1, 9)), "2d2d": ((10, 99), (10, 99))}


def sum_record(a: int, b: int) -> dict:
    """One prompt record in the data layer's format (chat prompt, gold answer, id)."""
    question = f"What is {a} + {b}? {INSTRUCTION}"
    return {"id": f"sum-{a}+{b}",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "answer": str(a + b)}


def sum_records(seed: int = 0, n_train: int = 1200, n_held_out: int = 192) -> tuple[list[dict], list[dict]]:
    """`(train, held_out)` prompt records: the kinds in turn, each sum at most once across both sets."""
    per_kind = -(-(n_train + n_held_out) // len(KINDS))
    smallest = min((hi_a - lo_a + 1) * (hi_b - lo_b + 1) for (lo_a, hi_a), (lo_b, hi_b) in KINDS.values())
    if per_kind > 0.8 * smallest:  # rejection sampling would crawl near the end of a kind
        raise ValueError(f"sum_records: {n_train} + {n_held_out} prompts need {per_kind} sums of each kind; the "
                         f"smallest kind has {smallest}")
    rng, seen, records = random.Random(f"sums-{seed}"), set(), []
    kinds = list(KINDS.values())
    while len(records) < n_train + n_held_out:
        (lo_a, hi_a), (lo_b, hi_b) = kinds[len(records) % len(kinds)]
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        if (a, b) not in seen:
            seen.add((a, b))
            records.append(sum_record(a, b))
    return records[:n_train], records[n_train:]
