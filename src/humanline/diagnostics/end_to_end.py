"""The two inspections of offline data end to end: load, score, compare, plot, and write the JSON report.

    report = inspect_data("prefs.jsonl", "runs/sft", Path("inspect/data"), filter_below=0.25)
    report = inspect_perception("runs/online", "runs/sft", "prompts.jsonl", Path("inspect/perception"),
                                data=["prefs.jsonl"], settings=PerceptionSettings(n=8))

`inspect_data` scores every completion by its average token log-prob under a model (the paper's data-quality
proxy); `inspect_perception` compares the human-perceived outcome distribution of the policy with candidate
sampling distributions (docs/perception.md, Proposition 3.4). Each writes its JSON report next to its plot
and returns it; the maths is in `data_quality` / `perception`, the figures in `plots`, and the command line
(`humanline inspect`, which prints the summaries) in `humanline.commands.inspection`.
"""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from humanline.data.convert import write_records
from humanline.data.load import load_records
from humanline.data.tokenization import encode_completion, encode_prompt, fit_lengths
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
from humanline.sampling.rollout import GenerationConfig, generate

# ------------------------------------------------------------------------------------------- inspect data


def encode_items(items: list[dq.Item], tokenizer: Any, *, max_prompt_length: int | None = None,
                 max_length: int | None = None) -> tuple[list[list[int]], list[list[int]], int]:
    """Token ids of every item as training sees them: `(prompts, completions, truncated)`.

    A record whose prompt leaves no room for a completion gets empty completions (scored NaN).
    """
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


