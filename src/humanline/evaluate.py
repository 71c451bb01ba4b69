"""Evaluation on held-out prompts: reward, pass@k, win rate against a baseline, lengths, and the generations.

`evaluate` is a plain function so the trainer can call it every N steps; `add_eval_parser` registers the
`humanline eval MODEL_OR_RUN --prompts FILE ...` subcommand that writes `eval.json`.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from humanline.errors import UserError
from humanline.rewards import RewardFn, build_reward, score_completions
from humanline.rollout import GenerationConfig, RolloutBackend, generate

WILSON_Z = 1.959963984540054  # two-sided 95%


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


def evaluate(
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
) -> dict[str, Any]:
    """Sample gen.n completions per record and summarise them (a JSON-ready dict, see `write_eval`).

    records: prompt records (attributes prompt, prompt_id, answer, metadata). reward_fn: None skips reward,
    pass@k and win rate. verifiable: the reward measures correctness; a sample is correct when its score is
    >= success_threshold (1.0 suits math_verify / exact_match) and pass@1 / pass@k are reported (needs
    gen.n >= k). baseline_texts: one baseline completion per record, scored by the same reward for the
    win rate. Reproducible for a fixed gen.seed (timings aside).
    """
    records = list(records)
    if not records:
        raise UserError("eval: no prompt records to evaluate")
    if gen.temperature == 0 and gen.n > 1:
        raise UserError(f"eval: temperature 0 is greedy decoding, one completion per prompt; got n={gen.n}")
    if verifiable and not 1 <= k <= gen.n:
        raise UserError(f"eval: pass@{k} needs k >= 1 and at least k samples per prompt (n={gen.n})")
    if baseline_texts is not None and len(baseline_texts) != len(records):
        raise UserError(f"eval: {len(baseline_texts)} baseline completions for {len(records)} prompts")
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
    lengths = [len(c) for group in rollout.completion_ids for c in group]
    chars = [len(t) for group in rollout.texts for t in group]
    reasons = [r for group in rollout.finish_reasons for r in group]
    result["length"] = {
        "tokens": _stats(lengths), "chars": _stats(chars),
        "finish_reasons": {why: reasons.count(why) for why in ("eos", "stop", "length")},
    }
    result["timing"] = {
        "generation_seconds": rollout.seconds, "reward_seconds": reward_seconds,
        "generated_tokens": rollout.num_generated_tokens,
    }
    result["failures"] = failures
    result["generations"] = _generations(records, rollout.texts, scores, baseline_texts, baseline_scores)
    return result


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
    """Write `result` as indented JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, ensure_ascii=False, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------------------------- CLI


def resolve_model_dir(path: str) -> str:
    """A run directory stands for its final model (RUN/final); a model folder or hub name is used as is."""
    p = Path(path)
    if (p / "final" / "config.json").is_file():
        return str(p / "final")
    if p.is_dir() and not (p / "config.json").is_file():
        raise UserError(f"{path}: neither a model folder (no config.json) nor a run directory (no final/config.json)")
    return path


def _load_model(path: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_dir(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot load a causal LM and tokenizer ({' '.join(str(exc).split())})") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to("cuda" if torch.cuda.is_available() else "cpu"), tokenizer


def _load_prompts(path: str) -> list[Any]:
    from humanline.data.load import load_records

    return list(load_records(path, kind="prompts").records)


def load_baseline_texts(path: str, records: Sequence[Any]) -> list[str]:
    """One baseline completion per record, matched by prompt id, from a previous eval.json (its first
    completion per prompt) or a JSONL/JSON list of {"prompt_id": ..., "completion" or "output": ...}."""
    text = Path(path).read_text(encoding="utf-8")
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


def add_eval_parser(subparsers: Any) -> Any:
    """Register `eval MODEL_OR_RUN --prompts FILE ...` on an argparse subparsers object."""
    p = subparsers.add_parser("eval", help="generate on held-out prompts and write eval.json")
    p.add_argument("model", metavar="MODEL_OR_RUN", help="a model folder, or a run directory (uses RUN/final)")
    p.add_argument("--prompts", required=True, help="prompt records file (prompt, prompt_id, optional answer)")
    p.add_argument("--reward", default=None,
                   help="reward spec: math_verify, exact_match, reward_model:PATH, module:function "
                   "(default: math_verify when every prompt has an answer, else no reward)")
    p.add_argument("--baseline", default=None,
                   help="baseline completions (eval.json or JSONL with prompt_id + completion) or a model folder/run")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (default: k)")
    p.add_argument("--k", type=int, default=1, help="k of pass@k for verifiable rewards")
    p.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens)
    p.add_argument("--temperature", type=float, default=GenerationConfig.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=GenerationConfig.top_p)
    p.add_argument("--batch-size", type=int, default=GenerationConfig.batch_size, help="prompts per generate call")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verifiable", action="store_true",
                   help="report pass@1/pass@k (implied by math_verify and exact_match rewards)")
    p.add_argument("--success-threshold", type=float, default=1.0, help="score counted as correct for pass@k")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail", help="when a reward fails on an item")
    p.add_argument("--output", default=None, help="where to write eval.json (default: MODEL_OR_RUN/eval.json)")
    p.set_defaults(func=run_eval)
    return p


