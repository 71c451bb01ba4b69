"""Built-in demo tasks, generated locally from a seed (no download).

Two tasks, each a `DemoTask` bundling its train / held-out prompt records, a reward function with the
protocol `reward(prompts, completions, **metadata) -> list[float]`, and a sampler of supervised completions
(some deliberately wrong) used to train the imperfect base policy:

- `arithmetic` (verifiable): "23+58=" -> "81"; reward 1.0 iff the answer is exactly right, else 0.0.
- `letters` (preference): "Write 6 from abekmo:" -> e.g. "bamoke"; there is no single right answer. A fixed
  deterministic scorer (a stand-in for a reward model the policy never sees directly) grades each completion
  in [0, 1] as the mean of four properties:
    length     `max(0, 1 - |len(w) - n| / n)`                       (n = requested length)
    allowed    share of the characters that are among the prompt's letters
    alternate  share of adjacent pairs that switch vowel <-> consonant (pronounceable)
    distinct   share of adjacent pairs whose two characters differ (no stutter)
  Many words score 1.0; corrupted ones get graded partial credit, which makes best-vs-worst pairs and
  above/below-mean labels meaningful.

Records are plain dicts in the data layer's JSONL format: prompt-only records
`{"prompt": [{"role": "user", "content": ...}], "answer": ..., "id": ...}` (the letters task has no "answer";
its scorer reads everything from the prompt). Train and held-out prompt sets are disjoint by construction.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Callable

from humanline.errors import UserError

Record = dict
RewardFn = Callable[..., list[float]]
# (record, rng, corrupt) -> completion text; `corrupt` asks for a wrong / degraded completion.
SftSampler = Callable[[Record, random.Random, bool], str]

VOWELS = "aeiou"
CONSONANTS = "".join(c for c in string.ascii_lowercase if c not in VOWELS)


@dataclass(frozen=True)
class DemoTask:
    """A built-in task: `train` and `held_out` prompt records, a `reward` function, and `sft_completion`."""

    name: str
    train: list[Record]
    held_out: list[Record]
    reward: RewardFn
    sft_completion: SftSampler


# ---------------------------------------------------------------------------------------------------- helpers


def completion_text(completion) -> str:
    """A completion as text: a plain string, or a list of chat messages (the last message's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return ""


def last_user_text(prompt) -> str:
    """The last user message of a chat prompt (or the prompt itself if it is a string)."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


# ------------------------------------------------------------------------------------------------- arithmetic

_OPS: dict[str, Callable[[int, int], int]] = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# Off-by-a-little answers: plausible mistakes (carry slips, tens-digit slips) rather than noise.
_ARITH_ERRORS = (-10, -2, -1, 1, 2, 10)


def arithmetic_task(
    *, seed: int = 0, digits: int = 2, operators: str = "+", n_train: int = 2000, n_held_out: int = 300
) -> DemoTask:
    """Exact-answer arithmetic on `digits`-digit operands (leading digit non-zero), e.g. "23+58=" -> "81".

    Problems are drawn without replacement from all `(a, op, b)` triples, so train and held-out never share
    a problem. Ids are `arith-<a><op><b>`; the same seed always gives the same records in the same order.
    """
    if digits < 1 or digits > 6:
        raise UserError(f"demo task arithmetic: digits must be in [1, 6], got {digits}")
    bad = [op for op in operators if op not in _OPS]
    if not operators or bad:
        raise UserError(f"demo task arithmetic: operators must be a non-empty string of '+-*', got {operators!r}")
    low, high = 10 ** (digits - 1), 10**digits - 1
    capacity = (high - low + 1) ** 2 * len(set(operators))
    if n_train + n_held_out > capacity:
        raise UserError(
            f"demo task arithmetic: {n_train} + {n_held_out} prompts requested but only {capacity} distinct "
            f"problems exist for digits={digits}, operators={operators!r}"
        )
    rng = random.Random(f"arithmetic-{seed}")
    ops = sorted(set(operators))
    seen: set[tuple[int, str, int]] = set()
    problems: list[tuple[int, str, int]] = []
    while len(problems) < n_train + n_held_out:
        triple = (rng.randint(low, high), rng.choice(ops), rng.randint(low, high))
        if triple not in seen:
            seen.add(triple)
            problems.append(triple)
    records = [
        {"prompt": _user(f"{a}{op}{b}="), "answer": str(_OPS[op](a, b)), "id": f"arith-{a}{op}{b}"}
        for a, op, b in problems
    ]
    return DemoTask("arithmetic", records[:n_train], records[n_train:], arithmetic_reward, _arithmetic_sft)


def arithmetic_reward(prompts, completions, answer=None, **_) -> list[float]:
    """1.0 where the completion (whitespace-stripped) equals the gold `answer` string exactly, else 0.0."""
    if answer is None or len(answer) != len(completions):
        raise ValueError(
            f"arithmetic_reward: need one answer per completion ({len(completions)}), got "
            f"{'none' if answer is None else len(answer)}"
        )
    return [1.0 if completion_text(c).strip() == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


def _arithmetic_sft(record: Record, rng: random.Random, corrupt: bool) -> str:
    value = int(record["answer"])
    return str(value + rng.choice(_ARITH_ERRORS)) if corrupt else str(value)


# ---------------------------------------------------------------------------------------------------- letters

_LETTERS_PREFIX = "Write "


def letters_task(
    *, seed: int = 0, n_letters: int = 6, lengths: tuple[int, ...] = (4, 5, 6), n_train: int = 2000,
    n_held_out: int = 300,
) -> DemoTask:
    """Preference task: "Write 5 from bdkmoa:" asks for a 5-letter word built from those letters.

    Each prompt's letter set has at least two vowels and two consonants, so a perfect (score 1.0) word always
    exists. Train and held-out prompts are distinct (letter set, length) combinations.
    """
    if n_letters < 4 or n_letters > 12 or not lengths or min(lengths) < 2:
        raise UserError(
            f"demo task letters: need 4 <= n_letters <= 12 and lengths >= 2, got {n_letters}, {lengths}"
        )
    rng = random.Random(f"letters-{seed}")
    seen: set[tuple[str, int]] = set()
    records: list[Record] = []
    attempts = 0
    while len(records) < n_train + n_held_out:
        attempts += 1
        if attempts > 100 * (n_train + n_held_out):
            raise UserError(f"demo task letters: cannot draw {n_train + n_held_out} distinct prompts")
        n_vowels = rng.randint(2, min(3, n_letters - 2))
        letters = rng.sample(VOWELS, n_vowels) + rng.sample(CONSONANTS, n_letters - n_vowels)
        rng.shuffle(letters)
        key = ("".join(letters), rng.choice(lengths))
        if key not in seen:
            seen.add(key)
            content = f"{_LETTERS_PREFIX}{key[1]} from {key[0]}:"
            records.append({"prompt": _user(content), "id": f"letters-{key[0]}-{key[1]}"})
    return DemoTask("letters", records[:n_train], records[n_train:], letters_reward, _letters_sft)


def parse_letters_prompt(text: str) -> tuple[str, int]:
    """`"Write 5 from bdkmoa:"` -> `("bdkmoa", 5)`; ValueError if the prompt is not in that form."""
    try:
        head, letters = text.removeprefix(_LETTERS_PREFIX).rstrip(":").split(" from ")
        return letters, int(head)
    except ValueError as exc:
        raise ValueError(f"letters task: cannot parse prompt {text!r}") from exc


def letters_score(word: str, letters: str, length: int) -> float:
    """The fixed scorer of the letters task, in [0, 1] (see the module docstring for the four parts).

    Example: `letters_score("bab", "abk", 4)`: length 1 - 1/4 = 0.75, allowed 3/3, alternate 2/2, distinct 2/2
    -> (0.75 + 1 + 1 + 1) / 4 = 0.9375.
    """
    word = word.strip()
    if not word:
        return 0.0
    length_part = max(0.0, 1.0 - abs(len(word) - length) / length)
    allowed = sum(c in letters for c in word) / len(word)
    pairs = list(zip(word, word[1:]))
    if pairs:
        alternate = sum((a in VOWELS) != (b in VOWELS) for a, b in pairs) / len(pairs)
        distinct = sum(a != b for a, b in pairs) / len(pairs)
    else:
        alternate = distinct = 0.0
    return (length_part + allowed + alternate + distinct) / 4.0


def letters_reward(prompts, completions, **_) -> list[float]:
    """Score each completion with `letters_score` against the letters and length its prompt asks for."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        letters, length = parse_letters_prompt(last_user_text(prompt))
        out.append(letters_score(completion_text(completion), letters, length))
    return out


def _letters_sft(record: Record, rng: random.Random, corrupt: bool) -> str:
    letters, length = parse_letters_prompt(last_user_text(record["prompt"]))
    vowels = [c for c in letters if c in VOWELS]
    consonants = [c for c in letters if c not in VOWELS]
    pools = [vowels, consonants] if rng.random() < 0.5 else [consonants, vowels]
    word: list[str] = []
    for i in range(length):
        choices = [c for c in pools[i % 2] if not word or c != word[-1]]
        word.append(rng.choice(choices))
    if corrupt:
        # One plausible flaw per corrupted word, so scores spread over (0.6, 1) instead of collapsing to 0.
        flaw = rng.randrange(4)
        i = rng.randrange(length)
        if flaw == 0:
            word[i] = rng.choice([c for c in string.ascii_lowercase if c not in letters])
        elif flaw == 1:
            word.insert(i, word[i])
        elif flaw == 2:
            del word[i]
        else:
            word[i] = rng.choice(pools[(i + 1) % 2])
    return "".join(word)


TASKS: dict[str, Callable[..., DemoTask]] = {"arithmetic": arithmetic_task, "letters": letters_task}


def make_task(name: str, **kwargs) -> DemoTask:
    """Build a built-in task by name (`arithmetic` or `letters`), passing settings through."""
    if name not in TASKS:
        raise UserError(f"demo task: unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)
