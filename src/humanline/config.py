"""Typed configuration: one dataclass per concern, loaded from YAML plus `--section.key=value` overrides.

Every field is documented once, next to its default. `validate()` runs at start-up and raises a `UserError`
naming the field (`humanline.low`) and the allowed range.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from humanline.errors import UserError

OBJECTIVES = ("dpo", "kto", "grpo")
REGIMES = ("offline", "online", "sparse")
TRACKERS = ("tensorboard", "wandb", "trackio", "comet_ml", "mlflow", "aim", "clearml", "dvclive", "swanlab")
REFERENCES = ("auto", "frozen", "cache", "copy", "lookahead", "sampler")


@dataclass
class ModelConfig:
    name: str = "tiny"  # "tiny" (random small LlamaConfig), a hub name, or a local folder
    gguf_file: str | None = None  # GGUF file inside `name` (dequantised once, cached as a plain copy)
    dtype: str = "float32"  # float32 | bfloat16 | float16: weights' dtype
    gradient_checkpointing: bool = False
    disable_dropout: bool = True  # dropout makes ratios noisy; the authors' code disables it too
    tiny_hidden_size: int = 64  # only for name == "tiny"
    tiny_layers: int = 2  # only for name == "tiny"
    lora: bool = False  # train LoRA adapters (needs the `peft` extra)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class DataConfig:
    train: str | None = None  # offline data: file (.jsonl/.json/.parquet/.csv), datasets folder or hub name
    eval: str | None = None  # held-out data in the same format; or use eval_fraction
    eval_fraction: float = 0.0  # share of prompts split off `train` for evaluation (by prompt id)
    format: str | None = None  # pairwise | unpaired | groups | prompts; None = detect
    split: str = "train"
    max_prompt_length: int = 256  # tokens; longer prompts keep their end
    max_length: int = 512  # prompt + completion tokens; longer completions keep their start
    skip_invalid: bool = False  # drop invalid records (counted and logged) instead of failing
    pair_threshold: float = 0.01  # groups -> pairs: keep best vs worst when the score gap exceeds this
    pair_mode: str = "best_worst"  # best_worst | all_pairs
    unpaired_rule: str = "mean"  # groups -> unpaired: desirable if above the group mean ("mean") or threshold
    unpaired_threshold: float | None = None


@dataclass
class ObjectiveConfig:
    name: str = "dpo"  # dpo | kto | grpo
    beta: float = 0.1  # DPO/KTO inverse temperature; GRPO KL coefficient (see grpo_beta)
    desirable_weight: float = 1.0  # KTO
    undesirable_weight: float = 1.0  # KTO
    grpo_beta: float = 0.01  # GRPO KL coefficient (HALOs 0.01)
    eps_low: float = 0.01  # GRPO ratio clip (HALOs 0.01; TRL 0.2)
    eps_high: float = 0.01
    advantage_eps: float = 0.01  # added to the group std
    reduction: str = "token"  # GRPO: token (HALOs) | sequence


@dataclass
class HumanlineConfig:
    enabled: bool = False
    sync_every: int = 1  # k: reference takes the pre-update policy weights every k optimizer steps
    transform: str = "clip"  # clip (SPEC 3.1) | reject (stochastic, SPEC 3.3) | none (syncing only)
    low: float = -1.5  # log eps_P (< 0); HALOs default -1.0
    high: float = 1.5  # log eps_R (> 0)
    gamma_p: float = 0.5  # humanline sampling Beta(gamma_p, 1)
    gamma_r: float = 0.01  # humanline sampling Beta(gamma_r, 1)


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
    prompts_per_step: int = 8  # prompts sampled per optimizer step (per process)
    n: int = 8  # completions per prompt
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    reward: Any = None  # reward spec: name, "module:function", "reward_model:PATH", or list of {type, weight}
    on_error: str = "fail"  # fail | skip: what a failing reward or generation does
    batch_size: int = 16  # prompts per generate call
    cache: str = "static"  # KV cache for generation: static (preallocated; compiled decoding on CUDA) | dynamic


@dataclass
class TrainConfig:
    regime: str = "offline"  # offline | online | sparse
    sample_every: int = 1  # sparse: sample a buffer every N optimizer steps (online == 1)
    reference: str = "auto"  # auto | frozen | cache | copy | lookahead | sampler (see humanline.reference)
    micro_batch_size: int = 4  # units per forward: pairs (dpo), examples (kto), prompt groups (grpo)
    grad_accum: int = 1
    max_steps: int | None = None  # None: epochs over the offline data
    epochs: int = 1
    seed: int = 0
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 2
    eval_every: int = 0  # evaluate every N steps (0: only at the end)
    max_bad_steps: int = 3  # abort after this many consecutive non-finite steps
    mixed_precision: str = "no"  # no | bf16 | fp16 (accelerate)
    output_dir: str = "runs/run"


@dataclass
class EvalConfig:
    prompts: str | None = None  # held-out prompts for generation-based evaluation
    reward: Any = None  # defaults to rollout.reward
    n: int = 4  # samples per prompt
    max_prompts: int = 0  # 0: all
    max_new_tokens: int = 64
    temperature: float = 1.0


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

    def validate(self) -> "Config":
        _validate(self)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate.

    `overrides` is a list of `section.key=value` strings (values parsed as YAML) or a nested dict.
    """
    raw: dict = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UserError(f"{path}: cannot read config file ({exc.strerror})") from exc
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else str(path)
            raise UserError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from exc
        if not isinstance(raw, dict):
            raise UserError(f"{path}: expected a mapping of sections (model:, data:, ...), got {type(raw).__name__}")
    if isinstance(overrides, dict):
        merge_dicts(raw, overrides)
    else:
        for item in overrides or []:
            merge_dicts(raw, _parse_override(item))
    return _build(Config, raw, source, prefix="").validate()


