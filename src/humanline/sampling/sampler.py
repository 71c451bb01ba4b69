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

from humanline.data.collate import at_completions, pad_sequences, to_device
from humanline.data.records import Unit
from humanline.devices.fsdp import full_weights
from humanline.devices.out_of_memory import is_out_of_memory
from humanline.devices.weights import copy_weights_
from humanline.errors import UserError
from humanline.model.forward import batch_logps_no_grad
from humanline.sampling.reward_scoring import RewardContractError, score_completions
from humanline.sampling.reward_spec import build_reward
from humanline.sampling.rollout import GenerationConfig, generate
from humanline.sampling.vllm_engine import VLLMEngine, choose_engine
from humanline.settings.config import Config, DataConfig

MISMATCH_ROWS = 32  # completions per forward of the mismatch measurement


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
        # rollout.engine resolved: hf or vllm, and why (the run's first lines say it)
        self.engine, self.engine_why = choose_engine(cfg.rollout.engine, accelerator.device.type, samples=True)
        if self.engine == "vllm" and (accelerator.num_processes > 1 or getattr(accelerator, "is_fsdp2", False)):
            raise UserError("config field 'rollout.engine': vllm samples in one training process (its engine holds "
                            "the whole policy); launch one process, with train.async_sampling to sample beside the "
                            "trainer, or set rollout.engine: hf")
        self._vllm: VLLMEngine | None = None  # started at the first sampling

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

    def _load_engine(self, model, version: int) -> dict:
        """Start the vLLM engine (at the first sampling) and give it the policy's weights of `version` unless it
        holds them already; the sync's count and time, for the step's stats."""
        if self._vllm is None:
            dtype = str(next(self.accelerator.unwrap_model(model).parameters()).dtype).removeprefix("torch.")
            self._vllm = VLLMEngine(dtype="bfloat16" if self.r.dtype == "bfloat16" else dtype,
                                    seed=self.cfg.train.seed * 1_000 + self.accelerator.process_index,
                                    device=self.accelerator.device, gpu_memory=self.r.vllm_gpu_memory,
                                    kv_cache_gb=self.r.vllm_kv_cache_gb)
        started, start = self._vllm.llm is not None, time.perf_counter()
        synced = self._vllm.load(self.accelerator.unwrap_model(model), self.tokenizer, version)
        stats = {"engine/synced": float(synced),
                 "time/engine_sync": time.perf_counter() - start - (0 if started else self._vllm.start_seconds)}
        return stats if started else {**stats, "time/engine_start": self._vllm.start_seconds}

    def close(self) -> None:
        """Free what the sampler holds besides the policy (a vLLM engine)."""
        if self._vllm is not None:
            self._vllm.close()
            self._vllm = None

    def prompts(self, steps: list[int], draw: int = 0) -> list:
        """This process's prompt records for `steps`, step-major; `draw` > 0: those of a step's redraw number
        `draw` (other prompts, from a stream of their own)."""
        per, procs, rank = self.r.prompts_per_step, self.accelerator.num_processes, self.accelerator.process_index
        return [self.pool[j] for step in steps
                for j in prompt_stream(len(self.pool), self.cfg.train.seed, (step * procs + rank) * per, per, draw)]

    def generate(self, step: int, records: list, model, draw: int = 0, version: int | None = None
                 ) -> tuple[object | None, dict]:
        """`(rollout, stats)`: `rollout.n` completions per prompt from `model` as it is now (None when
        generation failed and `rollout.on_error=skip`). `step` and `draw` seed the draws; `version` (default
        `step`) names the policy's weights: a vLLM engine copies them in when it holds another version."""
        r, rank = self.r, self.accelerator.process_index
        gen = GenerationConfig(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, n=r.n,
                               stop=list(r.stop), batch_size=r.batch_size, cache=r.cache, decoder=r.decoder,
                               seed=(self.cfg.train.seed * 1_000_003 + step) * 31 + rank + draw * (1 << 40))
        # the engine's start and weight sync are no prompt's fault (and timed apart from the generation)
        synced = self._load_engine(model, step if version is None else version) if self.engine == "vllm" else {}
        start, prompts = time.perf_counter(), [rec.prompt for rec in records]
        try:  # FSDP: every rank gathers the whole policy, samples its own prompts, then frees it again
            if self.engine == "vllm":
                rollout = generate(self.accelerator.unwrap_model(model), self.tokenizer, prompts, gen,
                                   backend=self._vllm)
            else:
                with full_weights(self.accelerator.unwrap_model(model)), self.accelerator.autocast():
                    rollout = generate(self.sampling_model(model), self.tokenizer, prompts, gen)
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
        stats = {"time/generation": time.perf_counter() - start, "generation/tokens_per_s": rollout.tokens_per_s,
                 "samples": sum(len(c) for c in rollout.completion_ids),
                 "generated_tokens": rollout.num_generated_tokens, **synced}
        policy = self.accelerator.unwrap_model(model)  # as the references run it (its precision, no DDP hooks)
        return rollout, {**stats, **mismatch(policy, rollout, self.tokenizer.pad_token_id, self.accelerator.device)}

    def score(self, step: int, records: list, rollout) -> tuple[list[Unit], dict]:
        """Scored groups `{"id", "prompt", "completions", "rewards", "logps"}` (token ids; `logps`: each completion's
        tokens' log-probabilities as the engine drew them, `Rollout.logprobs`), one per prompt; completions
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
            logps = rollout.logprobs[g] if rollout.logprobs else [None] * n
            kept = [(ids, s, lp) for ids, s, lp in zip(rollout.completion_ids[g], scored.scores[g * n:(g + 1) * n],
                                                      logps) if s is not None and ids]
            group = {"id": str(rec.prompt_id), "prompt": rollout.prompt_ids[g],
                     "completions": [ids for ids, _, _ in kept], "rewards": [s for _, s, _ in kept]}
            if rollout.logprobs:  # the behaviour policy's log-probs of each completion's tokens (as drawn)
                group["logps"] = [lp for _, _, lp in kept]
            groups.append(group)
        rewards = [s for group in groups for s in group["rewards"]]
        return groups, {"time/reward": time.perf_counter() - start, "reward_failures": len(scored.failures),
                        "sample_reward": sum(rewards) / max(len(rewards), 1)}


def mismatch(model, rollout, pad_id: int, device, rows: int = MISMATCH_ROWS) -> dict:
    """The training-inference mismatch of a rollout (docs/usage.md, "Rollouts on vLLM"): over its sampled tokens,
    `|log pi_trainer - log mu|`, the trainer's log-probs (`model`'s forward as the loss computes them, in the
    trainer's precision, at temperature 1) against those the engine recorded as it drew each token (its weights
    and dtype, the temperature and top-p). `mismatch/mean` and `mismatch/max` over the tokens, and their count
    (`mismatch/tokens`). Measured where the sampler's weights are the trainer's of the same step (they are the
    pre-update weights), so it is 0 up to rounding for the hf engine at temperature 1, top-p 1 and the policy's
    dtype; a weight sync that failed shows here. Every process runs the same number of forwards (FSDP meets in
    them), `rows` completions at a time. Empty when the engine recorded nothing."""
    if not rollout.logprobs:
        return {}
    prompts = [p for p, group in zip(rollout.prompt_ids, rollout.completion_ids) for _ in group]
    completions = [c for group in rollout.completion_ids for c in group]
    recorded = [lp for group in rollout.logprobs for lp in group]
    total, worst, count = 0.0, 0.0, 0
    for i in range(0, len(completions), rows):
        batch = to_device(pad_sequences(prompts[i:i + rows], completions[i:i + rows], pad_id), device)
        mask = batch["completion_mask"][:, 1:]
        trainer = batch_logps_no_grad(model, batch)["main"]
        engine = at_completions(recorded[i:i + rows], batch["host"]["completion_mask"]).to(trainer.device)[:, 1:]
        gap = (trainer.float() - engine).abs()[mask]
        if gap.numel():
            total, worst, count = total + gap.sum().item(), max(worst, gap.max().item()), count + gap.numel()
    if not count:
        return {}
    return {"mismatch/mean": total / count, "mismatch/max": worst, "mismatch/tokens": float(count)}


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