def inspect_data(data: str, model: str, out: Path, *, gguf_file: str | None = None, batch_size: int = 16,
                 filter_below: float | None = None, kind: str | None = None, split: str = "train",
                 max_prompt_length: int | None = None, max_length: int | None = None) -> dict:
    """Score, summarise, rank, plot and optionally filter a dataset; writes `out/inspect_data.json`.

    filter_below: a quantile; the records scored at or above it are written to `out/<name>.filtered.jsonl`.
    """
    loaded = load_records(data, kind=kind, split=split, skip_hint=None)
    items = dq.completion_items(loaded.records)
    scorer, tokenizer = load_scoring_model(model, gguf_file)
    prompts, completions, truncated = encode_items(items, tokenizer, max_prompt_length=max_prompt_length,
                                                   max_length=max_length)
    scores = score_sequences(scorer, prompts, completions, pad_id=tokenizer.pad_token_id, batch_size=batch_size,
                             desc="scoring")
    item_scores = scores.mean_logps.numpy()
    record_scores = dq.record_scores(len(loaded.records), items, item_scores)
    records_summary = dq.quartile_summary(record_scores)
    completion_summary = dq.quartile_summary(item_scores)
    if not records_summary.get("count"):
        raise UserError(f"{data}: no completion has a token left to score (check --max-length)")
    report = {
        "command": "inspect data", "data": str(data), "model": model, "gguf_file": gguf_file,
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
    if filter_below is not None:  # its folder made by the write: a refused filter leaves none
        report["filter"] = _write_filtered(loaded.records, record_scores, filter_below,
                                           out / f"{Path(str(data)).stem}.filtered.jsonl")
    out.mkdir(parents=True, exist_ok=True)  # only now, with the first file: a failed run leaves no empty folder
    sides = {side: np.array([s for it, s in zip(items, item_scores) if it.side == side]) for side in report["by_side"]}
    plot_logp_histogram(sides, records_summary, out / "histogram.png",
                        f"{Path(str(data)).name} under {Path(model).name}")
    report["ranked"] = dq.ranked_records(loaded.records, items, item_scores, scores.num_tokens.numpy(),
                                         record_scores, records_summary)
    write_json(out / "inspect_data.json", report)
    return report


def _write_filtered(records: list, record_scores: np.ndarray, quantile: float, path: Path) -> dict:
    """Write the records scored at or above `quantile`; the report's `filter` entry."""
    kept, threshold = dq.filter_records(records, record_scores, quantile)
    write_records(kept, path)
    return {"quantile": quantile, "threshold": threshold, "kept": len(kept), "dropped": len(records) - len(kept),
            "path": str(path)}


# ------------------------------------------------------------------------------------- inspect perception


@dataclass
class PerceptionSettings:
    """How `inspect_perception` samples and estimates (the flags of `humanline inspect perception`)."""

    gamma: float = 0.61  # capacity parameter (Tversky-Kahneman gains)
    n: int = 8  # samples per prompt
    max_prompts: int = 64  # the first prompts only
    max_records: int = 512  # a seeded random subset of each dataset
    max_new_tokens: int = 64
    temperature: float = 1.0  # 1.0 samples the policy itself
    value_bound: float | None = None  # ||v||_inf of Proposition 3.4 (None: max |v(z)| observed)
    bins: int | None = None  # None: ~sqrt(smallest sample), 2..20
    bootstrap: int = 200  # resamples for the 95% interval
    seed: int = 0
    batch_size: int = 16  # sequences per forward pass and per generate call (batch_size / n prompts)


def inspect_perception(policy: str, reference: str, prompts: str, out: Path, *, data: Sequence[str] = (),
                       other: Sequence[str] = (), settings: PerceptionSettings | None = None) -> dict:
    """Sample, score outcomes, compare omega with each Q; writes `out/perception.json` and `out/perception.png`.

    data: offline datasets to compare; other: other models whose samples to compare (same vocabulary).
    """
    s = settings or PerceptionSettings()
    policy_model, tokenizer = load_scoring_model(policy)
    reference_model, ref_tokenizer = load_scoring_model(reference)
    check_same_vocabulary(tokenizer, ref_tokenizer, (policy, reference))
    prompt_list = _load_prompts(prompts, s.max_prompts)
    eos = eos_ids_of(policy_model, tokenizer)
    print(f"sampling {s.n} completions for each of {len(prompt_list)} prompts from {policy}", file=sys.stderr)

    def outcomes(seqs, label):
        return _outcomes(policy_model, reference_model, *seqs, pad_id=tokenizer.pad_token_id,
                         batch_size=s.batch_size, label=label)

    z = {"on-policy": outcomes(_sample(policy_model, tokenizer, prompt_list, s), "on-policy")}
    for path in data:
        z[_unique(z, f"data:{Path(path).name}")] = outcomes(
            _dataset_sequences(path, tokenizer, eos, s.max_records, s.seed), path)
    for spec in other:
        other_model, other_tokenizer = load_scoring_model(spec)
        check_same_vocabulary(tokenizer, other_tokenizer, (policy, spec))
        seqs = _sample(other_model, other_tokenizer, prompt_list, s)
        z[_unique(z, f"other:{Path(spec).name}")] = outcomes(seqs, spec)
        del other_model
    return _compare_and_write(z, policy, reference, prompts, out, data, other, s)


def _compare_and_write(z: dict[str, torch.Tensor], policy: str, reference: str, prompts: str, out: Path,
                       data: Sequence[str], other: Sequence[str], s: PerceptionSettings) -> dict:
    """KL(omega || Q) for every sampled source `z`, the figure, and the report (written and returned)."""
    for name, values in z.items():
        if values.numel() == 0:
            raise UserError(f"{name}: no completion with at least one token to score")
    bins = s.bins or pc.default_bins(*(v.numel() for v in z.values()))
    candidates = {name: (None if name == "on-policy" else values) for name, values in z.items()}
    comparisons, shared = pc.compare(z["on-policy"], candidates, gamma=s.gamma, bins=bins,
                                     value_bound=s.value_bound, resamples=s.bootstrap, seed=s.seed)
    weights = pc.perceived_weights(z["on-policy"], s.gamma).numpy()
    out.mkdir(parents=True, exist_ok=True)  # only now, with the first file: a failed run leaves no empty folder
    plot_perception(comparisons, {k: v.numpy() for k, v in z.items()}, weights, s.gamma, out / "perception.png",
                    f"policy {Path(policy).name} vs reference {Path(reference).name}")
    candidates = [c for c in comparisons if c.name != "on-policy"]
    report = {
        "command": "inspect perception", "policy": policy, "reference": reference,
        "prompts": prompts, "data": list(data), "other": list(other),
        "settings": {"n": s.n, "max_prompts": s.max_prompts, "max_records": s.max_records,
                     "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "seed": s.seed},
        "estimator": "histogram KL on shared quantile bins of the pooled outcomes, additive smoothing, "
                     "percentile bootstrap (see docs/perception.md)",
        **shared,
        "comparisons": [c.to_json() for c in comparisons],
        "closest_offline": min(candidates, key=lambda c: c.kl).name if candidates else None,
        "outcomes": {name: _outcome_stats(values) for name, values in z.items()},
        "outcomes_raw": {name: [round(float(x), 4) for x in values] for name, values in z.items()},
        "plot": "perception.png",
    }
    write_json(out / "perception.json", report)
    return report


def _outcome_stats(values: torch.Tensor) -> dict:
    v = values.numpy()
    return {"count": int(v.size), "mean": float(v.mean()), "std": float(v.std()),
            **{f"q{int(q * 100)}": float(np.quantile(v, q)) for q in (0.05, 0.25, 0.5, 0.75, 0.95)}}


def _outcomes(policy: Any, reference: Any, prompts: list[list[int]], completions: list[list[int]], *,
              pad_id: int, batch_size: int, label: str) -> torch.Tensor:
    """`(N,)` sequence log-ratios z = log pi_P(y|x) - log pi_R(y|x) (sums over completion tokens)."""
    logp = score_sequences(policy, prompts, completions, pad_id=pad_id, batch_size=batch_size, desc=f"{label}: policy")
    logr = score_sequences(reference, prompts, completions, pad_id=pad_id, batch_size=batch_size,
                           desc=f"{label}: reference")
    keep = logp.num_tokens > 0
    return (logp.sum_logps - logr.sum_logps)[keep]


def _sample(model: Any, tokenizer: Any, prompts: list,
            s: PerceptionSettings) -> tuple[list[list[int]], list[list[int]]]:
    """Sample `s.n` completions per prompt; flattened `(prompt_ids, completion_ids)`, prompt-major."""
    cfg = GenerationConfig(max_new_tokens=s.max_new_tokens, temperature=s.temperature, n=s.n,
                           batch_size=max(1, s.batch_size // s.n), seed=s.seed)
    rollout = generate(model, tokenizer, prompts, cfg)
    flat_prompts = [p for p, group in zip(rollout.prompt_ids, rollout.completion_ids) for _ in group]
    return flat_prompts, [c for group in rollout.completion_ids for c in group]


def _dataset_sequences(path: str, tokenizer: Any, eos: set[int], max_records: int,
                       seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Every completion of (a seeded random subset of) a dataset, cut after its first end token."""
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
    """The first `limit` distinct prompts of a dataset (any format)."""
    records = load_records(path).records
    unique = list({r.prompt_id: r.prompt for r in records}.values())
    return unique[:limit]


# ------------------------------------------------------------------------------------------------ shared


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


def write_json(path: Path, payload: dict) -> None:
    """Strict, indented JSON (NaN and infinities as null)."""
    path.write_text(json.dumps(_finite(payload), indent=2, allow_nan=False) + "\n", encoding="utf-8")
