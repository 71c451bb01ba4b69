"""Evaluation on held-out prompts: reward, pass@k, win rate against a baseline, lengths, and the generations.

`evaluate_generations` samples from a model and summarises the samples; the trainer calls it every
`train.eval_every` steps and `humanline eval` (humanline.commands.evaluate) calls it once and writes `eval.json`.
`is_verifiable` is the one rule for when pass@k is reported.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from humanline.data import reasoning_gym
from humanline.errors import UserError
from humanline.files import write_json
from humanline.model.loading import BUILT_IN, load_model, load_tokenizer, model_config_for
from humanline.sampling.reward_scoring import RewardFn, score_completions
from humanline.sampling.rollout import GenerationConfig, HFGenerateBackend, RolloutBackend, generate

WILSON_Z = 1.959963984540054  # two-sided 95%
# scores are 1.0 (correct) or below (reasoning_gym: some tasks give partial credit, which counts as wrong)
VERIFIABLE_REWARDS = ("math_verify", "exact_match", "reasoning_gym")


def is_verifiable(reward_spec: Any) -> bool:
    """Does this reward spec measure correctness, so that pass@1 / pass@k mean something?

    True for the names in VERIFIABLE_REWARDS, alone or as `{type: NAME}` at weight 1 (a reward model, a
    custom function or a weighted sum scores something other than right/wrong). The one rule for `humanline
    eval` and the evaluation during training.
    """
    if isinstance(reward_spec, dict):
        extra = set(reward_spec) - {"type", "weight"}
        return not extra and reward_spec.get("weight", 1.0) == 1.0 and is_verifiable(reward_spec.get("type"))
    return isinstance(reward_spec, str) and reward_spec in VERIFIABLE_REWARDS


def default_reward_spec(records: Sequence[Any]) -> str | None:
    """The reward of `humanline eval` without --reward: reasoning_gym for a reasoning-gym task's prompts,
    math_verify when every prompt has an answer."""
    if records and all(reasoning_gym.METADATA_KEY in (_field(r, "metadata") or {}) for r in records):
        return "reasoning_gym"
    return "math_verify" if all(_field(r, "answer") is not None for r in records) else None


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021).

    Evaluated as 1 - prod_{i=n-c+1}^{n} (1 - k/i) to avoid huge binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def wilson_interval(p: float, n: int, z: float = WILSON_Z) -> tuple[float, float]:
    """Wilson score interval for a proportion p observed over n trials (always contains p)."""
    if n <= 0:
        return (0.0, 1.0)
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, min(centre - half, p)), min(1.0, max(centre + half, p)))


def _stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean, population std, min, max and count (None for an empty list)."""
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "count": 0}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "count": len(values)}


def _field(record: Any, name: str, default: Any = None) -> Any:
    """Duck-typed access to prompt records (data-layer dataclasses, or plain dicts)."""
    if isinstance(record, dict):
        return record.get(name, default)
    return getattr(record, name, default)


