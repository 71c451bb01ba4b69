"""The reproduction's data, prepared once and cached under `<output>/data/`.

- `train_prompts.jsonl`, `eval_prompts.jsonl`: the task's prompt records (`reproduce.task`).
- `offline_groups.jsonl`: the offline data, sampled **once from the base policy** (the paper's main setting) at
  the data temperature (`--data-temperature`; by default the runs' temperature), `samples_per_prompt`
  completions per prompt, scored by math-verify (or, `--offline-source`, written by a source off-policy from the
  start: humanline.experiments.harness.offline_sources); only groups whose
  scores differ are kept (a group of equal scores carries no signal for any objective: GRPO's advantages are
  zero, DPO has no pair, KTO no best and worst); `offline_groups_all.jsonl` keeps every group. Every offline
  run of every objective trains on this one file (DPO and KTO through the data layer's conversions).
- `offline.json`: what that sampling cost (seconds on one thread, summed over shards: the one-off cost that
  the results add to the offline regimes' wall-clock) and the cache key it was made with.
- `base_eval.json`: the base policy's held-out pass@1 (step 0 of every curve).
- `offline_quality.json`: the offline data's source and its quality proxy (below), for results to report.

The offline data is sampled only when a regime trains on it (or it is there already): a call that asks for
online and sparse regimes alone measures the base policy's pass@1 and nothing else.
- `inspect/inspect_data.json`: the paper's data-quality proxy, the mean token log-prob of the offline data
  under the reference (the base policy), by `humanline inspect data` on a seeded sample of groups.

Sampling runs in shards of `SHARD` prompts, each seeded by its index and run on one thread in a worker process,
so the data does not depend on the number of workers or cores.

Each file is made once per cache key (the settings it depends on). An output folder whose runs trained on one
version of the data refuses to make another (the runs' configs name the data by its path, not its content):
another `--output-dir` keeps both.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from humanline.data.load import load_records
from humanline.diagnostics.end_to_end import inspect_data
from humanline.errors import UserError
from humanline.evaluation.generations import evaluate_generations
from humanline.experiments.harness.cache import cache_key
from humanline.experiments.harness.offline_sources import offline_groups
from humanline.experiments.harness.regimes import regime_overrides
from humanline.experiments.harness.workers import run_jobs
from humanline.experiments.reproduce.settings import ReproduceSettings
from humanline.files import write_json, write_jsonl
from humanline.model.loading import load_model, load_tokenizer, model_config_for
from humanline.sampling.reward_spec import build_reward
from humanline.sampling.rollout import GenerationConfig, generate

SHARD = 64  # prompts per sampling job
# The offline data and the base's pass@1 are drawn by transformers' `generate`, as when the tables of
# docs/results.md were made: `humanline.sampling.decode` samples the same distribution with other random draws (the runs
# use it).
DECODER = "generate"
QUALITY_SAMPLE = 96  # groups scored for the data-quality proxy
DATA_VERSION = 1  # bump when sampling changes in a way the settings do not capture


def prepare_data(settings: ReproduceSettings, out: Path, log, make: bool = True) -> dict:
    """Prompt files, the offline data, the base policy's pass@1 and the data-quality proxy (cached).
    `make=False` (`--report`): only read what exists for these settings."""
    folder = out / "data"
    folder.mkdir(parents=True, exist_ok=True)
    key = offline_key(settings)
    _check_replaceable(folder / "offline.json", key, out, make)  # before any file is rewritten
    train, held_out = settings.task_spec.records(settings.train_prompts, settings.eval_prompts)
    paths = {"prompts": str(write_jsonl(folder / "train_prompts.jsonl", train)),
             "eval_prompts": str(write_jsonl(folder / "eval_prompts.jsonl", held_out))}
    offline = None
    if needs_offline(settings) or _holds(folder / "offline.json", key):
        offline = _cached(folder / "offline.json", key,
                          lambda: sample_offline(settings, train[: settings.offline_prompts], folder, log), make)
        source, tokens = made_by(settings.offline_source, data_temperature(settings)), offline["generated_tokens"]
        made = f"{tokens} tokens sampled {source}" if tokens else f"made {source}, nothing sampled,"
        log(f"offline data ({settings.offline_source}): {offline['groups_kept']} of {offline['groups']} groups with "
            f"differing scores, {made} in {offline['seconds']:.0f} s (one thread; cached in {folder})")
    else:
        log("no offline regime asked for: the offline data is not sampled")
    evals = _base_eval(settings, folder, log, with_quality=offline is not None, make=make)
    quality = evals.get("quality")
    log(f"base policy: held-out pass@1 {evals['pass@1']:.3f} ± {evals['pass@1_stderr']:.3f} "
        f"({len(held_out)} prompts x {settings.eval_samples})" + ("" if quality is None else
        f"; offline data quality (mean token log-prob under the base): {quality['mean']:.3f}, quartiles "
        f"{quality['q25']:.3f} / {quality['q50']:.3f} / {quality['q75']:.3f}"))
    if quality is not None:
        write_quality(folder / "offline_quality.json", settings.offline_source, quality)
    task = settings.task_spec
    return {**paths, "groups": str(folder / "offline_groups.jsonl"), "offline": offline, "base": evals,
            "task": task.name if task.source is None or task.source.startswith(task.name) else
            f"{task.name} ({task.source.rstrip('?&')})"}


def write_quality(path: Path, source: str, quality: dict) -> None:
    """The offline data's source and its quality proxy (mean token log-prob under the base policy, quartiles)."""
    keys = ("mean", "q25", "q50", "q75", "count", "groups_scored", "command")
    record = {"source": source, "proxy": "mean token log-prob of the completions under the base policy (nats)",
              **{k: quality[k] for k in keys if k in quality}}
    path.write_text(json.dumps(record, indent=2) + "\n")


