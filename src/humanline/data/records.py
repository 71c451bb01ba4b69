"""Typed records for the four feedback formats, and the problems found while reading them.

A prompt is a string or a list of `{"role", "content"}` messages; a completion is a string or a list of
assistant messages. `prompt_id` groups the completions of one prompt: it comes from the data's
`prompt_id` / `id` field when present, otherwise it is a stable hash of the prompt.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Union

Message = dict  # {"role": str, "content": str}
Prompt = Union[str, list]  # str or list[Message]
Completion = Union[str, list]  # str or list[Message] (assistant turns)

KINDS = ("pairwise", "unpaired", "groups", "prompts")
# A tokenised training unit: token ids and labels, as `humanline.data.tokenization` makes them and the collators take
Unit = dict


@dataclass(frozen=True)
class Location:
    """Where a record came from: `file` and a 1-based `line` (text files) or 0-based `row` (tables)."""

    file: str
    line: int | None = None
    unit: str = "line"  # "line" for JSONL/JSON/CSV, "row" for Parquet and `datasets`

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}" if self.unit == "line" else f"{self.file} row {self.line}"


@dataclass(frozen=True)
class Problem:
    """One invalid record (or file): printed as `data.jsonl:17: field 'scores': expected ..., got ...`."""

    file: str
    line: int | None
    field: str | None
    message: str
    unit: str = "line"

    @classmethod
    def at(cls, location: Location | None, field_name: str | None, message: str) -> Problem:
        location = location or Location("<records>")
        return cls(location.file, location.line, field_name, message, location.unit)

    def __str__(self) -> str:
        where = str(Location(self.file, self.line, self.unit))
        return f"{where}: field '{self.field}': {self.message}" if self.field else f"{where}: {self.message}"


def _source() -> object:
    # Where the record was read from; not part of equality, so a written-and-reloaded record compares equal.
    return field(default=None, compare=False, repr=False)


@dataclass
class PairRecord:
    """A preference pair: `chosen` is preferred to `rejected` for `prompt`."""

    prompt: Prompt
    chosen: Completion
    rejected: Completion
    prompt_id: str
    source: Location | None = _source()


@dataclass
class UnpairedRecord:
    """One completion with binary feedback (KTO: desirable / undesirable)."""

    prompt: Prompt
    completion: Completion
    desirable: bool
    prompt_id: str
    source: Location | None = _source()


@dataclass
class GroupRecord:
    """Several completions of one prompt with a finite score each (GRPO groups, UltraFeedback-ArmoRM)."""

    prompt: Prompt
    completions: list
    scores: list[float]
    prompt_id: str
    source: Location | None = _source()


@dataclass
class PromptRecord:
    """A prompt for online training or evaluation, with an optional reference answer and free metadata."""

    prompt: Prompt
    prompt_id: str
    answer: str | None = None
    metadata: dict = field(default_factory=dict)
    source: Location | None = _source()


RECORD_TYPES = {"pairwise": PairRecord, "unpaired": UnpairedRecord, "groups": GroupRecord, "prompts": PromptRecord}


def kind_of(record: object) -> str:
    """The format name of a record instance ("pairwise", "unpaired", "groups" or "prompts")."""
    for kind, cls in RECORD_TYPES.items():
        if isinstance(record, cls):
            return kind
    raise TypeError(f"not a humanline data record: {type(record).__name__}")


def hash_prompt(prompt: Prompt) -> str:
    """A stable 16-hex-digit id for a prompt (same prompt -> same id, across runs and machines)."""
    canonical = json.dumps(prompt, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()[:16]


def prompt_text(prompt: Prompt) -> str:
    """The prompt's text (message contents joined by newlines), for length statistics and display."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
