"""Assemble a run from its config: every part the training loop uses (`Run`), in one place.

The run folder is checked first (`humanline.training.run_dir`); then the accelerator, model, tokenizer, data, optimizer
and schedule; then, once a fresh run has cleared the folder, the loop's parts: the humanline transform, the
reference, the held-out eval set, the checkpoint manager and the metrics logger. Everything that can fail
because of user input fails here, before the first step, with a `UserError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from humanline.core.humanline import Humanline
from humanline.data.load import load_named, split_records
from humanline.devices.out_of_memory import memory_guard
from humanline.errors import UserError, require
from humanline.model.head import compile_output_head
from humanline.model.loading import check_model_source, load_model, load_tokenizer, resolved
from humanline.objectives.corrections import NEEDS_BEHAVIOUR
from humanline.sampling.sampler import Sampler, build_rewards
from humanline.settings.config import Config, TrainConfig
from humanline.training.accelerator import deterministic_kernels, fsdp_reference_copy, make_accelerator
from humanline.training.checkpoint import CheckpointManager
from humanline.training.config_checks import check_context
from humanline.training.held_out import EvalSet, make_eval_set
from humanline.training.metrics_log import MetricsLogger
from humanline.training.objective_table import SPECS, ObjectiveSpec
from humanline.training.reference import Reference, build_reference, choose_reference
from humanline.training.run_dir import check_output_dir, clear_previous_run, hold_folder, make_writable_dir
from humanline.training.schedule import BatchLayout, OfflineSchedule, SampleBuffer

if TYPE_CHECKING:  # annotations only: accelerate and transformers load with the run
    from accelerate import Accelerator
    from accelerate.scheduler import AcceleratedScheduler
    from transformers import PreTrainedTokenizerBase

    from humanline.sampling.reward_scoring import RewardFn


@dataclass
class Run:
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module  # as prepared by accelerate (possibly wrapped)
    unwrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer  # as prepared by accelerate (an AcceleratedOptimizer)
    lr_scheduler: AcceleratedScheduler
    schedule: OfflineSchedule | SampleBuffer  # OfflineSchedule, or the SampleBuffer of online/sparse regimes
    max_steps: int
    spec: ObjectiveSpec
    sampler: Sampler | None = None  # online/sparse: draws each buffer
    eval_units: list[dict] = field(default_factory=list)
    eval_prompts: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    eval_reward: RewardFn | None = None  # the reward of generation-based evaluation, built once at start-up
    ref_model: torch.nn.Module | None = None  # FSDP: the reference's sharded weight copy (copy / frozen)
    reference_strategy: str = ""  # train.reference resolved once (`reference_strategy`): frozen, copy, lookahead, ...
    planned_steps: int = 0  # the first segment's max_steps (a resumed run's warm-up and lookahead horizon)
    # the loop's parts, built once a fresh run has cleared the folder (`build_run`)
    humanline: Humanline | None = None  # transform, band, sync rule, metrics (its off form when humanline is off)
    reference: Reference | None = None  # the reference strategy (`humanline.training.reference`)
    behaviour: str | None = None  # the correction that reads the sampler's recorded log-probs (None: none does)
    eval_set: EvalSet | None = None  # held-out units, scored against the initial policy
    checkpoints: CheckpointManager | None = None
    logger: MetricsLogger | None = None


def build_run(cfg: Config, *, resume: bool = False, overwrite: bool = False, first: Config | None = None) -> Run:
    """Every part of a run of `cfg`. resume / overwrite: what to do with a run `train.output_dir` already holds
    (`humanline.training.run_dir.check_output_dir`); a run that does not resume starts from an emptied folder.
    first: the settings a resumed run started with (its LR warm-up stays laid out over their max_steps)."""
    out = Path(cfg.train.output_dir)
    check_output_dir(out, resume=resume, overwrite=overwrite)
    with memory_guard(cfg, "while building the run"):
        run = _build_model_and_data(cfg, (first or cfg).train)
    acc = run.accelerator
    if acc.is_main_process:  # one process per run folder; then checked again: another may have finished meanwhile
        make_writable_dir(str(out), "train.output_dir")
        hold_folder(out)
        check_output_dir(out, resume=resume, overwrite=overwrite)
    if not resume:  # a fresh run: nothing of an earlier one may stay (metrics would mix)
        clear_previous_run(out, acc)
    # transform, band (fixed, or set at each sync; held where the loss clips the ratio itself), sync rule,
    # metrics: one object, the same one the TRL bridge uses (its off form when humanline is off)
    sample_every = cfg.train.sample_every if cfg.train.regime == "sparse" else None  # bounds a drift rule's window
    clip = (cfg.objective.eps_low, cfg.objective.eps_high) if run.spec.own_ratio_clip else None
    run.humanline = hl = Humanline(cfg.humanline, seed=cfg.train.seed, ratio_clip=clip,
                                   process_index=acc.process_index, device=acc.device,
                                   sample_every=sample_every)
    strategy = run.reference_strategy
    run.reference = build_reference(strategy, run.unwrapped, sync=hl.rule, batches_of=run.schedule,
                                    max_steps=max(run.max_steps, run.planned_steps),
                                    later_steps=getattr(run.schedule, "later_steps", None),
                                    ref_model=run.ref_model)
    run.behaviour = cfg.objective.correction if run.sampler is not None and \
        cfg.objective.correction in NEEDS_BEHAVIOUR else None
    run.eval_set = make_eval_set(run.eval_units, run.spec.collate, run.tokenizer.pad_token_id,
                                 cfg.train.micro_batch_size, acc.device)
    run.checkpoints = CheckpointManager(out / "checkpoints", cfg.train.keep_checkpoints, acc)
    run.logger = MetricsLogger(out, cfg, acc, run.max_steps)
    run.logger.info(f"objective={cfg.objective.name} regime={cfg.train.regime} humanline={hl.on} "
                    f"reference={strategy} steps={run.max_steps} processes={acc.num_processes}")
    if run.sampler is not None:
        run.logger.info(f"rollout engine: {run.sampler.engine} ({run.sampler.engine_why})")
    for note in run.notes:
        run.logger.info(note)
    for warning in (stale_reference_warning(cfg), staleness_past_the_run_warning(cfg, run.max_steps)):
        if warning:
            run.logger.warn(warning)
    if hl.held_band:
        run.logger.info(f"humanline.band=auto: {cfg.objective.name} clips the ratio itself (objective.eps_low/"
                        f"eps_high), so the band holds [{cfg.humanline.low:g}, {cfg.humanline.high:g}] "
                        f"(docs/method.md §3.4)")
    return run


def stale_reference_warning(cfg: Config) -> str | None:
    """What a sparse regime whose humanline syncs less often than it samples does, in one line (None: nothing
    to say). The warning is all: the setting is legal, only rarely what was meant."""
    h, t = cfg.humanline, cfg.train
    if not h.enabled or t.regime != "sparse" or h.sync_every == "auto" or h.sync_every <= t.sample_every:
        return None
    return (f"humanline.sync_every={h.sync_every} > train.sample_every={t.sample_every}: some buffers are scored "
            f"against a reference older than the policy that sampled them; sampled tokens then have log-ratios above "
            f"0 on average, and positive-advantage tokens reach the ratio clip first (docs/method.md §3.5). Choose "
            f"sync_every <= {t.sample_every}, or sync_every: auto (its windows stay within the sampling period)")


def staleness_past_the_run_warning(cfg: Config, max_steps: int) -> str | None:
    """What a stale regime whose lag reaches the run's end does, in one line (None: nothing to say): with
    `staleness >= max_steps - 1` the queue filled at step 0 holds every step's batch, so the initial policy draws
    them all and no step trains on samples as old as the lag."""
    t = cfg.train
    if t.regime != "stale" or t.staleness < max(1, max_steps - 1):
        return None
    return (f"train.staleness={t.staleness} with {max_steps} steps: the initial policy draws every step's batch at "
            f"step 0 (samples at most {max_steps - 1} versions old, never {t.staleness}): offline training on fresh "
            f"samples of the initial policy. A lag of {t.staleness} needs more than {t.staleness + 1} steps")


def reference_strategy(cfg: Config, spec: ObjectiveSpec) -> str:
    """`train.reference` resolved (`choose_reference`), once per run: the accelerator's checks, the FSDP weight
    copy and the reference itself all act on this one answer."""
    return choose_reference(cfg.train.reference, humanline=cfg.humanline.enabled, regime=cfg.train.regime,
                            sampler_reference=spec.sampler_reference)


def _build_model_and_data(cfg: Config, first: TrainConfig) -> Run:
    """Accelerator, tokenizer, data, model, optimizer, LR schedule, batch schedule (and online sampler); the
    warm-up is laid out over `first`'s steps (the run's first segment: a resume that moves the end keeps it)."""
    from accelerate.utils import gather_object, set_seed

    preflight(cfg)
    rewards = build_rewards(cfg)  # every reward resolved before any data or model is loaded
    spec = SPECS[cfg.objective.name]
    strategy = reference_strategy(cfg, spec)
    accelerator = make_accelerator(cfg, strategy)
    tokenizer = load_tokenizer(cfg.model)
    layout = BatchLayout(cfg.train.micro_batch_size, cfg.train.grad_accum, accelerator.num_processes,
                         accelerator.process_index)
    notes: list[str] = [note] if (note := _half_weights_note(cfg)) else []
    eval_units: list = []
    if cfg.train.regime == "offline":  # data before the model: a bad record should not wait for a model load
        units, eval_units = offline_units(cfg, spec, tokenizer, notes)
        if len(units) < layout.per_step:
            raise UserError(f"{cfg.data.train}: {len(units)} training units are fewer than one optimizer step "
                            f"needs (train.micro_batch_size x train.grad_accum x processes = {layout.per_step})")
        steps_per_epoch = len(units) // layout.per_step
        max_steps = cfg.train.max_steps or steps_per_epoch * cfg.train.epochs
        planned = first.max_steps or steps_per_epoch * first.epochs
    else:
        units = []
        if cfg.train.max_steps is None:
            raise UserError(f"config field 'train.max_steps': required for train.regime={cfg.train.regime}")
        max_steps, planned = cfg.train.max_steps, first.max_steps or cfg.train.max_steps
        pool = load_named("rollout.prompts", cfg.rollout.prompts, kind="prompts").records  # before the model
        sampler = Sampler(cfg, tokenizer, accelerator, rewards["rollout"], pool)
    eval_prompts = _eval_prompts(cfg)  # also read before the model
    set_seed(cfg.train.seed)
    if cfg.train.deterministic:
        deterministic_kernels()
    model = load_model(cfg.model, tokenizer)
    check_context(cfg, model.config)
    if cfg.train.compile:
        compile_output_head(model)  # reference snapshots (deep copies) inherit the flag
    optimizer = make_optimizer(model, cfg.optim, accelerator.device)
    warmup = int(cfg.optim.warmup_ratio * planned)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / (warmup + 1)))
    ref_model = fsdp_reference_copy(strategy, accelerator, model)
    model, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    unwrapped = accelerator.unwrap_model(model)
    if cfg.train.regime == "offline":
        schedule, sampler = OfflineSchedule(units, spec.collate, tokenizer.pad_token_id, layout, seed=cfg.train.seed,
                                            device=accelerator.device, shuffle=cfg.data.shuffle), None
        if schedule.dropped_per_epoch:
            notes.append(f"{schedule.dropped_per_epoch} units per epoch do not fill a step and are left out")
    else:
        local = BatchLayout(cfg.train.micro_batch_size, cfg.train.grad_accum)  # units are sampled per process
        # several processes agree on each step's micro-batch count (their forwards and backwards meet)
        gather = (lambda obj: gather_object([obj])) if accelerator.num_processes > 1 else None
        schedule = SampleBuffer(spec.collate, tokenizer.pad_token_id, local, cfg.train.sample_every,
                                accelerator.device, gather=gather, staleness=cfg.train.staleness, max_steps=max_steps)
    return Run(accelerator, tokenizer, model, unwrapped, optimizer, lr_scheduler, schedule, max_steps, spec, sampler,
               eval_units, eval_prompts, notes, rewards["eval"] if eval_prompts else None, ref_model, strategy,
               planned_steps=planned)


def make_optimizer(model: torch.nn.Module, optim, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters: fused (one kernel per step for all of them) on CUDA, where a
    per-tensor optimizer is launch-bound; the multi-tensor (foreach) form on other devices."""
    fused = torch.device(device).type == "cuda"
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=optim.lr,
                             betas=tuple(optim.betas), weight_decay=optim.weight_decay,
                             fused=fused or None, foreach=None if fused else True)


