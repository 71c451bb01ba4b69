"""One run of the reproduction: its config, and running it so that nothing is lost or repeated.

A run lives in `<output>/runs/<objective>-<regime>-seed<N>/` (a normal run folder: `humanline report` and
`humanline eval` read it). `reproduce.json` there holds the key of the config it was started with, and
`summary.json` (written last, atomically) the summary of a finished run:

- finished (a summary with the same key): not run again, its summary is read;
- interrupted (a checkpoint, the same key): continued from its newest checkpoint (`Trainer(resume=True)`);
- nothing kept yet (no checkpoint, no summary): started afresh (`Trainer(overwrite=True)`);
- a run made with other settings (a summary or a checkpoint under another key): refused, naming what differs.

Keys (`keys.run_key`, the one rule of `keys`) hold paths relative to the output folder, so a moved or copied folder
keeps its runs.

Once finished, the run's checkpoints are removed (each holds the weights and the optimizer state); its final
model stays in `final/`, unless `discard_finals` removes it once its results are recorded (`keep_or_discard`).
With `final_samples` > 0, that model is evaluated once more, with that many samples per held-out prompt
(`final_eval.json`, keyed by what it measured): the same random draws for every run, so the regimes are compared
on common random numbers, and the sampling noise of a run's pass@1 shrinks with the square root of the samples.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from humanline.data.load import load_named
from humanline.errors import UserError
from humanline.evaluation.generations import evaluate_generations, write_eval
from humanline.experiments.harness.cache import cache_key, file_hash
from humanline.experiments.harness.regimes import regime_overrides
from humanline.experiments.harness.runs import (
    check_configs,
    checked_config,
    jobs,
    metrics,
    results_record,
    run_identity,
    run_name,
    seeds,
    step_rows,
    units_per_step,
)
from humanline.experiments.harness.workers import one_thread, run_jobs
from humanline.experiments.reproduce.data import prepare_data
from humanline.experiments.reproduce.keys import (
    changed_fields,
    other_settings,
    recorded_keys,
    replace_hint,
    run_key,
)
from humanline.experiments.reproduce.settings import ReproduceSettings, objective_config
from humanline.files import write_json
from humanline.model.loading import load_model, load_tokenizer, model_config_for
from humanline.sampling.reward_spec import build_reward
from humanline.sampling.rollout import GenerationConfig
from humanline.settings.config import Config
from humanline.training.loop import Trainer
from humanline.training.run_dir import held_run


def run_config(settings: ReproduceSettings, data: dict, objective: str, regime: str, seed: int,
               run_dir: Path) -> Config:
    """The full config of one run (as a recipe would hold it: `config.yaml` in the run folder)."""
    steps, task = settings.steps_of(objective), settings.task_spec
    overrides = {
        "model": {"name": settings.model},
        "data": {"train": data["groups"], "max_prompt_length": task.max_prompt_length,
                 "max_length": task.max_prompt_length + settings.answer_tokens},
        "rollout": {"prompts": data["prompts"], "prompts_per_step": settings.prompts_per_step,
                    "n": settings.samples_per_prompt, "max_new_tokens": settings.answer_tokens,
                    "temperature": settings.temperature, "stop": list(task.stop), "reward": task.reward,
                    "batch_size": 64},
        "optim": {"warmup_ratio": 0.0, "max_grad_norm": 1.0},
        "train": {"micro_batch_size": units_per_step(objective, settings.prompts_per_step), "max_steps": steps,
                  "seed": seed,
                  "sample_every": settings.sample_every, "eval_every": max(1, steps // settings.evals),
                  "output_dir": str(run_dir), "save_every": settings.save_every, "keep_checkpoints": 1},
        "eval": {"prompts": data["eval_prompts"], "reward": task.reward, "n": settings.eval_samples,
                 "max_new_tokens": settings.answer_tokens, "temperature": settings.temperature},
        "logging": {"progress": False, "log_every": 0},
    }
    if regime_overrides(regime)["train"]["regime"] != "offline":  # offline runs' keys stay put
        overrides["rollout"].update({"redraws": settings.redraws, "engine": settings.engine,
                                     "dtype": settings.rollout_dtype})  # at their defaults: no key changes
    return checked_config(overrides, objective_config(objective), regime, settings.lr_of(objective))


def train_run(settings: ReproduceSettings, data: dict, objective: str, regime: str, seed: int, out: Path) -> dict:
    """Run (or continue, or skip) one run; its summary, or `{"stopped": True}` when a signal stopped it."""
    run_dir, cfg = _run_dir_and_config(settings, data, objective, regime, seed, out)
    key, fields = run_key(cfg, out), changed_fields(cfg, out)
    summary_path, marker = run_dir / "summary.json", run_dir / "reproduce.json"
    finished = _finished(run_dir, key)
    if finished is not None:
        return keep_or_discard(settings, run_dir, with_final_eval(settings, data, run_dir, finished))
    other = other_settings(run_dir, key, fields)
    if other is not None:
        raise UserError(f"reproduce: {run_dir} holds a run made with other settings ({other}); {replace_hint()}")
    resume = key in recorded_keys(run_dir) and bool(held_run(run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    trainer = Trainer(cfg, resume=resume, overwrite=not resume)
    marker.write_text(json.dumps({"key": key, "objective": objective, "regime": regime, "seed": seed,
                                  "settings": fields}, default=str) + "\n")
    resumed_at = trainer.step
    trainer.train()
    if trainer.stopped_by is not None:
        return {"stopped": True, "signal": trainer.stopped_by, "run_dir": str(run_dir)}
    summary = summarize_run(run_dir, objective, regime, seed)
    summary.update(key=key, resumed_at_step=resumed_at, wall_seconds=round(time.perf_counter() - start, 2),
                   code=(trainer.run_info or {}).get("code"))
    write_json(summary_path, summary)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return keep_or_discard(settings, run_dir, with_final_eval(settings, data, run_dir, summary))


def keep_or_discard(settings: ReproduceSettings, run_dir: Path, summary: dict) -> dict:
    """`summary`, after removing the run's final model when `discard_finals` asks for it: only once everything
    measured from it is recorded (the summary, and the final evaluation when `final_samples` asks for one)."""
    if settings.discard_finals and (not settings.final_samples or "final_eval" in summary):
        shutil.rmtree(run_dir / "final", ignore_errors=True)
    return summary


FINAL_EVAL_SEED = 20_261_126  # one seed for every run's final evaluation (common random numbers)


def final_eval_key(settings: ReproduceSettings, data: dict, identity: str) -> str:
    """What a final evaluation depends on: the model (`identity`), the held-out prompts' content, the samples,
    answer length, temperature, stop strings and seed."""
    return cache_key({"final eval of": identity, "held_out": file_hash(data["eval_prompts"]),
                      "samples": settings.final_samples, "answer_tokens": settings.answer_tokens,
                      "temperature": settings.temperature, "stop": list(settings.task_spec.stop),
                      "seed": FINAL_EVAL_SEED})


def final_eval(settings: ReproduceSettings, data: dict, model: str, path: Path, identity: str,
               make: bool = True) -> dict | None:
    """Pass@1 of `model` (a model name, or a run folder for its final model) at `final_samples` samples per
    held-out prompt, with `FINAL_EVAL_SEED`: read back from `path` when it holds the same measurement of the
    same `identity` (a run's config key, or the base model's name), else measured now and written there
    (atomically); None when `final_samples` is 0, or with `make=False` when it was not measured yet."""
    if not settings.final_samples:
        return None
    key = final_eval_key(settings, data, identity)
    record = json.loads(path.read_text()) if path.exists() else {}
    if record.get("key") == key:
        return record
    if not make:
        return None
    if Path(model, "run_info.json").exists() and not Path(model, "final").is_dir():
        raise UserError(f"reproduce: the final model of {model} was removed (--discard-finals), so it cannot be "
                        f"evaluated with these settings (--final-samples {settings.final_samples}); pass the "
                        f"--final-samples it was evaluated with, or remove the folder to train it again")
    start = time.perf_counter()
    model_cfg = model_config_for(model)
    tokenizer = load_tokenizer(model_cfg)
    policy = load_model(model_cfg, tokenizer)
    prompts = load_named("eval.prompts", data["eval_prompts"], kind="prompts").records
    task = settings.task_spec
    gen = GenerationConfig(max_new_tokens=settings.answer_tokens, temperature=settings.temperature,
                           n=settings.final_samples, stop=list(task.stop), seed=FINAL_EVAL_SEED, batch_size=64)
    result = evaluate_generations(policy, tokenizer, prompts, build_reward(task.reward, "eval.reward"), gen=gen, k=1,
                                  verifiable=True)
    record = {"key": key, "samples": settings.final_samples, "prompts": len(prompts), "pass@1": result["pass@1"],
              "stderr": result["pass@1_stderr"], "seconds": round(time.perf_counter() - start, 2)}
    write_eval(record, path)  # atomically
    return record


def with_final_eval(settings: ReproduceSettings, data: dict, run_dir: Path, summary: dict,
                    make: bool = True) -> dict:
    """`summary` with `final_eval`: its final model's `final_eval` (`final_eval.json` in the run folder), when
    there is one."""
    record = final_eval(settings, data, str(run_dir), run_dir / "final_eval.json", summary["key"], make)
    return summary if record is None else {**summary, "final_eval": record}


def summarize_run(run_dir: Path, objective: str, regime: str, seed: int) -> dict:
    """Pass@1 curve against steps and seconds, and where the seconds went, from `metrics.jsonl`.

    Seconds per step are split into generation (sampling), reward (scoring), and training (reference,
    forward, backward, optimizer: `time/train`); `seconds` on the curve is their running sum, i.e. the
    wall-clock of training without evaluation (evaluations are timed apart: `eval_seconds`).
    """
    rows = metrics(run_dir)
    steps = step_rows(rows)
    totals = {"generation": 0.0, "reward": 0.0, "train": 0.0, "step": 0.0}
    curve, eval_seconds = [], 0.0
    for r in rows:
        if "time/step" in r:
            for name in totals:
                totals[name] += r.get(f"time/{name}", 0.0) or 0.0
        if isinstance(r.get("eval/pass@1"), (int, float)):
            eval_seconds += r.get("eval/seconds", 0.0)
            curve.append({"step": r["step"], "pass@1": r["eval/pass@1"], "stderr": r.get("eval/pass@1_stderr"),
                          "seconds": round(totals["step"], 3)})
    last = steps[-1] if steps else {}
    return {
        **run_identity(objective, regime, seed, run_dir),
        "final_pass@1": curve[-1]["pass@1"] if curve else float("nan"),
        "final_stderr": curve[-1]["stderr"] if curve else None,
        "curve": curve,
        "steps": len(steps),
        "seconds": {name: round(value, 2) for name, value in totals.items()} | {"eval": round(eval_seconds, 2)},
        "samples_generated": int(last.get("samples_generated", 0)),
        "generated_tokens": int(last.get("cost/generated_tokens", 0)),
        "empty_steps": int(max((r.get("empty_steps", 0) for r in steps), default=0)),
        "skipped_steps": int(last.get("skipped_steps", 0)),
        "train_sample_reward": _mean([r["sample_reward"] for r in steps if isinstance(r.get("sample_reward"), float)]),
        **mechanism(steps),
    }


# per-step metrics whose run means say what the method did: where the PPO clip bound (all tokens, and by the
# sign of the advantage), and how far the policy stood from its reference (mean |token log-ratio|)
MECHANISM = {"ppo_clip_fraction": "clip_fraction", "ppo_clip_pos": "clip_fraction_pos",
             "ppo_clip_neg": "clip_fraction_neg", "drift": "log_ratio/abs_mean",
             # stale samples: the batches' age in versions, and what a correction did (docs/method.md §3.6)
             "staleness": "staleness", "masked": "correction/masked", "capped": "correction/capped",
             "ess": "correction/ess",
             # the training-inference mismatch of the sampled tokens, |log pi_trainer - log pi_engine| (mean, max)
             "mismatch": "mismatch/mean", "mismatch_max": "mismatch/max",
             # DPO: the mean sigmoid(-beta margin), each pair's gradient factor (1/2 where the reference is the
             # pre-update policy); KTO: its reference point z0
             "pair_weight": "pair_weight", "kl_ref": "kl_ref"}


def mechanism(steps: list[dict]) -> dict:
    """Run means of the `MECHANISM` metrics and of every humanline metric, over the logged steps."""
    def mean_of(key: str) -> float | None:
        return _mean([r[key] for r in steps if isinstance(r.get(key), (int, float))])

    humanline = {key: mean_of(key) for key in sorted({k for r in steps for k in r if k.startswith("humanline/")})}
    return {**{name: mean_of(key) for name, key in MECHANISM.items()}, "humanline": humanline}


def _step_rows(run_dir: Path) -> list[dict]:
    return step_rows(metrics(run_dir)) if (run_dir / "metrics.jsonl").exists() else []


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _finished(run_dir: Path, key: str) -> dict | None:
    """The run's summary if it finished with the config of `key` (`run_key`), else None."""
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        return None
    summary = json.loads(summary_path.read_text())
    if summary.get("key") != key:
        return None
    steps = _step_rows(run_dir)  # read again: a summary written by older code may lack newer metrics
    return {**summary, **(mechanism(steps) if steps else {}), "cached": True}


