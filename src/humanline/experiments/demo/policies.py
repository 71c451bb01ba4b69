"""The demo's tiny base policies: a character-level `LlamaForCausalLM` taught the task format by a short
supervised fine-tuning (SFT) on answers of which a fraction is deliberately wrong, so that sampling at
temperature 1 mixes right and wrong answers (imperfect but non-trivial, room for alignment to help).

Two checkpoints per settings: `base` (the policy the demo aligns) and `weak` (more corrupted answers and a
different initialisation: the *other* policy whose samples form the off-policy offline data). Both are cached
with `save_pretrained` under `<cache>/<task>-<hash>/{base,weak}`, where `<cache>` is `$HUMANLINE_CACHE` or
`~/.cache/humanline/demo` and `<hash>` hashes every setting (and `CACHE_VERSION`), and are written atomically
(temporary folder + rename), so a crashed or concurrent run never leaves a half-written checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from humanline.core.logps import masked_mean, token_logps
from humanline.experiments.demo.tasks import DemoTask, make_task
from humanline.experiments.harness.cache import cache_key
from humanline.experiments.harness.workers import run_jobs, stderr_log
from humanline.files import folder_beside, publish_folder
from humanline.model.tiny import make_model, make_tokenizer

# Bump when the SFT procedure changes in a way the settings do not capture, to invalidate old caches.
CACHE_VERSION = 3  # 2: tokenizer splits runs of newlines; 3: SFT on one thread (caches made on more differ)
META_FILE = "humanline_demo.json"


@dataclass(frozen=True)
class BaseConfig:
    """Everything that determines the demo's base and weak checkpoints (all of it goes into the cache key)."""

    task: str = "arithmetic"
    task_seed: int = 0  # seed of the task's prompt sets (the same task object the demo aligns on)
    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    steps: int = 1200  # SFT optimizer steps
    batch_size: int = 64
    lr: float = 1e-3
    base_corruption: float = 0.5  # share of SFT answers that are wrong for the base policy
    weak_corruption: float = 0.8  # ... and for the weak policy that produces the offline data
    seed: int = 0  # model initialisation and SFT sampling; the weak policy uses seed + 1


@dataclass(frozen=True)
class DemoPolicies:
    """Folders holding the two cached checkpoints (each loadable with `load_policy`)."""

    base: Path
    weak: Path


def config_hash(config: BaseConfig) -> str:
    """The cache key (`harness.cache.cache_key`) of `config`'s field values and `CACHE_VERSION`, cut to 12 hex
    digits: the folder names of policies cached before the demo and the reproduction shared the rule."""
    return cache_key({"version": CACHE_VERSION, **dataclasses.asdict(config)})[:12]


def cache_root() -> Path:
    """`$HUMANLINE_CACHE` if set, else `~/.cache/humanline/demo`."""
    env = os.environ.get("HUMANLINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "humanline" / "demo"


def policy_dirs(config: BaseConfig, root: str | os.PathLike | None = None) -> DemoPolicies:
    """Where the checkpoints of `config` live (whether or not they exist yet)."""
    folder = Path(root if root is not None else cache_root()) / f"{config.task}-{config_hash(config)}"
    return DemoPolicies(base=folder / "base", weak=folder / "weak")


def encode_example(tokenizer, prompt: list[dict], completion: str) -> tuple[list[int], list[bool]]:
    """Token ids of chat `prompt` + assistant `completion` + EOS, and a mask true on completion tokens + EOS."""
    prompt_ids = list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)["input_ids"])
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [False] * len(prompt_ids) + [True] * len(completion_ids)


