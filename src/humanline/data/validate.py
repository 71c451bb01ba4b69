"""Turn one raw row (a dict from JSON, CSV, Parquet or `datasets`) into a typed record, or say precisely why not.

Each builder raises `FieldError(field, message)` at the record's first problem; the loader adds file and line.
Accepted layouts (TRL conventions plus UltraFeedback-ArmoRM):
    pairwise  prompt, chosen, rejected  (conversational chosen/rejected may repeat the prompt, or carry it
              implicitly when `prompt` is absent: the shared leading messages become the prompt)
    unpaired  prompt, completion, label (or desirable)
    groups    prompt, completions, scores  (or all_generated_responses, all_rm_scores)
    prompts   prompt, optional answer, optional metadata (other columns are kept in metadata)
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from humanline.data.records import GroupRecord, PairRecord, PromptRecord, UnpairedRecord, hash_prompt

ROLES = ("assistant", "developer", "system", "tool", "user")
GROUP_FIELDS = (("completions", "scores"), ("all_generated_responses", "all_rm_scores"))
LABEL_FIELDS = ("label", "desirable")
# (from, to) pairs `humanline data convert` supports, for hints when a row has the wrong format.
CONVERTIBLE = {("groups", "pairwise"), ("groups", "unpaired"), ("pairwise", "unpaired"), ("pairwise", "groups")}
# Columns that belong to a record format; everything else on a prompt row is metadata.
KNOWN_FIELDS = {"prompt", "answer", "metadata", "id", "prompt_id", "chosen", "rejected", "completion",
                "completions", "scores", "label", "desirable", "all_generated_responses", "all_rm_scores"}


class FieldError(Exception):
    """A record's first problem: the field (e.g. `completions[2]`) and what was expected."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def show(value: Any, limit: int = 80) -> str:
    """A short JSON-like rendering of a value for error messages (NaN stays visible)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True, default=repr)
    except (ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def detect_kind(row: dict) -> str | None:
    """The format a row's columns suggest, or None when they fit none."""
    keys = set(row)
    if keys & {"completions", "all_generated_responses"}:
        return "groups"
    if keys & {"chosen", "rejected"}:
        return "pairwise"
    if keys & {"completion", "label", "desirable"}:
        return "unpaired"
    return "prompts" if "prompt" in keys else None


def _require(row: dict, name: str, kind: str, needs: str) -> Any:
    if name not in row or row[name] is None:
        hint = ""
        other = detect_kind(row)
        if (other, kind) in CONVERTIBLE:
            hint = f" (the row looks {other}; convert it with `humanline data convert --to {kind}`)"
        article = "an" if kind[0] in "aeiou" else "a"
        raise FieldError(name, f"missing: {article} {kind} record needs {needs}{hint}")
    return row[name]


def _messages(value: list, field: str) -> list[dict]:
    if not value:
        raise FieldError(field, "expected a string or a non-empty list of {'role', 'content'} messages, got []")
    out = []
    for i, msg in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(msg, dict):
            raise FieldError(where, f"expected a message object with 'role' and 'content', got {show(msg)}")
        for key in ("role", "content"):
            if key not in msg:
                raise FieldError(where, f"message has no '{key}' key (keys: {', '.join(map(str, msg)) or 'none'})")
        role, content = msg["role"], msg["content"]
        if role not in ROLES:
            raise FieldError(f"{where}.role", f"unknown role {show(role)} (expected one of {', '.join(ROLES)})")
        if not isinstance(content, str):
            raise FieldError(f"{where}.content", f"expected a string, got {_type_name(content)}: {show(content)}")
        out.append({"role": role, "content": content})
    return out


def check_prompt(value: Any, field: str = "prompt") -> str | list[dict]:
    """A non-empty string, or messages that end with a user/tool turn (the model answers next)."""
    if isinstance(value, str):
        if not value.strip():
            raise FieldError(field, "empty prompt")
        return value
    if not isinstance(value, list):
        raise FieldError(field, f"expected a string or a list of messages, got {_type_name(value)}: {show(value)}")
    messages = _messages(value, field)
    if not any(m["content"].strip() for m in messages):
        raise FieldError(field, "empty prompt (every message content is blank)")
    last = messages[-1]["role"]
    if last in ("assistant", "system"):
        raise FieldError(f"{field}[{len(messages) - 1}].role",
                         f"a prompt must end with a user or tool message, got '{last}'")
    return messages


def check_completion(value: Any, field: str, prompt: str | list | None = None) -> str | list[dict]:
    """A non-empty string, or assistant messages (a leading copy of the prompt messages is removed)."""
    if isinstance(value, str):
        if not value.strip():
            raise FieldError(field, "empty completion")
        return value
    if not isinstance(value, list):
        raise FieldError(field, f"expected a string or a list of messages, got {_type_name(value)}: {show(value)}")
    messages = _messages(value, field)
    prefix = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    start = 0
    if prefix and messages[: len(prefix)] == prefix and len(messages) > len(prefix):
        start = len(prefix)  # full conversation including the prompt (e.g. UltraFeedback-ArmoRM chosen)
    for i in range(start, len(messages)):
        if messages[i]["role"] != "assistant":
            raise FieldError(f"{field}[{i}].role",
                             f"a completion holds assistant messages only, got '{messages[i]['role']}'")
    messages = messages[start:]
    if not any(m["content"].strip() for m in messages):
        raise FieldError(field, "empty completion (every message content is blank)")
    return messages


