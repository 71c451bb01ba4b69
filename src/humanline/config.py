"""Typed configuration: one dataclass per concern, loaded from YAML plus `--section.key=value` overrides.

Every field is documented once, next to its default (with its upper limit where sizes are bounded, see
`humanline.config_checks`). `validate()` runs at start-up and raises a `UserError` naming the field
(`humanline.low`) and the allowed range. YAML is read strictly (`humanline.yaml_io`): `1e-6` is a number,
duplicate keys and non-UTF-8 files are errors.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from humanline import yaml_io
from humanline.config_checks import show, validate
from humanline.core.humanline import HumanlineConfig
from humanline.errors import UserError

@dataclass
class ModelConfig:
    name: str = "tiny"  # "tiny" (random small LlamaConfig), a hub name, or a local folder
    gguf_file: str | None = None  # GGUF file inside `name` (dequantised once, cached as a plain copy)
    dtype: str = "float32"  # float32 | bfloat16 | float16: weights' dtype. AdamW on float16 weights overflows
    # within a few steps (refused on a CPU; elsewhere the run stops with exit code 3): train float32 or bfloat16
    gradient_checkpointing: bool = False
    disable_dropout: bool = True  # dropout makes ratios noisy; the authors' code disables it too
    tiny_hidden_size: int = 64  # only for name == "tiny"; a multiple of 4, at most 4096
    tiny_layers: int = 2  # only for name == "tiny"; at most 64 (and ~16 x layers x hidden^2 <= 2e8 parameters)
    lora: bool = False  # train LoRA adapters (needs the `peft` extra)
    lora_r: int = 16  # at most 4096
    lora_alpha: int = 32  # at most 1e6
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class DataConfig:
    train: str | None = None  # offline data: file (.jsonl/.json/.parquet/.csv), datasets folder or hub name
    eval: str | None = None  # held-out data in the same format; or use eval_fraction
    eval_fraction: float = 0.0  # share of prompts split off `train` for evaluation (by prompt id)
    format: str | None = None  # pairwise | unpaired | groups | prompts; None = detect
    split: str = "train"
    shuffle: bool = True  # permute the units every epoch (seeded); false: file order, every epoch
    max_prompt_length: int = 256  # tokens; longer prompts keep their end
    max_length: int = 512  # prompt + completion tokens (at most 2**20); longer completions keep their start
    skip_invalid: bool = False  # drop invalid records (counted and logged) instead of failing
    pair_threshold: float = 0.01  # groups -> pairs: keep best vs worst when the score gap exceeds this
    pair_mode: str = "best_worst"  # best_worst | all_pairs
    unpaired_rule: str = "mean"  # groups -> unpaired: desirable if above the group mean ("mean") or threshold;
    # best_worst: only the best (desirable) and the worst (undesirable) of each group, balanced
    unpaired_threshold: float | None = None


@dataclass
class ObjectiveConfig:
    name: str = "dpo"  # a key of humanline.objective_specs.SPECS (docs/adding-an-objective.md)
    beta: float = 0.1  # DPO/KTO inverse temperature; not GRPO's (grpo_beta); IPO reads it when tau is null
    # IPO's regulariser tau (> 0): the margin target is 1 / (2 tau) nats. null: objective.beta (IPO recipes
    # written before this field set beta)
    tau: float | None = None
    desirable_weight: float = 1.0  # KTO
    undesirable_weight: float = 1.0  # KTO
    grpo_beta: float = 0.01  # GRPO KL coefficient (HALOs 0.01)
    eps_low: float = 0.01  # GRPO ratio clip (HALOs 0.01; TRL 0.2)
    eps_high: float = 0.01
    advantage_eps: float = 0.01  # added to the group std (>= 0)
    reduction: str = "token"  # GRPO: token (HALOs) | sequence


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    warmup_ratio: float = 0.1  # linear warm-up over this share of max_steps, then constant
    max_grad_norm: float = 1.0  # 0 disables clipping


@dataclass
class RolloutConfig:
    prompts: str | None = None  # prompt file for online/sparse sampling
    prompts_per_step: int = 8  # prompts sampled per optimizer step (per process); at most 65536, and
    # prompts_per_step x n x train.sample_every <= 2**20 completions sampled at once
    n: int = 8  # completions per prompt, at most 1024
    max_new_tokens: int = 64  # at most 2**20 (512, the context, for the tiny model)
    temperature: float = 1.0  # in [0, 100]; 0 = greedy decoding, one completion per prompt: needs n = 1
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    reward: Any = None  # reward spec: name, "module:function", "reward_model:PATH", or list of {type, weight}
    on_error: str = "fail"  # fail | skip: what a failing reward or generation does
    batch_size: int = 16  # prompts per generate call, at most 65536
    cache: str = "static"  # KV cache for generation: static (preallocated; compiled decoding on CUDA) | dynamic
    decoder: str = "auto"  # auto (humanline.decode, a fast CPU loop, where it applies) | generate (model.generate);
    # the same distribution, other random draws per seed; also used by the run's held-out generation (eval)
    dtype: str = "policy"  # policy: sample with the policy's own weights | bfloat16: with a bfloat16 copy of
    # them, refreshed before each sampling (about 2x faster on CPUs with native bf16; the samples then come from
    # the policy rounded to bf16, as with a bf16 inference engine); held-out evaluation keeps the policy's weights


@dataclass
class TrainConfig:
    regime: str = "offline"  # offline | online | sparse
    sample_every: int = 1  # sparse: sample a buffer every N optimizer steps (online == 1)
    reference: str = "auto"  # auto | frozen | cache | copy | lookahead | sampler (see humanline.reference)
    micro_batch_size: int = 4  # units per forward: pairs (dpo), examples (kto), prompt groups (grpo); <= 65536
    grad_accum: int = 1  # at most 65536
    max_steps: int | None = None  # None: epochs over the offline data; at most 1e9
    epochs: int = 1  # at most 1e6
    seed: int = 0
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 2
    eval_every: int = 0  # evaluate every N steps (0: only at the end)
    max_bad_steps: int = 3  # abort after this many consecutive non-finite steps
    mixed_precision: str = "auto"  # auto (bf16 on a CUDA GPU that has it, else no) | no | bf16 | fp16: autocast
    compile: bool = False  # torch.compile the output head's per-slice softmax math (one fused kernel per pass on
    # a GPU; the first steps then compile, tens of seconds). Off until measured faster (BENCHMARKS.md)
    deterministic: bool = False  # deterministic kernels for the whole process (torch.use_deterministic_algorithms,
    # cuBLAS workspace, no TF32, math/flash attention only): on a GPU, a run killed and resumed then ends
    # bit-identical to an uninterrupted one; slower there. CPU runs are deterministic either way
    output_dir: str = "runs/run"  # the run folder (docs/usage.md: what it holds; resume=/overwrite= of Trainer)


@dataclass
class EvalConfig:
    prompts: str | None = None  # held-out prompts for generation-based evaluation
    reward: Any = None  # defaults to rollout.reward; resolved at start-up like rollout.reward
    n: int = 4  # samples per prompt, at most 1024
    max_prompts: int = 0  # 0: all
    max_new_tokens: int = 64  # at most 2**20 (512 for the tiny model)
    temperature: float = 1.0  # in [0, 100]; 0 = greedy: needs n = 1


@dataclass
class LoggingConfig:
    log_every: int = 1
    trackers: list[str] = field(default_factory=list)  # tensorboard | wandb | trackio (via accelerate)
    progress: bool = True


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    humanline: HumanlineConfig = field(default_factory=HumanlineConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> Config:
        validate(self)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate.

    `overrides` is a list of `section.key=value` strings (values parsed as YAML) or a nested dict.
    """
    raw: Any = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        raw = yaml_io.read(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise UserError(f"{path}: expected a mapping of sections (model:, data:, ...), got {type(raw).__name__}")
    if isinstance(overrides, dict):
        yaml_io.check_depth(overrides, "overrides")
        merge_dicts(raw, overrides)
    else:
        for item in overrides or []:
            merge_dicts(raw, _parse_override(item))
    return _build(Config, raw, source, prefix="").validate()


def _parse_override(item: str) -> dict:
    text = item[2:] if item.startswith("--") else item
    if "=" not in text:
        raise UserError(f"override {show(item)}: expected section.key=value")
    key, value = text.split("=", 1)
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"override {show(item)}: expected section.key=value (e.g. --humanline.sync_every=4)")
    # A value that is not valid YAML is taken as the string it is (a path with odd characters, say).
    parsed = yaml_io.parse(value, f"override --{key}", lenient=True) if value != "" else None
    return {parts[0]: {parts[1]: parsed}}


