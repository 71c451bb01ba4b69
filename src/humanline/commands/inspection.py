"""`humanline inspect data` and `humanline inspect perception`: look at offline data before training on it.

    humanline inspect data prefs.jsonl --model runs/sft [--filter-below 0.25] [--output-dir D]
    humanline inspect perception --policy P --reference R --prompts prompts.jsonl --data prefs.jsonl

The work is `humanline.diagnostics.end_to_end`; this module parses the flags, checks them (errors name the
flag) and prints the summaries. The method and its assumptions: docs/perception.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from humanline.diagnostics.end_to_end import PerceptionSettings, inspect_data, inspect_perception
from humanline.errors import UserError
from humanline.training.run_dir import check_creatable_dir


def add_parser(subparsers: Any) -> None:
    inspect = subparsers.add_parser("inspect", help="diagnose offline data: likelihood and perceptual distance")
    commands = inspect.add_subparsers(dest="inspect_command", metavar="{data,perception}", required=True)
    _add_data(commands)
    _add_perception(commands)


def _add_data(commands: Any) -> None:
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
    data.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier inspection there")
    data.set_defaults(func=run_data)


def _add_perception(commands: Any) -> None:
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
    per.add_argument("--max-new-tokens", type=int, default=64, help="the longest sampled completion, in tokens")
    per.add_argument("--temperature", type=float, default=1.0, help="1.0 samples the policy itself")
    per.add_argument("--value-bound", type=float, default=None,
                     help="||v||_inf for Proposition 3.4 (default: max |v(z)| over the observed outcomes)")
    per.add_argument("--bins", type=int, default=None, help="histogram bins (default: ~sqrt(smallest sample), 2..20)")
    per.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the 95%% interval")
    per.add_argument("--seed", type=int, default=0, help="seeds the sampling and the bootstrap")
    per.add_argument("--batch-size", type=int, default=16,
                     help="sequences per forward pass and per generate call (batch-size / n prompts at a time)")
    per.add_argument("--output-dir", default="inspect/perception",
                     help="where perception.json and perception.png go (made with the first file)")
    per.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier inspection there")
    per.set_defaults(func=run_perception)


def run_data(args: argparse.Namespace) -> int:
    if args.filter_below is not None and not 0.0 < args.filter_below < 1.0:  # before the model is loaded
        raise UserError(f"--filter-below: expected a quantile strictly between 0 and 1 (0.25 drops the bottom "
                        f"quartile), got {args.filter_below}")
    out = check_creatable_dir(args.output_dir, "--output-dir")  # created with its first file
    filtered = [f"{Path(str(args.data)).stem}.filtered.jsonl"] if args.filter_below is not None else []
    refuse_earlier(out, ["inspect_data.json", "histogram.png", *filtered], args.overwrite)
    report = inspect_data(args.data, args.model, out, gguf_file=args.gguf_file, batch_size=args.batch_size,
                          filter_below=args.filter_below, kind=args.format, split=args.split,
                          max_prompt_length=args.max_prompt_length, max_length=args.max_length)
    _print_data_summary(report, out)
    return 0


def run_perception(args: argparse.Namespace) -> int:
    settings = _perception_settings(args)
    out = check_creatable_dir(args.output_dir, "--output-dir")  # created with its first file
    refuse_earlier(out, ["perception.json", "perception.png"], args.overwrite)
    report = inspect_perception(args.policy, args.reference, args.prompts, out, data=args.data, other=args.other,
                                settings=settings)
    _print_perception_summary(report, out)
    return 0


def refuse_earlier(out: Path, names: list[str], overwrite: bool) -> None:
    """Before any work: the outputs of an earlier inspection in `out` are replaced only with --overwrite (and
    must be writable then)."""
    earlier = [name for name in names if (out / name).exists()]
    if earlier and not overwrite:
        raise UserError(f"inspect: {out / earlier[0]} exists (an earlier inspection): pass --overwrite to replace "
                        f"{', '.join(earlier)}, or choose another --output-dir")
    for name in earlier:
        if (out / name).is_dir() or not os.access(out / name, os.W_OK):
            raise UserError(f"inspect: cannot replace {out / name} (a folder, or not writable); choose another "
                            f"--output-dir")


def _perception_settings(args: argparse.Namespace) -> PerceptionSettings:
    """The flags as settings, each checked (errors name the flag) before any model loads."""
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
    return PerceptionSettings(gamma=args.gamma, n=args.n, max_prompts=args.max_prompts, max_records=args.max_records,
                              max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              value_bound=args.value_bound, bins=args.bins, bootstrap=args.bootstrap, seed=args.seed,
                              batch_size=args.batch_size)


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

