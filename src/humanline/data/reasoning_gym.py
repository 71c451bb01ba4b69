"""reasoning-gym tasks as prompt records, and their own verifiers as a reward.

A source named `reasoning_gym:NAME?key=value&...` stands wherever a prompt file does (`rollout.prompts`,
`eval.prompts`, `data.train`, `humanline eval --prompts`, `data check`, `inspect data`): `read_source` turns it
into rows as a JSONL file of prompt records would hold them. Keys (all optional):

    size      training prompts (default 1000)
    held_out  held-out prompts generated after them (default 100)
    seed      the generator's seed (default 0)
    split     train (default) | held_out
    format    tag (default): "<answer>...</answer>" | boxed: "\\boxed{...}"; the instruction appended to each question
    extract   strict (default): only an answer in the asked format counts | lenient: else the number after the
              first "=", else the last number in the completion (for models too small to follow the format)
    any other key: a setting of the task's config (e.g. min_digits=2); a value is read as JSON when it parses
    (2, true, ["+","-"]), else as a string.

Disjoint by construction: one dataset of `size + held_out` entries is generated with `seed`; the training split
is entries `0 .. size-1`, the held-out split the rest less every entry whose question is also a training one
(small tasks repeat questions). The two splits of one spec differ only in `split`, so a recipe names the same
string twice, once with `&split=held_out`.

Each row carries the task, the dataset's config and the entry's index (`metadata.reasoning_gym`): the reward
regenerates the entry from them and scores with the task's `score_answer(answer, entry)`. Entries are
regenerated rather than stored because a JSON copy of some entries loses types their verifier needs (tuples
in arc_agi's grids). The answer is taken from the completion leniently: the last `<answer>...</answer>`, else
the last `\\boxed{...}`, else none (score 0).
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from humanline.errors import UserError

PREFIX = "reasoning_gym:"
INSTRUCTIONS = {"tag": "Put your final answer inside <answer></answer>.",
                "boxed": "Put your final answer inside \\boxed{}."}
RESERVED = ("size", "held_out", "seed", "split", "format", "extract")
EXTRACTIONS = ("strict", "lenient")
SPLITS = ("train", "held_out")
MAX_ENTRIES = 1_000_000  # size + held_out
METADATA_KEY = "reasoning_gym"


@dataclass(frozen=True)
class TaskSpec:
    """A parsed `reasoning_gym:NAME?...` source: the task, its own settings, and ours."""

    task: str
    settings: dict = field(default_factory=dict)  # the task's config fields
    size: int = 1000
    held_out: int = 100
    seed: int = 0
    split: str = "train"
    format: str = "tag"
    extract: str = "strict"

    def config(self) -> dict:
        """The keyword arguments of `reasoning_gym.create_dataset` (one dataset for both splits)."""
        return {**self.settings, "seed": self.seed, "size": self.size + self.held_out}


def is_task_source(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _integer(source: str, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{source}: '{key}' expected an integer in [{low}, {high}], got {value!r}")
    return value


def parse_task_source(source: str) -> TaskSpec:
    """The spec of `reasoning_gym:NAME?key=value&...` (syntax and our keys only; the task is checked on load)."""
    body = source[len(PREFIX):] if is_task_source(source) else source
    name, _, query = body.partition("?")
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise UserError(f"{source}: expected reasoning_gym:NAME?key=value&... with a task name such as chain_sum")
    values: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, eq, text = part.partition("=")
        if not eq or not key:
            raise UserError(f"{source}: '{part}' expected key=value (e.g. size=500)")
        if key in values:
            raise UserError(f"{source}: '{key}' given twice")
        values[key] = _value(text) if key not in ("split", "format", "extract") else text
    spec = {k: values.pop(k) for k in RESERVED if k in values}
    for key, high in (("size", MAX_ENTRIES), ("held_out", MAX_ENTRIES), ("seed", 2**63 - 1)):
        if key in spec:
            spec[key] = _integer(source, key, spec[key], 1 if key == "size" else 0, high)
    if spec.get("split", "train") not in SPLITS:
        raise UserError(f"{source}: 'split' expected one of {', '.join(SPLITS)}, got {spec['split']!r}")
    if spec.get("format", "tag") not in INSTRUCTIONS:
        raise UserError(f"{source}: 'format' expected one of {', '.join(INSTRUCTIONS)}, got {spec['format']!r}")
    if spec.get("extract", "strict") not in EXTRACTIONS:
        raise UserError(f"{source}: 'extract' expected one of {', '.join(EXTRACTIONS)}, got {spec['extract']!r}")
    parsed = TaskSpec(name, values, **spec)
    if parsed.size + parsed.held_out > MAX_ENTRIES:
        raise UserError(f"{source}: size + held_out expected at most {MAX_ENTRIES}")
    if parsed.split == "held_out" and parsed.held_out == 0:
        raise UserError(f"{source}: split=held_out needs held_out >= 1")
    return parsed


def import_reasoning_gym(source: str = "reasoning_gym"):
    try:  # deferred: an optional dependency, and a second or two to import
        import reasoning_gym
    except ImportError as exc:
        raise UserError(f"{source}: needs reasoning-gym: pip install 'humanline[reasoning]' ({exc})") from exc
    return reasoning_gym


def _check_task(source: str, spec: TaskSpec) -> None:
    """Unknown task or setting: one line that names it and lists what is allowed."""
    import dataclasses

    import_reasoning_gym(source)
    from reasoning_gym.factory import DATASETS  # deferred: the optional dependency

    if spec.task not in DATASETS:
        close = difflib.get_close_matches(spec.task, DATASETS, n=5, cutoff=0.5)
        hint = f"close names: {', '.join(close)}" if close else f"{len(DATASETS)} tasks, e.g. chain_sum, leg_counting"
        raise UserError(f"{source}: unknown reasoning-gym task '{spec.task}' ({hint})")
    own = [f.name for f in dataclasses.fields(DATASETS[spec.task][1]) if f.name not in ("seed", "size")]
    unknown = sorted(set(spec.settings) - set(own))
    if unknown:
        raise UserError(f"{source}: unknown setting '{unknown[0]}' of task {spec.task}; expected one of "
                        f"{', '.join(RESERVED)} or the task's own: {', '.join(own) or 'none'}")


@functools.lru_cache(maxsize=16)
def _dataset(task: str, config_json: str):
    """The task's dataset for one config (cached: the reward scores many completions of one dataset)."""
    return import_reasoning_gym().create_dataset(task, **json.loads(config_json))


