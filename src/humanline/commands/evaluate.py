"""`humanline eval MODEL_OR_RUN --prompts FILE ...`: sample on held-out prompts, score, write eval.json."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from humanline.data.load import load_records
from humanline.errors import UserError
from humanline.evaluation.generations import (
    baseline_from_model,
    default_reward_spec,
    evaluate_generations,
    is_verifiable,
    load_baseline_texts,
    load_eval_model,
    write_eval,
)
from humanline.model.loading import BUILT_IN, check_model_source, model_config_for
from humanline.sampling.reward_spec import build_reward
from humanline.sampling.rollout import GenerationConfig
from humanline.training.run_dir import check_creatable_dir

# GenerationConfig field -> the flag that sets it, so that an error names what the user typed
FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p", "n": "--n",
         "stop": "--stop", "batch_size": "--batch-size", "seed": "--seed"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("eval", help="generate on held-out prompts and write eval.json")
    p.add_argument("model", metavar="MODEL_OR_RUN", help="a model folder, or a run directory (uses RUN/final)")
    p.add_argument("--prompts", required=True, help="prompt records file (prompt, prompt_id, optional answer), or "
                   "reasoning_gym:NAME?...&split=held_out")
    p.add_argument("--reward", default=None,
                   help="reward spec: math_verify, exact_match, reasoning_gym, reward_model:PATH, module:function "
                   "(default: reasoning_gym for a reasoning-gym task's prompts, math_verify when every prompt has "
                   "an answer, else no reward)")
    p.add_argument("--baseline", default=None,
                   help="baseline completions (eval.json or JSONL with prompt_id + completion) or a model folder/run")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (default: k)")
    p.add_argument("--k", type=int, default=1, help="k of pass@k for verifiable rewards")
    p.add_argument("--max-new-tokens", type=int, default=GenerationConfig.max_new_tokens,
                   help="the longest completion sampled, in tokens")
    p.add_argument("--temperature", type=float, default=GenerationConfig.temperature, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=GenerationConfig.top_p,
                   help="nucleus sampling: sample from the smallest set of tokens holding this much probability "
                        "(1.0: all of them)")
    p.add_argument("--batch-size", type=int, default=GenerationConfig.batch_size, help="prompts per generate call")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seeds the sampling (the same seed, the same completions)")
    p.add_argument("--verifiable", action="store_true",
                   help="report pass@1/pass@k (implied by math_verify and exact_match rewards)")
    p.add_argument("--success-threshold", type=float, default=1.0, help="score counted as correct for pass@k")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail", help="when a reward fails on an item")
    p.add_argument("--output", default=None,
                   help="where to write the result (default: MODEL_OR_RUN/eval.json for a model or run folder, else "
                        "./eval-NAME.json, NAME the model name with every character other than letters, digits, "
                        "'.', '_' and '-' made '-': eval-smollm2.json, eval-owner-model.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing result file")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    gen = generation_config(args)  # flags first: a typo should not wait for the prompts or the model
    output = output_path(args.model, args.output, args.overwrite)
    baseline_is_model = check_baseline(args.baseline)
    check_model_source(model_config_for(args.model))  # a name found nowhere fails before the prompts and reward load
    records = list(load_records(args.prompts, kind="prompts", skip_hint=None).records)
    reward_spec = args.reward if args.reward is not None else default_reward_spec(records)
    reward_fn = build_reward(reward_spec, "--reward") if reward_spec is not None else None
    if args.model in BUILT_IN and Path(args.model).exists():  # as for train: the built-in model, said so
        print(f"[humanline] eval: '{args.model}' is the built-in model; the folder ./{args.model} is not read (pass "
              f"./{args.model} for it)", file=sys.stderr)
    model, tokenizer = load_eval_model(args.model)
    baseline_texts = None
    if args.baseline is not None:
        baseline_texts = (baseline_from_model(args.baseline, records, gen) if baseline_is_model
                          else load_baseline_texts(args.baseline, records))
    print(f"[humanline] eval: {len(records)} prompts x {gen.n} samples of {args.model} -> {output}", file=sys.stderr,
          flush=True)
    result = evaluate_generations(
        model, tokenizer, records, reward_fn, gen=gen, k=args.k, baseline_texts=baseline_texts,
        verifiable=args.verifiable or is_verifiable(reward_spec), success_threshold=args.success_threshold,
        on_error=args.on_error, progress=sys.stderr.isatty(),
    )
    header = {"model": args.model, "prompts": args.prompts, "reward_spec": reward_spec, "baseline": args.baseline}
    result = header | result
    try:
        write_eval(result, output)
    except OSError as exc:  # checked before the work; the disk may have filled or changed since
        raise UserError(f"--output: cannot write '{output}' ({exc.strerror or exc})") from exc
    print(summary_line(result, output))
    return 0


def output_path(model: str, output: str | None, overwrite: bool) -> str:
    """Where the result goes (`--output`'s help), refused before any work when a result is there already and
    `overwrite` is not given (an evaluation can take minutes: its result is never replaced silently), or when it
    cannot be written there."""
    if output is None:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-") or "model"
        folder = model not in BUILT_IN and Path(model).is_dir()
        output = str(Path(model) / "eval.json") if folder else f"eval-{name}.json"
    path = Path(output)
    if path.is_dir():
        raise UserError(f"--output: '{output}' is a folder; name the file to write (e.g. {path / 'eval.json'})")
    if path.exists() and not overwrite:
        raise UserError(f"eval: '{output}' holds an earlier result: pass --overwrite to replace it, or --output FILE "
                        f"to write another")
    check_creatable_dir(str(path.parent), "--output")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"--output: '{output}' is not writable")
    return output


def check_baseline(baseline: str | None) -> bool:
    """Before any work: `--baseline` names a model (a folder, a run, a built-in name: True) or a file of
    completions (False)."""
    if baseline is None:
        return False
    if baseline in BUILT_IN or Path(baseline).is_dir():
        return True
    if not Path(baseline).is_file():
        raise UserError(f"--baseline: no such file or folder '{baseline}' (expected an eval.json, a JSONL of "
                        f"prompt_id + completion, or a model folder or run)")
    return False


def generation_config(args: argparse.Namespace) -> GenerationConfig:
    """The sampling settings from the command line; errors name the flag (`--n`), not the internal field."""
    n_flag = "--n" if args.n is not None else "--k (--n defaults to it)"
    n = args.n if args.n is not None else args.k
    if args.temperature == 0 and n > 1:
        raise UserError(f"--temperature: expected > 0 with {n_flag} = {n} (temperature 0 is greedy decoding: one "
                        f"completion per prompt; pass --n 1)")
    if args.k < 1:
        raise UserError(f"--k: expected an integer >= 1, got {args.k}")
    try:
        return GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                n=n, stop=list(args.stop), batch_size=args.batch_size, seed=args.seed)
    except UserError as exc:
        text = str(exc)
        for name, flag in FLAGS.items():
            if text.startswith(f"generation.{name}:"):
                flag = n_flag if name == "n" else flag
                raise UserError(flag + text[len(f"generation.{name}"):]) from None
        raise


def summary_line(result: dict[str, Any], output: str) -> str:
    parts = [f"{result['num_prompts']} prompts x {result['n']}"]
    if result.get("reward", {}).get("mean") is not None:
        parts.append(f"reward {result['reward']['mean']:.4f} ± {result['reward']['std']:.4f}")
    if "pass@1" in result:
        parts.append(f"pass@1 {result['pass@1']:.4f}")
    if result.get("win_rate", {}).get("rate") is not None:
        w = result["win_rate"]
        parts.append(f"win rate {w['rate']:.3f} [{w['ci95_low']:.3f}, {w['ci95_high']:.3f}]")
    parts.append(f"mean length {result['length']['tokens']['mean']:.1f} tokens")
    return "eval: " + ", ".join(parts) + f" -> {output}"
