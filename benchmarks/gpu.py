"""GPU benchmark: our trainer vs TRL on a 0.5 B-class model in bf16, each measurement in its own process.

    bash benchmarks/gpu.sh                       # everything; writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --only dpo,rollout  # a subset (names: dpo kto grpo rollout)
    python benchmarks/gpu.py --small             # a tiny model: checks the harness anywhere, CPU included

The model is a randomly initialised Llama with Qwen2-0.5B's dimensions (494 M parameters, hidden 896, 24
layers, 14 heads / 2 KV heads, vocabulary 151,936, tied embeddings) and a word-level tokenizer of exactly that
vocabulary, built locally (no download). Fairness rules:
- every measurement runs in a fresh process (no side inherits the other's cached attention set-ups or
  compiled kernels), bf16 weights on both sides, no autocast, same records in the same order, same batch;
- each side first runs every distinct batch once (warm-up: every batch shape seen), then the same batches
  again, timed, >= 10 steps, `torch.cuda.synchronize()` before and after each step; the median is kept;
- both sides are timed over the same span: a whole step with its collation and logging (TRL: from one
  `on_step_end` to the next; TRL's GRPO side collates its inputs inside the timed step);
- measurements run in the order given, then again in reverse (`--repeats 2`, ABBA, at least 2 for figures that
  are reported), and the median is kept, with the spread of the repeats;
- peak memory is `torch.cuda.max_memory_allocated()` over the whole process (model, optimizer, steps).
Training: DPO (8 pairs per step), KTO (16 examples), GRPO on fixed completions (4 groups of 4; TRL's side
driven by hand: reference log-probs + compute_loss + backward + clip + optimizer, as benchmarks/grpo_vs_trl.py),
sides ours-frozen, ours-lookahead (humanline k = 1) and TRL, gradient checkpointing off and on. MFU counts
useful FLOPs only (6 N per trained token, 2 N per reference token, N = parameters, attention left out) against a
bf16 8192^3 matmul measured in the same process. Rollout: our generation backend, 64 prompts x 256 new tokens,
static vs dynamic KV cache, tokens/s after one warm-up call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import torch

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151_936),
    "small": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=4096),
}
SIDES = ("trl", "ours-frozen", "ours-lookahead")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


# ------------------------------------------------------------------ model, tokenizer, data


def build_model_folder(folder: Path, shape: str) -> Path:
    """Random Llama of `shape` and a word-level tokenizer whose vocabulary fills the model's exactly."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    dims = SHAPES[shape]
    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    words = specials + ["user", "assistant"] + [f"w{i}" for i in range(dims["vocab_size"] - len(specials) - 2)]
    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<|im_end|>",
                                        unk_token="<unk>", additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = CHATML
    config = LlamaConfig(**dims, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=True,
                         pad_token_id=0, eos_token_id=2, bos_token_id=None)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def records(kind: str, n: int, *, vocab: int, max_length: int, seed: int = 0) -> list[dict]:
    """`n` records of random words: prompts of 16..max/4 words, completions of 16..max/2 (fits max_length)."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(f"w{rng.randrange(vocab - 6)}" for _ in range(rng.randint(lo, hi)))

    out = []
    for i in range(n):
        prompt = [{"role": "user", "content": text(16, max_length // 4)}]
        if kind == "pairwise":
            out.append({"id": f"r{i}", "prompt": prompt, "chosen": text(16, max_length // 2),
                        "rejected": text(16, max_length // 2)})
        elif kind == "unpaired":
            out.append({"id": f"r{i}", "prompt": prompt, "completion": text(16, max_length // 2), "label": i % 2 == 0})
        else:
            out.append({"id": f"r{i}", "prompt": prompt, "completions": [text(16, max_length // 2) for _ in range(4)],
                        "scores": [rng.random() for _ in range(4)]})
    return out


# ------------------------------------------------------------------ one measurement (a worker process)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def matmul_peak() -> float:
    """Measured dense matmul rate in FLOP/s (bf16 8192^3 on CUDA, float32 1024^3 on the CPU)."""
    n, dtype = (8192, torch.bfloat16) if torch.cuda.is_available() else (1024, torch.float32)
    a = torch.randn(n, n, device="cuda" if torch.cuda.is_available() else "cpu", dtype=dtype)
    for _ in range(3):
        a @ a
    seconds = min(timed(lambda: a @ a) for _ in range(10))
    return 2 * n**3 / seconds


KINDS = {"dpo": "pairwise", "kto": "unpaired", "grpo": "groups"}
BATCH = {"dpo": 8, "kto": 16, "grpo": 4}


def our_side(spec: dict, folder: Path, data: list[dict], steps: int) -> tuple[list[float], list[int], list[int]]:
    extra = {"train": {"reference": "frozen"}} if spec["side"] == "ours-frozen" else \
        {"humanline": {"enabled": True, "sync_every": 1}, "train": {}}
    extra["train"]["mixed_precision"] = "no"  # bf16 weights, no autocast: TRL's side of the comparison
    run = common.our_trainer(spec["objective"], "tiny", data, batch=BATCH[spec["objective"]], steps=steps,
                             max_length=spec["max_length"], extra=extra,
                             model_section={"name": str(folder), "dtype": "bfloat16",
                                            "gradient_checkpointing": spec["checkpointing"]})
    trained = [int(sum(b["completion_mask"].sum() for b in run.trainer.run.schedule(s))) for s in range(steps)]
    fed = [run.tokens(s) for s in range(steps)]
    return [timed(run.step) for _ in range(steps)], trained, fed


def trl_side_times(spec: dict, folder: Path, data: list[dict], steps: int) -> tuple[list[float], list[int], list[int]]:
    import trl_side
    from transformers import TrainerCallback

    objective = spec["objective"]
    if objective == "grpo":
        return _trl_grpo(spec, folder, data, steps)
    times, trained, fed = [], [], []

    class Clock(TrainerCallback):  # step end to step end: data, collation and logging timed, as ours
        def on_train_begin(self, args, state, control, **kwargs):
            sync()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            now = time.perf_counter()
            times.append(now - self.start)
            self.start = now

    build = {"dpo": trl_side.dpo_trainer, "kto": trl_side.kto_trainer}[objective]
    trainer = build(str(folder), data, batch=BATCH[objective], steps=steps, max_length=spec["max_length"],
                    callbacks=[Clock()], gradient_checkpointing=spec["checkpointing"], dtype="bfloat16")
    collate = trainer.data_collator

    def counting(examples):
        batch = collate(examples)
        trained.append(int(sum(v.sum() for k, v in batch.items() if k.endswith("completion_mask"))))
        fed.append(int(sum(v.sum() for k, v in batch.items() if k.endswith("attention_mask"))))
        return batch

    trainer.data_collator = counting
    trainer.train()
    return times, trained[:steps], fed[:steps]


def _trl_grpo(spec: dict, folder: Path, data: list[dict], steps: int):
    import grpo_vs_trl
    from transformers import AutoTokenizer

    from humanline.data.load import load_records
    from humanline.data.tokenization import encode_groups

    tokenizer = AutoTokenizer.from_pretrained(folder)
    trainer = grpo_vs_trl.trl_grpo(str(folder), data, rows=16, group=4, steps=steps, dtype="bfloat16",
                                   gradient_checkpointing=spec["checkpointing"])
    if spec["checkpointing"]:  # HF's Trainer turns it on inside train(), which is not called here
        trainer.model.gradient_checkpointing_enable(trainer.args.gradient_checkpointing_kwargs)
    path = common.write_jsonl(data, folder / "groups.jsonl")
    units = encode_groups(load_records(str(path), kind="groups").records, tokenizer,
                          max_prompt_length=spec["max_length"] - 1, max_length=spec["max_length"]).units
    groups = [units[s * 4:(s + 1) * 4] for s in range(steps)]  # collated inside the timed step, as ours
    times = [timed(lambda g=g: grpo_vs_trl.trl_step(trainer, g, tokenizer.pad_token_id)) for g in groups]
    trained = [sum(sum(map(len, u["completions"])) for u in g) for g in groups]
    return times, trained, [t + sum(len(u["prompt"]) * len(u["completions"]) for u in g)
                            for g, t in zip(groups, trained)]


def rollout(spec: dict, folder: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from humanline.sampling.rollout import GenerationConfig, HFGenerateBackend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device)
    rng = random.Random(0)
    prompts = [[rng.randrange(6, len(tokenizer)) for _ in range(rng.randint(32, 64))] for _ in range(spec["prompts"])]
    cfg = GenerationConfig(max_new_tokens=spec["new_tokens"], n=1, batch_size=spec["prompts"], seed=0,
                           cache=spec["cache"])
    backend = HFGenerateBackend()
    backend.generate(model, tokenizer, prompts, cfg)  # warm-up (compiles the decoding step on CUDA)
    runs = [backend.generate(model, tokenizer, prompts, cfg) for _ in range(3)]
    return {"tokens_per_s": common.median([r.tokens_per_s for r in runs]),
            "tokens": runs[0].num_generated_tokens, "peak_MiB": _peak_mib()}


def _peak_mib() -> float:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else common.peak_rss_mb()


def worker(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="hl-gpu-") as tmp:
        folder = build_model_folder(Path(tmp) / "model", spec["shape"])
        if spec["kind"] == "rollout":
            return {**spec, **rollout(spec, folder)}
        distinct = spec["distinct_batches"]
        batch = BATCH[spec["objective"]]
        base = records(KINDS[spec["objective"]], distinct * batch, vocab=SHAPES[spec["shape"]]["vocab_size"],
                       max_length=spec["max_length"])
        data = base * (1 + spec["timed_passes"])  # warm-up pass over every distinct batch, then timed passes
        steps = len(data) // batch
        side = trl_side_times if spec["side"] == "trl" else our_side
        times, trained, fed = side(spec, folder, data, steps)
        params = _parameters(folder)
        timed_steps = slice(distinct, steps)
        s_per_step = common.median(times[timed_steps])
        flops = common.median([(6 * t + 2 * f) * params for t, f in zip(trained[timed_steps], fed[timed_steps])])
        return {**spec, "steps_timed": len(times[timed_steps]), "s_per_step": s_per_step,
                "trained_tokens_per_step": common.median(trained[timed_steps]),
                "tokens_per_s": common.median(trained[timed_steps]) / s_per_step,
                "peak_MiB": _peak_mib(), "mfu": flops / s_per_step / matmul_peak()}


def _parameters(folder: Path) -> int:
    """Parameter count of the saved model (tied embeddings once), from its config on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ the driver