def _metadata(records: Sequence[Any], repeat: int) -> dict[str, list[Any]]:
    """Reward metadata aligned with the flat completion list: `answer` plus every record metadata key."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(_field(r, "metadata", None) or {}))
    keys.pop("answer", None)
    out: dict[str, list[Any]] = {"answer": [_field(r, "answer") for r in records for _ in range(repeat)]}
    for key in keys:
        if key not in ("prompts", "completions"):  # would collide with the protocol's positional names
            out[key] = [(_field(r, "metadata", None) or {}).get(key) for r in records for _ in range(repeat)]
    return out


def _score(reward_fn, records, texts, on_error) -> tuple[list[list[float | None]], list[str], float]:
    """Rewards per prompt (len(texts[i]) each), failure messages, and seconds spent."""
    start = time.perf_counter()
    n = len(texts[0])
    flat_prompts = [_field(r, "prompt") for r in records for _ in range(n)]
    flat_ids = [_field(r, "prompt_id") for r in records for _ in range(n)]
    flat_texts = [t for group in texts for t in group]
    result = score_completions(reward_fn, flat_prompts, flat_texts, _metadata(records, n), flat_ids, on_error=on_error)
    grouped = [result.scores[i * n : (i + 1) * n] for i in range(len(records))]
    return grouped, result.failures, time.perf_counter() - start


def _pass_metrics(scores: list[list[float | None]], k: int, threshold: float) -> dict[str, float]:
    """pass@1 (with its standard error over prompts) and pass@k; a failed score counts as incorrect."""
    n = len(scores[0])
    correct = [sum(1 for s in group if s is not None and s >= threshold) for group in scores]
    per_prompt_p1 = [c / n for c in correct]
    p1 = sum(per_prompt_p1) / len(scores)
    var = sum((p - p1) ** 2 for p in per_prompt_p1) / max(len(scores) - 1, 1)
    out = {"pass@1": p1, "pass@1_stderr": math.sqrt(var / len(scores)), "success_threshold": threshold}
    out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(scores)
    return out


def _win_rate(scores: list[list[float | None]], baseline: list[float | None]) -> dict[str, Any]:
    """Mean over prompts of the fraction of samples beating the baseline (ties half), with a Wilson 95% CI.

    The interval treats each prompt as one trial, which is conservative when n > 1 samples share a prompt.
    """
    wins = ties = losses = 0
    per_prompt: list[float] = []
    for group, b in zip(scores, baseline):
        valid = [s for s in group if s is not None]
        if b is None or not valid:
            continue
        w, t = sum(s > b for s in valid), sum(s == b for s in valid)
        wins, ties, losses = wins + w, ties + t, losses + len(valid) - w - t
        per_prompt.append((w + 0.5 * t) / len(valid))
    rate = sum(per_prompt) / len(per_prompt) if per_prompt else None
    low, high = wilson_interval(rate, len(per_prompt)) if per_prompt else (None, None)
    return {
        "rate": rate, "ci95_low": low, "ci95_high": high, "num_prompts": len(per_prompt),
        "wins": wins, "ties": ties, "losses": losses, "method": "wilson over prompts, ties count half",
    }


def evaluate_generations(
    model: Any,
    tokenizer: Any,
    records: Sequence[Any],
    reward_fn: RewardFn | None,
    *,
    gen: GenerationConfig,
    k: int = 1,
    baseline_texts: list[str] | None = None,
    verifiable: bool = False,
    success_threshold: float = 1.0,
    on_error: str = "fail",
    backend: RolloutBackend | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Sample gen.n completions per record and summarise them (a JSON-ready dict, see `write_eval`).

    records: prompt records (attributes prompt, prompt_id, answer, metadata). reward_fn: None skips reward,
    pass@k and win rate. verifiable: the reward measures correctness; a sample is correct when its score is
    >= success_threshold (1.0 suits math_verify / exact_match) and pass@1 / pass@k are reported (needs
    gen.n >= k). baseline_texts: one baseline completion per record, scored by the same reward for the
    win rate. Reproducible for a fixed gen.seed (timings aside). progress: a bar of the prompts sampled (stderr;
    the caller asks for it on a terminal only).
    """
    records = list(records)
    _check_request(records, gen, k, verifiable, baseline_texts)
    with _progress(backend, len(records), gen.n, progress) as backend:
        rollout = generate(model, tokenizer, [_field(r, "prompt") for r in records], gen, backend)
    result: dict[str, Any] = {"num_prompts": len(records), "n": gen.n, "k": k, "generation": asdict(gen)}
    scores: list[list[float | None]] = [[None] * gen.n for _ in records]
    baseline_scores: list[float | None] = []
    failures: list[str] = []
    reward_seconds = 0.0
    if reward_fn is not None:
        scores, failures, reward_seconds = _score(reward_fn, records, rollout.texts, on_error)
        valid = [s for group in scores for s in group if s is not None]
        result["reward"] = _stats(valid) | {"num_failed": len(records) * gen.n - len(valid)}
        if verifiable:
            result.update(_pass_metrics(scores, k, success_threshold))
        if baseline_texts is not None:
            grouped, base_failures, seconds = _score(reward_fn, records, [[t] for t in baseline_texts], on_error)
            baseline_scores, reward_seconds = [g[0] for g in grouped], reward_seconds + seconds
            failures += [f"baseline: {m}" for m in base_failures]
            result["win_rate"] = _win_rate(scores, baseline_scores)
    result["length"] = _lengths(rollout)
    result["timing"] = {
        "generation_seconds": rollout.seconds, "reward_seconds": reward_seconds,
        "generated_tokens": rollout.num_generated_tokens,
    }
    result["failures"] = failures
    result["generations"] = _generations(records, rollout.texts, scores, baseline_texts, baseline_scores)
    return result


@contextlib.contextmanager
def _progress(backend: RolloutBackend | None, prompts: int, n: int, shown: bool):
    """The backend to sample with: with `shown` (and no backend of the caller's), one that moves a progress bar of
    the prompts sampled (stderr), closed after."""
    if not shown or backend is not None:
        yield backend
        return
    from tqdm.auto import tqdm

    with tqdm(total=prompts, desc=f"eval: sampling {n} per prompt", unit="prompt", dynamic_ncols=True) as bar:
        yield HFGenerateBackend(progress=bar.update)