# GenerationConfig field -> the flag that sets it, so that an error names what the user typed
_FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p", "n": "--n",
          "stop": "--stop", "batch_size": "--batch-size", "seed": "--seed"}


def _generation_config(args: Any) -> GenerationConfig:
    """The sampling settings from the command line; errors name the flag (`--n`), not the internal field."""
    n_flag = "--n" if args.n is not None else "--k (--n defaults to it)"
    n = args.n if args.n is not None else args.k
    if args.temperature == 0 and n > 1:
        raise UserError(f"--temperature: expected > 0 with {n_flag} = {n} (temperature 0 is greedy decoding: one "
                        f"completion per prompt; pass --n 1)")
    if args.k < 1:
        raise UserError(f"--k: expected an integer >= 1, got {args.k}")
    try:
        return GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                n=n, stop=list(args.stop), batch_size=args.batch_size, seed=args.seed)
    except UserError as exc:
        text = str(exc)
        for name, flag in _FLAGS.items():
            if text.startswith(f"generation.{name}:"):
                flag = n_flag if name == "n" else flag
                raise UserError(flag + text[len(f"generation.{name}"):]) from None
        raise


def run_eval(args: Any) -> int:
    """The `humanline eval` command: returns the process exit code."""
    gen = _generation_config(args)  # flags first: a typo should not wait for the prompts or the model
    records = _load_prompts(args.prompts)
    reward_spec = args.reward
    if reward_spec is None and all(_field(r, "answer") is not None for r in records):
        reward_spec = "math_verify"
    reward_fn = build_reward(reward_spec, "--reward") if reward_spec is not None else None
    verifiable = args.verifiable or reward_spec in ("math_verify", "exact_match")
    model, tokenizer = _load_model(args.model)
    baseline_texts = None
    if args.baseline is not None:
        if Path(args.baseline).is_dir():
            base_model, base_tok = _load_model(args.baseline)
            base_gen = GenerationConfig(**(asdict(gen) | {"n": 1}))
            rollout = generate(base_model, base_tok, [_field(r, "prompt") for r in records], base_gen)
            baseline_texts = [group[0] for group in rollout.texts]
            del base_model
        else:
            baseline_texts = load_baseline_texts(args.baseline, records)
    result = evaluate(
        model, tokenizer, records, reward_fn, gen=gen, k=args.k, baseline_texts=baseline_texts,
        verifiable=verifiable, success_threshold=args.success_threshold, on_error=args.on_error,
    )
    header = {"model": args.model, "prompts": args.prompts, "reward_spec": reward_spec, "baseline": args.baseline}
    result = header | result
    output = args.output or (str(Path(args.model) / "eval.json") if Path(args.model).is_dir() else "eval.json")
    write_eval(result, output)
    print(_summary_line(result, output))
    return 0


def _summary_line(result: dict[str, Any], output: str) -> str:
    parts = [f"{result['num_prompts']} prompts x {result['n']}"]
    if result.get("reward", {}).get("mean") is not None:
        parts.append(f"reward {result['reward']['mean']:.4f} ± {result['reward']['std']:.4f}")
    if "pass@1" in result:
        parts.append(f"pass@1 {result['pass@1']:.4f}")
    if result.get("win_rate", {}).get("rate") is not None:
        w = result["win_rate"]
        parts.append(f"win rate {w['rate']:.3f} [{w['ci95_low']:.3f}, {w['ci95_high']:.3f}]")
    parts.append(f"mean length {result['length']['tokens']['mean']:.1f} tokens")
    return "eval: " + ", ".join(parts) + f" -> {output}"
