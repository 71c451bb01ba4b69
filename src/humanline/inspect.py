"""`humanline inspect data` and `humanline inspect perception`: look at offline data before training on it.

    humanline inspect data prefs.jsonl --model runs/sft [--filter-below 0.25] [--output-dir D]
    humanline inspect perception --policy P --reference R --prompts prompts.jsonl --data prefs.jsonl

`data` scores every completion by its average token log-prob under the model (the paper's data-quality proxy);
`perception` compares the human-perceived outcome distribution of the policy with candidate sampling
distributions (SPEC section 2, Proposition 3.4). Both write a JSON report next to their plot. The method and
its assumptions: docs/perception.md. The maths lives in `humanline.diagnostics`.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from humanline.diagnostics import data_quality as dq
from humanline.diagnostics import perception as pc
from humanline.diagnostics.plots import plot_logp_histogram, plot_perception
from humanline.diagnostics.scoring import (
    check_same_vocabulary,
    cut_after_eos,
    eos_ids_of,
    load_scoring_model,
    score_sequences,
)
from humanline.errors import UserError


def add_inspect_parser(subparsers: Any) -> None:
    """Register `inspect data` and `inspect perception` on an argparse subparsers object (sets `args.func`)."""
    inspect = subparsers.add_parser("inspect", help="diagnose offline data: likelihood and perceptual distance")
    commands = inspect.add_subparsers(dest="inspect_command", metavar="{data,perception}", required=True)

    data = commands.add_parser("data", help="average token log-prob of every completion under a model")
    data.add_argument("data", help="dataset: a .jsonl/.json/.parquet/.csv file or a datasets folder")
    data.add_argument("--model", required=True,
                      help="'tiny', a model folder, a run directory, package:NAME or FOLDER/FILE.gguf")
    data.add_argument("--gguf-file", default=None, help="GGUF file inside the --model folder")
    data.add_argument("--output-dir", default="inspect/data", help="where the JSON, PNG and filtered data go")
    data.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass")
    data.add_argument("--filter-below", type=float, default=None, metavar="QUANTILE",
                      help="also write the records scored at or above this quantile (0.25 drops the bottom quartile)")
    data.add_argument("--format", default=None, help="dataset format (default: detect)")
    data.add_argument("--split", default="train", help="split, optionally sliced: train, train[:1000]")
    data.add_argument("--max-prompt-length", type=int, default=None, help="tokens; longer prompts keep their end")
    data.add_argument("--max-length", type=int, default=None, help="prompt + completion tokens")
    data.set_defaults(func=run_inspect_data)

    per = commands.add_parser("perception", help="KL between the perceived outcome distribution and candidate data")
    per.add_argument("--policy", required=True,
                     help="'tiny', a model folder, a run directory, FOLDER/FILE.gguf or package:NAME/FILE.gguf")
    per.add_argument("--reference", required=True, help="the reference model (same vocabulary as the policy)")
    per.add_argument("--prompts", required=True, help="dataset whose prompts the policy answers (any format)")
    per.add_argument("--data", action="append", default=[], help="offline dataset to compare (repeatable)")
    per.add_argument("--other", action="append", default=[], help="another model whose samples to compare (repeatable)")
    per.add_argument("--gamma", type=float, default=0.61, help="capacity parameter (Tversky-Kahneman gains: 0.61)")
    per.add_argument("--n", type=int, default=8, help="samples per prompt")
    per.add_argument("--max-prompts", type=int, default=64, help="use at most this many prompts (first ones)")
    per.add_argument("--max-records", type=int, default=512, help="score at most this many records of each --data")
    per.add_argument("--max-new-tokens", type=int, default=64)
    per.add_argument("--temperature", type=float, default=1.0, help="1.0 samples the policy itself")
    per.add_argument("--value-bound", type=float, default=None,
                     help="||v||_inf for Proposition 3.4 (default: max |v(z)| over the observed outcomes)")
    per.add_argument("--bins", type=int, default=None, help="histogram bins (default: ~sqrt(smallest sample), 2..20)")
    per.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the 95%% interval")
    per.add_argument("--seed", type=int, default=0)
    per.add_argument("--batch-size", type=int, default=16,
                     help="sequences per forward pass and per generate call (batch-size / n prompts at a time)")
    per.add_argument("--output-dir", default="inspect/perception")
    per.set_defaults(func=run_inspect_perception)


# ------------------------------------------------------------------------------------------- inspect data


def encode_items(items: list[dq.Item], tokenizer: Any, *, max_prompt_length: int | None = None,
                 max_length: int | None = None) -> tuple[list[list[int]], list[list[int]], int]:
    """Token ids of every item as training sees them: `(prompts, completions, truncated)`.

    A record whose prompt leaves no room for a completion gets empty completions (scored NaN).
    """
    from humanline.data.tokenize import encode_completion, encode_prompt, fit_lengths

    prompts, completions, truncated, cache = [], [], 0, {}
    for item in items:
        if item.record not in cache:
            cache[item.record] = encode_prompt(tokenizer, item.prompt)
        full_prompt = cache[item.record]
        completion = encode_completion(tokenizer, item.prompt, item.completion, prompt_ids=full_prompt)
        fitted = fit_lengths(full_prompt, [completion], max_prompt_length=max_prompt_length, max_length=max_length)
        if fitted is None:
            prompts.append(full_prompt)
            completions.append([])
            continue
        prompt, (completion,), cut = fitted
        truncated += cut
        prompts.append(prompt)
        completions.append(completion)
    return prompts, completions, truncated


def run_inspect_data(args: Any) -> int:
    """Score, summarise, rank, plot and optionally filter a dataset; writes `inspect_data.json`."""
    from humanline.data.convert import write_records
    from humanline.data.load import load_records

    out = _output_dir(args.output_dir)
    loaded = load_records(args.data, kind=args.format, split=args.split)
    items = dq.completion_items(loaded.records)
    model, tokenizer = load_scoring_model(args.model, args.gguf_file)
    prompts, completions, truncated = encode_items(items, tokenizer, max_prompt_length=args.max_prompt_length,
                                                   max_length=args.max_length)
    scores = score_sequences(model, prompts, completions, pad_id=tokenizer.pad_token_id,
                             batch_size=args.batch_size, desc="scoring")
    item_scores = scores.mean_logps.numpy()
    record_scores = dq.record_scores(len(loaded.records), items, item_scores)
    records_summary = dq.quartile_summary(record_scores)
    completion_summary = dq.quartile_summary(item_scores)
    if not records_summary.get("count"):
        raise UserError(f"{args.data}: no completion has a token left to score (check --max-length)")
    report = {
        "command": "inspect data", "data": str(args.data), "model": args.model, "gguf_file": args.gguf_file,
        "format": loaded.kind, "records": len(loaded.records), "completions": len(items),
        "truncated_completions": truncated, "unscored_completions": int(np.isnan(item_scores).sum()),
        "score": "average token log-prob (nats) of the completion tokens; a record's score is the mean over "
                 "its completions",
        "record_quartiles": records_summary,
        "record_bottom_quartile_share": dq.bottom_share(record_scores, records_summary["q25"]),
        "completion_quartiles": completion_summary,
        "completion_bottom_quartile_share": dq.bottom_share(item_scores, completion_summary["q25"]),
        "by_side": dq.side_summary(items, item_scores, completion_summary["q25"]),
        "filter": None, "histogram": "histogram.png",
    }
    if args.filter_below is not None:
        kept, threshold = dq.filter_records(loaded.records, record_scores, args.filter_below)
        path = out / f"{Path(str(args.data)).stem}.filtered.jsonl"
        write_records(kept, path)
        report["filter"] = {"quantile": args.filter_below, "threshold": threshold, "kept": len(kept),
                            "dropped": len(loaded.records) - len(kept), "path": str(path)}
    sides = {side: np.array([s for it, s in zip(items, item_scores) if it.side == side]) for side in report["by_side"]}
    plot_logp_histogram(sides, records_summary, out / "histogram.png",
                        f"{Path(str(args.data)).name} under {Path(args.model).name}")
    report["ranked"] = dq.ranked_records(loaded.records, items, item_scores, scores.num_tokens.numpy(),
                                         record_scores, records_summary)
    _write_json(out / "inspect_data.json", report)
    _print_data_summary(report, out)
    return 0


def _print_data_summary(report: dict, out: Path) -> None:
    q = report["record_quartiles"]
    print(f"{report['data']}: {report['records']} {report['format']} records, {report['completions']} completions "
          f"({report['truncated_completions']} truncated, {report['unscored_completions']} unscored)")
    print(f"record score (mean token log-prob): q25 {q['q25']:.4f}  q50 {q['q50']:.4f}  q75 {q['q75']:.4f}  "
          f"[min {q['min']:.4f}, max {q['max']:.4f}]; bottom quartile: {report['record_bottom_quartile_share']:.1%}")
    for side, s in report["by_side"].items():
        mean = "n/a" if s["mean"] is None else f"{s['mean']:.4f}"
        print(f"  {side:<12} n={s['count']:<6} mean {mean}  in the completion bottom quartile: "
              f"{s['bottom_quartile_share']:.1%}")
    if report["filter"]:
        f = report["filter"]
        print(f"filter: kept {f['kept']} records scored >= {f['threshold']:.4f} (quantile {f['quantile']}), "
              f"dropped {f['dropped']} -> {f['path']}")
    print(f"wrote {out / 'inspect_data.json'} and {out / report['histogram']}")


# ------------------------------------------------------------------------------------- inspect perception


def _outcomes(policy: Any, reference: Any, prompts: list[list[int]], completions: list[list[int]], *,
              pad_id: int, batch_size: int, label: str) -> torch.Tensor:
    """`(N,)` sequence log-ratios z = log pi_P(y|x) - log pi_R(y|x) (sums over completion tokens)."""
    logp = score_sequences(policy, prompts, completions, pad_id=pad_id, batch_size=batch_size, desc=f"{label}: policy")
    logr = score_sequences(reference, prompts, completions, pad_id=pad_id, batch_size=batch_size,
                           desc=f"{label}: reference")
    keep = logp.num_tokens > 0
    return (logp.sum_logps - logr.sum_logps)[keep]


def _sample(model: Any, tokenizer: Any, prompts: list, args: Any) -> tuple[list[list[int]], list[list[int]]]:
    """Sample `args.n` completions per prompt; flattened `(prompt_ids, completion_ids)`, prompt-major."""
    from humanline.rollout import GenerationConfig, generate

    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, n=args.n,
                           batch_size=max(1, args.batch_size // args.n), seed=args.seed)
    rollout = generate(model, tokenizer, prompts, cfg)
    flat_prompts = [p for p, group in zip(rollout.prompt_ids, rollout.completion_ids) for _ in group]
    return flat_prompts, [c for group in rollout.completion_ids for c in group]


def _dataset_sequences(path: str, tokenizer: Any, eos: set[int], max_records: int,
                       seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every completion of (a seeded random subset of) a dataset, cut after its first end token."""
    from humanline.data.load import load_records

    records = load_records(path).records
    if len(records) > max_records:
        records = [records[i] for i in sorted(random.Random(seed).sample(range(len(records)), max_records))]
    prompts, completions, _ = encode_items(dq.completion_items(records), tokenizer)
    return prompts, [cut_after_eos(c, eos) for c in completions]


