"""Typed configuration: one dataclass per concern, each field documented once, next to its default.

A field's documentation is its trailing comment and the comment-only lines right below it; `humanline config`
prints it from here (`humanline.settings.field_docs`), so it is written nowhere else.

Upper limits of sizes are noted next to their fields and checked at start-up (`humanline.training.config_checks`).
Only the types live here, importing nothing above `humanline.core`, so that every module can name them in a
signature; a recipe is read into them by `humanline.training.config_loading.load_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from humanline.core.humanline import HumanlineConfig


@dataclass
class ModelConfig:
    name: str = "tiny"  # "tiny" (random small LlamaConfig), a hub name, or a local folder
    gguf_file: str | None = None  # GGUF file inside `name` (dequantised once, cached as a plain copy)
    dtype: str = "float32"  # float32 | bfloat16 | float16: weights' dtype. AdamW on float16 weights overflows
    # within a few steps (refused on a CPU; elsewhere the run stops with exit code 3): train float32 or bfloat16
    gradient_checkpointing: bool = False  # recompute activations in the backward pass: less memory, the same numbers
    disable_dropout: bool = True  # dropout makes ratios noisy; the authors' code disables it too
    tiny_hidden_size: int = 64  # only for name == "tiny"; a multiple of 4, at most 4096
    tiny_layers: int = 2  # only for name == "tiny"; at most 64 (and ~16 x layers x hidden^2 <= 2e8 parameters)
    lora: bool = False  # train LoRA adapters (needs the `peft` extra)
    lora_r: int = 16  # rank of each LoRA adapter (the inner size of its two matrices); at most 4096
    lora_alpha: int = 32  # LoRA scaling: the adapters' update is scaled by lora_alpha / lora_r; at most 1e6
    lora_dropout: float = 0.0  # dropout on the LoRA adapters' input, in [0, 1)
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])  # the
    # model's modules that get LoRA adapters (names of its linear layers)


@dataclass
class DataConfig:
    train: str | None = None  # offline data: file (.jsonl/.json/.parquet/.csv), datasets folder or hub name
    eval: str | None = None  # held-out data in the same format; or use eval_fraction
    eval_fraction: float = 0.0  # share of prompts split off `train` for evaluation (by prompt id)
    format: str | None = None  # pairwise | unpaired | groups | prompts; None = detect
    split: str = "train"  # split of a datasets folder or hub dataset, optionally sliced: train[:90%]
    shuffle: bool = True  # permute the units every epoch (seeded); false: file order, every epoch
    max_prompt_length: int = 256  # tokens; longer prompts keep their end
    max_length: int = 512  # prompt + completion tokens (at most 2**20); longer completions keep their start
    skip_invalid: bool = False  # drop invalid records (counted and logged) instead of failing
    pair_threshold: float = 0.01  # groups -> pairs: keep best vs worst when the score gap exceeds this
    pair_mode: str = "best_worst"  # groups -> pairs: best_worst (one pair per group) | all_pairs (every pair past
    # the gap)
    unpaired_rule: str = "mean"  # groups -> unpaired: desirable if above the group mean ("mean") or threshold;
    # best_worst: only the best (desirable) and the worst (undesirable) of each group, balanced
    unpaired_threshold: float | None = None  # unpaired_rule threshold: a completion scored at least this is
    # desirable


@dataclass
class ObjectiveConfig:
    name: str = "dpo"  # a key of humanline.training.objective_table.SPECS (docs/adding-an-objective.md)
    beta: float = 0.1  # DPO/KTO inverse temperature; not GRPO's (grpo_beta); IPO reads it when tau is null
    tau: float | None = None  # IPO's regulariser tau (> 0): the margin target is 1 / (2 tau) nats. null:
    # objective.beta (IPO recipes written before this field set beta)
    desirable_weight: float = 1.0  # KTO: the weight of the loss on desirable examples (lambda_D)
    undesirable_weight: float = 1.0  # KTO: the weight of the loss on undesirable examples (lambda_U)
    nll_weight: float = 0.0  # DPO, IPO, KTO: weight of the NLL anchor added to the loss, the length-normalised
    # negative log-likelihood of the preferred answers (DPO/IPO: the chosen; KTO: the desirable; iterative RPO's
    # term, TRL's "sft"), >= 0; 0: none
    grpo_beta: float = 0.01  # GRPO: the weight of the KL penalty to the reference in the loss (HALOs 0.01)
    eps_low: float = 0.01  # GRPO ratio clip (HALOs 0.01; TRL 0.2)
    eps_high: float = 0.01  # GRPO ratio clip above 1 (HALOs 0.01; TRL 0.2)
    advantage_eps: float = 0.01  # added to the group std (>= 0)
    reduction: str = "token"  # GRPO: how token losses are averaged: token (over every token of the micro-batch,
    # HALOs) | sequence (each sequence's token mean, then over sequences)
    correction: str = "none"  # GRPO in sampled regimes: what becomes of tokens drawn by an older policy or
    # another engine (humanline.objectives.corrections; docs/method.md §3.6): none | drop | tis | decoupled | m2po |
    # vespo | icepop | geo_mask; composes with humanline.enabled
    max_staleness: int = 4  # drop: samples more than this many optimizer steps old count no token
    tis_cap: float = 2.0  # tis: the behaviour weight pi_prox / pi_behav (with humanline pi_ref / pi_behav) is
    # truncated at this C (> 0)
    behaviour_cap: float | None = None  # decoupled: the same truncation, or null for none
    m2_threshold: float = 0.04  # m2po: tau, the bound on the mean squared log pi_prox / pi_behav (with humanline
    # log pi_ref / pi_behav) of the tokens kept
    vespo_k_pos: float = 2.0  # vespo: k of phi(w) = exp(lambda + k log w - lambda w) where the advantage >= 0 (TRL's)
    vespo_lambda_pos: float = 3.0  # vespo: lambda where the advantage >= 0 (> 0)
    vespo_k_neg: float = 3.0  # vespo: k where the advantage < 0
    vespo_lambda_neg: float = 2.0  # vespo: lambda where the advantage < 0 (> 0)
    icepop_band: list[float] = field(default_factory=lambda: [0.5, 2.0])  # icepop: tokens whose pi_prox / pi_behav
    # (with humanline pi_ref / pi_behav) lies outside [low, high] count for nothing (0 < low < 1 < high)
    geo_band: list[float] = field(default_factory=lambda: [0.99, 1.01])  # geo_mask: sequences whose geometric-mean
    # token ratio pi_prox / pi_behav (with humanline pi_ref / pi_behav) lies outside [low, high] count for nothing
    # (0 < low < 1 < high)


@dataclass
class OptimConfig:
    lr: float = 1e-6  # AdamW learning rate, in (0, 1]: language models train at 1e-7 to 1e-3
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (>= 0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's beta1, beta2, each in [0, 1)
    warmup_ratio: float = 0.1  # linear warm-up over this share of max_steps, then constant
    max_grad_norm: float = 1.0  # the gradient is clipped to this global norm before each update (0: no clipping)


@dataclass
class RolloutConfig:
    prompts: str | None = None  # prompt file for online/sparse sampling
    prompts_per_step: int = 8  # prompts sampled per optimizer step (per process); at most 65536, and
    # prompts_per_step x n x train.sample_every <= 2**20 completions sampled at once
    n: int = 8  # completions per prompt, at most 1024
    max_new_tokens: int = 64  # the longest sampled completion, in tokens; at most 2**20 (512 for the tiny model)
    temperature: float = 1.0  # in [0, 100]; 0 = greedy decoding, one completion per prompt: needs n = 1
    top_p: float = 1.0  # nucleus sampling mass in (0, 1]; 1.0 samples from the full distribution
    stop: list[str] = field(default_factory=list)  # strings that end a completion (kept in it)
    reward: Any = None  # reward spec: name, "module:function", "reward_model:PATH", or list of {type, weight}
    on_error: str = "fail"  # fail | skip: what a failing reward or generation does
    redraws: int = 0  # equal units: a sampled step with fewer units than an offline step trains on
    # (train.micro_batch_size x train.grad_accum: DPO pairs, KTO examples, GRPO groups) draws fresh prompts again,
    # up to this many times, then keeps that many units (0: it trains on what its first draw gave); logged as
    # redraws and units_short (humanline.sampling.draw)
    batch_size: int = 16  # prompts per generate call, at most 65536
    cache: str = "static"  # KV cache for generation: static (preallocated; compiled decoding on CUDA) | dynamic
    decoder: str = "auto"  # auto (sampling.decode, a fast CPU loop, where it applies) | generate (model.generate);
    # the same distribution, other random draws per seed; also used by the run's held-out generation (eval)
    dtype: str = "policy"  # policy: sample with the policy's own weights | bfloat16: with a bfloat16 copy of
    # them, refreshed before each sampling (about 2x faster on CPUs with native bf16; the samples then come from
    # the policy rounded to bf16, as with a bf16 inference engine); held-out evaluation keeps the policy's weights
    engine: str = "auto"  # what samples: hf (humanline's decode loop or transformers' generate) | vllm (a vLLM
    # engine held by the sampling process, its weights synced from the policy before each sampling; docs/usage.md,
    # "Rollouts on vLLM") | auto (vllm where it is installed and the device is a CUDA GPU, else hf; the run's
    # first lines say which and why)
    vllm_gpu_memory: float = 0.3  # engine vllm on a GPU: the share of its memory vLLM may take, in (0, 1]
    # (gpu_memory_utilization; the trainer keeps the rest)
    vllm_kv_cache_gb: float = 1.0  # engine vllm on a CPU: GiB of host memory for its KV cache, in (0, 1024]


@dataclass
class TrainConfig:
    regime: str = "offline"  # where the training samples come from: offline (data.train) | online (sampled every
    # step) | sparse (sampled every sample_every steps) | stale (sampled staleness steps before they train)
    sample_every: int = 1  # sparse: sample a buffer every N optimizer steps (online == 1)
    staleness: int = 0  # stale: every step trains on samples drawn by the policy this many steps earlier (0 is
    # online); the first `staleness` steps train on samples of the initial policy (humanline.training.schedule)
    async_sampling: bool = False  # stale: a sampler process draws the queue's batches while the trainer trains
    # (the same batches, weights shipped after every update: equal to the synchronous queue; one training process)
    async_mode: str = "fixed"  # async_sampling: fixed (the sampler exactly `staleness` versions behind: the
    # synchronous stale run, bit for bit) | bounded (each batch drawn by the newest weights the sampler has, at
    # most `staleness` versions old: it waits for newer weights at the bound; not deterministic)
    sampler_device: str = "auto"  # async_sampling: where the sampler process generates: auto (the trainer's
    # device) | cpu | cuda:N (a second GPU; untested)
    reference: str = "auto"  # auto | frozen | cache | copy | lookahead | sampler (see humanline.training.reference)
    micro_batch_size: int = 4  # units per forward: pairs (dpo), examples (kto), prompt groups (grpo); <= 65536
    grad_accum: int = 1  # micro-batches whose gradients add up to one optimizer step; at most 65536
    max_steps: int | None = None  # None: epochs over the offline data; at most 1e9
    epochs: int = 1  # passes over the offline data when max_steps is null; at most 1e6
    seed: int = 0  # seeds the tiny model's weights, the data order, sampling and humanline's random draws
    save_every: int = 0  # checkpoint every N steps (0: only at the end)
    keep_checkpoints: int = 2  # the newest this many checkpoints are kept, older ones removed
    eval_every: int = 0  # evaluate every N steps (0: only at the end)
    max_bad_steps: int = 3  # abort after this many consecutive non-finite steps
    allow_collapse: bool = False  # a run whose policy stopped learning (docs/usage.md, "Exit codes") ends with exit
    # code 0 instead of 5, for sweeps that expect some settings to fail; its last line and report.md say it either way
    mixed_precision: str = "auto"  # the autocast precision of forward passes: auto (bf16 on a CUDA GPU that has
    # it, else no) | no | bf16 | fp16
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
    max_prompts: int = 0  # evaluate the first this many held-out prompts (0: all of them)
    max_new_tokens: int = 64  # the longest completion sampled at evaluation, in tokens; at most 2**20 (512 for
    # the tiny model)
    temperature: float = 1.0  # the sampling temperature at evaluation, in [0, 100]; 0 = greedy: needs n = 1


@dataclass
class LoggingConfig:
    log_every: int = 1  # a console line of the step's metrics every N steps (0: none); metrics.jsonl has every step
    trackers: list[str] = field(default_factory=list)  # tensorboard | wandb | trackio (via accelerate)
    progress: bool = True  # a progress bar on a terminal (never in a log file: plain lines there)


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

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
