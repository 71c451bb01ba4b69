"""Evaluation during training (`Trainer.evaluate` -> `evaluate_run`).

- Held-out objective metrics: the plain objective (no humanline transform) on the eval units, against the
  *initial* policy as reference, whatever the training reference is. The lookahead and synced references
  move, so a fixed ruler is what makes these numbers comparable across steps and across regimes.
- Generation metrics: when `eval.prompts` is set, sample from the policy on held-out prompts and score them
  with `eval.reward` (default: `rollout.reward`) through `humanline.evaluation.generations`.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from humanline.data.collate import to_device
from humanline.devices.fsdp import full_weights
from humanline.evaluation.generations import evaluate_generations, is_verifiable
from humanline.model.forward import batch_logps_no_grad
from humanline.sampling.rollout import GenerationConfig
from humanline.settings.config import Config, ObjectiveConfig
from humanline.training.objective_table import ObjectiveSpec, loss_input


class EvalSet:
    """Eval micro-batches and their log-probs under the initial policy (computed once, kept in checkpoints)."""

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.initial: list[dict] | None = None

    def ensure_initial(self, model) -> None:
        if self.initial is None:
            self.initial = [batch_logps_no_grad(model, b) for b in self.batches]

    def state_dict(self) -> dict:
        return {"initial": [{k: v.cpu() for k, v in d.items()} for d in self.initial or []]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("initial"):
            self.initial = state["initial"]


def make_eval_set(units: list[dict], collate: Callable, pad_id: int, size: int, device: torch.device) -> EvalSet:
    """Eval units collated `size` at a time (the training micro-batch size), on `device`."""
    batches = [collate(units[i: i + size], pad_id) for i in range(0, len(units), size)]
    return EvalSet([to_device(b, device) for b in batches])


@torch.no_grad()
def objective_metrics(model, eval_set: EvalSet, spec: ObjectiveSpec, cfg: ObjectiveConfig) -> dict:
    """`eval/<metric>`: the objective's loss and metrics on the eval set, against the initial policy."""
    if not eval_set.batches:
        return {}
    eval_set.ensure_initial(model)
    totals: dict[str, float] = {}
    for batch, initial in zip(eval_set.batches, eval_set.initial):
        device = batch["input_ids"].device
        initial = {k: v.to(device) for k, v in initial.items()}
        logps = batch_logps_no_grad(model, batch)
        out = spec.loss(loss_input(spec, batch, logps.__getitem__, initial), cfg)  # no transform: the plain objective
        for key, value in {"loss": out.loss, **out.metrics}.items():
            totals[f"eval/{key}"] = totals.get(f"eval/{key}", 0.0) + float(value) / len(eval_set.batches)
    return totals


def generation_metrics(model, tokenizer, prompts: list, reward, cfg: Config) -> dict:
    """`eval/reward_mean` (and `eval/pass@1` for a verifiable reward) of `eval.n` samples per held-out prompt.
    `reward` is the built `eval.reward` (or `rollout.reward`), resolved at start-up."""
    spec = cfg.eval.reward if cfg.eval.reward is not None else cfg.rollout.reward  # the spec `reward` was built from
    gen = GenerationConfig(max_new_tokens=cfg.eval.max_new_tokens, temperature=cfg.eval.temperature, n=cfg.eval.n,
                           seed=cfg.train.seed + 12345, stop=list(cfg.rollout.stop), decoder=cfg.rollout.decoder)
    result = evaluate_generations(model, tokenizer, prompts, reward, gen=gen, k=1, verifiable=is_verifiable(spec))
    out = {"eval/reward_mean": float(result["reward"]["mean"])}
    if "pass@1" in result:
        out["eval/pass@1"] = float(result["pass@1"])
        out["eval/pass@1_stderr"] = float(result["pass@1_stderr"])  # over prompts
    return out


def evaluate_run(run, cfg: Config) -> dict:
    """Held-out objective metrics (against the initial policy) and generation metrics, if configured, of the policy
    of `run` (a `build.Run`) as it is now; `eval/seconds` is this evaluation's wall-clock (runs are timed
    without it)."""
    start = time.perf_counter()
    metrics = objective_metrics(run.model, run.eval_set, run.spec, cfg.objective)
    if run.eval_prompts:  # FSDP: every rank gathers the whole policy; the main process samples from it
        with full_weights(run.unwrapped), run.accelerator.autocast():  # the training forward's precision
            if run.accelerator.is_main_process:
                metrics.update(generation_metrics(run.unwrapped, run.tokenizer, run.eval_prompts, run.eval_reward,
                                                  cfg))
    if metrics:
        metrics["eval/seconds"] = time.perf_counter() - start
    return metrics
