"""Calling a reward safely: one score per completion, failures named by prompt id (`score_completions`).

The reward protocol is in `humanline.sampling.rewards`. Here: a batch is scored in one call; exceptions, non-numbers
and non-finite scores are found item by item and either raise a `UserError` naming the prompt id or are
skipped and counted (`on_error`); a reward that breaks the protocol (a wrong number of scores) is an error
naming the reward and the counts, whatever `on_error` says.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from humanline.errors import UserError, short_repr

RewardFn = Callable[..., list[float]]


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def reward_name(fn: Any) -> str:
    """A short readable name for error messages."""
    if isinstance(fn, functools.partial):
        return reward_name(fn.func)
    if isinstance(getattr(fn, "terms", None), list):  # rewards.WeightedSum: (weight, reward) terms
        return "weighted_sum(" + ", ".join(reward_name(f) for _, f in fn.terms) + ")"
    if hasattr(fn, "__qualname__"):
        return f"{getattr(fn, '__module__', '?')}:{fn.__qualname__}"
    return type(fn).__name__


@dataclass
class ScoreResult:
    """scores[i] is the reward of completion i, or None when it failed and on_error='skip'."""

    scores: list[float | None]
    failures: list[str] = field(default_factory=list)


def _check_score(value: Any) -> float:
    if isinstance(value, str) or not hasattr(value, "__float__"):
        raise ValueError(f"returned {short_repr(value)}, not a number")
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:  # e.g. a multi-element tensor
        raise ValueError(f"returned {short_repr(value)}, not a number") from exc
    if not math.isfinite(value):
        raise ValueError(f"returned the non-finite score {value}")
    return value


class RewardContractError(UserError):
    """A reward returned something other than one score per completion: its bug, whatever on_error says."""


def _as_scores(returned: Any, name: str, n: int) -> list:
    """The list of scores a reward call returned, or a `UserError` when it is not one score per completion."""
    try:
        scores = None if isinstance(returned, (str, bytes, dict)) else list(returned)
    except TypeError:  # a number, None, a 0-d tensor: not a list
        scores = None
    if scores is None:
        raise RewardContractError(f"reward {name} returned {type(returned).__name__} {short_repr(returned)} for {n} "
                                  f"completions; expected a list of {n} scores (one per completion)")
    if len(scores) != n:
        raise RewardContractError(f"reward {name} returned {len(scores)} scores for {n} completions; expected one "
                                  f"score per completion")
    return scores


def _call_one(fn: RewardFn, prompts, completions, metadata, i: int) -> float:
    out = list(fn([prompts[i]], [completions[i]], **{k: [v[i]] for k, v in metadata.items()}))
    if len(out) != 1:
        raise ValueError(f"returned {len(out)} scores for 1 completion")
    return _check_score(out[0])


def score_completions(
    fn: RewardFn,
    prompts: Sequence[Any],
    completions: Sequence[str],
    metadata: dict[str, Sequence[Any]] | None,
    prompt_ids: Sequence[Any],
    *,
    on_error: str = "fail",
) -> ScoreResult:
    """Score completion i of prompt `prompt_ids[i]` with `fn`, reporting failures by prompt id.

    The batch is scored in one call; if that call raises, each item is re-scored alone to find which ones fail.
    A failing item (exception, non-number, NaN or inf) raises a `UserError` naming its prompt id when
    on_error="fail", and becomes None with a message in `failures` when on_error="skip". A reward that returns
    something other than one score per completion breaks the protocol for every item: a `UserError` naming the
    reward and the counts, whatever on_error says (re-scoring item by item would hide the bug).
    """
    if on_error not in ("fail", "skip"):
        raise UserError(f"reward on_error: expected 'fail' or 'skip', got {on_error!r}")
    metadata = {k: list(v) for k, v in (metadata or {}).items()}
    n = len(completions)
    if len(prompts) != n or len(prompt_ids) != n or any(len(v) != n for v in metadata.values()):
        raise ValueError("score_completions: prompts, completions, prompt_ids and metadata lists must align")
    name = reward_name(fn)
    try:
        returned = fn(list(prompts), list(completions), **metadata)
    except Exception:
        returned, batch = None, None  # find the culprits one by one
    else:
        batch = _as_scores(returned, name, n)
    scores: list[float | None] = []
    failures: list[str] = []
    for i in range(n):
        try:
            if batch is not None:
                scores.append(_check_score(batch[i]))
            else:
                scores.append(_call_one(fn, prompts, completions, metadata, i))
        except Exception as exc:
            message = f"reward {name} failed on prompt id {prompt_ids[i]!r} (completion {i}): {one_line(exc)}"
            if on_error == "fail":
                raise UserError(message) from exc
            scores.append(None)
            failures.append(message)
    return ScoreResult(scores, failures)