def collate(
    examples: list[tuple[list[int], list[bool]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad `(ids, mask)` pairs to `(input_ids, attention_mask, completion_mask)`, each `(B, L)`."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    completion = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, (ids, mask) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        completion[row, : len(ids)] = torch.tensor(mask)
    return input_ids, attention, completion


def sft_train(task: DemoTask, config: BaseConfig, *, corruption: float, seed: int, progress=None):
    """Train a fresh tiny model on `task.train` prompts for `config.steps` steps; returns `(model, tokenizer)`.

    Each example's answer is wrong with probability `corruption` (the task's `sft_completion` decides how).
    Loss: mean cross-entropy over completion tokens (EOS included), AdamW at `config.lr` with linear decay to
    10%, max grad norm 1. Uses its own RNGs, so the global torch RNG is left untouched.
    progress: called as `progress(steps_done, loss)` about every tenth of the run and at the end.
    """
    tokenizer = make_tokenizer()
    model = make_model(
        tokenizer, hidden_size=config.hidden_size, num_layers=config.num_layers, num_heads=config.num_heads, seed=seed
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - 0.9 * s / max(1, config.steps))
    rng = random.Random(f"sft-{seed}")
    for step in range(config.steps):
        records = [rng.choice(task.train) for _ in range(config.batch_size)]
        completions = [task.sft_completion(r, rng, rng.random() < corruption) for r in records]
        examples = [encode_example(tokenizer, r["prompt"], c) for r, c in zip(records, completions)]
        input_ids, attention, completion = collate(examples, tokenizer.pad_token_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        logps, mask = token_logps(logits, input_ids, completion)
        loss = -masked_mean(logps, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress and ((step + 1) % max(1, config.steps // 10) == 0 or step == config.steps - 1):
            progress(step + 1, loss.item())
    model.eval()
    return model, tokenizer


def _save_atomically(model, tokenizer, target: Path, meta: dict) -> None:
    with folder_beside(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        publish_folder(tmp, target)  # False: a concurrent writer won the race (the same policy)


def ensure_policies(
    config: BaseConfig = BaseConfig(), *, root: str | os.PathLike | None = None, log=None, workers: int = 1
) -> DemoPolicies:
    """Train and cache the base and weak checkpoints of `config` unless already cached; return their folders.

    A cached folder is recognised by its metadata file (written last, inside the atomic rename), whose
    `sft_seconds` records how long training took. `log(message)`, if given, hears the SFT's progress (it
    takes minutes on a CPU, once). Each SFT runs on one thread (`experiments.harness.workers`), the two side by side
    when `workers` > 1, so the checkpoints do not depend on the machine's core count.
    """
    dirs = policy_dirs(config, root)
    missing = [(target, corruption, seed)
               for target, corruption, seed in ((dirs.base, config.base_corruption, config.seed),
                                                (dirs.weak, config.weak_corruption, config.seed + 1))
               if not (target / META_FILE).exists()]
    if workers > 1 and len(missing) > 1 and log is not None:
        log = stderr_log  # a worker process cannot be handed the caller's function; its lines go to stderr
    run_jobs(train_policy, [(config, *job, log) for job in missing], workers)
    return dirs


def train_policy(config: BaseConfig, target: Path, corruption: float, seed: int, log=None) -> None:
    """SFT one policy (`sft_train`) and cache it at `target` with its metadata; `log` hears the progress."""
    task = make_task(config.task, seed=config.task_seed)
    start = time.perf_counter()
    progress = _sft_progress(log, target.name, corruption, config.steps, start) if log else None
    model, tokenizer = sft_train(task, config, corruption=corruption, seed=seed, progress=progress)
    meta = {
        "config": dataclasses.asdict(config),
        "corruption": corruption,
        "seed": seed,
        "sft_seconds": round(time.perf_counter() - start, 2),
        "cache_version": CACHE_VERSION,
    }
    _save_atomically(model, tokenizer, target, meta)


def _sft_progress(log, name: str, corruption: float, steps: int, start: float):
    """A `progress(done, loss)` that logs one line with the time spent and an estimate of the time left."""

    def progress(done: int, loss: float) -> None:
        spent = time.perf_counter() - start
        left = spent / done * (steps - done)
        log(f"SFT of the {name} policy ({corruption:.0%} wrong answers, cached once): step {done}/{steps}, "
            f"loss {loss:.3f}, {spent:.0f} s, about {left:.0f} s left")

    return progress


def load_policy(path: str | os.PathLike):
    """Load a cached demo checkpoint as `(model, tokenizer)` (model in eval mode, float32, CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer
