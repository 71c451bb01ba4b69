"""Shared-prompt (prefix) layout vs the layout it replaces, on a GRPO-shaped batch, interleaved.

    python benchmarks/prefix_forward.py [--quick] [--model smollm2|tiny] [--prompts 4] [--group 8] [--reps 5]

The batch: `--prompts` chat-templated prompts (~35 tokens on SmolLM2) x `--group` sampled-length completions
(~20 tokens), collated as the GRPO trainer does. Times `humanline.model.forward.part_logps` with
`humanline.model.prefix.ENABLED` on ("prefix": each prompt runs once, completions on its expanded KV cache) and
off ("plain": today's fused head + packed rows), as a policy forward + backward and as a no-grad
(reference / lookahead) forward, alternating the two so load changes hit both alike. Checks that both give
the same log-probs and gradients. Writes benchmarks/results/prefix_forward.json.
"""

from __future__ import annotations

import os
import random
import time

import common
import torch


def grpo_batch(tokenizer, prompts: int, group: int, seed: int = 0) -> dict:
    from humanline.data.collate import collate_grpo
    from humanline.data.tokenization import encode_completion, encode_prompt

    rng = random.Random(seed)
    units = []
    for p in range(prompts):
        prompt = [{"role": "user", "content": common._text(rng, rng.randint(6, 10))}]
        prompt_ids = encode_prompt(tokenizer, prompt)
        completions = [encode_completion(tokenizer, prompt, common._text(rng, rng.randint(12, 22)),
                                         prompt_ids=prompt_ids) for _ in range(group)]
        units.append({"id": p, "prompt": prompt_ids, "completions": completions, "rewards": [0.0] * group})
    return collate_grpo(units, tokenizer.pad_token_id)


def _run(model, batch: dict, prefix: bool, grad: bool) -> tuple[float, float, torch.Tensor]:
    import humanline.model.forward as fwd
    import humanline.model.prefix as pfx

    pfx.ENABLED = prefix
    wall, cpu = time.perf_counter(), time.process_time()
    if grad:
        logps = fwd.part_logps(model, batch)
        logps.sum().backward()
    else:
        with torch.no_grad():
            logps = fwd.part_logps(model, batch)
    return time.perf_counter() - wall, time.process_time() - cpu, logps.detach()


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model, 2 repetitions")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if args.quick:
        args.model, args.reps = "tiny", 2
    common.set_threads(args.threads)
    from humanline.model.capabilities import forward_path

    if args.model == "smollm2":
        from humanline.model import loading as models

        cfg = models.model_config_for("smollm2")
        tokenizer = models.load_tokenizer(cfg)
        torch.manual_seed(0)
        model = models.load_model(cfg, tokenizer)
    else:
        tokenizer, model = common.load_policy("tiny")
    model.train()
    batch = grpo_batch(tokenizer, args.prompts, args.group)
    grads, outs = {}, {}
    for side in ("plain", "prefix"):  # correctness first (and warm-up): values and gradients of both sides
        *_, outs[side] = _run(model, batch, side == "prefix", True)
        grads[side] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        model.zero_grad(set_to_none=True)
    path = forward_path(model)
    value_diff = float((outs["plain"] - outs["prefix"]).abs().max())
    grad_diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                    for a, b in zip(grads["prefix"], grads["plain"]))
    load_before = round(os.getloadavg()[0], 2)  # `machine()` in `finish` records the load at the end
    times = {side: {"fwd_bwd": [], "no_grad": []} for side in ("plain", "prefix")}
    for _ in range(args.reps):
        for side in ("plain", "prefix"):
            for kind in ("fwd_bwd", "no_grad"):
                wall, cpu, _ = _run(model, batch, side == "prefix", kind == "fwd_bwd")
                model.zero_grad(set_to_none=True)
                times[side][kind].append((wall, cpu))
    import humanline.model.prefix as pfx

    pfx.ENABLED = True
    rows = []
    for side, t in times.items():
        row = {"layout": side}
        for kind in ("fwd_bwd", "no_grad"):
            row[f"{kind} s"] = common.median([w for w, _ in t[kind]])
            row[f"{kind} cpu s"] = common.median([c for _, c in t[kind]])
        rows.append(row)
    ratios = {f"{kind} plain/prefix (median of paired reps)": common.median(
        [a[0] / b[0] for a, b in zip(times["plain"][kind], times["prefix"][kind])]) for kind in ("fwd_bwd", "no_grad")}
    mask, scored = batch["attention_mask"], batch["completion_mask"]
    prompt_tokens = (mask.sum(1) - scored.sum(1)).float()
    shape = {"rows": mask.shape[0], "columns": mask.shape[1], "real_tokens": int(mask.sum()),
             "completion_tokens": int(scored.sum()), "mean_prompt_tokens": float(prompt_tokens.mean()),
             "mean_completion_tokens": float(scored.sum(1).float().mean())}
    common.print_table(rows, ["layout", "fwd_bwd s", "fwd_bwd cpu s", "no_grad s", "no_grad cpu s"],
                       f"part_logps on {args.model}, {shape} (medians of {args.reps})")
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")
    print(f"forward path: {path}; max |logp diff| {value_diff:.2e}; max relative grad diff {grad_diff:.2e}")
    common.finish("prefix_forward", args, {
        "load_average_1m_before_timing": load_before, "batch": shape, "forward_path": path,
        "max_abs_logp_diff": value_diff, "max_rel_grad_diff": grad_diff, "results": rows, "ratios": ratios,
        "times": times})

if __name__ == "__main__":
    main()
