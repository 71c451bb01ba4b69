"""Online and sparse-online sampling: prompts -> completions from the current policy -> rewards -> units.

The trainer runs the three parts in order when a buffer is due (`training.loop.Trainer.train_step`):
`Sampler.generate` (sample), `Sampler.score` (score), `units_per_step` (units). Each process samples its own
prompts (so generation scales with processes); the prompt stream is a deterministic function of
(seed, step, process), so a resumed run samples the same prompts.
"""

from __future__ import annotations

import copy
import random
import sys
import time
from typing import Callable

import torch

from humanline.data.records import Unit
from humanline.devices.fsdp import full_weights
from humanline.devices.out_of_memory import is_out_of_memory
from humanline.devices.weights import copy_weights_
from humanline.errors import UserError
from humanline.sampling.reward_scoring import RewardContractError, score_completions
from humanline.sampling.rewards import build_reward
from humanline.sampling.rollout import GenerationConfig, generate
from humanline.settings.config import Config, DataConfig


def prompt_stream(n_pool: int, seed: int, start: int, count: int, draw: int = 0) -> list[int]:
    """Indices `start .. start+count-1` of an endless stream of epoch-wise permutations of the pool. `draw` > 0:
    another stream of the same kind (a step's redraws, `sampling.draw`), independent of the first."""
    out = []
    perms: dict[int, list[int]] = {}
    for idx in range(start, start + count):
        epoch, pos = divmod(idx, n_pool)
        if epoch not in perms:
            order = list(range(n_pool))
            random.Random(seed * 7919 + epoch if not draw else f"{seed}:{epoch}:redraw{draw}").shuffle(order)
            perms[epoch] = order
        out.append(perms[epoch][pos])
    return out


def _warn(message: str) -> None:
    print(f"[humanline] warning: {message}", file=sys.stderr, flush=True)