def finished_summary(settings: ReproduceSettings, data: dict, objective: str, regime: str, seed: int,
                     out: Path) -> dict | None:
    """The summary of the run if it finished with these settings, else None."""
    run_dir, cfg = _run_dir_and_config(settings, data, objective, regime, seed, out)
    summary = _finished(run_dir, run_key(cfg, out))
    return None if summary is None else with_final_eval(settings, data, run_dir, summary, make=False)


def replaced_runs(settings: ReproduceSettings, data: dict, objective: str, regime: str, seed: int,
                  out: Path) -> str | None:
    """`run_name (what differs)` when the run's folder holds a run made with other settings, else None."""
    run_dir, cfg = _run_dir_and_config(settings, data, objective, regime, seed, out)
    other = other_settings(run_dir, run_key(cfg, out), changed_fields(cfg, out))
    return None if other is None else f"{run_dir.name} ({other})"


def _run_dir_and_config(settings: ReproduceSettings, data: dict, objective: str, regime: str, seed: int,
                        out: Path) -> tuple[Path, Config]:
    """The run's folder (`out/runs/<run_name>`) and its config."""
    run_dir = out / "runs" / run_name(objective, regime, seed, settings.lr_of(objective))
    return run_dir, run_config(settings, data, objective, regime, seed, run_dir)