def needs_offline(settings: ReproduceSettings) -> bool:
    """Whether a regime of `settings` trains on the offline data."""
    return any(regime_overrides(r)["train"]["regime"] == "offline" for _, r in settings.plan())


def _holds(path: Path, key: str) -> bool:
    return path.exists() and json.loads(path.read_text()).get("key") == key


def _base_eval(settings: ReproduceSettings, folder: Path, log, *, with_quality: bool, make: bool) -> dict:
    """The base policy's pass@1, with the offline data's quality proxy when there is offline data (cached in
    `base_eval.json`, keyed by the data it measured: a record without the proxy is measured again once the offline
    data exists)."""
    return _cached(folder / "base_eval.json", base_eval_key(settings, with_quality),
                   lambda: measure_base(settings, folder, log, with_quality=with_quality), make)


def _check_replaceable(path: Path, key: str, out: Path, make: bool) -> None:
    """Refuse to replace `path`, made with another key, under --report (`make` False) or where runs in
    `out/runs` trained on it."""
    if not path.exists() or json.loads(path.read_text()).get("key") == key:
        return
    if not make:
        raise UserError(f"reproduce --report: {path} was made with other settings than these (the data flags, "
                        f"e.g. --data-temperature, differ); give the settings its runs were made with")
    runs = sorted(p.name for p in (out / "runs").glob("*") if p.is_dir())
    if runs:
        listed = ", ".join(runs[:3]) + (" ..." if len(runs) > 3 else "")
        raise UserError(f"reproduce: {path} was made with other settings than these, and the runs in "
                        f"{out / 'runs'} ({len(runs)}: {listed}) "
                        f"trained on it; use another --output-dir for these settings, or remove {out}")


def _cached(path: Path, key: str, make_record, may_make: bool) -> dict:
    """`path`'s record if it was made with `key`, else `make_record()` stored there with the key (`may_make`)."""
    if path.exists():
        record = json.loads(path.read_text())
        if record.get("key") == key:
            return record
    if not may_make:
        raise UserError(f"reproduce --report: no data in {path.parent} for these settings yet: run without --report")
    record = {**make_record(), "key": key}
    write_json(path, record)
    return record


def offline_key(s: ReproduceSettings) -> str:
    """What the offline data depends on (`harness.cache.cache_key`): the model, the prompts, the samples per prompt, the
    answer length, the runs' and the data's temperature, the source, the task and its stop strings, the shard size
    and `DATA_VERSION`."""
    task = s.task_spec
    return cache_key({"offline data": DATA_VERSION, "model": s.model, "train_prompts": s.train_prompts,
                      "offline_prompts": s.offline_prompts, "samples_per_prompt": s.samples_per_prompt,
                      "answer_tokens": s.answer_tokens, "temperature": s.temperature,
                      "data_temperature": data_temperature(s), "offline_source": s.offline_source, "task": task.name,
                      "source": task.source, "stop": list(task.stop), "shard": SHARD})


def base_eval_key(s: ReproduceSettings, with_quality: bool) -> str:
    """What the base policy's evaluation depends on: the held-out prompts and samples, and (`with_quality`) the
    offline data whose quality proxy it also measures."""
    return cache_key({"base eval": DATA_VERSION, "offline data": offline_key(s) if with_quality else None,
                      "eval_prompts": s.eval_prompts, "eval_samples": s.eval_samples, "quality_sample": QUALITY_SAMPLE})


def data_temperature(s: ReproduceSettings) -> float:
    """The offline data's sampling temperature: `data_temperature`, else the runs' `temperature`."""
    return s.temperature if s.data_temperature is None else s.data_temperature


def generation(settings: ReproduceSettings, n: int, seed: int, temperature: float | None = None):
    """The sampling settings of the offline data and of the base's evaluation (at the runs' temperature unless
    `temperature` is given; the runs' own: `runs.run_config`)."""
    return GenerationConfig(max_new_tokens=settings.answer_tokens,
                            temperature=settings.temperature if temperature is None else temperature, n=n,
                            stop=list(settings.task_spec.stop), seed=seed, batch_size=SHARD,
                            decoder=DECODER)


def made_by(source: str, temperature: float) -> str:
    """Where offline data comes from, in words: the base policy at its temperature, or the named source."""
    return f"from the base policy at T = {temperature:g}" if source == "base" else f"from the source {source!r}"


