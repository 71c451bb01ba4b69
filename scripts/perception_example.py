"""The worked example of docs/perception.md, on the embedded arithmetic task, end to end.

    python scripts/perception_example.py [--out runs/perception-example] [--seeds 2] [--steps 80]

1. The demo's cached base and weak policies (trained by SFT on first use, as `humanline demo` does).
2. Three offline datasets of scored groups (8 completions per training prompt, empty completions dropped):
     weak       sampled from the weak policy at temperature 1 (the demo's own offline data)
     base       sampled from the base policy (the model being aligned) at temperature 1
     base-cold  sampled from the base policy at temperature 0.5
3. The diagnostics, through the command line (each command is printed before it runs):
     humanline inspect data DATASET --model BASE                 (average token log-prob under the reference)
     humanline inspect perception --policy ONLINE --reference BASE --prompts EVAL --data ... (KL to omega)
   where ONLINE is the final policy of an online GRPO run from BASE: the distribution training should move
   towards, so its outcomes z = log pi_ONLINE - log pi_BASE are what a perceptual loss weighs.
4. Offline GRPO with the demo's settings, without and with humanline, on each dataset for `--seeds` seeds,
   and the held-out reward each reaches: did the diagnostics predict which dataset trains better?
Writes OUT/example.json (every number the docs quote) and OUT/summary.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from humanline.experiments.demo.offline import mean_sample_reward, write_offline_groups
from humanline.experiments.demo.policies import ensure_policies, load_policy
from humanline.experiments.demo.run import DemoSettings, drop_empty_completions, run_config, summarize_run
from humanline.experiments.demo.tasks import make_task
from humanline.files import write_jsonl

REGIMES = ("offline", "offline+humanline")  # the demo's settings for each (humanline: k = 1, band +-1.5)
DATASETS = {  # name -> (policy, temperature, sampling seed)
    "weak": ("weak", 1.0, 1),
    "base": ("base", 1.0, 2),
    "base-cold": ("base", 0.5, 3),
}


def log(message: str) -> None:
    print(f"[example] {message}", flush=True)


def humanline_cli(*args: str) -> None:
    """Run `humanline ARGS` in a child process (as a user would), printing the command first."""
    log("$ humanline " + " ".join(shlex.quote(a) for a in args))
    subprocess.run([sys.executable, "-m", "humanline", *args], check=True)


def train(settings: DemoSettings, data: dict, regime: str, seed: int, run_dir: Path) -> dict:
    from humanline.training.loop import Trainer

    if (run_dir / "final").is_dir() and (run_dir / "metrics.jsonl").is_file():
        log(f"{run_dir.name}: already trained, reusing it")
    else:
        Trainer(run_config(settings, data, "grpo", regime, seed, run_dir), overwrite=True).train()
    return summarize_run(run_dir, "grpo", regime, seed, float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/perception-example")
    parser.add_argument("--seeds", type=int, default=2, help="offline training seeds per dataset")
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps of every training run")
    args = parser.parse_args()
    out = Path(args.out)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    settings = DemoSettings(steps=args.steps)
    policies = ensure_policies(settings.base)
    task = make_task(settings.base.task, seed=settings.base.task_seed)
    train_prompts = task.train[: settings.train_prompts]
    prompts = write_jsonl(data_dir / "train_prompts.jsonl", train_prompts)
    eval_prompts = write_jsonl(data_dir / "eval_prompts.jsonl", task.held_out[: settings.eval_prompts])

    files = {}
    for name, (which, temperature, seed) in DATASETS.items():
        path = data_dir / f"{name}.jsonl"
        if not path.is_file():
            model, tokenizer = load_policy(getattr(policies, which))
            write_offline_groups(model, tokenizer, task, path, n=settings.samples_per_prompt,
                                 temperature=temperature, seed=seed, records=train_prompts)
            dropped = drop_empty_completions(path)
            log(f"dataset {name}: {which} policy at temperature {temperature:g}, {dropped} empty completions dropped")
        files[name] = path
    base_model, base_tokenizer = load_policy(policies.base)
    base_reward = mean_sample_reward(base_model, base_tokenizer, task, task.held_out[: settings.eval_prompts],
                                n=settings.eval_samples, seed=0)
    log(f"base policy: held-out reward {base_reward:.3f}")
    data = {"base": str(policies.base), "prompts": str(prompts), "eval_prompts": str(eval_prompts)}

    online = train(settings, dict(data, groups=str(files["weak"])), "online", 0, out / "runs" / "online-seed0")
    log(f"online GRPO (the policy P of inspect perception): held-out reward {online['final_reward']:.3f}")

    inspect_data = {}
    for name, path in files.items():
        target = out / "inspect" / f"data-{name}"
        humanline_cli("inspect", "data", str(path), "--model", str(policies.base), "--output-dir", str(target),
                      "--batch-size", "256")
        report = json.loads((target / "inspect_data.json").read_text())
        inspect_data[name] = {k: report[k] for k in ("records", "completions", "record_quartiles", "by_side")}
    perception_dir = out / "inspect" / "perception"
    perception_args = ["inspect", "perception", "--policy", str(out / "runs" / "online-seed0"),
                       "--reference", str(policies.base), "--prompts", str(eval_prompts),
                       "--n", "8", "--max-prompts", "300", "--max-records", "300", "--max-new-tokens", "8",
                       "--batch-size", "256", "--output-dir", str(perception_dir)]
    for path in files.values():
        perception_args += ["--data", str(path)]
    humanline_cli(*perception_args)
    perception = json.loads((perception_dir / "perception.json").read_text())

    trained = {regime: {} for regime in REGIMES}
    for regime in REGIMES:
        for name, path in files.items():
            finals = []
            for seed in range(args.seeds):
                record = train(settings, dict(data, groups=str(path)), regime, seed,
                               out / "runs" / f"{regime.replace('+', '-')}-{name}-seed{seed}")
                finals.append(record["final_reward"])
                log(f"{regime} GRPO on {name}, seed {seed}: held-out reward {record['final_reward']:.3f}")
            trained[regime][name] = finals

    rows = []
    by_name = {c["name"]: c for c in perception["comparisons"]}
    for name, path in files.items():
        comparison = by_name[f"data:{path.name}"]
        rows.append({
            "dataset": name,
            "mean_logp": inspect_data[name]["record_quartiles"]["mean"],
            "kl": comparison["kl"], "kl_interval": comparison["kl_95"], "implied_gamma": comparison["implied_gamma"],
            **{f"{regime} rewards": trained[regime][name] for regime in REGIMES},
        })
    result = {"base_reward": base_reward, "online_reward": online["final_reward"],
              "inspect_data": inspect_data, "perception": perception, "trained": trained, "rows": rows,
              "seconds": round(time.perf_counter() - start, 1)}
    (out / "example.json").write_text(json.dumps(result, indent=2))
    lines = ["| dataset | mean token log-prob under base | KL(omega \\|\\| Q) [95% interval] | implied gamma* | "
             + " | ".join(f"{regime} GRPO held-out reward: mean (per seed)" for regime in REGIMES) + " |",
             "|---|---|---|---|" + "---|" * len(REGIMES)]
    for r in rows:
        lo, hi = r["kl_interval"]
        rewards = [r[f"{regime} rewards"] for regime in REGIMES]
        lines.append(f"| {r['dataset']} | {r['mean_logp']:.3f} | {r['kl']:.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{r['implied_gamma']:.2f} | " + " | ".join(
                         f"{statistics.fmean(x):.3f} ({', '.join(f'{v:.3f}' for v in x)})" for x in rewards) + " |")
    lines.append(f"\nbase (before training): {base_reward:.3f}; online GRPO (P): {online['final_reward']:.3f}; "
                 f"on-policy KL {by_name['on-policy']['kl']:.3f}; total {result['seconds']:.0f} s")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