def _unique(taken: dict, name: str) -> str:
    """`name`, or `name#2`, `name#3`, ... when a source of that name is already there."""
    candidate, k = name, 1
    while candidate in taken:
        k += 1
        candidate = f"{name}#{k}"
    return candidate


def _load_prompts(path: str, limit: int) -> list:
    from humanline.data.load import load_records

    records = load_records(path).records
    unique = list({r.prompt_id: r.prompt for r in records}.values())
    return unique[:limit]


def run_inspect_perception(args: Any) -> int:
    """Sample, score outcomes, compare omega with each Q; writes `perception.json` and `perception.png`."""
    _check_perception_args(args)
    out = _output_dir(args.output_dir)
    policy, tokenizer = load_scoring_model(args.policy)
    reference, ref_tokenizer = load_scoring_model(args.reference)
    check_same_vocabulary(tokenizer, ref_tokenizer, (args.policy, args.reference))
    prompts = _load_prompts(args.prompts, args.max_prompts)
    pad, eos, bs = tokenizer.pad_token_id, eos_ids_of(policy, tokenizer), args.batch_size
    print(f"sampling {args.n} completions for each of {len(prompts)} prompts from {args.policy}", file=sys.stderr)
    z = {"on-policy": _outcomes(policy, reference, *_sample(policy, tokenizer, prompts, args), pad_id=pad,
                                batch_size=bs, label="on-policy")}
    for path in args.data:
        seqs = _dataset_sequences(path, tokenizer, eos, args.max_records, args.seed)
        z[_unique(z, f"data:{Path(path).name}")] = _outcomes(policy, reference, *seqs, pad_id=pad, batch_size=bs, label=path)
    for spec in args.other:
        other, other_tokenizer = load_scoring_model(spec)
        check_same_vocabulary(tokenizer, other_tokenizer, (args.policy, spec))
        seqs = _sample(other, other_tokenizer, prompts, args)
        z[_unique(z, f"other:{Path(spec).name}")] = _outcomes(policy, reference, *seqs, pad_id=pad, batch_size=bs, label=spec)
        del other
    for name, values in z.items():
        if values.numel() == 0:
            raise UserError(f"{name}: no completion with at least one token to score")
    bins = args.bins or pc.default_bins(*(v.numel() for v in z.values()))
    candidates = {name: (None if name == "on-policy" else values) for name, values in z.items()}
    comparisons, shared = pc.compare(z["on-policy"], candidates, gamma=args.gamma, bins=bins,
                                     value_bound=args.value_bound, resamples=args.bootstrap, seed=args.seed)
    weights = pc.perceived_weights(z["on-policy"], args.gamma).numpy()
    plot_perception(comparisons, {k: v.numpy() for k, v in z.items()}, weights, args.gamma, out / "perception.png",
                    f"policy {Path(args.policy).name} vs reference {Path(args.reference).name}")
    report = _perception_report(args, comparisons, shared, z)
    _write_json(out / "perception.json", report)
    _print_perception_summary(report, out)
    return 0