def sample_offline(settings: ReproduceSettings, records: list[dict], folder: Path, log) -> dict:
    """Sample and score the offline groups in shards (in parallel over `settings.workers`); write both files."""
    shards = [(settings, records[i: i + SHARD], i // SHARD) for i in range(0, len(records), SHARD)]
    log(f"making the offline data once: {len(records)} prompts x {settings.samples_per_prompt} "
        f"{made_by(settings.offline_source, data_temperature(settings))} in {len(shards)} shards")
    start = time.perf_counter()
    results = run_jobs(sample_shard, shards, settings.workers)
    groups = [g for shard in results for g in shard["groups"]]
    trainable = [without_empty(g) for g in groups]
    kept = [g for g in trainable if len(set(g["scores"])) > 1]
    write_jsonl(folder / "offline_groups_all.jsonl", groups)
    write_jsonl(folder / "offline_groups.jsonl", kept)
    return {"groups": len(groups), "groups_kept": len(kept), "prompts": len(records),
            "samples_per_prompt": settings.samples_per_prompt, "source": settings.offline_source,
            # what each sampled source drew at (hot: its own 1.5, not the data temperature; reference: nothing)
            "temperatures": results[0]["temperatures"] if results else {},
            "temperature": data_temperature(settings) if settings.offline_source == "base" else None,
            "seconds": round(sum(r["seconds"] for r in results), 2),
            "generation_seconds": round(sum(r["generation_seconds"] for r in results), 2),
            "wall_seconds": round(time.perf_counter() - start, 2),
            "generated_tokens": sum(r["tokens"] for r in results),
            "empty_completions_dropped": sum(len(g["completions"]) - len(t["completions"])
                                             for g, t in zip(groups, trainable)),
            "mean_score": sum(s for g in groups for s in g["scores"]) / max(1, sum(len(g["scores"]) for g in groups))}


def without_empty(group: dict) -> dict:
    """The group without its empty completions (the sampler stopped at once): a dataset cannot hold them, and
    the training data and the quality sample are read as one. A group left with one completion has one score,
    so it is not kept."""
    keep = [i for i, c in enumerate(group["completions"]) if c.strip()]
    out = {**group, "completions": [group["completions"][i] for i in keep],
           "scores": [group["scores"][i] for i in keep]}
    if "sources" in group:
        out["sources"] = [group["sources"][i] for i in keep]
    return out


def sample_shard(settings: ReproduceSettings, records: list[dict], index: int) -> dict:
    """One shard of the offline data from `settings.offline_source` (seed 1000 + index), scored by the task's
    verifier."""
    cfg = model_config_for(settings.model)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer).eval()
    start = time.perf_counter()
    gen = generation(settings, settings.samples_per_prompt, seed=1000 + index, temperature=data_temperature(settings))
    groups, sampled = offline_groups(model, tokenizer, records, settings.offline_source, gen,
                                     build_reward(settings.task_spec.reward), generate)
    return {"groups": groups, "seconds": time.perf_counter() - start, **sampled}


def measure_base(settings: ReproduceSettings, folder: Path, log, with_quality: bool = True) -> dict:
    """The base policy's held-out pass@1 and (`with_quality`) the offline data's quality proxy, side by side."""
    if not with_quality:
        log("measuring the base policy's held-out pass@1 (cached once)")
        return base_job("eval", settings, folder)
    log("measuring the base policy's held-out pass@1 and the offline data's quality (cached once)")
    groups = [json.loads(line) for line in (folder / "offline_groups.jsonl").read_text().splitlines()]
    sample = random.Random(0).sample(groups, min(QUALITY_SAMPLE, len(groups)))
    write_jsonl(folder / "quality_sample.jsonl", sample)
    jobs = [("eval", settings, folder), ("quality", settings, folder)]
    evaluated, quality = run_jobs(base_job, jobs, settings.workers)
    return {**evaluated, "quality": quality}


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (a record names no machine's folders)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def base_job(kind: str, settings: ReproduceSettings, folder: Path) -> dict:
    if kind == "quality":
        start = time.perf_counter()
        (folder / "inspect").mkdir(exist_ok=True)
        report = inspect_data(str(folder / "quality_sample.jsonl"), settings.model, folder / "inspect")
        return {**report["completion_quartiles"], "per_group": report["record_quartiles"],
                "groups_scored": report["records"],
                "command": f"humanline inspect data {_shown(folder / 'quality_sample.jsonl')} --model {settings.model}",
                "seconds": round(time.perf_counter() - start, 2)}

    cfg = model_config_for(settings.model)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer).eval()
    records = load_records(folder / "eval_prompts.jsonl", kind="prompts").records
    start = time.perf_counter()
    result = evaluate_generations(model, tokenizer, records, build_reward(settings.task_spec.reward),
                                  gen=generation(settings, settings.eval_samples, seed=12345), verifiable=True)
    return {"pass@1": result["pass@1"], "pass@1_stderr": result["pass@1_stderr"],
            "mean_length": result.get("length", {}).get("mean"), "seconds": round(time.perf_counter() - start, 2)}