def _half_weights_note(cfg: Config) -> str | None:
    """A warning for half-precision weights at small learning rates: bf16 resolves 2^-8 of a weight, so an
    AdamW step of ~lr per weight below ~1e-4 rounds away for most weights (training stalls silently)."""
    if cfg.model.dtype == "float32" or cfg.optim.lr >= 1e-4:
        return None
    return (f"warning: model.dtype={cfg.model.dtype} keeps the weights in half precision, where most AdamW steps "
            f"of optim.lr={cfg.optim.lr:g} round to nothing (a {cfg.model.dtype} weight resolves 1/256 of itself); "
            f"model.dtype=float32 with train.mixed_precision=bf16 trains in bf16 without losing them")


def preflight(cfg: Config) -> None:
    """Checks that need no model or data, run first: output folder, optional dependencies, model folder."""
    make_writable_dir(cfg.train.output_dir, "config field 'train.output_dir'")
    wanted = [("model.lora", "peft", "peft")] if cfg.model.lora else []
    wanted += [("model.gguf_file", "gguf", "gguf")] if resolved(cfg.model).gguf_file else []  # an alias names one
    for field_name, module, extra in wanted:
        try:
            require(module, extra)
        except UserError as exc:
            raise UserError(f"config field '{field_name}': {exc}") from exc
    check_model_source(cfg.model)
    if cfg.logging.trackers:
        import accelerate.utils

        for name in cfg.logging.trackers:  # accelerate only warns and drops a tracker that is not installed
            if not getattr(accelerate.utils, f"is_{name}_available", lambda: True)():
                raise UserError(f"config field 'logging.trackers': '{name}' is not installed "
                                f"(pip install {name.replace('_', '-')})")


