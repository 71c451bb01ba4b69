"""One optimizer step, stage by stage, in the method's order (`training.loop.Trainer.train_step` calls them):
the sampled batch and its staleness, the reference's log-probs and the pre-update capture, each micro-batch's forward,
transform, loss and backward, and the update with the step's one host read (`read_back`). Each stage reads a
`StepContext` (the run, its settings, the running counts, the step) and what the stages before it made; the
Trainer holds the state between steps (counters, the step, the sampler process)."""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch

from humanline.devices.collectives import clip_grad_norm, mean_across_processes
from humanline.errors import UserError
from humanline.model.forward import part_logps
from humanline.objectives import LossOutput
from humanline.sampling.draw import draw, short_lines
from humanline.settings.config import Config
from humanline.training.build import Run
from humanline.training.counters import Counters
from humanline.training.faults import check_alive, skip_non_finite
from humanline.training.objective_table import loss_input
from humanline.training.schedule import FILLER


@dataclass(frozen=True)
class StepContext:
    """What every stage of optimizer step `step` reads: the run's parts, its settings, its running counts, and the
    sum across processes (`devices.collectives.reduce_sum` bound to the run's accelerator)."""

    run: Run
    cfg: Config
    counters: Counters
    step: int
    reduce_sum: Callable[[torch.Tensor], torch.Tensor]


def sample(ctx: StepContext) -> dict:
    """1-3. Online / sparse / stale, when a buffer is due (`SampleBuffer.request`): prompts, completions from the
    current policy, rewards, units, into the buffer for the steps they serve. Returns the stats to log."""
    run, cfg, step = ctx.run, ctx.cfg, ctx.step
    buffer = run.schedule
    request = buffer.request(step) if run.sampler is not None else None
    if request is None:
        return {}
    first, span = request
    drawn = draw(run.sampler, run.model, run.spec.units_from_group, cfg.data, at=step, first=first, span=span,
                 fill=buffer.layout.per_step, redraws=cfg.rollout.redraws)
    buffer.fill(step, first, drawn.units)
    for line in short_lines(drawn.short, buffer.layout.per_step, cfg.rollout.redraws):
        run.logger.warn(line)
    ctx.counters.count_sampled(drawn.stats)
    return drawn.stats


def sampled_staleness(ctx: StepContext) -> int | None:
    """The staleness of the step's samples: versions between their sampler and the step (0 online; every sample
    of a step has the same). None where nothing is sampled (offline)."""
    return None if ctx.run.sampler is None else ctx.run.schedule.staleness_of(ctx.step)


def reference_logps(ctx: StepContext, micro_batches: list[dict]) -> list[dict]:
    """4. The reference's log-probs of each micro-batch, and, where a correction reads them (`run.behaviour`), the
    sampler's (`"behaviour"`): those the engine recorded as it drew the tokens (`collate_grpo`'s
    `behaviour_logps`), at its temperature, top-p and weights."""
    run, step = ctx.run, ctx.step
    refs = [run.reference.logps(step, i, mb) for i, mb in enumerate(micro_batches)]
    for mb, ref in zip(micro_batches, refs) if run.behaviour else ():
        if "behaviour_logps" not in mb:
            raise UserError(f"objective.correction={run.behaviour}: the batch of step {step + 1} carries no sampler "
                            f"log-probs (a buffer from a checkpoint written before they were recorded); start the "
                            f"run anew")
        ref["behaviour"] = mb["behaviour_logps"][:, 1:]
    return refs


def capture_pre_update(ctx: StepContext) -> None:
    """5. The reference takes from the policy, still pre-update, what it needs for later steps (a sampler reference
    scores its buffer's later steps; humanline's sync schedule must not lose a beat, so also on a step with nothing
    to train on)."""
    ctx.run.reference.capture_pre_update(ctx.step)


def micro_batch_loss(ctx: StepContext, index: int, batch: dict, ref: dict, staleness: int = 0
                     ) -> tuple[LossOutput, dict]:
    """6, for micro-batch `index`: policy forward, log-ratio, humanline transform, objective. `staleness`: how many
    versions old its samples are (`sampled_staleness`; 0 offline). Returns the loss and the drift metrics."""
    run = ctx.run
    x = loss_input(run.spec, batch, lambda part: part_logps(run.model, batch, part), ref,
                   transform=lambda raw, mask, part: run.humanline.apply(raw, mask, step=ctx.step, index=index,
                                                                         part=part),
                   reduce_sum=ctx.reduce_sum, humanline=run.humanline.on,
                   staleness=staleness)  # counted, observed by an auto band
    return run.spec.loss(x, ctx.cfg.objective), drift_metrics(x.raw_log_ratio, x.mask)


