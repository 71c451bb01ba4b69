"""Rollout tokens/s on SmolLM2-135M-Instruct: today's path, transformers' default generate, humanline.sampling.decode.

    python benchmarks/rollout_speed.py [--quick] [--threads 2] [--prompts 32] [--n 8] [--levers]

On one batch of the arithmetic task ("What is a + b? Put the final answer in \\boxed{}.", system "Answer in one
line.", chat template, ~39 prompt tokens), T=1.0, max_new_tokens 32, n samples per prompt, 16 prompts per call
(the config default), in ONE run:
  today      `decoder="generate"`: model.generate, static cache, stop StoppingCriteria
  hf_default model.generate as a user would call it: DynamicCache, its own `stop_strings`, same sampling
  new        `HFGenerateBackend()`: humanline.sampling.decode (the default path)
for two workloads: stop at "\\n" (completions end after ~10-20 tokens) and no stop (eos or 32 tokens).
`--levers` adds, on the stop workload, the new path with compaction off, with n prompt copies prefilled
(n=1 on repeated prompts), with all prompts in one call, with torch.multinomial instead of the inverse-CDF draw,
and with bfloat16 weights.
Only kept tokens count (up to eos / the stop match). Writes benchmarks/results/rollout_speed.json.
"""

from __future__ import annotations

import random
import time

import common
import torch