def _check_perception_args(args: Any) -> None:
    if not 0.0 < args.gamma <= 1.0:
        raise UserError(f"--gamma: expected a number in (0, 1] (1 = no perceptual distortion), got {args.gamma}")
    for name in ("n", "max_prompts", "max_records", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.bins is not None and args.bins < 1:
        raise UserError(f"--bins: expected an integer >= 1, got {args.bins}")
    if args.value_bound is not None and not (args.value_bound > 0 and math.isfinite(args.value_bound)):
        raise UserError(f"--value-bound: expected a positive number, got {args.value_bound}")
    if args.temperature != 1.0:
        print("warning: --temperature != 1 samples a tempered policy, not pi_P itself", file=sys.stderr)


def _perception_report(args: Any, comparisons: list, shared: dict, z: dict[str, torch.Tensor]) -> dict:
    outcome_stats = {}
    for name, values in z.items():
        v = values.numpy()
        outcome_stats[name] = {"count": int(v.size), "mean": float(v.mean()), "std": float(v.std()),
                               **{f"q{int(q * 100)}": float(np.quantile(v, q)) for q in (0.05, 0.25, 0.5, 0.75, 0.95)}}
    candidates = [c for c in comparisons if c.name != "on-policy"]
    return {
        "command": "inspect perception", "policy": args.policy, "reference": args.reference,
        "prompts": args.prompts, "data": args.data, "other": args.other,
        "settings": {"n": args.n, "max_prompts": args.max_prompts, "max_records": args.max_records,
                     "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "seed": args.seed},
        "estimator": "histogram KL on shared quantile bins of the pooled outcomes, additive smoothing, "
                     "percentile bootstrap (see docs/perception.md)",
        **shared,
        "comparisons": [c.to_json() for c in comparisons],
        "closest_offline": min(candidates, key=lambda c: c.kl).name if candidates else None,
        "outcomes": outcome_stats,
        "outcomes_raw": {name: [round(float(x), 4) for x in values] for name, values in z.items()},
        "plot": "perception.png",
    }


def _print_perception_summary(report: dict, out: Path) -> None:
    print(f"perceived distribution: gamma {report['gamma']}, {report['policy_samples']} policy samples, "
          f"{report['bins']} bins, ||v||_inf = {report['value_bound']:.3f} ({report['value_bound_source']})")
    width = max([28] + [len(c["name"]) for c in report["comparisons"]])  # names are never cut
    print(f"{'Q':<{width}} {'n':>6} {'KL(omega||Q)':>13} {'95% interval':>18} {'bound':>8} {'|du|':>8} {'gamma*':>7}")
    for c in report["comparisons"]:
        low, high = c["kl_95"]
        print(f"{c['name']:<{width}} {c['samples']:>6} {c['kl']:>13.4f} {f'[{low:.3f}, {high:.3f}]':>18} "
              f"{c['utility_bound']:>8.3f} {c['utility_gap']:>8.3f} {c['implied_gamma']:>7.2f}")
    if report["closest_offline"]:
        print(f"closest to the perceived distribution (excluding on-policy): {report['closest_offline']}")
    print(f"wrote {out / 'perception.json'} and {out / report['plot']}")


# ------------------------------------------------------------------------------------------------ shared


def _output_dir(path: str) -> Path:
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output-dir {path}: cannot create it ({exc.strerror})") from exc
    return out


def _finite(value: Any) -> Any:
    """The JSON-safe copy of `value`: NaN and infinities become null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(_finite(payload), indent=2, allow_nan=False) + "\n", encoding="utf-8")
