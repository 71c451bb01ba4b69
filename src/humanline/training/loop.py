"""The one training loop: every objective, every regime, with or without humanline.

One optimizer step `s` (`Trainer.train_step`), in the order that *is* the method (docs/method.md §3.2):

    1. sample     online/sparse/stale, when a buffer is due: completions of this process's prompts from the
                  current policy, for the next N steps, or (stale) for step s + staleness
                  (`sampling.sampler.Sampler.generate`; `train.async_sampling`: asked of a sampler process, which
                  draws while this step trains, `training.async_sampling`)
    2. score      rewards of those completions (`sampling.sampler.Sampler.score`)
    3. units      the objective's units from the scored groups (`ObjectiveSpec.units_from_group`), buffered
    4. reference  reference log-probs of all this step's micro-batches, from the reference as it stands
    5. sync       the reference takes from the policy, still *pre-update*, what it needs for later steps
                  (humanline: its weights or log-probs every k steps; taking 4 before 5 makes them lag 1..k steps)
    6. loss       policy log-probs -> log-ratio -> humanline transform (clip / reject) -> objective loss,
                  backward per micro-batch (gradient accumulation), gradient-norm clipping
    7. step       optimizer and LR schedule step, unless the loss or gradient is non-finite (then skipped)
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch

from humanline.devices.collectives import clip_grad_norm, mean_across_processes, reduce_sum
from humanline.devices.out_of_memory import raise_if_out_of_memory
from humanline.errors import Stopped, UserError
from humanline.model.forward import part_logps
from humanline.sampling.draw import draw, short_lines
from humanline.settings.config import Config
from humanline.training.async_sampling import AsyncSampling
from humanline.training.build import build_run
from humanline.training.checkpoint import final_saved_after, newest_step, resume_run, save_final_model
from humanline.training.counters import Counters
from humanline.training.faults import (
    StopEvaluation,
    StopSignals,
    check_alive,
    skip_non_finite,
    stop_at_once,
    stopped_line,
)
from humanline.training.held_out import evaluate_run
from humanline.training.objective_table import loss_input, past_staleness_bound
from humanline.training.resume_settings import record_start, start_segment
from humanline.training.run_dir import release_folder
from humanline.training.run_info import record_run_info
from humanline.training.schedule import FILLER
from humanline.training.start_up import removed_if_unstarted


class Trainer:
    """Runs the loop over the parts `build_run` assembles. Build with `Trainer(cfg)` (or call `train(cfg)`).

    resume: continue from the newest complete checkpoint in `train.output_dir`; overwrite: remove the run that
    folder holds and start again. Without either, a folder holding a run is refused (`humanline.training.run_dir`).
    """

    @removed_if_unstarted  # a run that fails before its first step leaves no folder behind
    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False):
        self.cfg = cfg
        out = Path(cfg.train.output_dir)
        try:
            with stop_at_once():  # a signal now: nothing trained, nothing to save (the guard clears the folder)
                self._start(cfg, out, resume=resume, overwrite=overwrite)
        except Stopped as stop:
            resumed = resume and not overwrite
            raise Stopped(stop.signum, stopped_line(stop.signum, out, started=resumed, checkpoint=newest_step(
                out / "checkpoints"), during="while the run was being set up")) from None

    def _start(self, cfg: Config, out: Path, *, resume: bool, overwrite: bool) -> None:
        # --resume continues the run's own settings and inputs: a change other than `RESUMABLE`'s is refused before
        # anything is built or written (`humanline.training.resume_settings`)
        segment = start_segment(cfg, out, resume=resume and not overwrite)
        recorded = segment.recorded
        self.run = run = build_run(cfg, resume=resume, overwrite=overwrite,
                                   first=recorded.first if recorded is not None else None)
        # the run's parts, as the loop (and the tests and benchmarks that step through it) name them
        self.accelerator, self.spec, self.humanline = run.accelerator, run.spec, run.humanline
        self.reference, self.eval_set = run.reference, run.eval_set
        self.checkpoints, self.logger = run.checkpoints, run.logger
        self.counters, self.signals = Counters(), StopSignals()
        self._reduce_sum = partial(reduce_sum, self.accelerator)
        self.run_info: dict | None = None  # `run_info.json`, written after the first step
        self.stopped_by: int | None = None  # the signal that stopped `train()` early (after saving), else None
        self.resumed = resume
        self.step = resume_run(self.checkpoints, self._parts(), self.counters, self.logger,
                               run.max_steps) if resume else 0
        # a resumed run at its end whose final model is saved after its last checkpoint: not saved again; with its
        # final evaluation logged too (or none to run), the run is finished and this segment does nothing
        self.final_saved = resume and self.step >= run.max_steps and final_saved_after(out, self.step)
        self.finished = self.final_saved and (self.logger.has_eval(self.step) or not self._has_evaluation())
        # train.async_sampling: a sampler process draws the stale queue's batches (started at the first step)
        self.async_sampling = AsyncSampling(cfg, run) if cfg.train.async_sampling and not self.finished else None
        self.eval_set.ensure_initial(run.model)  # the initial policy is the fixed ruler for eval metrics
        if not self.finished:  # last: a run stopped while being set up has no segment on record
            record_start(segment, cfg, out, self.step, self.logger, self.accelerator.is_main_process)

    def _has_evaluation(self) -> bool:
        return bool(self.eval_set.batches or self.run.eval_prompts)

    # ------------------------------------------------------------------ loop

    @removed_if_unstarted
    def train(self) -> dict:
        """Run to `max_steps`; checkpoint, evaluate and log on the way; at the end a checkpoint, the final model,
        then the final evaluation. Returns the last metrics.

        SIGTERM / SIGINT: during a step, a checkpoint of that step once it is done, then an early return
        (`stopped_by`); during an evaluation, the evaluation is dropped at once (its checkpoint, and at the end the
        final model, are already saved) and a resumed run evaluates first."""
        cfg, max_steps = self.cfg.train, self.run.max_steps
        last: dict = {}
        with self.signals:
            try:
                if self.finished:  # nothing to train, save or evaluate (`humanline train` says so)
                    return last
                if 0 < self.step < max_steps and self._eval_due(self.step) and not self._evaluate(last):
                    return self._stop(last)  # resumed where an evaluation was due and not logged
                while self.step < max_steps:
                    last = self.train_step()
                    if cfg.save_every and self.step % cfg.save_every == 0 and self.step < max_steps:
                        self.save_checkpoint()
                    if self.step < max_steps and self._eval_due(self.step) and not self._evaluate(last):
                        return self._stop(last)
                    if self.signals.received is not None and self.step < max_steps:
                        return self._stop(last)
                self.save_checkpoint()
                if not self.final_saved:
                    self.save_final()
                if not self._evaluate(last):
                    return self._stop(last)
            except Stopped as stop:  # a second signal: the step it came in is not saved; say what is
                raise Stopped(stop.signum, stopped_line(
                    stop.signum, self.cfg.train.output_dir, started=self.resumed or self.step > 0,
                    checkpoint=newest_step(self.checkpoints.root),
                    during=f"a second time, after step {self.step}" if self.step else "a second time")
                ) from None
            except Exception as exc:  # an allocation failure: one line, and no checkpoint of the interrupted step
                raise_if_out_of_memory(exc, self.cfg, f"at step {self.step + 1}", self.checkpoints.complete())
                raise
            finally:
                self.close_sampler()
                self.logger.close()
                release_folder(Path(self.cfg.train.output_dir))  # the next run into the folder may start
        return last

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and step % every == 0

    def _evaluate(self, last: dict) -> bool:
        """Evaluate now and log it into `last` and the metrics log, unless this step's evaluation is logged
        already (a resumed run). False: a stop signal dropped it."""
        if self.logger.has_eval(self.step):
            return True
        try:
            with self.signals.abortable():
                metrics = self.evaluate()
        except StopEvaluation:
            self.logger.info(f"signal {self.signals.received}: the evaluation at step {self.step} is dropped (a "
                             f"resumed run runs it)")
            return False
        if metrics:
            self.logger.log(self.step, metrics)
        last.update(metrics)
        return True

    def _stop(self, last: dict) -> dict:
        """Stop early on a signal: a checkpoint of this step (a no-op if it is saved), then return."""
        self.save_checkpoint()
        self.stopped_by = self.signals.received
        self.logger.info(f"signal {self.stopped_by}: checkpoint saved at step {self.step}, stopping")
        return last

    def train_step(self) -> dict:
        """One optimizer step at `self.step` (then advanced), in the method's order; returns its logged metrics."""
        step, t_start, cpu_start = self.step, time.perf_counter(), time.process_time()
        stats = self._sample(step)  # 1-3. sample, score, units (online / sparse / stale, when a buffer is due)
        micro_batches, staleness = self.run.schedule(step), self._staleness(step, stats)
        t_train = time.perf_counter()
        synced = self.humanline.begin_step(step, self._reduce_sum)  # a humanline sync step? (module doc)
        refs = self._reference_logps(step, micro_batches)  # 4. reference (and the sampler's) log-probs
        self._capture_pre_update(step)  # 5. sync, also on a step with nothing to train on
        too_old = past_staleness_bound(self.cfg.objective, staleness)  # drop: every sample of the step is too old
        micro_batches = [] if too_old else micro_batches
        window = None  # the humanline metric sums, read back with the step's own metrics
        if micro_batches:
            metrics, finite = self._loss_and_backward(step, micro_batches, refs, staleness)  # 6. loss
            metrics, window = self._update(step, micro_batches, metrics, finite, t_train)  # 7. step
        else:
            metrics = self.counters.nothing_to_train(step, self.logger, staleness if too_old else None)
        # every process: the drift hand-over to a drift rule, then the token-weighted metrics of the window
        window = self.humanline.end_step(step, self._reduce_sum, sums=window)
        metrics.update(self.humanline.metrics(step, self._reduce_sum, sums=window))
        return self._log(step, {**metrics, **stats, "synced": float(synced)}, t_start, cpu_start)

    def _staleness(self, step: int, stats: dict) -> int:
        """Versions between the sampler of step `step`'s batch and the step (0 online and offline); logged."""
        if self.run.sampler is None:
            return 0
        stats["staleness"] = float(self.run.schedule.staleness_of(step))
        return self.run.schedule.staleness_of(step)

    def _reference_logps(self, step: int, micro_batches: list[dict]) -> list[dict]:
        """The reference's log-probs of each micro-batch, and the sampler's (`"behaviour"`) where a correction
        reads them."""
        refs = [self.reference.logps(step, i, mb) for i, mb in enumerate(micro_batches)]
        behaviour = self.run.behaviour
        for i, (mb, ref) in enumerate(zip(micro_batches, refs) if behaviour is not None else ()):
            ref["behaviour"] = ref["main"] if behaviour is self.reference else behaviour.logps(step, i, mb)["main"]
        return refs

    def _capture_pre_update(self, step: int) -> None:
        """The reference takes from the policy, still pre-update, what it needs for later steps (a sampler
        reference scores its buffer's later steps; humanline's sync schedule must not lose a beat); so does a
        behaviour source for the batches sampled at this step."""
        self.reference.capture_pre_update(step)
        if self.run.behaviour is not None and self.run.behaviour is not self.reference:
            self.run.behaviour.capture_pre_update(step)

    def _log(self, step: int, metrics: dict, t_start: float, cpu_start: float) -> dict:
        """Add the run's counts and costs to the step's metrics, advance the step, log; returns what was logged."""
        totals = self.counters.totals
        metrics.update({"time/step": time.perf_counter() - t_start,
                        "samples_generated": float(totals["samples_generated"]),
                        "skipped_steps": float(totals["skipped_steps"])})
        totals["cost/cpu_seconds"] += time.process_time() - cpu_start
        metrics.update(self.counters.costs())
        self.step += 1
        logged = self.logger.log(step + 1, metrics)
        if self.run_info is None:  # after the first step: the forward path is known then
            self.run_info = record_run_info(self.run.model, self.run.unwrapped, self.accelerator, self.reference.name,
                                            self.cfg.train.output_dir, self.logger)
        return logged

    def _sample(self, step: int) -> dict:
        """Online / sparse / stale, when a buffer is due (`SampleBuffer.request`): prompts, completions from the
        current policy, rewards, units, into the buffer for the steps they serve. Returns the stats."""
        sampler, buffer = self.run.sampler, self.run.schedule
        if self.async_sampling is not None:  # asked for, and this step's batch awaited, in the sampler process
            return self._taken(self.async_sampling.before_step(step, self.run.model))
        request = buffer.request(step) if sampler is not None else None
        if request is None:
            return {}
        first, span = request
        drawn = draw(sampler, self.run.model, self.spec.units_from_group, self.cfg.data, at=step, first=first,
                     span=span, fill=buffer.layout.per_step, redraws=self.cfg.rollout.redraws)  # 1-3
        buffer.fill(step, first, drawn.units)
        for line in short_lines(drawn.short, buffer.layout.per_step, self.cfg.rollout.redraws):
            self.logger.warn(line)
        self.counters.count_sampled(drawn.stats)
        return drawn.stats

    def _taken(self, results: list[dict]) -> dict:
        """Count each result the sampler process sent; the step logs the last one's stats (`async/*` included)."""
        stats: dict = {}
        for result in results:
            self.counters.count_sampled(result)
            stats.update(result)
        return stats

    def close_sampler(self) -> None:
        """Stop the sampler process of `train.async_sampling` (`train()` does; callers of `train_step` do)."""
        if self.async_sampling is not None:
            self.async_sampling.close()

    def _loss_and_backward(self, step: int, micro_batches: list[dict], refs: list[dict],
                           staleness: int = 0) -> tuple[dict, torch.Tensor]:
        """Loss and backward of every micro-batch (gradients accumulate; DDP syncs on the last one). A filler
        micro-batch (`schedule.FILLER`: it only keeps processes in step) runs with weight 0 and is not logged.
        Returns the metrics averaged over micro-batches and whether every loss was finite, both still on the
        device."""
        metrics: dict[str, torch.Tensor] = {}
        finite = torch.ones((), dtype=torch.bool, device=self.accelerator.device)
        n = max(sum(not batch.get(FILLER) for batch in micro_batches), 1)
        for i, (batch, ref) in enumerate(zip(micro_batches, refs)):
            last = i == len(micro_batches) - 1
            with nullcontext() if last else self.accelerator.no_sync(self.run.model):
                out, extra = self.micro_batch_loss(step, i, batch, ref, staleness)  # forward -> transform -> loss
                if batch.get(FILLER):
                    self.accelerator.backward(out.loss * 0.0)
                    continue
                finite = finite & torch.isfinite(out.loss.detach())
                self.accelerator.backward(out.loss / n)
            _accumulate(metrics, {**out.metrics, **extra, "loss": out.loss.detach()}, n)
        return metrics, finite

    def _update(self, step: int, micro_batches: list[dict], metrics: dict, finite: torch.Tensor,
                t_train: float) -> tuple[dict, list[float] | None]:
        """Clip the gradient norm; read the step's metrics, its finiteness, the norm and humanline's window
        back in one transfer (the step's only host read); then the optimizer and LR-schedule step (skipped when
        non-finite). Returns the logged metrics and humanline's window sums (None: humanline is off)."""
        grad_norm = clip_grad_norm(self.run.model, self.accelerator, self.cfg.optim.max_grad_norm)
        window = self.humanline.window_sums(self._reduce_sum)
        host = read_back({**metrics, "finite": finite, "grad_norm": grad_norm,
                          **({"humanline": window} if window is not None else {})})
        grad_norm, window = host.pop("grad_norm"), host.pop("humanline", None)
        if host.pop("finite") and math.isfinite(grad_norm):
            self.run.optimizer.step()
            self.run.lr_scheduler.step()
            self.counters.bad_streak = 0
            check_alive(self.counters, self.cfg, step, grad_norm)
        else:
            skip_non_finite(self.counters, self.cfg, step, micro_batches, self.logger)
        self.run.optimizer.zero_grad(set_to_none=True)
        tokens = self.counters.count_trained(micro_batches)
        elapsed = time.perf_counter() - t_train
        metrics = mean_across_processes(self.accelerator, host)
        metrics.update({"grad_norm": grad_norm, "lr": self.run.lr_scheduler.get_last_lr()[0],
                        "tokens_per_s": tokens / max(elapsed, 1e-9), "time/train": elapsed})
        return metrics, window

    def micro_batch_loss(self, step: int, index: int, batch: dict, ref: dict, staleness: int = 0) -> tuple:
        """Policy forward, log-ratio, humanline transform, objective. Returns (LossOutput, extra metrics)."""
        x = loss_input(self.spec, batch, lambda part: part_logps(self.run.model, batch, part), ref,
                       transform=lambda raw, mask, part: self.humanline.apply(raw, mask, step=step, index=index,
                                                                              part=part),
                       reduce_sum=self._reduce_sum, humanline=self.humanline.on,
                       staleness=staleness)  # counted, observed by an auto band
        raw, mask = x.raw_log_ratio, x.mask
        out = self.spec.loss(x, self.cfg.objective)
        n_tokens = mask.sum().clamp(min=1)
        extra = {"log_ratio/mean": (raw.detach() * mask).sum() / n_tokens,
                 "log_ratio/abs_mean": (raw.detach().abs() * mask).sum() / n_tokens}  # the reference's drift
        return out, extra

    # ------------------------------------------------------------------ evaluation and saving

    def evaluate(self) -> dict:
        """Held-out objective and generation metrics of the policy now (`held_out.evaluate_run`)."""
        return evaluate_run(self.run, self.cfg)

    def save_checkpoint(self) -> None:
        if self.async_sampling is not None:  # every batch asked for joins the queue the checkpoint holds
            self._taken(self.async_sampling.flush(self.step))
        self.checkpoints.save(self.step, self.counters.state(self.step), self._parts(), self.logger)

    def _parts(self) -> dict:
        # "band": the humanline object's state is its band's (the key older checkpoints hold it under)
        parts = {"reference": self.reference, "schedule": self.run.schedule, "eval": self.eval_set,
                 "band": self.humanline}
        if self.run.behaviour is not None and self.run.behaviour is not self.reference:
            parts["behaviour"] = self.run.behaviour  # the behaviour log-probs of batches sampled ahead
        return parts

    def save_final(self) -> Path:
        """Save the policy and tokenizer with `save_pretrained` into `output_dir/final` (LoRA merged)."""
        return save_final_model(self.accelerator, self.run.model, self.run.tokenizer,
                                Path(self.cfg.train.output_dir) / "final")


def _accumulate(total: dict, metrics: dict, n: int) -> None:
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


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Build a `Trainer` for `cfg` and run it (resume / overwrite as for `Trainer`)."""
    if not cfg.train.output_dir:
        raise UserError("config field 'train.output_dir': expected a folder")
    return Trainer(cfg, resume=resume, overwrite=overwrite).train()