def _parse_override(item: str) -> dict:
    text = item[2:] if item.startswith("--") else item
    if "=" not in text:
        raise UserError(f"override {item!r}: expected section.key=value")
    key, value = text.split("=", 1)
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"override {item!r}: expected section.key=value (e.g. --humanline.sync_every=4)")
    try:
        parsed = yaml.safe_load(value) if value != "" else None
    except yaml.YAMLError:
        parsed = value
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
                raise UserError(f"{source}: config section '{dotted}' must be a mapping, got {value!r}")
            kwargs[key] = _build(hint, value, source, prefix=f"{dotted}.")
        else:
            kwargs[key] = _coerce(value, hint, f"{source}: config field '{dotted}'")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    text = str(hint)
    optional = "None" in text
    if value is None:
        if optional or hint is Any:
            return None
        raise UserError(f"{where}: must not be empty")
    if hint is Any:
        return value
    if text.startswith("list") or "list[" in text:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}")
        inner = getattr(hint, "__args__", (Any,))[0]
        return [_coerce(item, inner, f"{where}[{i}]") for i, item in enumerate(value)]
    if hint is bool or text == "bool" or text.startswith("bool"):
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {value!r}")
        return value
    if "int" in text and "float" not in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        return value
    if "float" in text:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = math.inf
        if not math.isfinite(number):  # .nan/.inf parse as YAML floats but no field has a use for them
            raise UserError(f"{where}: expected a finite number, got {value!r}")
        return number
    if "str" in text:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


# ---------------------------------------------------------------- validation


def _check(ok: bool, field_name: str, expected: str, value: Any) -> None:
    if not ok:
        raise UserError(f"config field '{field_name}': expected {expected}, got {value!r}")


def _one_of(value: Any, field_name: str, allowed: tuple) -> None:
    _check(value in allowed, field_name, "one of " + " | ".join(map(str, allowed)), value)


