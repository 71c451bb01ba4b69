"""`humanline demo`: the embedded comparison (offline vs online vs humanline on a tiny task, on a CPU)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from humanline.commands import add_shared_flags
from humanline.errors import UserError
from humanline.experiments.demo.results import write_outputs
from humanline.experiments.demo.run import OBJECTIVES, OFFLINE_SOURCES, DemoSettings, run_all
from humanline.experiments.harness.command import (
    at_least_one,
    first_seed,
    learning_rate,
    print_outputs,
)
from humanline.experiments.harness.regimes import regime_overrides
from humanline.experiments.harness.workers import chosen_workers, tagged_log


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the embedded comparison: offline vs online vs humanline on a CPU",
                       description="Align a tiny model offline, online and with humanline; print a table and "
                                   "write results.json, report.md and plots.")
    add_shared_flags(p, objectives=list(OBJECTIVES), objective_default=None, output_default="runs/demo",
                     output_help="where results, report and plots go (default runs/demo)",
                     lr_help="every run's learning rate (default: each objective's own, GRPO 1e-4); compare "
                             "learning rates in output folders of their own",
                     quick_help="a 2-minute version (CI)")
    p.add_argument("--ablation", action="store_true",
                   help="the paper's Figure 5 per objective (default: every objective): syncing only, clipping only, "
                        "both, rejection, k in 1/4/16, the auto band; 3 seeds (the time it expects is printed first)")
    p.add_argument("--offline-source", choices=sorted(OFFLINE_SOURCES), default=None,
                   help="the policy the offline data are sampled from: weak (default; a different, weaker policy) "
                        "or base (the policy being aligned, before alignment: the paper's main setting)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = demo_settings(args)
    out = Path(args.output_dir)
    hf_logging.disable_progress_bar()  # a bar per model load and save, dozens per demo; the demo prints its own
    start = time.perf_counter()
    results = run_all(settings, out, tagged_log("demo"))
    return print_outputs(write_outputs(results, out, time.perf_counter() - start), out, start)


def demo_settings(args: argparse.Namespace) -> DemoSettings:
    """The defaults (or --quick's), with what the flags name replaced; errors name the flag."""
    settings = DemoSettings.quick() if args.quick else DemoSettings()
    if args.ablation:
        settings.ablation, settings.objectives = True, sorted(OBJECTIVES)
    if args.objective:
        settings.objectives = sorted(OBJECTIVES) if args.objective == "all" else [args.objective]
    if args.seeds is not None:
        settings.seeds = at_least_one("seeds", args.seeds)
    settings.first_seed = first_seed(args.first_seed)
    if args.regimes:
        if args.ablation:
            raise UserError("--regimes: the ablation runs its own regimes; give one or the other")
        for regime in args.regimes:
            regime_overrides(regime)  # a malformed name fails here, naming it
        settings.regimes = args.regimes
    if args.steps is not None:
        settings.steps = args.steps
    if args.lr is not None:
        settings.lr = learning_rate(args.lr)
    if args.offline_source is not None:
        settings.offline_source = args.offline_source
    settings.workers = chosen_workers(args.workers)
    return settings
