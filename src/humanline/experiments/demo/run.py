"""`humanline demo`: the paper's comparison in miniature, on a CPU, with honest numbers.

1. A tiny base policy (and a different, weaker policy) are taught the task format by SFT and cached.
2. Offline data: scored groups sampled from the *weak* policy (off-policy), stored as JSONL; or, with
   `offline_source="base"`, from the base policy itself before alignment (the paper's main setting: its offline
   data were sampled from the model it then aligned, off-policy only once training moves the policy).
3. The same base is aligned under each regime (offline, offline+humanline, online, sparse, ...) and seed with
   `humanline.training.loop.Trainer`; held-out reward is measured every few steps by sampling.
4. `humanline.experiments.demo.results` turns the runs into a table, `results.json`, `report.md` and plots.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from humanline.experiments.demo.offline import DECODER, mean_sample_reward, write_offline_groups
from humanline.experiments.demo.policies import BaseConfig, ensure_policies, load_policy
from humanline.experiments.demo.tasks import make_task
from humanline.experiments.harness.regimes import ablation_regimes, regime_overrides
from humanline.experiments.harness.runs import (
    Progress,
    check_configs,
    checked_config,
    jobs,
    metrics,
    plan,
    results_record,
    run_identity,
    run_name,
    step_rows,
    units_per_step,
)
from humanline.experiments.harness.workers import one_thread, run_jobs
from humanline.files import write_jsonl
from humanline.settings.config import Config
from humanline.training.loop import Trainer
from humanline.training.objective_table import SPECS

REWARD = "humanline.experiments.demo.tasks:arithmetic_reward"
# Where the offline data come from (`--offline-source`): a weaker, different policy (default: off-policy from the
# first step), or the base policy being aligned (the paper's main setting)
OFFLINE_SOURCES = {"weak": "weak policy", "base": "base policy (the one being aligned, before alignment)"}

# Per-objective settings (lab/log.md has how they were chosen). The humanline band must fit
# how far a tiny model moves between syncs at these learning rates.
OBJECTIVES = {
    "grpo": {  # PPO clip: HALOs' 0.01 below, 0.1 above ("clip-higher"; chosen on tuning seeds, not reported ones: an
        # off-policy correct answer may rise further per step, a pushed-down token may not fall further)
        "objective": {"name": "grpo", "grpo_beta": 0.0, "eps_low": 0.01, "eps_high": 0.1},
        "humanline": {"sync_every": 1, "low": -1.5, "high": 1.5},
        "optim": {"lr": 1e-4},
    },
    "dpo": {
        "objective": {"name": "dpo", "beta": 0.1},
        "humanline": {"sync_every": 4, "low": -0.1, "high": 0.2},
        "optim": {"lr": 1e-4},
    },
    "ipo": {  # tau = 1: a margin target of 0.5 nats, about where DPO's tiny-model margins stand after a run
        # (untuned: the band and k are DPO's)
        "objective": {"name": "ipo", "tau": 1.0},
        "humanline": {"sync_every": 4, "low": -0.1, "high": 0.2},
        "optim": {"lr": 1e-4},
    },
    "kto": {  # the best and the worst of each group (a DPO pair split in two), offline and online alike
        "objective": {"name": "kto", "beta": 0.1},
        "data": {"unpaired_rule": "best_worst"},
        "humanline": {"sync_every": 4, "low": -0.05, "high": 0.1},
        "optim": {"lr": 1e-4},
    },
}


@dataclass
class DemoSettings:
    objectives: list[str] = field(default_factory=lambda: ["grpo"])
    # Plain "sparse" (and the online+humanline variants) are available with --regimes; left out of the
    # default to keep the default demo within minutes on a CPU.
    regimes: list[str] = field(default_factory=lambda: ["offline", "offline+humanline", "online",
                                                        "sparse+humanline"])
    seeds: int = 3
    first_seed: int = 0  # seeds first_seed .. first_seed + seeds - 1 (others than the reported 0-2: for tuning)
    steps: int = 80
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    sample_every: int = 16
    eval_every: int = 20
    eval_prompts: int = 300
    eval_samples: int = 4
    train_prompts: int = 2000  # prompts for offline data and online sampling (the task has 2000)
    offline_source: str = "weak"  # the policy the offline data are sampled from: weak | base (OFFLINE_SOURCES)
    lr: float | None = None  # every run's learning rate; None: each objective's own (OBJECTIVES)
    ablation: bool = False  # run `humanline.experiments.harness.regimes.ABLATION` per objective instead of `regimes`
    # Runs side by side in processes of one thread each; results do not depend on it. Above 1 the processes
    # are spawned: a script calling `run_all` needs the `if __name__ == "__main__":` guard.
    workers: int = 1
    base: BaseConfig = field(default_factory=BaseConfig)

    def plan(self) -> list[tuple[str, str]]:
        """Every (objective, regime) to run, in order (each for `seeds` seeds)."""
        if not self.ablation:
            return plan(self.objectives, lambda o: self.regimes)
        return plan(self.objectives, lambda o: ablation_regimes(OBJECTIVES[o]["humanline"]["sync_every"]))

    @classmethod
    def quick(cls) -> "DemoSettings":
        """Under 2 minutes on 2 CPU cores: shorter SFT, one seed, three regimes, fewer steps."""
        return cls(regimes=["offline", "offline+humanline", "online"], seeds=1, steps=24, sample_every=8,
                   eval_every=12, eval_prompts=100, eval_samples=2, prompts_per_step=8,
                   base=BaseConfig(steps=300))


def prepare_data(settings: DemoSettings, out: Path, log) -> dict:
    """Cached policies, prompt files and the off-policy offline groups; returns their paths and base reward."""
    start = time.perf_counter()
    policies = ensure_policies(settings.base, log=log, workers=settings.workers)
    log(f"base and weak policies ready ({time.perf_counter() - start:.0f} s; cached under {policies.base.parent})")
    task = make_task(settings.base.task, seed=settings.base.task_seed)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    train = task.train[: settings.train_prompts]
    prompts = write_jsonl(data / "train_prompts.jsonl", train)
    held_out = task.held_out[: settings.eval_prompts]
    eval_prompts = write_jsonl(data / "eval_prompts.jsonl", held_out)
    groups = data / "offline_groups.jsonl"
    weak, weak_tok = load_policy(policies.weak)
    base, base_tok = load_policy(policies.base)
    source, source_tok = (weak, weak_tok) if settings.offline_source == "weak" else (base, base_tok)
    start = time.perf_counter()
    write_offline_groups(source, source_tok, task, groups, n=settings.samples_per_prompt, seed=1, records=train)
    offline_seconds = time.perf_counter() - start
    dropped = drop_empty_completions(groups)
    log(f"offline data: {len(train)} groups x {settings.samples_per_prompt} samples from the "
        f"{OFFLINE_SOURCES[settings.offline_source]} ({offline_seconds:.0f} s; {dropped} empty "
        f"completions dropped: a dataset cannot hold them)")
    base_reward = mean_sample_reward(base, base_tok, task, held_out, n=settings.eval_samples, seed=0)
    weak_reward = mean_sample_reward(weak, weak_tok, task, held_out, n=settings.eval_samples, seed=0)
    log(f"held-out reward before alignment: base {base_reward:.3f}, weak {weak_reward:.3f} (offline data: "
        f"{settings.offline_source})")
    return {"base": str(policies.base), "prompts": str(prompts), "eval_prompts": str(eval_prompts),
            "groups": str(groups), "base_reward": base_reward, "weak_reward": weak_reward,
            "offline_source": settings.offline_source, "offline_seconds": round(offline_seconds, 3),
            "offline_tokens": completion_tokens(groups, source_tok)}


def completion_tokens(path: Path, tokenizer) -> int:
    """The completion tokens a groups file holds (what sampling it cost, in the units a sampled run counts)."""
    groups = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) + 1 for g in groups for c in g["completions"])


def drop_empty_completions(path: Path) -> int:
    """Remove empty completions (the sampler stopped at once) from a groups file; groups left with fewer than
    two completions are removed too. Returns the number of completions dropped."""
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        group = json.loads(line)
        pairs = [(c, s) for c, s in zip(group["completions"], group["scores"]) if c.strip()]
        dropped += len(group["completions"]) - len(pairs)
        if len(pairs) >= 2:
            group["completions"], group["scores"] = [c for c, _ in pairs], [s for _, s in pairs]
            kept.append(json.dumps(group))
        else:
            dropped += len(pairs)
    path.write_text("".join(line + "\n" for line in kept))
    return dropped


def run_config(settings: DemoSettings, data: dict, objective: str, regime: str, seed: int, out: Path) -> Config:
    """The full config of one demo run."""
    overrides = {
        "model": {"name": data["base"]},
        "data": {"train": data["groups"], "max_prompt_length": 32, "max_length": 48},
        "rollout": {"prompts": data["prompts"], "prompts_per_step": settings.prompts_per_step,
                    "n": settings.samples_per_prompt, "max_new_tokens": 8, "reward": REWARD, "batch_size": 64,
                    "decoder": DECODER},
        "optim": {"warmup_ratio": 0.0, "max_grad_norm": 1.0},
        "train": {"micro_batch_size": units_per_step(objective, settings.prompts_per_step),
                  "max_steps": settings.steps, "seed": seed,
                  "sample_every": settings.sample_every, "eval_every": settings.eval_every,
                  "output_dir": str(out), "save_every": 0, "keep_checkpoints": 1},
        "eval": {"prompts": data["eval_prompts"], "reward": REWARD, "n": settings.eval_samples,
                 "max_new_tokens": 8, "temperature": 1.0},
        "logging": {"progress": False, "log_every": 0},
    }
    return checked_config(overrides, OBJECTIVES[objective], regime, settings.lr)


def run_all(settings: DemoSettings, out: Path, log) -> dict:
    """Train every (objective, regime, seed), `settings.workers` runs at a time; return the per-run records."""
    check_configs(settings, run_config, out)
    out.mkdir(parents=True, exist_ok=True)
    with one_thread():  # the offline data is sampled here: one thread, like every run (demo.workers)
        data = prepare_data(settings, out, log)
    todo = jobs(settings, data, out)
    estimate = [run_estimate(settings, objective, regime) for _, _, objective, regime, _, _ in todo]
    workers = max(1, min(settings.workers, len(todo)))
    log(f"{len(todo)} runs, {workers} at a time, about {sum(estimate) / workers / 60:.0f} min on idle cores "
        f"(longer on a busy machine)")
    progress = Progress(estimate, workers)

    def report(i: int, record: dict) -> None:
        left = progress.minutes_left(i)
        log(f"[{len(progress.done)}/{len(todo)}] {record['objective']:4s} {record['regime']:22s} seed "
            f"{record['seed']}: held-out reward {record['final_reward']:.3f}, train {record['train_seconds']:.1f} s "
            f"wall / {record['cpu_seconds']:.1f} s CPU, samples {record['samples_generated']}; about {left:.1f} min "
            f"left")

    return results_record(settings, data, run_jobs(train_run, todo, workers, on_result=report))


def train_run(settings: DemoSettings, data: dict, objective: str, regime: str, seed: int, out: Path) -> dict:
    """Train one demo run into `out/runs/<objective>-<regime>-seed<seed>`; return its summary record."""
    run_dir = out / "runs" / run_name(objective, regime, seed)
    cfg = run_config(settings, data, objective, regime, seed, run_dir)
    start, cpu = time.perf_counter(), time.process_time()
    trainer = Trainer(cfg, overwrite=True)  # the demo owns its run folders: a re-run replaces them
    trainer.train()
    if trainer.stopped_by is not None:  # SIGTERM / Ctrl-C mid-run: no partial result; a re-run starts it again
        raise SystemExit(128 + trainer.stopped_by)
    record = summarize_run(run_dir, objective, regime, seed, time.perf_counter() - start)
    record["process_cpu_seconds"] = round(time.process_time() - cpu, 3)  # evaluation included
    return record


# Seconds per run (training + its evaluations) on one idle core, 1 thread, default settings, by the record format
# the objective trains on (`training.objective_table.SPECS[name].kind`) and the data regime: the up-front estimate of a
# demo's length, scaled by steps and evaluation size (the measurement: lab/log.md; groups: GRPO,
# pairwise: DPO, unpaired: KTO). A new objective takes its format's figures, one on a new format the largest.
RUN_SECONDS = {("groups", "offline"): 23, ("groups", "online"): 26, ("groups", "sparse"): 26,
               ("pairwise", "offline"): 8, ("pairwise", "online"): 12, ("pairwise", "sparse"): 12,
               ("unpaired", "offline"): 10, ("unpaired", "online"): 15, ("unpaired", "sparse"): 15}


def run_estimate(settings: DemoSettings, objective: str, regime: str) -> float:
    """Expected seconds of one run (`RUN_SECONDS` for the objective's record format, scaled to the settings'
    steps and prompts per step); any objective of the table has one, with no entry of its own."""
    scale = settings.steps / 80 * settings.prompts_per_step / 16
    data_regime = regime_overrides(regime)["train"]["regime"]
    known = {kind: seconds for (kind, r), seconds in RUN_SECONDS.items() if r == data_regime}
    seconds = known.get(SPECS[objective].kind, max(known.values()))
    return seconds * max(scale, 0.1)


def summarize_run(run_dir: Path, objective: str, regime: str, seed: int, wall: float) -> dict:
    rows = metrics(run_dir)
    steps = step_rows(rows)
    curve, clock, cpu = [], 0.0, 0.0
    for r in rows:
        if "time/step" in r:
            clock, cpu = clock + r["time/step"], r.get("cost/cpu_seconds", cpu)
        if isinstance(r.get("eval/reward_mean"), (int, float)):
            curve.append({"step": r["step"], "train_seconds": round(clock, 3), "cpu_seconds": round(cpu, 3),
                          "reward": r["eval/reward_mean"]})
    inside = [r["humanline/inside_band"] for r in steps if isinstance(r.get("humanline/inside_band"), float)]
    last = steps[-1] if steps else {}
    return {
        **run_identity(objective, regime, seed, run_dir),
        "final_reward": curve[-1]["reward"] if curve else float("nan"),
        "curve": curve,
        "train_seconds": round(sum(r["time/step"] for r in steps), 3),
        "generation_seconds": round(sum(r.get("time/generation", 0.0) for r in steps), 3),
        "wall_seconds": round(wall, 3),
        "samples_generated": int(last.get("samples_generated", 0)),
        "skipped_steps": int(last.get("skipped_steps", 0)),
        "inside_band": sum(inside) / len(inside) if inside else None,
        "inside_band_curve": [round(sum(inside[i:i + 10]) / len(inside[i:i + 10]), 4)
                              for i in range(0, len(inside), 10)],  # mean of each 10 steps
        "band": [last["humanline/low"], last["humanline/high"]] if "humanline/low" in last else None,
        "cpu_seconds": round(last.get("cost/cpu_seconds", 0.0), 3),
        "generated_tokens": int(last.get("cost/generated_tokens", 0)),
        "forward_tokens": int(last.get("cost/forward_tokens", 0)),
        "backward_tokens": int(last.get("cost/backward_tokens", 0)),
    }

