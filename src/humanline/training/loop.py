"""The one training loop: every objective, every regime, with or without humanline.

One optimizer step `s` (`Trainer.train_step`; each stage a function of `training.step`), in the order that *is*
the method (docs/method.md §3.2):

    1-3. sample   online / sparse / stale, when a buffer is due: prompts -> completions of the current policy ->
                  rewards -> the objective's units, buffered for the steps they serve (`sampling.draw`;
                  `train.async_sampling`: drawn by a sampler process while earlier steps train)
    4. reference  reference log-probs of all this step's micro-batches, from the reference as it stands
    5. sync       the reference takes from the policy, still *pre-update*, what it needs for later steps
                  (humanline: its weights or log-probs every k steps; taking 4 before 5 makes them lag 1..k steps)
    6. loss       policy log-probs -> log-ratio -> humanline transform (clip / reject) -> objective loss,
                  backward per micro-batch (gradient accumulation), gradient-norm clipping
    7. step       optimizer and LR schedule step, unless the loss or gradient is non-finite (then skipped)
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from humanline.devices.collectives import reduce_sum
from humanline.devices.out_of_memory import raise_if_out_of_memory
from humanline.errors import Stopped, UserError
from humanline.settings.config import Config
from humanline.training.async_sampling import AsyncSampling
from humanline.training.build import build_run
from humanline.training.checkpoint import final_saved_after, newest_step, resume_run, save_final_model
from humanline.training.collapse_watch import WeightSample, end_of_run
from humanline.training.counters import Counters
from humanline.training.faults import StopEvaluation, StopSignals, stop_at_once, stopped_line
from humanline.training.held_out import evaluate_run
from humanline.training.objective_table import past_staleness_bound
from humanline.training.resume_settings import record_start, start_segment
from humanline.training.run_dir import release_folder
from humanline.training.run_info import record_run_info
from humanline.training.start_up import removed_if_unstarted
from humanline.training.step import (
    StepContext,
    capture_pre_update,
    loss_and_backward,
    reference_logps,
    sample,
    sampled_staleness,
    update,
)


class Trainer:
    """Runs the loop over the parts `build_run` assembles. Build with `Trainer(cfg)` (or call `train(cfg)`).

    resume: continue from the newest complete checkpoint in `train.output_dir`; overwrite: remove the run that
    folder holds and start again. Without either, a folder holding a run is refused (`humanline.training.run_dir`).
    trust_inputs: resume a run that has no `inputs.json` (its inputs taken as they are now, then recorded).
    """

    @removed_if_unstarted  # a run that fails before its first step leaves no folder behind
    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False, trust_inputs: bool = False):
        self.cfg = cfg
        out = Path(cfg.train.output_dir)
        self._trust_inputs = trust_inputs
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
        segment = start_segment(cfg, out, resume=resume and not overwrite, trust_inputs=self._trust_inputs)
        first = segment.recorded.first if segment.recorded is not None else None
        self.run = run = build_run(cfg, resume=resume, overwrite=overwrite, first=first)
        # the run's parts are reached as `self.run.<part>`; the Trainer holds what changes from step to step
        self.counters, self.signals = Counters(), StopSignals()
        self._reduce_sum = partial(reduce_sum, run.accelerator)
        self.run_info: dict | None = None  # `run_info.json`, written after the first step
        self.stopped_by: int | None = None  # the signal that stopped `train()` early (after saving), else None
        self.collapse: list[str] = []  # why the finished run's policy stopped learning (`collapse_watch`), if it did
        self.resumed = resume
        self.step = 0 if not resume else resume_run(run.checkpoints, self._parts(), self.counters, run.logger,
                                                    run.max_steps)
        # a resumed run at its end whose final model is saved after its last checkpoint: not saved again; with its
        # final evaluation logged too (or none to run), the run is finished and this segment does nothing
        self.final_saved = resume and self.step >= run.max_steps and final_saved_after(out, self.step)
        has_evaluation = bool(run.eval_set.batches or run.eval_prompts)
        self.finished = self.final_saved and (run.logger.has_eval(self.step) or not has_evaluation)
        # train.async_sampling: a sampler process draws the stale queue's batches (started at the first step)
        self.async_sampling = AsyncSampling(cfg, run) if cfg.train.async_sampling and not self.finished else None
        run.eval_set.ensure_initial(run.model)  # the initial policy is the fixed ruler for eval metrics
        if not self.finished:  # last: a run stopped while being set up has no segment on record
            record_start(segment, cfg, out, self.step, run.logger, run.accelerator.is_main_process)

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
                weights = WeightSample(self)  # did the policy stop learning? (`collapse_watch`, at the end)
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
                self.collapse = end_of_run(self, weights)
            except Stopped as stop:  # a second signal: the step it came in is not saved; say what is
                raise Stopped(stop.signum, stopped_line(
                    stop.signum, self.cfg.train.output_dir, started=self.resumed or self.step > 0,
                    checkpoint=newest_step(self.run.checkpoints.root),
                    during=f"a second time, after step {self.step}" if self.step else "a second time")
                ) from None
            except Exception as exc:  # an allocation failure: one line, and no checkpoint of the interrupted step
                raise_if_out_of_memory(exc, self.cfg, f"at step {self.step + 1}", self.run.checkpoints.complete())
                raise
            finally:
                self.close_sampler()
                self.run.logger.close()
                release_folder(Path(self.cfg.train.output_dir))  # the next run into the folder may start
        return last

    def _eval_due(self, step: int) -> bool:
        every = self.cfg.train.eval_every
        return bool(every) and step % every == 0

    def _evaluate(self, last: dict) -> bool:
        """Evaluate now and log it into `last` and the metrics log, unless this step's evaluation is logged
        already (a resumed run). False: a stop signal dropped it."""
        if self.run.logger.has_eval(self.step):
            return True
        try:
            with self.signals.abortable():
                metrics = self.evaluate()
        except StopEvaluation:
            self.run.logger.info(f"signal {self.signals.received}: the evaluation at step {self.step} is dropped "
                                 f"(a resumed run runs it)")
            return False
        if metrics:
            self.run.logger.log(self.step, metrics)
        last.update(metrics)
        return True

    def _stop(self, last: dict) -> dict:
        """Stop early on a signal: a checkpoint of this step (a no-op if it is saved), then return."""
        self.save_checkpoint()
        self.stopped_by = self.signals.received
        self.run.logger.info(f"signal {self.stopped_by}: checkpoint saved at step {self.step}, stopping")
        return last

    def train_step(self) -> dict:
        """One optimizer step at `self.step` (then advanced), in the method's order; returns its logged metrics."""
        run, step, t_start, cpu_start = self.run, self.step, time.perf_counter(), time.process_time()
        ctx = self.context(step)
        stats = self._sample(ctx)  # 1-3. sample, score, units (online / sparse / stale, when a buffer is due)
        micro_batches, staleness = run.schedule(step), sampled_staleness(ctx)
        if staleness is not None:  # sampled regimes: each step logs how old its samples are
            stats["staleness"] = float(staleness)
        t_train = time.perf_counter()
        synced = run.humanline.begin_step(step, self._reduce_sum)  # a humanline sync step? (module doc)
        refs = reference_logps(ctx, micro_batches)  # 4. reference (and the sampler's) log-probs
        capture_pre_update(ctx)  # 5. sync, also on a step with nothing to train on
        too_old = past_staleness_bound(self.cfg.objective, staleness or 0)  # drop: every sample of the step is too old
        window = None  # the humanline metric sums, read back with the step's own metrics
        if micro_batches and not too_old:
            metrics, finite = loss_and_backward(ctx, micro_batches, refs, staleness or 0)  # 6. loss
            metrics, window = update(ctx, micro_batches, metrics, finite, t_train)  # 7. step
        else:
            metrics = self.counters.nothing_to_train(step, run.logger, staleness if too_old else None)
        # every process: the drift hand-over to a drift rule, then the token-weighted metrics of the window
        window = run.humanline.end_step(step, self._reduce_sum, sums=window)
        metrics.update(run.humanline.metrics(step, self._reduce_sum, sums=window))
        return self._log(step, {**metrics, **stats, "synced": float(synced)}, t_start, cpu_start)

    def context(self, step: int) -> StepContext:
        """What the stages of step `step` read (`training.step`)."""
        return StepContext(self.run, self.cfg, self.counters, step, self._reduce_sum)

    def _sample(self, ctx: StepContext) -> dict:
        """1-3, here or (`train.async_sampling`) asked of the sampler process, which drew it meanwhile."""
        if self.async_sampling is None:
            return sample(ctx)
        return self._taken(self.async_sampling.before_step(ctx.step, self.run.model))

    def _taken(self, results: list[dict]) -> dict:
        """Count each result the sampler process sent; the step logs the last one's stats (`async/*` included)."""
        stats: dict = {}
        for result in results:
            self.counters.count_sampled(result)
            stats.update(result)
        return stats

    def _log(self, step: int, metrics: dict, t_start: float, cpu_start: float) -> dict:
        """Add the run's counts and costs to the step's metrics, advance the step, log; returns what was logged."""
        totals = self.counters.totals
        metrics.update({"time/step": time.perf_counter() - t_start,
                        "samples_generated": float(totals["samples_generated"]),
                        "skipped_steps": float(totals["skipped_steps"])})
        totals["cost/cpu_seconds"] += time.process_time() - cpu_start
        metrics.update(self.counters.costs())
        self.step += 1
        logged = self.run.logger.log(step + 1, metrics)
        if self.run_info is None:  # after the first step: the forward path is known then
            self.run_info = record_run_info(self.run.model, self.run.unwrapped, self.run.accelerator,
                                            self.run.reference.name, self.cfg.train.output_dir, self.run.logger)
        return logged

    def close_sampler(self) -> None:
        """Stop the sampler process of `train.async_sampling` and free the sampler's engine (`train()` does; callers
        of `train_step` do)."""
        if self.async_sampling is not None:
            self.async_sampling.close()
        if self.run.sampler is not None:
            self.run.sampler.close()

    # ------------------------------------------------------------------ evaluation and saving

    def evaluate(self) -> dict:
        """Held-out objective and generation metrics of the policy now (`held_out.evaluate_run`)."""
        return evaluate_run(self.run, self.cfg)

    def save_checkpoint(self) -> None:
        if self.async_sampling is not None:  # every batch asked for joins the queue the checkpoint holds
            self._taken(self.async_sampling.flush(self.step))
        self.run.checkpoints.save(self.step, self.counters.state(self.step), self._parts(), self.run.logger)

    def _parts(self) -> dict:
        """The run's parts a checkpoint holds besides the weights and the optimizer ("band": the humanline
        object's state is its band's, the key older checkpoints hold it under)."""
        run = self.run
        return {"reference": run.reference, "schedule": run.schedule, "eval": run.eval_set, "band": run.humanline}

    def save_final(self) -> Path:
        """Save the policy and tokenizer with `save_pretrained` into `output_dir/final` (LoRA merged)."""
        return save_final_model(self.run.accelerator, self.run.model, self.run.tokenizer,
                                Path(self.cfg.train.output_dir) / "final")


def train(cfg: Config, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Build a `Trainer` for `cfg` and run it (resume / overwrite as for `Trainer`)."""
    if not cfg.train.output_dir:
        raise UserError("config field 'train.output_dir': expected a folder")
    return Trainer(cfg, resume=resume, overwrite=overwrite).train()