def loss_and_backward(ctx: StepContext, micro_batches: list[dict], refs: list[dict],
                      staleness: int = 0) -> tuple[dict, torch.Tensor]:
    """6. Loss and backward of every micro-batch (`micro_batch_loss`; gradients accumulate, DDP syncs on the last
    one). A filler micro-batch (`schedule.FILLER`: it only keeps processes in step) runs with weight 0 and is not
    logged. Returns the metrics averaged over micro-batches and whether every loss was finite, both still on the
    device."""
    run = ctx.run
    metrics: dict[str, torch.Tensor] = {}
    finite = torch.ones((), dtype=torch.bool, device=run.accelerator.device)
    n = max(sum(not batch.get(FILLER) for batch in micro_batches), 1)
    for i, (batch, ref) in enumerate(zip(micro_batches, refs)):
        last = i == len(micro_batches) - 1
        with nullcontext() if last else run.accelerator.no_sync(run.model):
            out, extra = micro_batch_loss(ctx, i, batch, ref, staleness)
            if batch.get(FILLER):
                run.accelerator.backward(out.loss * 0.0)
                continue
            finite = finite & torch.isfinite(out.loss.detach())
            run.accelerator.backward(out.loss / n)
        accumulate(metrics, {**out.metrics, **extra, "loss": out.loss.detach()}, n)
    return metrics, finite


def update(ctx: StepContext, micro_batches: list[dict], metrics: dict, finite: torch.Tensor,
           t_train: float) -> tuple[dict, list[float] | None]:
    """7. Clip the gradient norm; read the step's metrics (`loss_and_backward`'s), its finiteness, the norm and
    humanline's window back in one transfer (the step's only host read); then the optimizer and LR-schedule step
    (skipped when non-finite). `t_train`: when the step's training began. Returns the logged metrics and
    humanline's window sums (None: humanline is off)."""
    run, cfg, counters, step = ctx.run, ctx.cfg, ctx.counters, ctx.step
    grad_norm = clip_grad_norm(run.model, run.accelerator, cfg.optim.max_grad_norm)
    window = run.humanline.window_sums(ctx.reduce_sum)
    host = read_back({**metrics, "finite": finite, "grad_norm": grad_norm,
                      **({"humanline": window} if window is not None else {})})
    grad_norm, window = host.pop("grad_norm"), host.pop("humanline", None)
    lr = run.lr_scheduler.get_last_lr()[0]  # the rate this step's update uses (the scheduler's step moves it on)
    if host.pop("finite") and math.isfinite(grad_norm):
        run.optimizer.step()
        run.lr_scheduler.step()
        counters.bad_streak = 0
        no_signal = host.get("loss") == 0.0 or (window is not None and not window[0])  # no token inside the band
        check_alive(counters, cfg, step, grad_norm, signal=not no_signal)
    else:
        skip_non_finite(counters, cfg, step, micro_batches, run.logger)
    run.optimizer.zero_grad(set_to_none=True)
    tokens = counters.count_trained(micro_batches)
    elapsed = time.perf_counter() - t_train
    metrics = mean_across_processes(run.accelerator, host)
    metrics.update({"grad_norm": grad_norm, "lr": lr,
                    "tokens_per_s": tokens / max(elapsed, 1e-9), "time/train": elapsed})
    return metrics, window


def drift_metrics(raw_log_ratio: torch.Tensor, mask: torch.Tensor) -> dict:
    """The mean and the mean absolute raw token log-ratio of a micro-batch (how far the policy stands from its
    reference), on the device."""
    raw, n_tokens = raw_log_ratio.detach(), mask.sum().clamp(min=1)
    return {"log_ratio/mean": (raw * mask).sum() / n_tokens, "log_ratio/abs_mean": (raw.abs() * mask).sum() / n_tokens}


def accumulate(total: dict, metrics: dict, n: int) -> None:
    """Add `metrics / n` into `total`, on the device (float64, as the host's floats were)."""
    for key, value in metrics.items():
        value = value.detach().double() if isinstance(value, torch.Tensor) else float(value)
        total[key] = total.get(key, 0.0) + value / n


def read_back(values: dict) -> dict:
    """Device tensors (scalars, or vectors such as humanline's window sums) and plain numbers as host values,
    through one transfer: scalars become floats, vectors lists of floats."""
    tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in values.items() if k not in tensors}
    if tensors:
        device = next(iter(tensors.values())).device
        flat = torch.cat([v.detach().reshape(-1).to(device, torch.float64) for v in tensors.values()]).tolist()
        start = 0
        for key, value in tensors.items():
            size = value.numel()
            out[key] = flat[start] if value.dim() == 0 else flat[start: start + size]
            start += size
    return {k: out[k] for k in values}
