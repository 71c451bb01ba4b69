"""The reproduction's tasks: by default sums of two numbers, answered in one line and checked by math-verify
(`sums`, below); or any reasoning-gym task with its own verifier (`TASKS`, `task_of`).

SmolLM2-135M-Instruct answers "What is 89 + 42?" at temperature 1 correctly about one time in six: it often
rambles, decomposes wrongly or never states a number (lab/log.md has the measurement). Three
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
from dataclasses import dataclass

from humanline.data import reasoning_gym
from humanline.errors import UserError

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


@dataclass(frozen=True)
class Task:
    """What the reproduction needs of a task: its prompts (train and held-out, disjoint), the reward that
    scores them (training and evaluation alike), where sampling stops, and the lengths of prompt and answer."""

    name: str  # a key of TASKS, or a reasoning_gym:NAME?... source
    source: str | None  # the reasoning_gym: source (None: the sums task)
    reward: str
    stop: tuple[str, ...]
    max_prompt_length: int
    max_new_tokens: int

    def records(self, n_train: int, n_held_out: int) -> tuple[list[dict], list[dict]]:
        """`(train, held_out)` prompt records, no held-out question among the training ones.

        A reasoning-gym task is split by question, as its easy settings hold few distinct ones (1-digit sums:
        121): one dataset of `n_train + 4 n_held_out` entries, whose first `held_out` distinct questions are held
        out (at most `n_held_out`, and at most a third of the distinct ones); training prompts are the other
        entries, in order, up to `n_train` (a question may recur, each a prompt of the sampling pool)."""
        if self.source is None:
            return sum_records(seed=0, n_train=n_train, n_held_out=n_held_out)
        rows = reasoning_gym.task_rows(f"{self.source}&size={n_train + 4 * n_held_out}&held_out=0")
        questions = list(dict.fromkeys(r["prompt"] for r in rows))
        held = set(questions[: min(n_held_out, len(questions) // 3)])
        if len(held) < min(n_held_out, 16):
            raise UserError(f"--task {self.name}: only {len(questions)} distinct questions; at least "
                            f"{3 * min(n_held_out, 16)} are needed to hold some out: choose harder settings")
        held_out, seen = [], set()
        for r in rows:  # each held-out question once
            if r["prompt"] in held and r["prompt"] not in seen:
                seen.add(r["prompt"])
                held_out.append(r)
        return [r for r in rows if r["prompt"] not in held][:n_train], held_out


SUMS = Task("sums", None, "math_verify", tuple(STOP), max_prompt_length=64, max_new_tokens=32)

# reasoning-gym tasks at difficulties where SmolLM2-135M-Instruct's base pass@1 lies in 0.1-0.6 with lenient
# extraction (lab/log.md, the reasoning-gym survey: 1-digit sums 0.30, 1-digit chain sums with "-" 0.13-0.17; at 1-2
# digits 0.05, and with strict extraction 0.00-0.06 at any difficulty). Answers end at the chat's end of turn (no
# stop string); 48 tokens hold ~95 % of them.
_RG = "reasoning_gym:{}?seed=0&format=tag&extract=lenient&"
TASKS = {
    "sums": SUMS,
    "add": Task("add", _RG.format("basic_arithmetic") + "min_terms=2&max_terms=2&min_digits=1&max_digits=1&"
                "operators=[\"+\"]&allow_parentheses=false&allow_negation=false", "reasoning_gym", (), 96, 48),
    "chain": Task("chain", _RG.format("chain_sum") + "min_terms=2&max_terms=2&min_digits=1&max_digits=1",
                  "reasoning_gym", (), 96, 48),
}


def task_of(name: str) -> Task:
    """The task named `name` (a key of TASKS), or a `reasoning_gym:NAME?...` source taken as it is."""
    if name in TASKS:
        return TASKS[name]
    if reasoning_gym.is_task_source(name):
        reasoning_gym.parse_task_source(name)  # syntax errors name the source
        keys = {part.partition("=")[0] for part in name.partition("?")[2].split("&")}
        if keys & {"size", "held_out", "split"}:
            raise UserError(f"--task {name}: leave size, held_out and split out (the reproduction sets them from "
                            f"the numbers of training and held-out prompts)")
        return Task(name, name if "?" in name else name + "?", "reasoning_gym", (), 96, 48)
    raise UserError(f"--task: unknown task {name!r}; expected one of {', '.join(TASKS)} or "
                    f"reasoning_gym:NAME?setting=value&... (docs/usage.md, reasoning-gym tasks)")
