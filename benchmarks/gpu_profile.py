"""Where a GPU training step's time goes, ours against TRL, and what sampling costs against training.

    python benchmarks/gpu_profile.py                # a GPU, <= 8 min: writes benchmarks/results/gpu_profile.json
    python benchmarks/gpu_profile.py --small        # a tiny model on the CPU: checks the script (figures mean nothing)

1. Steps. For DPO (8 pairs) and GRPO on fixed completions (4 groups of 4), TRL and ours (a frozen reference),
   gradient checkpointing off, each in a fresh process on `gpu.py`'s model and data (a random Llama of Qwen2-0.5B's
   shape, bf16 weights, no autocast; <= 512 tokens): every distinct batch once (warm-up), timed steps (median
   s/step, min-max; both sides timed over a whole step with its collation), 2 steps under torch.profiler, 1 step
   under the host-sync counter (`humanline.diagnostics.syncs`, the whole step, optimizer included, both sides).
   From the trace (`trace_stats.py`): device busy share, kernel launches and CUDA synchronisations per step,
   host time by phase, device idle gaps by the phase that launched the work ending them, device time by kernel
   group (GEMM, attention, head, optimizer, elementwise). Then, while the deadline allows, ours with
   `train.compile: true` (not in `--small`).
2. Rates. For the same shape, tokens/s of sampling (our rollout backend, static cache, 64 prompts) and of
   training (our GRPO step, 4 groups of 4 completions) at 256- and 1024-token answers. Per trained completion
   token an online step costs 1/sampling + 1/training, an offline one 1/training: offline saves the factor
   1 + training/sampling in wall-clock (this project's sparse regime samples as many tokens as online, in larger
   batches). And the fixed cost of one forward + backward call in tokens (what `model/prefix.py` allows for a second
   forward on an accelerator).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import gpu
import torch
import trace_stats

STEP = "profiled_step"
PHASES = {"collate", "reference", "sync", "forward+loss", "backward", "clip", "read_back", "optimizer", "logging"}


# ------------------------------------------------------------------ labels and the measured session


def phase(name: str):
    return torch.profiler.record_function(name)


def label(owner, attribute: str, name: str) -> None:
    """Run `owner.attribute(...)` under the profiler label `name` (an instance or module attribute)."""
    fn = getattr(owner, attribute)

    @functools.wraps(fn)
    def labelled(*args, **kwargs):
        with phase(name):
            return fn(*args, **kwargs)

    setattr(owner, attribute, labelled)


class Phased:
    """A callable object (our schedule) whose calls run under a label; everything else passes through."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def __call__(self, *args, **kwargs):
        with phase(self.name):
            return self.inner(*args, **kwargs)

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)