def check_label(row: dict) -> bool:
    name = next((n for n in LABEL_FIELDS if row.get(n) is not None), None)
    if name is None:
        raise FieldError("label", "missing: an unpaired record needs 'prompt', 'completion' and 'label' (true/false)")
    value = row[name]
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    raise FieldError(name, f"expected true or false, got {show(value)}")


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        return False


def check_scores(value: Any, field: str, count: int) -> list[float]:
    ok = isinstance(value, list) and len(value) == count and all(_finite(s) for s in value)
    if not ok:
        raise FieldError(field, f"expected a list of {count} finite numbers (one per completion), got {show(value)}")
    return [float(s) for s in value]


def check_prompt_id(row: dict, prompt: Any) -> str:
    for name in ("prompt_id", "id"):
        value = row.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
            raise FieldError(name, f"expected a non-empty string or an integer id, got {show(value)}")
        return str(value)
    return hash_prompt(prompt)


def _implicit_prompt(row: dict) -> tuple[list, list, list]:
    """TRL's implicit-prompt pairs: chosen/rejected are whole conversations sharing the prompt turns."""
    chosen, rejected = row["chosen"], row["rejected"]
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise FieldError("prompt", "missing: a pairwise record needs 'prompt', 'chosen' and 'rejected' "
                                   "(or conversational chosen/rejected that start with the prompt messages)")
    chosen, rejected = _messages(chosen, "chosen"), _messages(rejected, "rejected")
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared > 0 and chosen[shared - 1]["role"] == "assistant":
        shared -= 1
    if shared == 0:
        raise FieldError("prompt", "missing, and 'chosen' and 'rejected' share no leading prompt messages")
    return chosen[:shared], chosen[shared:], rejected[shared:]


def to_pair(row: dict) -> PairRecord:
    needs = "'prompt', 'chosen' and 'rejected'"
    chosen_raw = _require(row, "chosen", "pairwise", needs)
    rejected_raw = _require(row, "rejected", "pairwise", needs)
    if row.get("prompt") is None:
        implicit, chosen_raw, rejected_raw = _implicit_prompt(row)
        prompt = check_prompt(implicit)
    else:
        prompt = check_prompt(row["prompt"])
    chosen = check_completion(chosen_raw, "chosen", prompt)
    rejected = check_completion(rejected_raw, "rejected", prompt)
    if chosen == rejected:
        raise FieldError("rejected", "identical to 'chosen' (a pair needs two different completions)")
    return PairRecord(prompt, chosen, rejected, check_prompt_id(row, prompt))


def to_unpaired(row: dict) -> UnpairedRecord:
    needs = "'prompt', 'completion' and 'label' (true/false)"
    prompt = check_prompt(_require(row, "prompt", "unpaired", needs))
    completion = check_completion(_require(row, "completion", "unpaired", needs), "completion", prompt)
    return UnpairedRecord(prompt, completion, check_label(row), check_prompt_id(row, prompt))


def to_group(row: dict) -> GroupRecord:
    names = next((pair for pair in GROUP_FIELDS if pair[0] in row), GROUP_FIELDS[0])
    needs = "'prompt', 'completions' (a list) and 'scores' (one number per completion)"
    prompt = check_prompt(_require(row, "prompt", "groups", needs))
    raw = _require(row, names[0], "groups", needs)
    if not isinstance(raw, list) or len(raw) < 2:
        got = f"{len(raw)}" if isinstance(raw, list) else f"{_type_name(raw)}: {show(raw)}"
        raise FieldError(names[0], f"expected a list of at least 2 completions, got {got}")
    completions = [check_completion(c, f"{names[0]}[{i}]", prompt) for i, c in enumerate(raw)]
    scores = check_scores(_require(row, names[1], "groups", needs), names[1], len(completions))
    return GroupRecord(prompt, completions, scores, check_prompt_id(row, prompt))


def to_prompt(row: dict) -> PromptRecord:
    prompt = check_prompt(_require(row, "prompt", "prompts", "'prompt'"))
    answer = row.get("answer")
    if isinstance(answer, bool) or not (answer is None or isinstance(answer, (str, int, float))):
        raise FieldError("answer", f"expected a string or a number, got {_type_name(answer)}: {show(answer)}")
    metadata = {k: v for k, v in row.items() if k not in KNOWN_FIELDS}
    extra = row.get("metadata")
    if extra is not None and not isinstance(extra, dict):
        raise FieldError("metadata", f"expected an object, got {_type_name(extra)}: {show(extra)}")
    metadata.update(extra or {})
    return PromptRecord(prompt, check_prompt_id(row, prompt), None if answer is None else str(answer), metadata)


BUILDERS: dict[str, Callable[[dict], Any]] = {
    "pairwise": to_pair, "unpaired": to_unpaired, "groups": to_group, "prompts": to_prompt,
}


def build_record(row: Any, kind: str):
    """The typed record for `row` in format `kind`; raises `FieldError` at its first problem."""
    if not isinstance(row, dict):
        raise FieldError(None, f"expected a JSON object (one record), got {_type_name(row)}: {show(row)}")
    return BUILDERS[kind](row)
