"""Peak memory of DPO training by reference strategy, each configuration in its own process.

    python benchmarks/memory.py [--quick] [--model smollm2|tiny] [--steps 4] [--repeats 1] [--threads 1]

Configurations (SmolLM2-135M-Instruct by default, 4 pairs of <= 128 tokens per step, float32, AdamW):
  policy_only  a bare loop with no reference at all: our forward, the DPO loss against zero reference
               log-probs, backward, clipping, AdamW step (the floor any DPO trainer has to pay)
  lookahead    our Trainer, humanline k = 1 with the lookahead reference (no second set of weights)
  copy         our Trainer, humanline k = 1 with a synced weight copy
  frozen       our Trainer, plain DPO with a frozen reference model
  trl          TRL's DPOTrainer with its reference model (loaded from the same folder)
  *_gc         lookahead and trl again with gradient checkpointing (TRL's default; off in the rows above)
Every child loads the model from the same plain folder (the converted SmolLM2 copy), runs `--steps`
optimizer steps and reports its peak resident set size (VmHWM from /proc/self/status), the RSS after
building the trainer, and CUDA max allocated memory when a GPU is used. Target: lookahead within 3% of
policy_only. Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import common
import torch

CONFIGS = ["policy_only", "lookahead", "copy", "frozen", "trl", "lookahead_gc", "trl_gc"]
OUR_EXTRA = {
    "lookahead": {"train": {"reference": "lookahead"}, "humanline": {"enabled": True, "sync_every": 1}},
    "copy": {"train": {"reference": "copy"}, "humanline": {"enabled": True, "sync_every": 1}},
    "frozen": {"train": {"reference": "frozen"}, "humanline": {"enabled": False}},
    "lookahead_gc": {"train": {"reference": "lookahead"}, "humanline": {"enabled": True, "sync_every": 1}},
}


def _policy_only(folder: str, records: list[dict], steps: int, batch: int, max_length: int) -> float:
    import humanline.training.loop  # noqa: F401  (same imports as the trainer configurations)
    from humanline.data.collate import collate_dpo
    from humanline.data.load import load_records
    from humanline.data.tokenization import encode_pairs
    from humanline.model.forward import completion_mask, part_logps
    from humanline.model.loading import load_model, load_tokenizer
    from humanline.objectives import dpo_loss
    from humanline.settings.config import ModelConfig

    cfg = ModelConfig(name=folder)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    with tempfile.TemporaryDirectory() as tmp:
        path = common.write_jsonl(records, Path(tmp) / "train.jsonl")
        units = encode_pairs(load_records(str(path)).records, tokenizer, max_prompt_length=max_length - 1,
                             max_length=max_length).units
    after_build = common.current_rss_mb()
    for step in range(steps):
        batch_ = collate_dpo(units[step * batch: (step + 1) * batch], tokenizer.pad_token_id)
        mask = completion_mask(batch_)
        logps = part_logps(model, batch_)  # log-ratio against a zero "reference"
        half = logps.shape[0] // 2
        out = dpo_loss(logps[:half], logps[half:], mask[:half], mask[half:], beta=0.1)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return after_build


def _ours(config: str, folder: str, records: list[dict], steps: int, batch: int, max_length: int) -> float:
    model_section = {"name": folder, "gradient_checkpointing": config.endswith("_gc")}
    run = common.our_trainer("dpo", "smollm2", records, batch=batch, max_length=max_length, steps=steps,
                             extra=OUR_EXTRA[config], model_section=model_section)
    after_build = common.current_rss_mb()
    for _ in range(steps):
        run.step()
    return after_build


def _trl(folder: str, records: list[dict], steps: int, batch: int, max_length: int, checkpointing: bool) -> float:
    import trl_side

    trainer = trl_side.dpo_trainer(folder, records, batch=batch, steps=steps, max_length=max_length, callbacks=[],
                                   gradient_checkpointing=checkpointing)
    after_build = common.current_rss_mb()
    trainer.train()
    return after_build


def child(args) -> None:
    common.set_threads(args.threads)
    records = json.loads(Path(args.records).read_text())
    if args.config == "policy_only":
        after = _policy_only(args.folder, records, args.steps, args.batch, args.max_length)
    elif args.config.startswith("trl"):
        after = _trl(args.folder, records, args.steps, args.batch, args.max_length, args.config.endswith("_gc"))
    else:
        after = _ours(args.config, args.folder, records, args.steps, args.batch, args.max_length)
    result = {"config": args.config, "peak_rss_mb": common.peak_rss_mb(), "rss_after_build_mb": after}
    if torch.cuda.is_available():
        result["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print("RESULT " + json.dumps(result), flush=True)


def _child_env(malloc: str) -> dict:
    """The children's environment. `fixed`: glibc's mmap threshold pinned at 128 KiB, so every large tensor
    is mmap-ed and returned to the system when freed; by default glibc raises the threshold as large blocks
    are freed, later tensors then come from the heap and fragment it, and peak RSS depends on allocation
    order rather than on what is alive (differences of hundreds of MiB between identical workloads)."""
    env = dict(os.environ)
    if malloc == "fixed":
        env.update(MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    return env


def _model_folder(model: str, workdir: str) -> str:
    if model == "smollm2":
        return common.converted_smollm2()
    tokenizer, policy = common.load_policy("tiny")
    policy.save_pretrained(workdir)
    tokenizer.save_pretrained(workdir)
    return workdir


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model, 2 steps (checks the machinery only)")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--repeats", type=int, default=1, help="runs of each configuration (median reported)")
    parser.add_argument("--malloc", choices=["fixed", "default"], default="fixed",
                        help="glibc malloc thresholds in the children (see _child_env)")
    parser.add_argument("--child", dest="config", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:
        return child(args)
    if args.quick:
        args.model, args.steps = "tiny", 2
    work = tempfile.TemporaryDirectory(prefix="hl-bench-mem-")
    folder = _model_folder(args.model, work.name)
    from transformers import AutoTokenizer

    records = common.bench_records(args.model, "pairwise", args.steps * args.batch,
                                   tokenizer=AutoTokenizer.from_pretrained(folder), max_length=args.max_length)
    records_path = Path(work.name) / "records.json"
    records_path.write_text(json.dumps(records))
    rows = []
    for config in args.configs.split(","):
        cmd = [sys.executable, __file__, "--child", config, "--folder", folder, "--records", str(records_path),
               "--steps", str(args.steps), "--batch", str(args.batch), "--max-length", str(args.max_length),
               "--threads", str(args.threads)]
        peaks = []
        for _ in range(args.repeats):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_child_env(args.malloc))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode or not lines:
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"configuration {config} failed (exit {proc.returncode})")
            peaks.append(json.loads(lines[-1][len("RESULT "):]))
        row = dict(peaks[0])  # medians over the repeats; the spread shows how reproducible a figure is
        row["peak_rss_mb"] = common.median([p["peak_rss_mb"] for p in peaks])
        low, high = min(p["peak_rss_mb"] for p in peaks), max(p["peak_rss_mb"] for p in peaks)
        row["peak_rss_range_mb"] = f"{low:.0f}..{high:.0f}"
        rows.append(row)
        print(f"{config}: peak RSS {row['peak_rss_mb']:.0f} MiB (range {low:.0f}..{high:.0f} over {args.repeats})",
              flush=True)
    base = next((r["peak_rss_mb"] for r in rows if r["config"] == "policy_only"), None)
    for row in rows:
        row["vs_policy_only"] = row["peak_rss_mb"] / base if base else float("nan")
    columns = ["config", "peak_rss_mb", "peak_rss_range_mb", "rss_after_build_mb", "vs_policy_only"]
    if torch.cuda.is_available():
        columns.append("cuda_max_allocated_mb")
    common.print_table(rows, columns, f"peak memory, DPO on {args.model}, {args.steps} steps of {args.batch} pairs")
    common.finish("memory", args, {"results": rows})


if __name__ == "__main__":
    main()