def prompts(count: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [[{"role": "system", "content": "Answer in one line."},
             {"role": "user", "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}? "
                                         "Put the final answer in \\boxed{}."}] for _ in range(count)]


class GenerateDecoder:
    """Our rollout with `decoder="generate"`: every call through `model.generate` (today's path)."""

    def generate(self, model, tokenizer, prompt_token_ids, cfg):
        from dataclasses import replace

        from humanline.sampling.rollout import HFGenerateBackend

        return HFGenerateBackend().generate(model, tokenizer, prompt_token_ids, replace(cfg, decoder="generate"))


class DefaultGenerate:
    """transformers' `generate` with its defaults (DynamicCache, `stop_strings`), sampling as ours does."""

    def generate(self, model, tokenizer, prompt_token_ids, cfg):
        from humanline.sampling import rollout as R

        start = time.perf_counter()
        eos_ids = R.eos_ids_of(model, tokenizer)
        rows = []
        with R.eval_mode(model), torch.no_grad(), R._seeded(cfg.seed, torch.device("cpu")):
            for b in range(0, len(prompt_token_ids), cfg.batch_size):
                batch = prompt_token_ids[b: b + cfg.batch_size]
                ids, mask = R._left_pad(batch, tokenizer.pad_token_id, "cpu")
                extra = {"stop_strings": cfg.stop, "tokenizer": tokenizer} if cfg.stop else {}
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens,
                                     num_return_sequences=cfg.n, eos_token_id=eos_ids,
                                     pad_token_id=tokenizer.pad_token_id, **extra, do_sample=True,
                                     temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
                rows.extend(out[:, ids.shape[1]:].tolist())
        return R._assemble(prompt_token_ids, rows, cfg, tokenizer, set(eos_ids), time.perf_counter() - start,
                           [[0.0] * len(row) for row in rows])


def multinomial_choose(logits, temperature, top_p):
    """The draw `humanline.sampling.decode` made before its inverse-CDF `draw`: torch.multinomial (one exponential
    variate per vocabulary entry), with the chosen tokens' log-probabilities as `decode.choose` returns them."""
    from humanline.sampling import decode

    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, torch.zeros(tokens.shape)
    processed = decode.scores(logits, temperature, top_p)
    tokens = torch.multinomial(processed.softmax(-1), 1)[:, 0]
    return tokens, processed.log_softmax(-1).gather(1, tokens[:, None])[:, 0]


def run(name, model, tok, msgs, cfg, backend) -> dict:
    from humanline.sampling.rollout import generate

    r = generate(model, tok, msgs, cfg, backend=backend)
    reasons = [w for g in r.finish_reasons for w in g]
    row = {"path": name, "tokens": r.num_generated_tokens, "seconds": round(r.seconds, 2),
           "tokens_per_s": round(r.tokens_per_s, 1), "stopped": reasons.count("stop"), "eos": reasons.count("eos"),
           "length": reasons.count("length"), "load_1m": round(__import__("os").getloadavg()[0], 2)}
    print(f"  {name}: {row['tokens']} tokens in {row['seconds']} s = {row['tokens_per_s']} tok/s", flush=True)
    return row


def main() -> None:
    p = common.parser(__doc__, quick="8 prompts x 4 samples, max_new_tokens 16")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--levers", action="store_true", help="also measure each lever of the new path")
    p.add_argument("--skip-hf-default", action="store_true", help="leave out transformers' default generate")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.n, args.max_new_tokens = 8, 4, 16
    common.set_threads(args.threads)

    from humanline.model import loading as models
    from humanline.sampling import decode
    from humanline.sampling.rollout import GenerationConfig, HFGenerateBackend

    mcfg = models.model_config_for("smollm2")
    tok = models.load_tokenizer(mcfg)
    model = models.load_model(mcfg, tok)
    msgs = prompts(args.prompts)
    base = dict(max_new_tokens=args.max_new_tokens, temperature=1.0, n=args.n, seed=0, batch_size=16)
    workloads = {"stop_newline": GenerationConfig(stop=["\n"], **base), "no_stop": GenerationConfig(**base)}
    paths = {"today": GenerateDecoder(), "hf_default": DefaultGenerate(), "new": HFGenerateBackend()}
    if args.skip_hf_default:
        paths.pop("hf_default")

    rows = []
    for wname, cfg in workloads.items():
        print(f"{wname}: {args.prompts} prompts x {args.n}, max_new_tokens {args.max_new_tokens}", flush=True)
        for name, backend in paths.items():
            rows.append({"workload": wname, **run(name, model, tok, msgs, cfg, backend)})
        by = {r["path"]: r["tokens_per_s"] for r in rows if r["workload"] == wname}
        for r in rows:
            if r["workload"] == wname:
                r["vs_today"] = round(r["tokens_per_s"] / by["today"], 2)

    levers = []
    if args.levers:
        cfg = workloads["stop_newline"]
        print("levers (stop workload, new path):", flush=True)
        levers.append(run("new (default)", model, tok, msgs, cfg, HFGenerateBackend()))
        levers.append(run(f"batch_size {args.prompts} (one call)", model, tok, msgs,
                          GenerationConfig(**{**base, "batch_size": args.prompts}, stop=["\n"]), HFGenerateBackend()))
        saved = decode.COMPACT_FRACTION
        decode.COMPACT_FRACTION = 2.0
        try:
            levers.append(run("no compaction", model, tok, msgs, cfg, HFGenerateBackend()))
        finally:
            decode.COMPACT_FRACTION = saved
        repeated = [m for m in msgs for _ in range(args.n)]  # n prompt copies prefilled, like generate does
        levers.append(run("prefill n copies", model, tok, repeated,
                          GenerationConfig(**{**base, "n": 1, "batch_size": 16 * args.n}, stop=["\n"]),
                          HFGenerateBackend()))
        fast_choose = decode.choose
        decode.choose = multinomial_choose
        try:
            levers.append(run("torch.multinomial draw", model, tok, msgs, cfg, HFGenerateBackend()))
        finally:
            decode.choose = fast_choose
        model.to(torch.bfloat16)
        levers.append(run("bfloat16 weights", model, tok, msgs, cfg, HFGenerateBackend()))
        model.to(torch.float32)
        ref = levers[0]["tokens_per_s"]
        for r in levers:
            r["vs_new_default"] = round(r["tokens_per_s"] / ref, 2)

    common.print_table(rows, ["workload", "path", "tokens", "seconds", "tokens_per_s", "vs_today", "stopped", "eos",
                              "length", "load_1m"], title="rollout tokens/s (kept tokens)")
    if levers:
        common.print_table(levers, ["path", "tokens", "seconds", "tokens_per_s", "vs_new_default", "load_1m"],
                           title="levers of the new path (stop workload)")
    common.finish("rollout_speed", args, {"results": rows, "levers": levers})


if __name__ == "__main__":
    main()