def _convert(spec: ObjectiveSpec, records: list, kind: str, cfg: Config, notes: list[str]) -> list:
    records, note = spec.convert(records, kind, cfg.data)
    if note:
        notes.append(note)
    return records


def _encode(spec: ObjectiveSpec, records: list, tokenizer, cfg: Config, source: str, notes: list[str]) -> list:
    try:
        result = spec.encode(records, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                             max_length=cfg.data.max_length)
    except UserError as exc:  # e.g. conversational records and a tokenizer without a chat template
        raise UserError(f"{source}: {exc}") from exc
    if result.problems and not cfg.data.skip_invalid:
        first = "; ".join(str(p) for p in result.problems[:3])
        raise UserError(f"{source}: {len(result.problems)} records cannot be tokenised ({first}); "
                        f"set data.skip_invalid=true to drop them")
    if result.truncated or result.dropped:
        notes.append(f"{source}: {result.truncated} records truncated, {result.dropped} dropped while tokenising")
    return result.units


def offline_units(cfg: Config, spec: ObjectiveSpec, tokenizer, notes: list[str]) -> tuple[list, list]:
    """Load, validate, convert and tokenise the offline train (and eval) data."""
    d = cfg.data
    try:
        loaded = load_named("data.train", d.train, kind=d.format, split=d.split, skip_invalid=d.skip_invalid)
    except UserError as exc:  # a split the source does not have is data.split's fault
        if f"split '{d.split}'" not in str(exc):
            raise
        raise UserError(f"config field 'data.split': {str(exc).removeprefix('data.train: ')}") from exc
    if loaded.skipped:
        notes.append(f"{d.train}: {loaded.skipped} invalid records skipped: " +
                     "; ".join(str(p) for p in loaded.problems[:3]))
    records, eval_records = loaded.records, []
    if d.eval:
        eval_loaded = load_named("data.eval", d.eval, kind=d.format, skip_invalid=d.skip_invalid)
        eval_records = _convert(spec, eval_loaded.records, eval_loaded.kind, cfg, notes)
    elif d.eval_fraction > 0:
        records, eval_records = split_records(records, d.eval_fraction, seed=cfg.train.seed)
        if not eval_records:  # one prompt id: its records stay together, so none can be held out
            raise UserError(f"config field 'data.eval_fraction': {d.eval_fraction:g} of the prompts of '{d.train}' "
                            f"cannot be held out: its {len(records)} records share one prompt id; give each prompt "
                            f"its own id, set data.eval, or set data.eval_fraction: 0")
        eval_records = _convert(spec, eval_records, loaded.kind, cfg, notes)
    records = _convert(spec, records, loaded.kind, cfg, notes)
    units = _encode(spec, records, tokenizer, cfg, str(d.train), notes)
    eval_units = _encode(spec, eval_records, tokenizer, cfg, str(d.eval or d.train), notes) if eval_records else []
    if not units:
        raise UserError(f"data.train: '{d.train}' yields no training units for objective '{cfg.objective.name}'")
    return units, eval_units


def _eval_prompts(cfg: Config) -> list:
    if not cfg.eval.prompts:
        return []
    records = load_named("eval.prompts", cfg.eval.prompts, kind="prompts").records
    return records[: cfg.eval.max_prompts] if cfg.eval.max_prompts else records
