"""The reward kinds, behind one protocol: math-verify, exact match, regex, a reasoning-gym task's verifier, a
reward model, and weighted sums of rewards.

Protocol: `fn(prompts, completions, **metadata) -> list[float]`, one score per completion. `prompts[i]` is the
prompt that produced `completions[i]` (a string, or a list of chat messages for chat data), `completions[i]`
is the completion text, and every metadata value is a list aligned with them (for example `answer=[...]`
with the gold answers of verifiable tasks). Implementations take `**metadata` and ignore what they do not use.

`REWARD_TYPES` names the kinds a config may ask for; `humanline.sampling.reward_spec.build_reward` reads a config
value (the grammar of reward specs) into one; `humanline.sampling.reward_scoring.score_completions` calls one and
turns exceptions, non-finite scores and wrong lengths into errors (or skips) that name the prompt id.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from humanline.data import reasoning_gym
from humanline.data.records import prompt_text
from humanline.errors import UserError, short_repr
from humanline.sampling.reward_scoring import RewardFn, one_line, reward_name


class _GoldAnswer:
    """A reward that scores each completion against its gold answer (metadata `answer`, one per completion):
    `score(completion, gold)`, which a subclass defines; `kind` names it in errors."""

    kind = ""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **metadata: Any) -> list[float]:
        answers = metadata.get("answer")
        if answers is None or len(answers) != len(completions):
            raise ValueError(f"{self.kind} needs metadata 'answer' with one gold answer per completion")
        if any(gold is None for gold in answers):
            raise ValueError(f"{self.kind}: the gold answer is missing (null)")
        return [self.score(c, g) for c, g in zip(completions, answers)]


class MathVerifyReward(_GoldAnswer):
    """1.0 when the completion's final answer equals the gold `answer` under `math-verify`, else 0.0.

    The prediction is the content of the last `<answer>...</answer>` tag when there is one, otherwise
    math-verify's extraction with `\\boxed{}` first. With `require_tags=True` only those two places count
    (no free-text fallback). Anything that fails to parse scores 0.0; a missing gold answer is an error.
    """

    kind = "math_verify"

    def __init__(self, require_tags: bool = False):
        mv = _import_math_verify()
        self.require_tags = require_tags
        self._mv = mv
        self._latex = mv.LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=not require_tags)
        self._expr = mv.ExprExtractionConfig()
        self._gold_cache: dict[str, list[Any]] = {}  # a handful of golds are scored n times each per step

    def score(self, completion: str, gold: Any) -> float:
        gold_parsed = self._parse_gold(str(gold))
        pred = self._parse_prediction(completion)
        if not gold_parsed or not pred:
            return 0.0
        try:
            return 1.0 if self._mv.verify(gold_parsed, pred, timeout_seconds=_timeout()) else 0.0
        except Exception:  # sympy can fail on odd expressions: a wrong answer, not a crashed run
            return 0.0

    def _parse(self, text: str, configs: list[Any]) -> list[Any]:
        try:
            return self._mv.parse(text, extraction_config=configs, parsing_timeout=_timeout())
        except Exception:
            return []

    def _parse_gold(self, gold: str) -> list[Any]:
        if gold not in self._gold_cache:
            if len(self._gold_cache) > 4096:
                self._gold_cache.clear()
            # bare gold LaTeX such as `x^2` only parses inside math delimiters
            wrapped = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
            configs = [self._latex, self._expr]
            self._gold_cache[gold] = self._parse(wrapped, configs) or self._parse(gold, configs)
        return self._gold_cache[gold]

    def _parse_prediction(self, completion: str) -> list[Any]:
        tags = re.findall(r"<answer>(.*?)</answer>", completion, flags=re.DOTALL)
        if tags:
            inner = tags[-1].strip()
            anywhere = self._mv.LatexExtractionConfig(boxed_match_priority=0)
            return self._parse(inner, [anywhere, self._expr]) or self._parse(f"${inner}$", [anywhere])
        if self.require_tags:
            return self._parse(completion, [self._latex]) if "\\boxed" in completion else []
        return self._parse(completion, [self._latex, self._expr])


def _import_math_verify():
    try:
        import math_verify
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise UserError(f"reward 'math_verify' needs math-verify: pip install 'humanline[math]' ({exc})") from exc
    return math_verify


def _timeout() -> int | None:
    """math-verify's timeouts use SIGALRM, which only works on the main thread; elsewhere run without one."""
    return 5 if threading.current_thread() is threading.main_thread() else None


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


@dataclass
class ExactMatchReward(_GoldAnswer):
    """1.0 when the completion equals the gold `answer`, else 0.0.

    strip: compare after collapsing whitespace runs to one space and trimming the ends.
    final_number: also accept a completion whose last number equals the gold answer's number
    (thousands separators ignored), so "14 + 26 = 40" matches gold "40".
    """

    strip: bool = True
    final_number: bool = False
    kind = "exact_match"  # not a field: no annotation

    def score(self, completion: str, gold: Any) -> float:
        norm = (lambda s: " ".join(s.split())) if self.strip else (lambda s: s)
        if norm(completion) == norm(str(gold)):
            return 1.0
        if self.final_number:
            want, got = _last_number(str(gold)), _last_number(completion)
            return 1.0 if want is not None and got is not None and math.isclose(want, got) else 0.0
        return 0.0