class Session:
    """Warm-up, timed, profiled and counted steps, driven by step boundaries: `boundary(n)` once n steps are
    done (n = 0 before the first), from a loop we run or from a trainer's callback."""

    def __init__(self, warmup: int, timed: int, trace: Path):
        self.warmup, self.timed, self.trace = warmup, timed, trace
        self.times: list[float] = []
        self.prev = 0.0
        self.prof = self.span = self.counter = None
        self.syncs: dict = {}

    @property
    def total(self) -> int:
        return self.warmup + self.timed + 3

    def boundary(self, n: int) -> None:
        gpu.sync()
        now = time.perf_counter()
        first_profiled = self.warmup + self.timed
        if self.warmup < n <= first_profiled:
            self.times.append(now - self.prev)
        if first_profiled < n <= first_profiled + 2:
            self.span.__exit__(None, None, None)
        if n == first_profiled:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.start()
        if n == first_profiled + 2:
            self.prof.stop()
            self.prof.export_chrome_trace(str(self.trace))
            from humanline.diagnostics.syncs import SyncCounter

            self.counter = SyncCounter(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
            self.counter.__enter__()
        if n == first_profiled + 3:
            self.counter.__exit__(None, None, None)
            self.syncs = {"total": self.counter.total, **self.counter.by_kind}
        if first_profiled <= n < first_profiled + 2:
            self.span = phase(STEP)
            self.span.__enter__()
        gpu.sync()
        self.prev = time.perf_counter()

    def run(self, step) -> None:
        for n in range(self.total):
            self.boundary(n)
            step()
        self.boundary(self.total)


# ------------------------------------------------------------------ the sides


def our_step(spec: dict, folder: Path, data: list[dict], steps: int):
    """Our Trainer (frozen reference, bf16 weights, no autocast) with its parts labelled; returns step()."""
    import humanline.core.logps as logps_module
    import humanline.training.step as train_module

    run = common.our_trainer(spec["objective"], "tiny", data, batch=gpu.BATCH[spec["objective"]], steps=steps,
                             max_length=spec["max_length"],
                             extra={"train": {"reference": "frozen", "mixed_precision": "no",
                                              "compile": spec["side"] == "ours-compiled"}},
                             model_section={"name": str(folder), "dtype": "bfloat16"})
    trainer = run.trainer
    trainer.run.schedule = Phased(trainer.run.schedule, "collate")
    for owner, attribute, name in [
            (trainer.run.reference, "logps", "reference"), (trainer.run.reference, "capture_pre_update", "sync"),
            (train_module, "micro_batch_loss", "forward+loss"), (trainer.run.accelerator, "backward", "backward"),
            (train_module, "clip_grad_norm", "clip"), (train_module, "read_back", "read_back"),
            (trainer.run.optimizer, "step", "optimizer"), (trainer.run.logger, "log", "logging")]:
        label(owner, attribute, name)
    head = logps_module._LinearLogps
    for attribute in ("forward", "backward"):
        fn = getattr(head, attribute)
        setattr(head, attribute, staticmethod(lambda *a, _fn=fn: _labelled(_fn, *a)))
    return run.step


def _labelled(fn, *args):
    with phase("head"):
        return fn(*args)


def trl_grpo_step(spec: dict, folder: Path, data: list[dict], steps: int):
    import grpo_vs_trl
    from transformers import AutoTokenizer

    from humanline.data.load import load_records
    from humanline.data.tokenization import encode_groups

    tokenizer = AutoTokenizer.from_pretrained(folder)
    trainer = grpo_vs_trl.trl_grpo(str(folder), data, rows=16, group=4, steps=steps, dtype="bfloat16")
    path = common.write_jsonl(data, folder.parent / "groups.jsonl")
    units = encode_groups(load_records(str(path), kind="groups").records, tokenizer,
                          max_prompt_length=spec["max_length"] - 1, max_length=spec["max_length"]).units
    groups = iter([units[s * 4:(s + 1) * 4] for s in range(steps)])
    return lambda: grpo_vs_trl.trl_step(trainer, next(groups), tokenizer.pad_token_id, phase)


def trl_dpo(spec: dict, folder: Path, data: list[dict], session: Session) -> None:
    """TRL's own `train()` loop, its parts labelled, the session driven from its callbacks."""
    import trl_side
    from transformers import TrainerCallback

    class Boundaries(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            label(kwargs["optimizer"], "step", "optimizer")
            session.boundary(0)

        def on_step_end(self, args, state, control, **kwargs):
            session.boundary(state.global_step)

    trainer = trl_side.dpo_trainer(str(folder), data, batch=gpu.BATCH["dpo"], steps=session.total,
                                   max_length=spec["max_length"], callbacks=[Boundaries()], dtype="bfloat16")
    label(trainer, "data_collator", "collate")
    for owner, attribute, name in [(trainer, "compute_loss", "forward+loss"),
                                   (trainer.accelerator, "backward", "backward"),
                                   (trainer.accelerator, "clip_grad_norm_", "clip"), (trainer, "log", "logging")]:
        label(owner, attribute, name)
    trainer.train()


def step_worker(spec: dict) -> dict:
    folder = Path(spec["folder"])
    batch = gpu.BATCH[spec["objective"]]
    base = gpu.records(gpu.KINDS[spec["objective"]], spec["distinct"] * batch, vocab=spec["vocab"],
                       max_length=spec["max_length"])
    with tempfile.TemporaryDirectory(prefix="hl-profile-") as tmp:
        session = Session(spec["distinct"], spec["timed"], Path(tmp) / "trace.json")
        data = base * (-(-session.total // spec["distinct"]) + 1)
        if spec["side"] == "trl" and spec["objective"] == "dpo":
            trl_dpo(spec, folder, data, session)
        else:
            build = trl_grpo_step if spec["side"] == "trl" else our_step
            session.run(build(spec, folder, data, session.total))
        stats = trace_stats.step_stats(json.loads(session.trace.read_text())["traceEvents"], step=STEP,
                                       phases=PHASES)
    return {**spec, "s_per_step": common.median(session.times), "s_min": min(session.times),
            "s_max": max(session.times), "steps_timed": len(session.times), "syncs_per_step": session.syncs,
            "peak_MiB": gpu._peak_mib(), **stats}


# ------------------------------------------------------------------ sampling and training rates


def rates_worker(spec: dict) -> dict:
    """Sampling and training tokens/s at each answer length, and the fixed cost of a call in tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from humanline.sampling.rollout import GenerationConfig, HFGenerateBackend

    folder, device = Path(spec["folder"]), "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device)
    rng = random.Random(0)
    prompts = [[rng.randrange(6, len(tokenizer)) for _ in range(spec["prompt"])] for _ in range(spec["prompts"])]
    out = {**spec, "sampling_tokens_per_s": {}, "training_tokens_per_s": {}}
    backend = HFGenerateBackend()
    for length in spec["lengths"]:
        cfg = GenerationConfig(max_new_tokens=length, n=1, batch_size=spec["prompts"], seed=0, cache="static")
        backend.generate(model, tokenizer, prompts, cfg)  # warm-up (compiles the decoding step on CUDA)
        runs = [backend.generate(model, tokenizer, prompts, cfg) for _ in range(2)]
        out["sampling_tokens_per_s"][str(length)] = common.median([r.tokens_per_s for r in runs])
    out["call_overhead_tokens"] = call_overhead(model, tokenizer)
    del model
    for length in spec["lengths"]:
        out["training_tokens_per_s"][str(length)] = training_rate(spec, folder, length)
    for length in map(str, spec["lengths"]):
        sample, train = out["sampling_tokens_per_s"][length], out["training_tokens_per_s"][length]
        out.setdefault("offline_saving", {})[length] = 1 + train / sample  # (1/s + 1/t) / (1/t)
    return out


def training_rate(spec: dict, folder: Path, length: int) -> float:
    """Trained completion tokens/s of our GRPO step on 4 groups of 4 answers of exactly `length` tokens."""
    rng = random.Random(length)

    def words(n: int) -> str:
        return " ".join(f"w{rng.randrange(spec['vocab'] - 6)}" for _ in range(n))

    data = [{"id": f"r{i}", "prompt": [{"role": "user", "content": words(spec["prompt"])}],
             "completions": [words(length) for _ in range(4)], "scores": [rng.random() for _ in range(4)]}
            for i in range(4 * 5)]
    run = common.our_trainer("grpo", "tiny", data, batch=4, steps=5, max_length=spec["prompt"] + length + 16,
                             extra={"train": {"reference": "frozen", "mixed_precision": "no"}},
                             model_section={"name": str(folder), "dtype": "bfloat16"})
    trained = [int(sum(b["completion_mask"].sum() for b in run.trainer.run.schedule(s))) for s in range(5)]
    times = [gpu.timed(run.step) for _ in range(5)]
    return common.median([t / s for t, s in zip(trained[2:], times[2:])])  # 2 warm-up steps


def call_overhead(model, tokenizer) -> float:
    """Forward + backward of 2 rows x 16 tokens and of 8 rows x 512, through `part_logps`: the small call's
    time beyond its tokens' share, in tokens (the slope of the two calls' times)."""
    from humanline.data.collate import collate_grpo, to_device
    from humanline.model.forward import part_logps

    def batch(rows: int, tokens: int) -> dict:
        unit = {"id": 0, "prompt": list(range(6, 6 + tokens // 2)), "rewards": [0.0] * rows,
                "completions": [list(range(7, 7 + tokens - tokens // 2)) for _ in range(rows)]}
        return to_device(collate_grpo([unit], tokenizer.pad_token_id), next(model.parameters()).device)

    def seconds(b: dict) -> float:
        def once():
            part_logps(model, b).sum().backward()
        once()
        return common.median([gpu.timed(once) for _ in range(5)])

    small, large = batch(2, 16), batch(8, 512)
    t_small, t_large = seconds(small), seconds(large)
    per_token = (t_large - t_small) / (8 * 512 - 2 * 16)
    return t_small / per_token - 2 * 16 if per_token > 0 else float("nan")


# ------------------------------------------------------------------ the driver


def run_worker(spec: dict, threads: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec), "--threads", str(threads)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        return {**spec, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"!!! {spec.get('objective', 'rates')} {spec.get('side', '')}: exit {proc.returncode}\n"
              f"{proc.stderr[-3000:]}", flush=True)
        return {**spec, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"}
    result = json.loads(lines[-1])
    print(json.dumps({k: v for k, v in result.items() if k != "folder"}), flush=True)
    return result


def plan(args, folder: Path) -> list[dict]:
    small = args.small
    base = {"folder": str(folder), "vocab": gpu.SHAPES["small" if small else "0.5b"]["vocab_size"],
            "max_length": 128 if small else 512, "distinct": 2 if small else 4, "timed": 3 if small else 8}
    steps = [{**base, "kind": "step", "objective": o, "side": s} for o in ("dpo", "grpo") for s in ("trl", "ours")]
    rates = {**base, "kind": "rates", "lengths": [16, 32] if small else [256, 1024], "prompts": 8 if small else 64,
             "prompt": 16 if small else 64}
    # last, while time is left: `train.compile: true` (its first steps compile; they are warm-up steps)
    compiled = [] if small else [{**base, "kind": "step", "objective": o, "side": "ours-compiled"}
                                 for o in ("dpo", "grpo")]
    return steps + [rates] + compiled


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--small", action="store_true", help="a tiny model on the CPU (checks the script)")
    parser.add_argument("--deadline", type=float, default=460.0, help="seconds for the whole run (8 min on a GPU)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.set_threads(args.threads, gpu_ok=True)
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(step_worker(spec) if spec["kind"] == "step" else rates_worker(spec)), flush=True)
        return
    end = time.monotonic() + args.deadline
    with tempfile.TemporaryDirectory(prefix="hl-profile-model-") as tmp:
        folder = gpu.build_model_folder(Path(tmp) / "model", "small" if args.small else "0.5b")
        results = []
        for spec in plan(args, folder):
            left = end - time.monotonic()
            if left < 30:
                results.append({**spec, "error": f"skipped: {left:.0f} s left of --deadline"})
                continue
            results.append(run_worker(spec, args.threads, left))
    report(results, args)


def report(results: list[dict], args) -> None:
    steps = [r for r in results if r["kind"] == "step" and "error" not in r]
    for r in steps:
        trl = next((t for t in steps if t["objective"] == r["objective"] and t["side"] == "trl"), None)
        r["speed_vs_trl"] = trl["s_per_step"] / r["s_per_step"] if trl and r["side"] != "trl" else None
        r["syncs"] = r["syncs_per_step"].get("total")
    common.print_table(steps, ["objective", "side", "s_per_step", "s_min", "s_max", "speed_vs_trl",
                               "device_busy_share", "kernel_launches_per_step", "cuda_syncs_per_step", "syncs",
                               "aten_ops_per_step", "peak_MiB"], "Steps (checkpointing off)")
    for key in ("idle_ms_per_step_by_phase", "device_ms_per_step_by_group", "host_ms_per_step_by_phase"):
        print(f"\n{key}")
        for r in steps:
            values = {k: round(v, 2) for k, v in (r[key] or {}).items()}
            print(f"  {r['objective']:5s} {r['side']:5s} {json.dumps(values)}")
    for r in results:
        if r["kind"] == "rates" and "error" not in r:
            print(f"\nsampling tokens/s {r['sampling_tokens_per_s']}, training tokens/s {r['training_tokens_per_s']}, "
                  f"offline saving (1 + training/sampling) {r['offline_saving']}, "
                  f"fixed cost of a call: {r['call_overhead_tokens']:.0f} tokens")
    for r in results:
        if "error" in r:
            print(f"error: {r.get('objective', 'rates')} {r.get('side', '')}: {r['error']}")
    common.finish("gpu_profile_small" if args.small else "gpu_profile", args, {"results": results},
                  machine_info=gpu._gpu_info())


if __name__ == "__main__":
    main()
