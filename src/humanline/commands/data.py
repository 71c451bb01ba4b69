"""`humanline data check` and `humanline data convert`.

    humanline data check prefs.jsonl [--format pairwise] [--strict] [--tokenizer tiny|FOLDER|FILE.gguf]
    humanline data convert scored.jsonl pairs.jsonl --to pairwise [--threshold 0.01] [--mode all_pairs] [--overwrite]
    humanline data convert 'reasoning_gym:chain_sum?size=500' prompts.jsonl --to prompts   (a task's prompts, written)

`check` exits 0 when every record is valid and 2 when there is any problem; errors about the whole source
(missing file, unknown format) are raised as `UserError`, which the top-level CLI prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from humanline.data.convert import PAIR_MODES, UNPAIRED_RULES, ConvertOptions, convert_records, write_records
from humanline.data.load import load_records, read_rows, validate_rows
from humanline.data.records import KINDS, Problem
from humanline.data.stats import char_lengths, label_summary, token_counts
from humanline.data.tokenization import check_limits
from humanline.errors import UserError
from humanline.model.loading import load_tokenizer
from humanline.settings.config import ModelConfig
from humanline.training.run_dir import check_creatable_dir

MAX_LISTED = 50  # problems printed one per line; the rest are counted


def add_parser(subparsers) -> None:
    data = subparsers.add_parser("data", help="check and convert datasets")
    commands = data.add_subparsers(dest="data_command", metavar="{check,convert}", required=True)
    check = commands.add_parser("check", help="validate a dataset; print its format, counts, lengths, problems")
    check.add_argument("path", help="a .jsonl/.json/.parquet/.csv file, a datasets folder, a hub name or "
                                    "reasoning_gym:NAME?... (a task's prompts)")
    check.add_argument("--format", choices=KINDS, default=None, help="the expected format (default: detect)")
    check.add_argument("--split", default="train", help="split, optionally sliced: train, test, train[:90%%]")
    check.add_argument("--strict", action="store_true", help="stop at the first problem")
    check.add_argument("--tokenizer", default=None, help="also count tokens: 'tiny', a folder or a .gguf file")
    check.add_argument("--max-prompt-length", type=int, default=None, help="tokens; report truncation")
    check.add_argument("--max-length", type=int, default=None, help="tokens (prompt + completion)")
    check.set_defaults(func=run_check)

    convert = commands.add_parser("convert", help="convert a dataset to another format (canonical JSONL)")
    convert.add_argument("input", help="a .jsonl/.json/.parquet/.csv file, a datasets folder, a hub name or "
                                       "reasoning_gym:NAME?...")
    convert.add_argument("output", help="the .jsonl file to write")
    convert.add_argument("--to", required=True, choices=KINDS, help="prompts: prompt records as they are (e.g. a "
                                                                    "reasoning-gym task's, to a file)")
    convert.add_argument("--format", choices=KINDS, default=None, help="format of the input (default: detect)")
    convert.add_argument("--split", default="train", help="split, optionally sliced: train, test, train[:90%%]")
    convert.add_argument("--threshold", type=float, default=None,
                         help="groups->pairwise: minimum score gap (default 0.01); groups->unpaired: desirable "
                              "when score >= threshold (implies --rule threshold)")
    convert.add_argument("--mode", choices=PAIR_MODES, default="best_worst", help="groups->pairwise pairing")
    convert.add_argument("--rule", choices=UNPAIRED_RULES, default=None, help="groups->unpaired labelling")
    convert.add_argument("--skip-invalid", action="store_true", help="drop invalid input records (reported)")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing output file (never the input)")
    convert.set_defaults(func=run_convert)


def run_check(args: argparse.Namespace) -> int:
    """Print the detected format, counts, length statistics and problems; 0 if clean, 2 otherwise."""
    if (args.max_length or args.max_prompt_length) and not args.tokenizer:
        raise UserError("--max-length and --max-prompt-length count tokens: give --tokenizer too")
    check_limits(args.max_prompt_length, args.max_length)
    rows = read_rows(args.path, args.split)
    result = validate_rows(rows, kind=args.format, name=str(args.path), strict=args.strict,
                           skip_invalid=True, allow_empty=True)
    problems = list(result.problems) or ([] if rows else [Problem(str(args.path), None, None, "no records")])
    print(f"{args.path}: format {result.kind}, {len(rows)} records: {len(result.records)} valid, "
          f"{len(result.problems)} invalid")
    if result.records:
        _print_lengths("characters", char_lengths(result.kind, result.records))
        print(label_summary(result.kind, result.records))
    if args.tokenizer and result.records:
        problems += _check_tokens(args, result)
    if not problems:
        return 0
    print(f"problems ({len(problems)}):")
    for problem in problems[:MAX_LISTED]:
        print(f"  {problem}")
    if len(problems) > MAX_LISTED:
        print(f"  ... and {len(problems) - MAX_LISTED} more")
    print(f"error: {args.path}: {len(problems)} problem(s), the first: {problems[0]}", file=sys.stderr)
    return 2


def _print_lengths(unit: str, lengths: dict[str, list[int]]) -> None:
    print(f"lengths in {unit}:")
    for name, values in lengths.items():
        if values:
            mean = sum(values) / len(values)
            print(f"  {name:<11} min {min(values):>7}  mean {mean:>9.1f}  max {max(values):>7}  (n={len(values)})")


def _check_tokens(args: argparse.Namespace, result) -> list[Problem]:
    """Print token length statistics (and truncation counts when limits are given); return the problems."""
    counts = token_counts(result.kind, result.records, _load_tokenizer(args.tokenizer),
                          max_prompt_length=args.max_prompt_length, max_length=args.max_length)
    _print_lengths(f"tokens ({args.tokenizer})", counts.lengths)
    if args.max_length is not None or args.max_prompt_length is not None:
        print(f"truncated records: {counts.truncated} (max_prompt_length={args.max_prompt_length}, "
              f"max_length={args.max_length}); no room for a completion: {len(counts.problems)}")
    return counts.problems


def _load_tokenizer(spec: str):
    """--tokenizer: 'tiny', a folder or hub name, or a .gguf file (its folder and file name)."""
    path = Path(spec)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise UserError(f"--tokenizer: no such file '{spec}'")
        return load_tokenizer(ModelConfig(name=str(path.parent), gguf_file=path.name))
    return load_tokenizer(ModelConfig(name=spec))


def run_convert(args: argparse.Namespace) -> int:
    """Load, convert and write canonical JSONL; prints what was written and dropped."""
    check_output(args.input, args.output, args.overwrite)  # before any loading: nothing is lost
    if args.threshold is not None and not math.isfinite(args.threshold):
        raise UserError(f"--threshold: expected a finite number, got {args.threshold}")
    loaded = load_records(args.input, kind=args.format, split=args.split, skip_invalid=args.skip_invalid,
                          skip_hint="--skip-invalid")
    for problem in loaded.problems:
        print(f"skipped: {problem}", file=sys.stderr)
    records, note = _convert(loaded.records, loaded.kind, args)
    if not records:  # an empty file that exits 0 reads as a conversion that worked
        flag = f"--threshold {args.threshold:g}" if args.threshold is not None else "the conversion's rules"
        raise UserError(f"data convert: no {args.to} record is left of {len(loaded.records)} {loaded.kind} records "
                        f"({note.strip(' ()') or 'every one dropped'}); nothing written: loosen {flag}")
    try:
        count = write_records(records, args.output)
    except OSError as exc:  # checked before the work; the disk may have filled or changed since
        raise UserError(f"data convert: cannot write '{args.output}' ({exc.strerror or exc})") from exc
    print(f"{args.output}: wrote {count} {args.to} records from {len(loaded.records)} {loaded.kind} records{note}")
    return 0


def check_output(source: str, output: str, overwrite: bool) -> None:
    """Refuse an output that is the input file (under any name: `x`, `./x`, `/abs/x`, a link) or, without
    `overwrite`, any existing file: converting would destroy what it reads, or replace a file silently."""
    out = Path(output)
    if out.is_dir():
        raise UserError(f"data convert: the output '{output}' is a folder; name the .jsonl file to write")
    if out.suffix.lower() != ".jsonl":
        raise UserError(f"data convert: {output}: records are written as JSON Lines; name the output *.jsonl")
    check_creatable_dir(str(out.parent), "data convert: the output's folder")
    if not out.exists():
        return
    try:
        same = Path(source).exists() and os.path.samefile(source, out)
    except OSError:
        same = False
    if same:
        raise UserError(f"data convert: the output '{output}' is the input file '{source}'; converting would "
                        f"replace the records it reads: write to another file")
    if not overwrite:
        raise UserError(f"data convert: '{output}' exists: pass --overwrite to replace it, or choose another output "
                        f"file")
    if not os.access(out, os.W_OK):
        raise UserError(f"data convert: '{output}' is not writable")


def _convert(records: list, source: str, args: argparse.Namespace) -> tuple[list, str]:
    """The conversion the flags ask for (`humanline.data.convert.CONVERSIONS`), and a note on what it dropped.
    --threshold is a score gap for pairs (default 0.01) and a cut for unpaired labels (implying --rule threshold)."""
    options = ConvertOptions(pair_threshold=0.01 if args.threshold is None else args.threshold, pair_mode=args.mode,
                             unpaired_rule=args.rule or ("threshold" if args.threshold is not None else "mean"),
                             unpaired_threshold=args.threshold)
    try:
        converted, note = convert_records(records, source, args.to, options)
    except UserError as exc:
        raise UserError(f"{args.input}: {exc}") from exc
    return converted, f" ({note})" if note else ""