class Sampler:
    """Samples prompts' completions from the current policy and scores them (`rollout.*` settings)."""

    def __init__(self, cfg: Config, tokenizer, accelerator, reward_fn, pool: list):
        if not pool:
            raise UserError(f"rollout.prompts: '{cfg.rollout.prompts}' holds no prompts")
        self.cfg, self.r, self.tokenizer, self.accelerator = cfg, cfg.rollout, tokenizer, accelerator
        self.reward_fn, self.pool = reward_fn, pool
        self._rounded: torch.nn.Module | None = None  # rollout.dtype=bfloat16: the policy's bf16 copy

    def sampling_model(self, model) -> torch.nn.Module:
        """The model to sample from: the policy itself, or (`rollout.dtype: bfloat16`) its bfloat16 copy with
        the policy's current weights copied in (made once, refreshed at every call)."""
        policy = self.accelerator.unwrap_model(model)
        if self.r.dtype == "policy":
            return policy
        if self._rounded is None:  # parameters rounded; buffers (rotary frequencies) stay as they are
            self._rounded = copy.deepcopy(policy).eval().requires_grad_(False)
            for weights in self._rounded.parameters():
                weights.data = weights.data.to(torch.bfloat16)
        else:
            copy_weights_(self._rounded, policy)
        return self._rounded

    def prompts(self, steps: list[int], draw: int = 0) -> list:
        """This process's prompt records for `steps`, step-major; `draw` > 0: those of a step's redraw number
        `draw` (other prompts, from a stream of their own)."""
        per, procs, rank = self.r.prompts_per_step, self.accelerator.num_processes, self.accelerator.process_index
        return [self.pool[j] for step in steps
                for j in prompt_stream(len(self.pool), self.cfg.train.seed, (step * procs + rank) * per, per, draw)]

    def generate(self, step: int, records: list, model, draw: int = 0) -> tuple[object | None, dict]:
        """`(rollout, stats)`: `rollout.n` completions per prompt from `model` as it is now (None when
        generation failed and `rollout.on_error=skip`). `step` and `draw` seed the draws."""
        r, rank = self.r, self.accelerator.process_index
        gen = GenerationConfig(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, n=r.n,
                               stop=list(r.stop), batch_size=r.batch_size, cache=r.cache, decoder=r.decoder,
                               seed=(self.cfg.train.seed * 1_000_003 + step) * 31 + rank + draw * (1 << 40))
        start = time.perf_counter()
        try:  # FSDP: every rank gathers the whole policy, samples its own prompts, then frees it again
            with full_weights(self.accelerator.unwrap_model(model)), self.accelerator.autocast():
                rollout = generate(self.sampling_model(model), self.tokenizer, [rec.prompt for rec in records], gen)
        except Exception as exc:  # rollout.on_error decides: stop (naming the prompts) or skip these steps
            if is_out_of_memory(exc):  # not a prompt's fault: skipping would skip every step; the trainer reports it
                raise
            ids = [str(rec.prompt_id) for rec in records]
            message = (f"generation failed at step {step + 1} for prompt ids {ids[:8]}"
                       f"{' ...' if len(ids) > 8 else ''}: {type(exc).__name__}: {exc}")
            if r.on_error == "fail":
                raise RuntimeError(message + " (rollout.on_error=skip skips such steps)") from exc
            last = step + len(records) // r.prompts_per_step
            _warn(f"{message}; skipping steps {step + 1}-{last} (rollout.on_error=skip)")
            return None, {"generation_failures": len(records), "dropped_groups": len(records)}
        return rollout, {"time/generation": time.perf_counter() - start,
                         "generation/tokens_per_s": rollout.tokens_per_s,
                         "samples": sum(len(c) for c in rollout.completion_ids),
                         "generated_tokens": rollout.num_generated_tokens}

    def score(self, step: int, records: list, rollout) -> tuple[list[Unit], dict]:
        """Scored groups `{"id", "prompt", "completions", "rewards"}` (token ids), one per prompt; completions
        without a reward (`rollout.on_error=skip`) or empty ones are left out of their group. No groups when
        generation failed (`rollout` None)."""
        if rollout is None:
            return [], {}
        n, start = self.r.n, time.perf_counter()
        flat = [rec for rec in records for _ in range(n)]
        metadata = {"answer": [rec.answer for rec in flat]}
        for key in sorted({k for rec in records for k in (rec.metadata or {})}):
            metadata[key] = [(rec.metadata or {}).get(key) for rec in flat]
        texts = [t for group in rollout.texts for t in group]
        try:  # prompts as given: reward models template them
            scored = score_completions(self.reward_fn, [rec.prompt for rec in flat], texts, metadata,
                                       [rec.prompt_id for rec in flat], on_error=self.r.on_error)
        except RewardContractError as exc:  # the reward's bug: no on_error setting helps
            raise UserError(f"{exc} (at step {step + 1})") from exc
        except UserError as exc:
            raise UserError(f"{exc} (at step {step + 1}; rollout.on_error=skip drops and counts such samples)") from exc
        if scored.failures:
            _warn(f"step {step + 1}: {len(scored.failures)} samples without a reward, dropped "
                  f"(rollout.on_error=skip); first: {scored.failures[0]}")
        groups = []
        for g, rec in enumerate(records):
            kept = [(ids, s) for ids, s in zip(rollout.completion_ids[g], scored.scores[g * n:(g + 1) * n])
                    if s is not None and ids]
            groups.append({"id": str(rec.prompt_id), "prompt": rollout.prompt_ids[g],
                           "completions": [ids for ids, _ in kept], "rewards": [s for _, s in kept]})
        rewards = [s for group in groups for s in group["rewards"]]
        return groups, {"time/reward": time.perf_counter() - start, "reward_failures": len(scored.failures),
                        "sample_reward": sum(rewards) / max(len(rewards), 1)}


def units_per_step(groups: list[Unit], units_from_group: Callable[[Unit, DataConfig], list[Unit]],
                   data: DataConfig, n_steps: int) -> tuple[list[list[Unit]], int]:
    """The objective's units of each of `n_steps` steps (groups are step-major, equally many per step), and
    how many groups gave no unit (no signal: equal rewards, a gap within the pair threshold, ...)."""
    per_step, dropped, size = [], 0, len(groups) // n_steps if n_steps else 0
    for i in range(n_steps):
        units = []
        for group in groups[i * size:(i + 1) * size]:
            made = units_from_group(group, data)
            dropped += not made
            units.extend(made)
        per_step.append(units)
    return per_step, dropped


def build_rewards(cfg: Config) -> dict:
    """`{"rollout": fn | None, "eval": fn | None}`: every reward spec of the config, built once.

    A spec is resolved even where this run would not call it (rollout.reward of an offline run, eval.reward
    without eval.prompts): a typo in a recipe is reported at start-up, not after the last training step.
    """
    rollout = _reward(cfg.rollout.reward, "rollout.reward") if cfg.rollout.reward is not None else None
    if cfg.eval.reward is None:
        return {"rollout": rollout, "eval": rollout}
    return {"rollout": rollout, "eval": _reward(cfg.eval.reward, "eval.reward")}


def _reward(spec, field_name: str):
    """`build_reward`, with every error naming the config field (some only name the spec they failed on)."""
    try:
        return build_reward(spec, field_name)
    except UserError as exc:
        if str(exc).startswith(field_name):
            raise
        raise UserError(f"config field '{field_name}': {exc}") from exc