def plan(args) -> list[dict]:
    shape, only = ("small" if args.small else "0.5b"), set(args.only.split(","))
    base = {"shape": shape, "max_length": 128 if args.small else 512, "distinct_batches": 4 if args.small else 8,
            "timed_passes": 2 if args.small else 2}
    specs = [{**base, "kind": "train", "objective": o, "side": s, "checkpointing": c}
             for o in ("dpo", "kto", "grpo") if o in only for c in (False, True) for s in SIDES]
    if "rollout" in only:
        specs += [{"shape": shape, "kind": "rollout", "cache": c, "prompts": 8 if args.small else 64,
                   "new_tokens": 32 if args.small else 256} for c in ("static", "dynamic")]
    return specs


def run_one(spec: dict, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"!!! {spec}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
        return {**spec, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"}
    result = json.loads(lines[-1])
    print(json.dumps({k: v for k, v in result.items() if k not in ("shape",)}), flush=True)
    return result


def key(spec: dict) -> tuple:
    return tuple(spec.get(k) for k in ("kind", "objective", "side", "checkpointing", "cache"))


def summarise(results: list[dict]) -> list[dict]:
    """Median over repeats per measurement, plus ours/TRL ratios of throughput and peak memory."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if "error" not in r:
            groups.setdefault(key(r), []).append(r)
    rows = []
    for k, rs in groups.items():
        row = {**rs[0], **{m: common.median([r[m] for r in rs])
                           for m in ("tokens_per_s", "peak_MiB", "s_per_step", "mfu") if m in rs[0]},
               "repeats": len(rs)}
        if "s_per_step" in rs[0]:  # how far the repeats lie apart (one pass alone carried about +-15 %)
            row["spread"] = (max(r["s_per_step"] for r in rs) - min(r["s_per_step"] for r in rs)) / row["s_per_step"]
        trl = groups.get(("train", row.get("objective"), "trl", row.get("checkpointing"), None))
        if row["kind"] == "train" and trl and row["side"] != "trl":
            row["speed_vs_trl"] = row["tokens_per_s"] / common.median([r["tokens_per_s"] for r in trl])
            row["memory_vs_trl"] = row["peak_MiB"] / common.median([r["peak_MiB"] for r in trl])
        rows.append(row)
    return rows


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--only", default="dpo,kto,grpo,rollout")
    parser.add_argument("--small", action="store_true", help="a tiny model (harness check; figures mean nothing)")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the plan, alternately reversed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.set_threads(args.threads, gpu_ok=True)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    specs = plan(args)
    results = [run_one(spec, args.threads) for rep in range(args.repeats)
               for spec in (specs if rep % 2 == 0 else specs[::-1])]
    rows = summarise(results)
    common.print_table([r for r in rows if r["kind"] == "train"],
                       ["objective", "checkpointing", "side", "s_per_step", "tokens_per_s", "peak_MiB", "mfu",
                        "speed_vs_trl", "memory_vs_trl", "repeats", "spread"],
                       "Training steps (medians over repeats; spread: (max - min) / median of s/step)")
    common.print_table([r for r in rows if r["kind"] == "rollout"], ["cache", "prompts", "new_tokens", "tokens_per_s",
                                                                      "peak_MiB", "repeats"], "Rollouts")
    name = "gpu_small" if args.small else "gpu"
    common.finish(name, args, {"rows": rows, "raw": results}, machine_info=_gpu_info())


def _gpu_info() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": None}
    return {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}


if __name__ == "__main__":
    main()