def dataset(source: str, task: str, config: dict):
    try:
        return _dataset(task, json.dumps(config, sort_keys=True))
    except UserError:
        raise
    except Exception as exc:  # the task's own validation: AssertionError, ValueError, TypeError
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{source}: task {task} refuses these settings: {reason}") from exc


def task_rows(source: str) -> list[dict]:
    """The rows (prompt, id, answer, metadata) of the spec's split, as a prompt file would hold them."""
    spec = parse_task_source(source)
    _check_task(source, spec)
    config = spec.config()
    data = dataset(source, spec.task, config)
    train = range(spec.size)
    if spec.split == "train":
        indices = list(train)
    else:
        seen = {data[i]["question"] for i in train}
        indices = [i for i in range(spec.size, spec.size + spec.held_out) if data[i]["question"] not in seen]
    rows = []
    for i in indices:
        entry = data[i]
        rows.append({"id": f"{spec.task}-{spec.seed}-{i}",
                     "prompt": f"{entry['question']}\n\n{INSTRUCTIONS[spec.format]}",
                     "answer": None if entry["answer"] is None else str(entry["answer"]),
                     "metadata": {METADATA_KEY: {"task": spec.task, "config": config, "index": i,
                                                 "format": spec.format, "extract": spec.extract}}})
    return rows


def _boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


NUMBER = r"-?\d+(?:\.\d+)?"


def extract_answer(completion: str, extract: str = "strict") -> str | None:
    """The last `<answer>...</answer>`, else the last `\\boxed{...}`, else None (`strict`); `lenient` then
    tries the number right after the first "=" ("4 + 5 = 9, so ..." gives 9), then the last number in the text.

    Lenient extraction measures what a model too small to follow the answer format knows (SmolLM2-135M puts
    the right number in the asked tag about 1 time in 100 on 1-digit sums, and states it about 30 times in 100:
    lab/log.md); it is the reproduction's setting, and strict stays the default."""
    tags = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)
    strict = tags[-1].strip() if tags else _boxed(completion)
    if strict is not None or extract == "strict":
        return strict
    after_equals = re.search(rf"=\s*({NUMBER})", completion)
    if after_equals:
        return after_equals.group(1)
    numbers = re.findall(NUMBER, completion)
    return numbers[-1] if numbers else None


def answer_completion(answer: str, format: str = "tag") -> str:
    """`answer` written in the answer format the prompt asks for."""
    return f"<answer>{answer}</answer>" if format == "tag" else f"\\boxed{{{answer}}}"


def entry_of(info: Any) -> dict:
    """The task entry a row's `metadata.reasoning_gym` names (regenerated from its task, config and index)."""
    if not isinstance(info, dict) or not {"task", "config", "index"} <= set(info):
        raise ValueError("reward reasoning_gym needs prompts from a reasoning_gym: source (metadata "
                         f"'{METADATA_KEY}' with task, config and index), got {info!r:.80}")
    return dataset(f"{PREFIX}{info['task']}", info["task"], info["config"])[info["index"]]


def score_completion(completion: str, info: Any, prompt_text: str | None = None) -> float:
    """The task's own score of the answer extracted from `completion` (0.0 when there is none)."""
    entry = entry_of(info)
    if prompt_text is not None and entry["question"] not in prompt_text:
        raise ValueError(f"the prompt is not the question of {info['task']} entry {info['index']} (made by another "
                         f"reasoning-gym version, or edited?)")
    answer = extract_answer(completion, info.get("extract", "strict"))
    if answer is None:
        return 0.0
    dataset_ = dataset(f"{PREFIX}{info['task']}", info["task"], info["config"])
    return float(dataset_.score_answer(answer=answer, entry=entry))
