"""Token ids for records: chat templates, completion-only labels and the truncation policy.

With a chat template, the prompt is `apply_chat_template(messages, add_generation_prompt=True)` (a plain
prompt becomes one user message) and the completion is what the templated full conversation adds after
those prompt tokens, end-of-turn tokens included. Without one, the prompt is the tokenizer's encoding of the
text (with its special tokens, e.g. BOS) and the completion its text tokens plus EOS.

Truncation (per record): the prompt keeps its last `max_prompt_length` tokens, then every completion keeps
its first `max_length - len(prompt)` tokens. A prompt that leaves no room for a completion token drops the
record with a problem. Units are plain dicts of python lists (cheap to pickle to dataloader workers):
    DPO  {"id", "prompt", "chosen", "rejected"}     KTO  {"id", "prompt", "completion", "desirable"}
    GRPO {"id", "prompt", "completions", "rewards"} (one whole group per unit)
Collation into padded tensors lives in `humanline.data.collate` (re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

from humanline.data.collate import collate_dpo, collate_grpo, collate_kto  # noqa: F401  (re-export)
from humanline.data.records import Problem
from humanline.errors import UserError


@dataclass
class EncodeResult:
    """`units` to train on; `truncated`: records cut to fit; `dropped`: records left out, with `problems`."""

    units: list[dict]
    truncated: int = 0
    dropped: int = 0
    problems: list[Problem] = field(default_factory=list)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _messages(value, role: str) -> list[dict]:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def _template_ids(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True,
                                        return_dict=False)
    if isinstance(ids, Mapping):  # some tokenizer versions return a BatchEncoding regardless
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def _name(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def _needs_template(tokenizer) -> UserError:
    return UserError(f"tokenizer '{_name(tokenizer)}' has no chat template, so conversational (message list) "
                     f"records cannot be encoded; use a tokenizer with a chat template or plain-text records")


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt, ending where the model starts its answer (the generation prompt)."""
    if has_chat_template(tokenizer):
        return _template_ids(tokenizer, _messages(prompt, "user"), generation_prompt=True)
    if not isinstance(prompt, str):
        raise _needs_template(tokenizer)
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def encode_completion(tokenizer, prompt, completion, *, prompt_ids: list[int] | None = None) -> list[int]:
    """Token ids of `completion` as it follows `prompt` (pass `prompt_ids` to reuse `encode_prompt`'s result)."""
    if not has_chat_template(tokenizer):
        if not isinstance(completion, str):
            raise _needs_template(tokenizer)
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        return list(tokenizer(completion, add_special_tokens=False)["input_ids"]) + eos
    if prompt_ids is None:
        prompt_ids = encode_prompt(tokenizer, prompt)
    full = _template_ids(tokenizer, _messages(prompt, "user") + _messages(completion, "assistant"), False)
    n = len(prompt_ids)
    if full[:n] != prompt_ids or len(full) == n:
        at = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), min(n, len(full)))
        raise UserError(
            f"the chat template of '{_name(tokenizer)}' does not render the prompt (with "
            f"its generation prompt) as a prefix of prompt + completion; they differ at token {at}: "
            f"{tokenizer.decode(prompt_ids[at:at + 8])!r} vs {tokenizer.decode(full[at:at + 8])!r}, so completion "
            f"tokens cannot be separated from prompt tokens (templates that rewrite earlier turns do this)"
        )
    return full[n:]


def check_limits(max_prompt_length: int | None, max_length: int | None) -> None:
    """Both limits are None (no limit) or positive token counts; `UserError` naming the limit otherwise."""
    for name, value in (("max_prompt_length", max_prompt_length), ("max_length", max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"{name}: expected a positive number of tokens, got {value!r}")


def fit_lengths(prompt: list[int], completions: list[list[int]], *, max_prompt_length: int | None,
                max_length: int | None) -> tuple[list[int], list[list[int]], bool] | None:
    """Apply the truncation policy; returns `(prompt, completions, truncated)`, or None when no room is left.

    Example: prompt of 10 tokens, completions of 4 and 9, max_prompt_length 6, max_length 12 -> the prompt
    keeps its last 6 tokens and each completion its first 12 - 6 = 6 tokens: (6, [4, 6], truncated=True).
    """
    cut_prompt = prompt[-max_prompt_length:] if max_prompt_length is not None else prompt
    room = None if max_length is None else max_length - len(cut_prompt)
    if room is not None and room < 1:
        return None
    cut = [c if room is None else c[:room] for c in completions]
    truncated = len(cut_prompt) < len(prompt) or any(len(a) < len(b) for a, b in zip(cut, completions))
    return cut_prompt, cut, truncated


def no_room_problem(record, prompt_tokens: int, max_prompt_length: int | None, max_length: int | None) -> Problem:
    """The problem reported for a record whose (truncated) prompt leaves no room for a completion token."""
    kept = prompt_tokens if max_prompt_length is None else min(prompt_tokens, max_prompt_length)
    return Problem.at(record.source, "prompt", f"prompt is {kept} tokens (max_prompt_length={max_prompt_length}), "
                                               f"leaving no room for a completion within max_length={max_length}")


def _encode(records: list, tokenizer, max_prompt_length: int | None, max_length: int | None,
            completions_of: Callable, make_unit: Callable) -> EncodeResult:
    check_limits(max_prompt_length, max_length)
    result = EncodeResult([])
    for record in records:
        prompt_ids = encode_prompt(tokenizer, record.prompt)
        completions = [encode_completion(tokenizer, record.prompt, c, prompt_ids=prompt_ids)
                       for c in completions_of(record)]
        fitted = fit_lengths(prompt_ids, completions, max_prompt_length=max_prompt_length, max_length=max_length)
        if fitted is None:
            result.dropped += 1
            result.problems.append(no_room_problem(record, len(prompt_ids), max_prompt_length, max_length))
            continue
        prompt, completions, truncated = fitted
        result.truncated += truncated
        result.units.append(make_unit(record, prompt, completions))
    return result


def encode_pairs(records: list, tokenizer, *, max_prompt_length: int | None, max_length: int | None) -> EncodeResult:
    """DPO units `{"id", "prompt", "chosen", "rejected"}` from `PairRecord`s."""
    return _encode(records, tokenizer, max_prompt_length, max_length, lambda r: [r.chosen, r.rejected],
                   lambda r, p, c: {"id": r.prompt_id, "prompt": p, "chosen": c[0], "rejected": c[1]})


def encode_unpaired(records: list, tokenizer, *, max_prompt_length: int | None,
                    max_length: int | None) -> EncodeResult:
    """KTO units `{"id", "prompt", "completion", "desirable"}` from `UnpairedRecord`s."""
    return _encode(records, tokenizer, max_prompt_length, max_length, lambda r: [r.completion],
                   lambda r, p, c: {"id": r.prompt_id, "prompt": p, "completion": c[0], "desirable": r.desirable})


def encode_groups(records: list, tokenizer, *, max_prompt_length: int | None, max_length: int | None) -> EncodeResult:
    """GRPO units `{"id", "prompt", "completions", "rewards"}` from `GroupRecord`s, one whole group each."""
    return _encode(records, tokenizer, max_prompt_length, max_length, lambda r: r.completions,
                   lambda r, p, c: {"id": r.prompt_id, "prompt": p, "completions": c,
                                    "rewards": [float(s) for s in r.scores]})