@dataclass
class RegexReward:
    """`score` when `pattern` is found in the completion (re.search, DOTALL), else 0.0: a format reward.

    Anchor with ^...$ to demand the whole completion match, e.g. r"^<think>.*</think>\\s*<answer>.*</answer>$".
    """

    pattern: str
    score: float = 1.0
    _regex: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._regex = re.compile(self.pattern, flags=re.DOTALL)
        except re.error as exc:
            raise UserError(f"regex reward pattern {short_repr(self.pattern)}: not a valid regular expression "
                            f"({exc})") from exc

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **metadata: Any) -> list[float]:
        return [float(self.score) if self._regex.search(c) else 0.0 for c in completions]


class ReasoningGymReward:
    """A reasoning-gym task's own verifier, `score_answer(answer, entry)`, on the answer extracted from each
    completion (the last `<answer>...</answer>`, else the last `\\boxed{...}`; none scores 0.0).

    The entry comes from the prompt's metadata (`reasoning_gym: {task, config, index}`, written by the
    `reasoning_gym:NAME` source, humanline.data.reasoning_gym), so one reward serves every task.
    """

    def __init__(self) -> None:
        reasoning_gym.import_reasoning_gym("reward reasoning_gym")

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **metadata: Any) -> list[float]:
        infos = metadata.get(reasoning_gym.METADATA_KEY)
        if infos is None or len(infos) != len(completions):
            raise ValueError("reasoning_gym needs prompts from a reasoning_gym:NAME source (metadata "
                             f"'{reasoning_gym.METADATA_KEY}' on every prompt)")
        return [reasoning_gym.score_completion(c, info, prompt_text(p))
                for p, c, info in zip(prompts, completions, infos)]


def _check_reward_model_path(path: str) -> None:
    """A reward model named by a path that is no folder fails here in one line of ours (the hub library would
    take it for a malformed hub id: "Repo id must use alphanumeric chars")."""
    local = Path(path).expanduser()
    if local.is_dir():
        return
    if local.exists():
        raise UserError(f"reward_model '{path}': a file, not a folder (expected a model folder with config.json)")
    if not path or path.startswith((".", "/", "~")) or path.count("/") > 1 or "\\" in path:
        raise UserError(f"reward_model '{path}': no such folder (expected a local model folder with config.json, or "
                        f"a hub id owner/name)")


class RewardModelReward:
    """The scalar logit of a `transformers` sequence-classification reward model, on prompt + completion.

    The text is built with the reward model's own tokenizer and chat template (user prompt, assistant
    completion); without a template, prompt and completion are concatenated. Scores in batches of
    `batch_size`, without grad, on `device` (default: CUDA when available, else CPU).
    """

    def __init__(self, path: str, batch_size: int = 16, device: str | None = None, label_index: int | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if batch_size < 1:
            raise UserError(f"reward_model batch_size: expected an integer >= 1, got {short_repr(batch_size)}")
        _check_reward_model_path(path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"reward_model '{path}': cannot load a sequence-classification model ({one_line(exc)})"
            ) from exc
        num_labels = self.model.config.num_labels
        if label_index is None and num_labels != 1:
            raise UserError(f"reward_model '{path}': has {num_labels} labels; set label_index to pick the score")
        self.label_index = label_index or 0
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:  # HF needs it to find each row's last token
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device).eval()
        self.batch_size, self.path = batch_size, path

    def _text(self, prompt: Any, completion: str) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            return (prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)) + completion
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        messages.append({"role": "assistant", "content": completion})
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **metadata: Any) -> list[float]:
        import torch

        texts = [self._text(p, c) for p, c in zip(prompts, completions)]
        scores: list[float] = []
        for b in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[b : b + self.batch_size], padding=True, truncation=True, add_special_tokens=False,
                return_tensors="pt",
            ).to(self.device)
            with torch.no_grad():
                logits = self.model(**enc).logits
            scores.extend(logits[:, self.label_index].float().tolist())
        return scores


class WeightedSum:
    """sum_i weight_i * fn_i(prompts, completions, **metadata), per completion."""

    def __init__(self, terms: Sequence[tuple[float, RewardFn]]):
        if not terms:
            raise UserError("reward: a weighted sum needs at least one term")
        for weight, fn in terms:
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise UserError(f"reward weight: expected a finite number, got {short_repr(weight)}")
            if not callable(fn):
                raise UserError(f"reward: weighted-sum term {short_repr(fn)} is not callable")
        self.terms = [(float(w), fn) for w, fn in terms]

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **metadata: Any) -> list[float]:
        total = [0.0] * len(completions)
        for weight, fn in self.terms:
            scores = list(fn(prompts, completions, **metadata))
            if len(scores) != len(completions):
                raise ValueError(f"{reward_name(fn)} returned {len(scores)} scores for {len(completions)} completions")
            total = [t + weight * float(s) for t, s in zip(total, scores)]
        return total


REWARD_TYPES: dict[str, Callable[..., RewardFn]] = {
    "math_verify": MathVerifyReward,
    "exact_match": ExactMatchReward,
    "regex": RegexReward,
    "reasoning_gym": ReasoningGymReward,
    "reward_model": RewardModelReward,
}
