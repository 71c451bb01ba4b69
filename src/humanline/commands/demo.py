"""`humanline demo`: the embedded comparison (offline vs online vs humanline on a tiny task, on a CPU)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from humanline.errors import UserError
from humanline.experiments.demo.results import write_outputs
from humanline.experiments.demo.run import OBJECTIVES, OFFLINE_SOURCES, DemoSettings, run_all
from humanline.experiments.harness.command import at_least_one, first_seed, learning_rate, print_outputs
from humanline.experiments.harness.regimes import REGIMES, regime_overrides
from humanline.experiments.harness.workers import MAX_WORKERS, chosen_workers, tagged_log


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the embedded comparison: offline vs online vs humanline on a CPU",
                       description="Align a tiny model offline, online and with humanline; print a table and "
                                   "write results.json, report.md and plots.")
    p.add_argument("--output-dir", default="runs/demo")
    p.add_argument("--objective", choices=[*OBJECTIVES, "all"], default=None,
                   help="objective(s) to compare (default grpo)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per regime (default 3; --quick: 1)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="first seed (default 0): other seeds than the reported ones, to choose settings on")
    p.add_argument("--regimes", nargs="+", default=None,
                   help=f"regimes to run: {', '.join(REGIMES)}, or a variant such as offline+humanline-k16, "
                        f"offline+humanline-auto, offline+sync-only (humanline.experiments.harness.regimes)")
    p.add_argument("--ablation", action="store_true",
                   help="the paper's Figure 5 per objective (default: every objective): syncing only, clipping only, "
                        "both, rejection, k in 1/4/16, the auto band; 3 seeds (the time it expects is printed first)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    p.add_argument("--lr", type=float, default=None,
                   help="every run's learning rate (default: each objective's own, GRPO 1e-4); compare learning "
                        "rates in output folders of their own")
    p.add_argument("--offline-source", choices=sorted(OFFLINE_SOURCES), default=None,
                   help="the policy the offline data are sampled from: weak (default; a different, weaker policy) "
                        "or base (the policy being aligned, before alignment: the paper's main setting)")
    p.add_argument("--quick", action="store_true", help="a 2-minute version (CI)")
    p.add_argument("--workers", type=int, default=None,
                   help=f"runs side by side, in processes of one thread each (default: the usable cores, at most "
                        f"{MAX_WORKERS}); the numbers do not depend on it")
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