def run_all(settings: ReproduceSettings, out: Path, log, finished_only: bool = False) -> dict:
    """Prepare the data (cached), then every (objective, regime, seed) `settings.workers` at a time; finished
    runs are read back, interrupted ones continued. Returns the data record and the runs' summaries.
    `finished_only`: train nothing, return the runs finished so far (the data must exist already). `out` is
    made absolute first: the runs' configs (hence their keys) name their folders and data by path, so
    `results` and `/abs/path/results` find the same runs."""

    out = Path(out).expanduser().resolve()
    check_configs(settings, run_config, out)
    out.mkdir(parents=True, exist_ok=True)
    if finished_only:
        if not (out / "data" / "base_eval.json").exists():
            raise UserError(f"reproduce --report: no data in {out / 'data'} yet: run without --report first")
        data = prepare_data(settings, out, log, make=False)
        data = _with_base_final_eval(settings, data, out, log, make=False)
        todo = jobs(settings, data, out)
        runs = [s for s in (finished_summary(*job) for job in todo) if s is not None]
        log(f"{len(runs)} of {len(todo)} runs finished; the table holds those")
        return results_record(settings, data, runs, complete=len(runs) == len(todo))
    data = _with_base_final_eval(settings, prepare_data(settings, out, log), out, log)
    todo, numbers = jobs(settings, data, out), seeds(settings)
    clashes = [c for c in (replaced_runs(*job) for job in todo) if c is not None]
    if clashes:  # before any run starts
        raise UserError(f"reproduce: {len(clashes)} run folder(s) in {out / 'runs'} hold runs made with other "
                        f"settings than these: {'; '.join(clashes[:3])}{' ...' if len(clashes) > 3 else ''}; "
                        + replace_hint(len(clashes)))
    log(f"{len(todo)} runs ({', '.join(f'{o} {r}' for o, r in settings.plan())}; seeds {numbers.start}-"
        f"{numbers.stop - 1}), {settings.workers} at a time; finished runs are read back, interrupted ones continued")
    start, done = time.perf_counter(), []

    def report(i: int, record: dict) -> None:
        if record.get("stopped"):
            log(f"stopped: {record['run_dir']} keeps its checkpoint; run the same command again to continue")
            return
        done.append(i)
        warning = None if settings.discard_finals else disk_warning(out / record["run_dir"], len(todo) - len(done))
        if warning:
            log(warning)
        how = "finished earlier" if record.get("cached") else f"{time.perf_counter() - start:.0f} s into this call"
        final = record.get("final_eval")
        again = f"; final model {final['pass@1']:.3f} at {final['samples']} samples per prompt" if final else ""
        log(f"{record['objective']} {record['regime']} seed {record['seed']}: pass@1 {record['final_pass@1']:.3f}, "
            f"{record['seconds']['step']:.0f} s training + {record['seconds']['eval']:.0f} s evaluation{again} ({how})")

    runs = run_jobs(train_run, todo, settings.workers, on_result=report,
                    stopped_by=lambda record: record.get("signal"))  # set only on a stopped run
    stopped = [r for r in runs if r is None or r.get("stopped")]
    return results_record(settings, data, [r for r in runs if r not in stopped], complete=not stopped)