def merge_dicts(base: dict, extra: dict) -> None:
    """Recursively merge `extra` into `base` (nested dicts merge, other values replace)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_dicts(base[key], value)
        else:
            base[key] = value


def _build(cls, raw: dict, source: str, prefix: str):
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else f" (known: {', '.join(names)})"
            raise UserError(f"{source}: unknown config field '{dotted}'{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"{source}: config section '{dotted}' must be a mapping, got {show(value)}")
            kwargs[key] = _build(hint, value, source, prefix=f"{dotted}.")
        else:
            kwargs[key] = _coerce(value, hint, f"{source}: config field '{dotted}'")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    text = str(hint)
    if value is None:
        if "None" in text or hint is Any:
            return None
        raise UserError(f"{where}: expected {_expected(text)}, got null")
    if hint is Any:
        return value
    if text.startswith("list") or "list[" in text:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {show(value)}")
        inner = getattr(hint, "__args__", (Any,))[0]
        return [_coerce(item, inner, f"{where}[{i}]") for i, item in enumerate(value)]
    if text.startswith("bool") or hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {show(value)}")
        return value
    if "int" in text and "str" in text:  # a number or a named setting (humanline.sync_every: 4 or auto)
        if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
            raise UserError(f"{where}: expected an integer or a name, got {show(value)}")
        return value
    if "int" in text and "float" not in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {show(value)}")
        return value
    if "float" in text:
        return _finite(value, where)
    if "str" in text:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"{where}: expected a string, got {show(value)}")
        if value == "":
            raise UserError(f"{where}: expected a non-empty string, got ''")
        return str(value)
    return value


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: expected a number (such as 0.5 or 1e-6), got {show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):  # .nan/.inf parse as YAML floats but no field has a use for them
        raise UserError(f"{where}: expected a finite number, got {show(value)}")
    return number


def _expected(text: str) -> str:
    """What a field of type `text` expects, for the error about a null value."""
    if "list" in text:
        return "a list"
    if "bool" in text:
        return "true or false"
    if "int" in text and "float" not in text:
        return "an integer"
    return "a number" if "float" in text else "a string"