def _validate(cfg: Config) -> None:
    m, d, o, h, op, r, t, e = (cfg.model, cfg.data, cfg.objective, cfg.humanline, cfg.optim, cfg.rollout,
                               cfg.train, cfg.eval)
    _one_of(m.dtype, "model.dtype", ("float32", "bfloat16", "float16"))
    _check(m.tiny_hidden_size > 0 and m.tiny_hidden_size % 4 == 0, "model.tiny_hidden_size",
           "a positive multiple of 4 (the tiny model has 4 attention heads)", m.tiny_hidden_size)
    _check(m.tiny_layers > 0, "model.tiny_layers", "> 0", m.tiny_layers)
    _check(m.name != "tiny" or m.gguf_file is None, "model.gguf_file",
           "null for model.name=tiny (a GGUF file lives in a local model folder)", m.gguf_file)
    _check(m.lora_r > 0, "model.lora_r", "> 0", m.lora_r)
    _check(m.lora_alpha > 0, "model.lora_alpha", "> 0", m.lora_alpha)
    _check(0 <= m.lora_dropout < 1, "model.lora_dropout", "in [0, 1)", m.lora_dropout)
    _check(0.0 <= d.eval_fraction < 1.0, "data.eval_fraction", "in [0, 1)", d.eval_fraction)
    _check(d.format in (None, "pairwise", "unpaired", "groups", "prompts"), "data.format",
           "pairwise | unpaired | groups | prompts", d.format)
    _check(d.max_prompt_length > 0, "data.max_prompt_length", "> 0", d.max_prompt_length)
    _check(d.max_length > d.max_prompt_length, "data.max_length", f"> data.max_prompt_length ({d.max_prompt_length})",
           d.max_length)
    _one_of(d.pair_mode, "data.pair_mode", ("best_worst", "all_pairs"))
    _one_of(d.unpaired_rule, "data.unpaired_rule", ("mean", "threshold"))
    _check(d.unpaired_rule != "threshold" or d.unpaired_threshold is not None, "data.unpaired_threshold",
           "a number when data.unpaired_rule=threshold", d.unpaired_threshold)
    _check(d.pair_threshold >= 0, "data.pair_threshold", ">= 0", d.pair_threshold)
    _one_of(o.name, "objective.name", OBJECTIVES)
    _check(o.beta > 0, "objective.beta", "> 0", o.beta)
    _check(o.grpo_beta >= 0, "objective.grpo_beta", ">= 0", o.grpo_beta)
    _check(0 <= o.eps_low < 1, "objective.eps_low", "in [0, 1)", o.eps_low)
    _check(o.eps_high >= 0, "objective.eps_high", ">= 0", o.eps_high)
    _check(o.desirable_weight > 0 and o.undesirable_weight > 0, "objective.desirable_weight/undesirable_weight",
           "> 0", (o.desirable_weight, o.undesirable_weight))
    _one_of(o.reduction, "objective.reduction", ("token", "sequence"))
    _check(h.sync_every >= 1, "humanline.sync_every", "an integer >= 1", h.sync_every)
    _one_of(h.transform, "humanline.transform", ("clip", "reject", "none"))
    _check(h.low < 0, "humanline.low", "log eps_P < 0", h.low)
    _check(h.high > 0, "humanline.high", "log eps_R > 0", h.high)
    _check(h.gamma_p > 0 and h.gamma_r > 0, "humanline.gamma_p/gamma_r", "> 0", (h.gamma_p, h.gamma_r))
    _check(op.lr > 0, "optim.lr", "> 0", op.lr)
    _check(0 <= op.warmup_ratio < 1, "optim.warmup_ratio", "in [0, 1)", op.warmup_ratio)
    _check(op.max_grad_norm >= 0, "optim.max_grad_norm", ">= 0", op.max_grad_norm)
    _check(op.weight_decay >= 0, "optim.weight_decay", ">= 0", op.weight_decay)
    _check(len(op.betas) == 2 and all(0 <= b < 1 for b in op.betas), "optim.betas", "two numbers in [0, 1)", op.betas)
    _one_of(t.regime, "train.regime", REGIMES)
    _one_of(t.reference, "train.reference", REFERENCES)
    _check(t.sample_every >= 1, "train.sample_every", "an integer >= 1", t.sample_every)
    _check(t.micro_batch_size >= 1, "train.micro_batch_size", ">= 1", t.micro_batch_size)
    _check(t.grad_accum >= 1, "train.grad_accum", ">= 1", t.grad_accum)
    _check(t.max_steps is None or t.max_steps >= 1, "train.max_steps", ">= 1 or null", t.max_steps)
    _check(t.epochs >= 1, "train.epochs", ">= 1", t.epochs)
    _check(t.save_every >= 0 and t.eval_every >= 0, "train.save_every/eval_every", ">= 0", (t.save_every, t.eval_every))
    _check(t.keep_checkpoints >= 1, "train.keep_checkpoints", ">= 1", t.keep_checkpoints)
    _check(t.max_bad_steps >= 1, "train.max_bad_steps", ">= 1", t.max_bad_steps)
    _check(0 <= t.seed < 2**32, "train.seed", "an integer in [0, 2**32)", t.seed)
    _check(bool(t.output_dir.strip()), "train.output_dir", "a folder", t.output_dir)
    _one_of(t.mixed_precision, "train.mixed_precision", ("no", "bf16", "fp16"))
    _one_of(r.on_error, "rollout.on_error", ("fail", "skip"))
    _one_of(r.cache, "rollout.cache", ("static", "dynamic"))
    _check(r.n >= 1, "rollout.n", ">= 1", r.n)
    _check(r.prompts_per_step >= 1, "rollout.prompts_per_step", ">= 1", r.prompts_per_step)
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", ">= 1", r.max_new_tokens)
    _check(r.temperature >= 0, "rollout.temperature", ">= 0", r.temperature)
    _check(0 < r.top_p <= 1, "rollout.top_p", "in (0, 1]", r.top_p)
    _check(r.batch_size >= 1, "rollout.batch_size", ">= 1", r.batch_size)
    _check(all(r.stop), "rollout.stop", "a list of non-empty strings", r.stop)
    _check(e.n >= 1 and e.max_prompts >= 0, "eval.n/max_prompts", "n >= 1, max_prompts >= 0", (e.n, e.max_prompts))
    _check(e.max_new_tokens >= 1, "eval.max_new_tokens", ">= 1", e.max_new_tokens)
    _check(e.temperature >= 0, "eval.temperature", ">= 0", e.temperature)
    _check(cfg.logging.log_every >= 0, "logging.log_every", ">= 0", cfg.logging.log_every)
    for name in cfg.logging.trackers:
        _one_of(name, "logging.trackers", TRACKERS)
    if t.regime == "offline":
        _check(d.train is not None, "data.train", "a data file or dataset for train.regime=offline", d.train)
    else:
        _check(r.prompts is not None, "rollout.prompts", f"a prompt file for train.regime={t.regime}", r.prompts)
        _check(r.reward is not None, "rollout.reward", f"a reward spec for train.regime={t.regime}", r.reward)
        _check(o.name != "grpo" or r.n >= 2, "rollout.n", ">= 2 for online grpo (groups)", r.n)
        _check(o.name == "grpo" or r.n >= 2, "rollout.n", ">= 2 to build pairs or desirable/undesirable labels", r.n)
    if t.regime == "online":
        _check(t.sample_every == 1, "train.sample_every", "1 for train.regime=online (use regime sparse)", t.sample_every)
    if t.reference == "lookahead":
        _check(t.regime == "offline", "train.reference", "lookahead only with offline data (future batches known)",
               t.reference)
    if t.reference in ("lookahead", "copy"):
        _check(h.enabled, "train.reference", f"{t.reference} needs humanline.enabled=true", t.reference)
    if t.reference in ("frozen", "cache"):
        _check(not h.enabled, "train.reference", f"{t.reference} cannot sync; humanline needs copy or lookahead",
               t.reference)
    if t.reference == "cache":
        _check(t.regime == "offline", "train.reference", "cache only with offline data", t.reference)
    if t.reference == "sampler":
        _check(t.regime != "offline" and not h.enabled, "train.reference",
               "sampler only for online/sparse regimes without humanline (the sampling policy is the reference)",
               t.reference)