def disk_warning(run_dir: Path, runs_left: int) -> str | None:
    """A warning when the runs still to come would not find room for final models the size of `run_dir`'s, else
    None (also when it kept none)."""
    size = sum(f.stat().st_size for f in (run_dir / "final").rglob("*") if f.is_file())
    if not size:
        return None
    free = shutil.disk_usage(run_dir).free
    if runs_left * size <= free:
        return None
    return (f"warning: each run keeps its final model ({size / 2**30:.2f} GB in {run_dir / 'final'}): the "
            f"{runs_left} runs left need about {runs_left * size / 2**30:.1f} GB, {free / 2**30:.1f} GB are free; "
            f"--discard-finals removes each final model once its results are recorded")


def _with_base_final_eval(settings: ReproduceSettings, data: dict, out: Path, log, make: bool = True) -> dict:
    """`data` with `base_final`: the base model's final evaluation (the runs' ruler at step 0), when asked for."""
    with one_thread():  # as the runs' own evaluations
        record = final_eval(settings, data, settings.model, out / "data" / "base_final_eval.json",
                            f"base:{settings.model}", make)
    if record is None:
        return data
    log(f"base policy: pass@1 {record['pass@1']:.3f} ± {record['stderr']:.3f} at {record['samples']} samples per "
        f"held-out prompt (the final models' evaluation)")
    return {**data, "base_final": record}

