"""Wall-clock per optimizer step and the share spent generating, by data regime (GRPO).

    python benchmarks/regimes.py [--quick] [--models tiny,smollm2] [--rounds 3] [--threads 1]

Tiny model (2 layers, hidden 64; 2-digit addition; 4 prompts x 4 samples of <= 6 new tokens per step;
graded exact-match reward): every regime runs `--steps` (default 64) whole Trainer steps, so a sparse
buffer's generation is paid inside the measured span (N = 64 generates exactly once). Regimes are run in
turn, `--rounds` times, with fresh trainers; medians over rounds.
  online            sample every step                   (reference: the sampling policy, no weight copy)
  sparse8/64        sample a buffer every 8 / 64 steps  (the policy that drew the buffer, cached log-probs)
  sparse8/64+hl     the same with humanline, k = 4      (synced weight copy)
  offline+hl        fixed offline groups, humanline k=4 (lookahead: no copy, no generation)
SmolLM2-135M (math prompts, 4 prompts x 4 samples of <= 64 new tokens, 4 groups per step as 2 x 2
micro-batches like recipes/smollm2): whole runs are too slow here, so per-buffer costs are measured and
combined: the generation time of one online step and of one 8-step buffer (timed inside Trainer steps),
and the training-step time for each reference strategy; a 64-step buffer is taken as 8 x the 8-step
buffer (generation is batched 16 prompts per call, so its cost is linear in the prompts). The SmolLM2 reward
is a hash of the text (`varied_reward`) so that no group is dropped as degenerate and every regime trains
on 16 sequences per step; its offline data are synthetic groups of similar length. `--models smollm2` keeps
the other models' rows already in the JSON. Writes benchmarks/results/regimes.json.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import common

TINY = {
    "model": {"name": "tiny", "tiny_hidden_size": 64, "tiny_layers": 2},
    "data": {"max_prompt_length": 32, "max_length": 48},
    "rollout": {"prompts": str(common.TINY_DATA / "prompts.jsonl"), "prompts_per_step": 4, "n": 4,
                "max_new_tokens": 6, "reward": str(common.ROOT / "recipes/tiny/rewards.py") + ":digits"},
    "optim": {"lr": 1e-3},
}
REGIMES = {
    "online": {"train": {"regime": "online", "sample_every": 1}},
    "sparse8": {"train": {"regime": "sparse", "sample_every": 8}},
    "sparse8+hl": {"train": {"regime": "sparse", "sample_every": 8}, "humanline": {"enabled": True, "sync_every": 4}},
    "sparse64": {"train": {"regime": "sparse", "sample_every": 64}},
    "sparse64+hl": {"train": {"regime": "sparse", "sample_every": 64},
                    "humanline": {"enabled": True, "sync_every": 4}},
    "offline+hl": {"train": {"regime": "offline"}, "humanline": {"enabled": True, "sync_every": 4}},
}


def _metrics(run: common.OurRun) -> list[dict]:
    path = Path(run.trainer.cfg.train.output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tiny_run(regime: str, steps: int) -> dict:
    extra = json.loads(json.dumps(TINY))
    for section, values in REGIMES[regime].items():
        extra.setdefault(section, {}).update(values)
    records = common.tiny_records("groups", steps * 4) if regime.startswith("offline") else [
        {"id": "unused", "prompt": "1+1=", "completions": ["2", "3"], "scores": [1.0, 0.0]}]
    run = common.our_trainer("grpo", "tiny", records, batch=4, max_length=48, steps=steps, extra=extra)
    walls = [run.step()[0] for _ in range(steps)]
    metrics = _metrics(run)
    generation = sum(m.get("time/generation", 0.0) for m in metrics)
    reward = sum(m.get("time/reward", 0.0) for m in metrics)
    return {"wall": sum(walls), "generation": generation, "reward": reward, "steps": steps}


def tiny(rounds: int, steps: int) -> list[dict]:
    per_regime: dict[str, list[dict]] = {name: [] for name in REGIMES}
    for _ in range(rounds):
        for name in REGIMES:
            per_regime[name].append(_tiny_run(name, steps))
    rows = []
    for name, runs in per_regime.items():
        rows.append({
            "model": "tiny", "regime": name, "steps": steps,
            "s/step": common.median([r["wall"] / r["steps"] for r in runs]),
            "generation share": common.median([r["generation"] / r["wall"] for r in runs]),
            "reward share": common.median([r["reward"] / r["wall"] for r in runs]),
        })
    online = rows[0]["s/step"]
    for row in rows:
        row["speed-up vs online"] = online / row["s/step"]
    return rows


# ------------------------------------------------------------------ SmolLM2: per-buffer costs


def varied_reward(prompts, completions, **_):
    """A reward that never ties within a group (a hash of the text): no group is dropped as degenerate, so
    every regime trains on all 16 sequences per step and the training times compare like for like. (With
    math-verify most SmolLM2 groups score all 0 and are dropped, and steps train on different amounts.)"""
    return [int(hashlib.sha1(c.encode()).hexdigest()[:8], 16) / 16**8 for c in completions]


def _smol_extra(regime: dict) -> dict:
    extra = {
        "data": {"max_prompt_length": 64, "max_length": 128},
        "rollout": {"prompts": str(common.ROOT / "recipes/smollm2/data/prompts.jsonl"), "prompts_per_step": 4,
                    "n": 4, "max_new_tokens": 64, "reward": f"{Path(__file__).resolve()}:varied_reward"},
        "objective": {"grpo_beta": 1e-4, "eps_low": 0.2, "eps_high": 0.2},
        "optim": {"lr": 1e-5},
        "train": {"grad_accum": 2},
    }
    for section, values in regime.items():
        extra.setdefault(section, {}).update(values)
    return extra


def _smol_steps(regime: dict, records: list[dict], steps: int) -> list[dict]:
    run = common.our_trainer("grpo", "smollm2", records, batch=2, max_length=128, steps=max(steps, 8),
                             extra=_smol_extra(regime))
    for _ in range(steps):
        run.step()
    return _metrics(run)


def smollm2() -> list[dict]:
    """Each strategy's training time is the mean over one whole cycle of its reference work: a sparse buffer's
    log-probs are computed at its first step (8 steps), a lookahead or copy reference syncs every k = 4 steps,
    an online step is its own cycle. (A median over non-sync steps would leave that work out.)"""
    tokenizer, _ = common.load_policy("smollm2")
    offline = common.synthetic_records("groups", 8 * 4, tokenizer=tokenizer, max_length=110)
    online = _smol_steps({"train": {"regime": "online"}}, offline, 2)
    sparse = _smol_steps({"train": {"regime": "sparse", "sample_every": 8}}, offline, 8)
    sparse_hl = _smol_steps({"train": {"regime": "sparse", "sample_every": 8},
                             "humanline": {"enabled": True, "sync_every": 4}}, offline, 8)
    offline_hl = _smol_steps({"train": {"regime": "offline"}, "humanline": {"enabled": True, "sync_every": 4}},
                             offline, 4)

    def train_time(metrics: list[dict]) -> float:
        return sum(m["time/train"] for m in metrics) / len(metrics)

    def tokens(metrics: list[dict]) -> float:  # completion tokens trained per step (the trainer's own count)
        return sum(m["tokens_per_s"] * m["time/train"] for m in metrics) / len(metrics)

    gen1 = common.median([m["time/generation"] + m["time/reward"] for m in online])
    gen8 = sparse[0]["time/generation"] + sparse[0]["time/reward"]
    t_frozen, t_copy, t_lookahead = train_time(sparse), train_time(sparse_hl), train_time(offline_hl)
    t_online = train_time(online)
    parts = {
        "online": (gen1, t_online, tokens(online)),
        "sparse8": (gen8 / 8, t_frozen, tokens(sparse)), "sparse8+hl": (gen8 / 8, t_copy, tokens(sparse_hl)),
        "sparse64": (gen8 / 8, t_frozen, tokens(sparse)), "sparse64+hl": (gen8 / 8, t_copy, tokens(sparse_hl)),
        "offline+hl": (0.0, t_lookahead, tokens(offline_hl)),
    }
    rows = []
    for name, (gen, train, n_tokens) in parts.items():
        rows.append({"model": "smollm2", "regime": name, "steps": "per-buffer", "s/step": gen + train,
                     "generation share": gen / (gen + train), "reward share": float("nan"),
                     "completion tokens/step": round(n_tokens)})
    online_s = rows[0]["s/step"]
    for row in rows:
        row["speed-up vs online"] = online_s / row["s/step"]
    rows.append({"model": "smollm2", "regime": "(components)", "steps": "",
                 "s/step": float("nan"), "gen_online_step_s": gen1, "gen_8step_buffer_s": gen8,
                 "train_frozen_s": t_frozen, "train_copy_s": t_copy, "train_lookahead_s": t_lookahead})
    return rows


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model, 1 round")
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="tiny: steps per run (>= 64 so N = 64 samples once)")
    args = parser.parse_args()
    if args.quick:
        args.models, args.rounds = "tiny", 1
    common.set_threads(args.threads)
    rows = []
    columns = ["model", "regime", "steps", "s/step", "generation share", "reward share", "speed-up vs online",
               "completion tokens/step"]
    for model in args.models.split(","):
        rows += tiny(args.rounds, args.steps) if model == "tiny" else smollm2()
        common.print_table([r for r in rows if r["model"] == model], columns, f"regimes ({model})")
    previous = common.RESULTS / "regimes.json"
    if previous.is_file():  # keep the rows of models not measured this time
        measured = set(args.models.split(","))
        rows = [r for r in json.loads(previous.read_text())["results"] if r["model"] not in measured] + rows
    common.print_table([r for r in rows if r["regime"] != "(components)"], columns,
                       "GRPO wall-clock per optimizer step by regime (medians)")
    common.finish("regimes", args, {"results": rows})


if __name__ == "__main__":
    main()
