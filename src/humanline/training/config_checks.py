"""Start-up validation of a `Config`: every value the run would later reject is rejected here, with one line
naming the field, what was expected and the value given.

Sizes have upper limits (the `MAX_*` constants, also noted next to the fields in `humanline.settings.config`): generous
for real runs, and small enough that a typo such as 10**12 fails at load time instead of allocating until the
machine gives up or running for hours.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from humanline.core.humanline import HumanlineConfig, settings_problems
from humanline.data import reasoning_gym
from humanline.errors import UserError, short_repr
from humanline.objectives.corrections import CORRECTIONS
from humanline.sampling.rollout import DECODERS
from humanline.sampling.vllm_engine import ENGINES
from humanline.settings.config import (
    Config,
    DataConfig,
    EvalConfig,
    ModelConfig,
    ObjectiveConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
)
from humanline.training.objective_table import SPECS

REGIMES = ("offline", "online", "sparse", "stale")
TRACKERS = ("tensorboard", "wandb", "trackio", "comet_ml", "mlflow", "aim", "clearml", "dvclive", "swanlab")
REFERENCES = ("auto", "frozen", "cache", "copy", "lookahead", "sampler")

MAX_TOKENS = 1_048_576  # data.max_length / max_prompt_length, rollout/eval.max_new_tokens (2**20 tokens)
MAX_BATCH = 65_536  # train.micro_batch_size, train.grad_accum, rollout.batch_size, rollout.prompts_per_step
MAX_REDRAWS = 64  # rollout.redraws: draws of fresh prompts per step beyond the first
MAX_SAMPLES = 1_024  # rollout.n, eval.n: completions per prompt
# optim.lr: AdamW moves every weight by about lr per step, so a language model trains at 1e-7 to 1e-3; beyond
# this, one step saturates every output and the model stops learning (optim.lr=1e6: gradient norm 0 from step 2)
MAX_LR = 1.0
MAX_BUFFER = 1_048_576  # online/sparse: prompts_per_step x n x sample_every completions sampled at once
MAX_STEPS = 10**9  # train.max_steps; train.epochs at most MAX_EPOCHS
MAX_EPOCHS = 1_000_000
MAX_TINY_HIDDEN = 4_096  # model.tiny_hidden_size
MAX_TINY_LAYERS = 64  # model.tiny_layers
MAX_TINY_PARAMS = 200_000_000  # ~16 x tiny_layers x tiny_hidden_size**2: tiny models are for tests and demos
TINY_CONTEXT = 512  # max_position_embeddings of `humanline.model.tiny.make_model`: longest tiny generation
MAX_TEMPERATURE = 100.0  # rollout/eval.temperature: far past this, sampling is uniform noise
MAX_LORA_R = 4_096
MAX_LORA_ALPHA = 1_000_000


def check(ok: bool, field_name: str, expected: str, value: Any) -> None:
    if not ok:
        raise UserError(f"config field '{field_name}': expected {expected}, got {short_repr(value)}")


def one_of(value: Any, field_name: str, allowed: tuple) -> None:
    check(value in allowed, field_name, "one of " + " | ".join(map(str, allowed)), value)


def in_range(value: int, field_name: str, low: int, high: int) -> None:
    check(low <= value <= high, field_name, f"an integer in [{low}, {high}]", value)


def not_blank(value: str | None, field_name: str, what: str) -> None:
    check(value is None or bool(value.strip()), field_name, what, value)


def validate(cfg: Config) -> None:
    """Raise a `UserError` for the first invalid field of `cfg`."""
    _model(cfg.model)
    _data(cfg.data)
    _objective(cfg.objective, cfg.humanline)
    _optim(cfg.optim)
    _train(cfg.train)
    _rollout(cfg.rollout, cfg.model)
    _eval(cfg.eval, cfg.model, cfg.rollout)
    check(cfg.logging.log_every >= 0, "logging.log_every", ">= 0", cfg.logging.log_every)
    for name in cfg.logging.trackers:
        one_of(name, "logging.trackers", TRACKERS)
    _regime(cfg)
    _reference(cfg.train, cfg.humanline)
    _task_sources(cfg)


def _model(m: ModelConfig) -> None:
    not_blank(m.name, "model.name", "'tiny', a hub name or a model folder")
    not_blank(m.gguf_file, "model.gguf_file", "a GGUF file name or null")
    one_of(m.dtype, "model.dtype", ("float32", "bfloat16", "float16"))
    check(0 < m.tiny_hidden_size <= MAX_TINY_HIDDEN and m.tiny_hidden_size % 4 == 0, "model.tiny_hidden_size",
          f"a positive multiple of 4 (the tiny model has 4 attention heads) up to {MAX_TINY_HIDDEN}",
          m.tiny_hidden_size)
    in_range(m.tiny_layers, "model.tiny_layers", 1, MAX_TINY_LAYERS)
    if m.name == "tiny":
        params = 16 * m.tiny_layers * m.tiny_hidden_size**2
        check(params <= MAX_TINY_PARAMS, "model.tiny_layers",
              f"16 x model.tiny_layers x model.tiny_hidden_size^2 <= {MAX_TINY_PARAMS:.0e} (the tiny model's "
              f"parameters, here {params:.1e}: use a real model for more)", (m.tiny_layers, m.tiny_hidden_size))
    check(m.name != "tiny" or m.gguf_file is None, "model.gguf_file",
          "null for model.name=tiny (a GGUF file lives in a local model folder)", m.gguf_file)
    in_range(m.lora_r, "model.lora_r", 1, MAX_LORA_R)
    in_range(m.lora_alpha, "model.lora_alpha", 1, MAX_LORA_ALPHA)
    check(0 <= m.lora_dropout < 1, "model.lora_dropout", "in [0, 1)", m.lora_dropout)
    check(bool(m.lora_target_modules) and all(name.strip() for name in m.lora_target_modules),
          "model.lora_target_modules", "a non-empty list of module names", m.lora_target_modules)


def _data(d: DataConfig) -> None:
    not_blank(d.train, "data.train", "a data file, dataset folder or hub name (or null)")
    not_blank(d.eval, "data.eval", "a data file, dataset folder or hub name (or null)")
    not_blank(d.split, "data.split", "a split name such as 'train'")
    check(0.0 <= d.eval_fraction < 1.0, "data.eval_fraction", "in [0, 1)", d.eval_fraction)
    check(d.format in (None, "pairwise", "unpaired", "groups", "prompts"), "data.format",
          "pairwise | unpaired | groups | prompts", d.format)
    in_range(d.max_prompt_length, "data.max_prompt_length", 1, MAX_TOKENS - 1)
    check(d.max_prompt_length < d.max_length <= MAX_TOKENS, "data.max_length",
          f"> data.max_prompt_length ({d.max_prompt_length}) and <= {MAX_TOKENS}", d.max_length)
    one_of(d.pair_mode, "data.pair_mode", ("best_worst", "all_pairs"))
    one_of(d.unpaired_rule, "data.unpaired_rule", ("mean", "threshold", "best_worst"))
    check(d.unpaired_rule != "threshold" or d.unpaired_threshold is not None, "data.unpaired_threshold",
          "a number when data.unpaired_rule=threshold", d.unpaired_threshold)
    check(d.pair_threshold >= 0, "data.pair_threshold", ">= 0", d.pair_threshold)


def _objective(o: ObjectiveConfig, h: HumanlineConfig) -> None:
    one_of(o.name, "objective.name", tuple(SPECS))  # the objective table is the one list of objectives
    check(o.beta > 0, "objective.beta", "> 0", o.beta)
    check(o.tau is None or o.tau > 0, "objective.tau", "> 0 or null (IPO: objective.beta)", o.tau)
    check(o.grpo_beta >= 0, "objective.grpo_beta", ">= 0", o.grpo_beta)
    check(0 <= o.eps_low < 1, "objective.eps_low", "in [0, 1)", o.eps_low)
    check(o.eps_high >= 0, "objective.eps_high", ">= 0", o.eps_high)
    check(o.advantage_eps >= 0, "objective.advantage_eps", ">= 0 (added to the group std)", o.advantage_eps)
    check(o.desirable_weight > 0, "objective.desirable_weight", "> 0", o.desirable_weight)
    check(o.undesirable_weight > 0, "objective.undesirable_weight", "> 0", o.undesirable_weight)
    one_of(o.reduction, "objective.reduction", ("token", "sequence"))
    one_of(o.correction, "objective.correction", CORRECTIONS)
    check(isinstance(o.max_staleness, int) and o.max_staleness >= 0, "objective.max_staleness", "an integer >= 0",
          o.max_staleness)
    check(o.tis_cap > 0, "objective.tis_cap", "> 0", o.tis_cap)
    check(o.behaviour_cap is None or o.behaviour_cap > 0, "objective.behaviour_cap", "> 0 or null", o.behaviour_cap)
    check(0 <= o.nll_weight < float("inf"), "objective.nll_weight", "a number >= 0", o.nll_weight)
    check(o.nll_weight == 0 or SPECS[o.name].kind in ("pairwise", "unpaired"), "objective.nll_weight",
          f"0 for objective {o.name} (the anchor is on preferred answers: DPO, IPO, KTO)", o.nll_weight)
    check(o.vespo_lambda_pos > 0 and o.vespo_lambda_neg > 0, "objective.vespo_lambda_pos",
          "> 0 (and objective.vespo_lambda_neg > 0)", (o.vespo_lambda_pos, o.vespo_lambda_neg))
    for name in ("icepop_band", "geo_band"):
        band = getattr(o, name)
        check(isinstance(band, list) and len(band) == 2 and all(isinstance(b, (int, float)) for b in band)
              and 0 < band[0] < 1 < band[1] < float("inf"), f"objective.{name}", "[low, high] with 0 < low < 1 < high",
              band)
    check(o.m2_threshold > 0, "objective.m2_threshold", "> 0", o.m2_threshold)
    for field_name, expected, value in settings_problems(h)[:1]:  # the one humanline check (core.humanline)
        check(False, field_name, expected, value)


def _optim(op: OptimConfig) -> None:
    check(op.lr > 0, "optim.lr", "> 0", op.lr)
    check(op.lr <= MAX_LR, "optim.lr", f"at most {MAX_LR:g} (AdamW moves each weight by about lr per step: "
          f"language models train at 1e-7 to 1e-3)", op.lr)
    check(0 <= op.warmup_ratio < 1, "optim.warmup_ratio", "in [0, 1)", op.warmup_ratio)
    check(op.max_grad_norm >= 0, "optim.max_grad_norm", ">= 0", op.max_grad_norm)
    check(op.weight_decay >= 0, "optim.weight_decay", ">= 0", op.weight_decay)
    check(len(op.betas) == 2 and all(0 <= b < 1 for b in op.betas), "optim.betas", "two numbers in [0, 1)", op.betas)


def _train(t: TrainConfig) -> None:
    one_of(t.regime, "train.regime", REGIMES)
    one_of(t.reference, "train.reference", REFERENCES)
    check(t.sample_every >= 1, "train.sample_every", "an integer >= 1", t.sample_every)
    check(isinstance(t.staleness, int) and 0 <= t.staleness <= MAX_STEPS, "train.staleness",
          "an integer >= 0 (optimizer steps between a batch's sampler and the step that trains on it)", t.staleness)
    check(t.regime == "stale" or t.staleness == 0, "train.staleness", "0 unless train.regime=stale", t.staleness)
    check(not t.async_sampling or (t.regime == "stale" and t.staleness >= 1), "train.async_sampling",
          "false unless train.regime=stale with train.staleness >= 1 (the sampler draws that many steps ahead while "
          "the trainer trains; at 0 there is nothing to overlap)", t.async_sampling)
    check(t.async_mode in ("fixed", "bounded"), "train.async_mode", "fixed or bounded", t.async_mode)
    check(re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps|xpu(:\d+)?", str(t.sampler_device)) is not None,
          "train.sampler_device", "auto, cpu, cuda, cuda:N, mps or xpu:N", t.sampler_device)
    in_range(t.micro_batch_size, "train.micro_batch_size", 1, MAX_BATCH)
    in_range(t.grad_accum, "train.grad_accum", 1, MAX_BATCH)
    check(t.max_steps is None or 1 <= t.max_steps <= MAX_STEPS, "train.max_steps", f"an integer in [1, {MAX_STEPS}] "
          f"or null", t.max_steps)
    in_range(t.epochs, "train.epochs", 1, MAX_EPOCHS)
    check(t.save_every >= 0, "train.save_every", ">= 0", t.save_every)
    check(t.eval_every >= 0, "train.eval_every", ">= 0", t.eval_every)
    check(t.keep_checkpoints >= 1, "train.keep_checkpoints", ">= 1", t.keep_checkpoints)
    check(t.max_bad_steps >= 1, "train.max_bad_steps", ">= 1", t.max_bad_steps)
    check(0 <= t.seed < 2**32, "train.seed", "an integer in [0, 2**32)", t.seed)
    not_blank(t.output_dir, "train.output_dir", "a folder")
    one_of(t.mixed_precision, "train.mixed_precision", ("auto", "no", "bf16", "fp16"))


def _generation(prefix: str, n: int, max_new_tokens: int, temperature: float, model: ModelConfig) -> None:
    """Checks shared by rollout.* and eval.*: sizes, and that greedy decoding is asked for one sample."""
    in_range(n, f"{prefix}.n", 1, MAX_SAMPLES)
    limit = TINY_CONTEXT if model.name == "tiny" else MAX_TOKENS
    why = " (the tiny model's context)" if model.name == "tiny" else ""
    check(1 <= max_new_tokens <= limit, f"{prefix}.max_new_tokens", f"an integer in [1, {limit}]{why}",
          max_new_tokens)
    check(0 <= temperature <= MAX_TEMPERATURE, f"{prefix}.temperature", f"in [0, {MAX_TEMPERATURE}] (0 = greedy)",
          temperature)
    check(temperature > 0 or n == 1, f"{prefix}.temperature",
          f"> 0 when {prefix}.n = {n} (temperature 0 is greedy decoding: one completion per prompt; set "
          f"{prefix}.n: 1)", temperature)


def _rollout(r: RolloutConfig, model: ModelConfig) -> None:
    not_blank(r.prompts, "rollout.prompts", "a prompt file (or null)")
    one_of(r.on_error, "rollout.on_error", ("fail", "skip"))
    one_of(r.cache, "rollout.cache", ("static", "dynamic"))
    one_of(r.decoder, "rollout.decoder", DECODERS)
    one_of(r.dtype, "rollout.dtype", ("policy", "bfloat16"))
    check(r.dtype == "policy" or not model.lora, "rollout.dtype",
          "policy with model.lora (a bfloat16 copy of a LoRA policy is not supported)", r.dtype)
    one_of(r.engine, "rollout.engine", ENGINES)
    check(0 < r.vllm_gpu_memory <= 1, "rollout.vllm_gpu_memory", "in (0, 1]", r.vllm_gpu_memory)
    check(0 < r.vllm_kv_cache_gb <= 1024, "rollout.vllm_kv_cache_gb", "in (0, 1024] GiB", r.vllm_kv_cache_gb)
    _generation("rollout", r.n, r.max_new_tokens, r.temperature, model)
    in_range(r.prompts_per_step, "rollout.prompts_per_step", 1, MAX_BATCH)
    check(0 < r.top_p <= 1, "rollout.top_p", "in (0, 1]", r.top_p)
    in_range(r.batch_size, "rollout.batch_size", 1, MAX_BATCH)
    in_range(r.redraws, "rollout.redraws", 0, MAX_REDRAWS)
    check(all(r.stop), "rollout.stop", "a list of non-empty strings", r.stop)


def _eval(e: EvalConfig, model: ModelConfig, r: RolloutConfig) -> None:
    not_blank(e.prompts, "eval.prompts", "a prompt file (or null)")
    _generation("eval", e.n, e.max_new_tokens, e.temperature, model)
    check(e.max_prompts >= 0, "eval.max_prompts", ">= 0 (0: all)", e.max_prompts)
    if e.prompts is not None:
        check(e.reward is not None or r.reward is not None, "eval.reward",
              "a reward spec when eval.prompts is set (or set rollout.reward)", e.reward)


def _regime(cfg: Config) -> None:
    d, o, r, t = cfg.data, cfg.objective, cfg.rollout, cfg.train
    if t.regime == "offline":
        check(d.train is not None, "data.train", "a data file or dataset for train.regime=offline", d.train)
        check(o.correction == "none", "objective.correction", "none for train.regime=offline (no sampler policy "
              "is recorded)", o.correction)
        return
    check(t.max_steps is not None, "train.max_steps", f"a number of steps for train.regime={t.regime}", t.max_steps)
    check(r.prompts is not None, "rollout.prompts", f"a prompt file for train.regime={t.regime}", r.prompts)
    check(r.reward is not None, "rollout.reward", f"a reward spec for train.regime={t.regime}", r.reward)
    check(r.n >= 2, "rollout.n", f">= 2 for online {o.name} (its {SPECS[o.name].kind} units are built from groups of "
          f"completions)", r.n)
    if t.regime in ("online", "stale"):
        check(t.sample_every == 1, "train.sample_every", f"1 for train.regime={t.regime} (use regime sparse)",
              t.sample_every)
    check(o.correction == "none" or o.name == "grpo", "objective.correction",
          f"none for objective {o.name} (the corrections reweigh GRPO's token ratio)", o.correction)
    steps = max(t.sample_every, t.staleness + 1)  # a stale queue samples staleness + 1 steps at its start
    check(r.prompts_per_step * r.n * steps <= MAX_BUFFER, "rollout.prompts_per_step",
          f"rollout.prompts_per_step x rollout.n x train.sample_every (stale: train.staleness + 1) <= {MAX_BUFFER} "
          f"completions sampled at once", (r.prompts_per_step, r.n, steps))


def _reference(t: TrainConfig, h: HumanlineConfig) -> None:
    if t.reference == "lookahead":
        check(t.regime == "offline", "train.reference", "lookahead only with offline data (future batches known)",
              t.reference)
    if t.reference in ("lookahead", "copy"):
        check(h.enabled, "train.reference", f"{t.reference} needs humanline.enabled=true", t.reference)
    if t.reference in ("frozen", "cache"):
        check(not h.enabled, "train.reference", f"{t.reference} cannot sync; humanline needs copy or lookahead",
              t.reference)
    if t.reference == "cache":
        check(t.regime == "offline", "train.reference", "cache only with offline data", t.reference)
    if t.reference == "sampler":
        check(t.regime != "offline" and not h.enabled, "train.reference",
              "sampler only for online/sparse/stale regimes without humanline (the sampling policy is the reference)",
              t.reference)


def _task_sources(cfg: Config) -> None:
    """`reasoning_gym:NAME?...` sources (humanline.data.reasoning_gym): their syntax, and an evaluation on the
    task a run trains on, with the same settings, is that source's held-out split: the two are disjoint only as
    the two splits of one spec (another size or seed could hand trained questions to the evaluation)."""
    fields = {"data.train": cfg.data.train, "data.eval": cfg.data.eval, "rollout.prompts": cfg.rollout.prompts,
              "eval.prompts": cfg.eval.prompts}
    specs = {}
    for name, value in fields.items():
        if reasoning_gym.is_task_source(value):
            try:
                specs[name] = reasoning_gym.parse_task_source(value)
            except UserError as exc:
                raise UserError(f"config field '{name}': {exc}") from exc
    trained = [s for n, s in specs.items() if n in ("data.train", "rollout.prompts")]
    held = specs.get("eval.prompts")
    for spec in trained:
        same_task = held is not None and (held.task, held.settings) == (spec.task, spec.settings)
        check(not same_task or held == dataclasses.replace(spec, split="held_out"), "eval.prompts",
              "the held-out split of the task source trained on: the same source with '&split=held_out' "
              "(same size, held_out, seed, format)", cfg.eval.prompts)


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def check_context(cfg: Config, model_config) -> None:
    """Once the model is loaded: every sequence the run builds fits the model's context (positions beyond it
    fail, or give meaningless outputs, inside the model). A config without a context field is not checked."""
    context = next((getattr(model_config, f) for f in CONTEXT_FIELDS if getattr(model_config, f, None)), None)
    if not isinstance(context, int):
        return
    where = f"the context of model '{cfg.model.name}' is {context} tokens"
    if cfg.train.regime == "offline":
        check(cfg.data.max_length <= context, "data.max_length", f"at most {context} ({where})", cfg.data.max_length)
    generation = [] if cfg.train.regime == "offline" else [("rollout", cfg.rollout.max_new_tokens)]
    if cfg.eval.prompts is not None:
        generation.append(("eval", cfg.eval.max_new_tokens))
    for section, new_tokens in generation:  # prompt + completion of every sequence sampled
        total = cfg.data.max_prompt_length + new_tokens
        check(total <= context, f"{section}.max_new_tokens",
              f"data.max_prompt_length + {section}.max_new_tokens <= {context} ({where}; "
              f"{cfg.data.max_prompt_length} + {new_tokens} = {total})", new_tokens)