def _check_request(records, gen: GenerationConfig, k: int, verifiable: bool, baseline_texts) -> None:
    """Refuse a request that cannot be answered, before anything is generated."""
    if not records:
        raise UserError("eval: no prompt records to evaluate")
    if gen.temperature == 0 and gen.n > 1:
        raise UserError(f"eval: temperature 0 is greedy decoding, one completion per prompt; got n={gen.n}")
    if verifiable and not 1 <= k <= gen.n:
        raise UserError(f"eval: pass@{k} needs k >= 1 and at least k samples per prompt (n={gen.n})")
    if baseline_texts is not None and len(baseline_texts) != len(records):
        raise UserError(f"eval: {len(baseline_texts)} baseline completions for {len(records)} prompts")


def _lengths(rollout) -> dict[str, Any]:
    """Token and character lengths of every sample, and why each one ended."""
    lengths = [len(c) for group in rollout.completion_ids for c in group]
    chars = [len(t) for group in rollout.texts for t in group]
    reasons = [r for group in rollout.finish_reasons for r in group]
    return {"tokens": _stats(lengths), "chars": _stats(chars),
            "finish_reasons": {why: reasons.count(why) for why in ("eos", "stop", "length")}}


def _generations(records, texts, scores, baseline_texts, baseline_scores) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(records):
        item = {"prompt_id": _field(r, "prompt_id"), "prompt": _field(r, "prompt")}
        if _field(r, "answer") is not None:
            item["answer"] = _field(r, "answer")
        item |= {"completions": texts[i], "rewards": scores[i]}
        if baseline_texts is not None:
            item |= {"baseline": baseline_texts[i], "baseline_reward": baseline_scores[i] if baseline_scores else None}
        out.append(item)
    return out


def write_eval(result: dict[str, Any], path: str | Path) -> Path:
    """Write `result` as indented, strict JSON atomically (`humanline.files.write_json`)."""
    return write_json(path, result, allow_nan=False)


# ------------------------------------------------------------------------- models and baselines from files


def load_eval_model(path: str) -> tuple[Any, Any]:
    """(model, tokenizer) of any model name (`humanline.model.loading.model_config_for`: a folder, a run directory's
    final model, a hub name, an alias such as smollm2, a GGUF file), in eval mode, on the GPU if any."""
    import torch

    p = Path(path)
    if path not in BUILT_IN and p.is_dir() and not (p / "config.json").is_file() and \
            not (p / "final" / "config.json").is_file() and not (p / "run_info.json").is_file():  # a run: said below
        raise UserError(f"{path}: neither a model folder (no config.json) nor a run directory (no final/config.json)")
    cfg = model_config_for(path)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer).eval()
    return model.to("cuda" if torch.cuda.is_available() else "cpu"), tokenizer


def baseline_from_model(path: str, records: Sequence[Any], gen: GenerationConfig) -> list[str]:
    """One completion per record sampled from another model (a folder or run directory), with `gen` at n = 1."""
    model, tokenizer = load_eval_model(path)
    one = GenerationConfig(**(asdict(gen) | {"n": 1}))
    rollout = generate(model, tokenizer, [_field(r, "prompt") for r in records], one)
    return [group[0] for group in rollout.texts]


def load_baseline_texts(path: str, records: Sequence[Any]) -> list[str]:
    """One baseline completion per record, matched by prompt id, from a previous eval.json (its first
    completion per prompt) or a JSONL/JSON list of {"prompt_id": ..., "completion" or "output": ...}."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--baseline: cannot read '{path}' ({getattr(exc, 'strerror', None) or exc})") from exc
    try:
        data = json.loads(text)
        rows = data["generations"] if isinstance(data, dict) and "generations" in data else data
        numbered = list(enumerate(rows if isinstance(rows, list) else [rows], start=1))
        unit = "item"
    except json.JSONDecodeError:
        numbered, unit = [], "line"
        for line_no, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    numbered.append((line_no, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise UserError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
    by_id: dict[str, str] = {}
    for where, row in numbered:
        if not isinstance(row, dict) or "prompt_id" not in row:
            raise UserError(f"{path} {unit} {where}: field 'prompt_id': expected an object with a prompt_id")
        completion = row["completions"][0] if row.get("completions") else row.get("completion", row.get("output"))
        if not isinstance(completion, str):
            raise UserError(f"{path} {unit} {where}: field 'completion': expected a string (or 'output')")
        by_id[str(row["prompt_id"])] = completion
    missing = [str(_field(r, "prompt_id")) for r in records if str(_field(r, "prompt_id")) not in by_id]
    if missing:
        raise UserError(f"{path}: no baseline completion for prompt id {missing[0]!r} ({len(missing)} missing)")
    return [by_id[str(_field(r, "prompt_id"))] for r in records]
