"""Online and sparse-online sampling: prompts -> completions from the current policy -> rewards -> units.

`build_sampler` returns the `sample(step, n_steps, model)` function a `BufferSchedule` calls when a buffer
is due. Each process samples its own prompts (so generation scales with processes); the prompt stream is a
deterministic function of (seed, step, process), so a resumed run samples the same prompts.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Callable

from humanline.config import Config
from humanline.errors import UserError

Unit = dict


def group_units(objective: str, group: Unit, *, pair_threshold: float) -> list[Unit]:
    """Turn one scored group `{"id", "prompt", "completions", "rewards"}` into the objective's units.

    grpo: the group itself; dpo: best vs worst when the reward gap exceeds `pair_threshold` (0.01, HALOs);
    kto: each completion, desirable when its reward is above the group mean. Degenerate groups (all rewards
    equal) carry no signal for any objective and give no unit.
    """
    rewards = group["rewards"]
    if len(rewards) < 2 or max(rewards) == min(rewards):
        return []
    if objective == "grpo":
        return [group]
    if objective == "dpo":
        best = max(range(len(rewards)), key=rewards.__getitem__)
        worst = min(range(len(rewards)), key=rewards.__getitem__)
        if rewards[best] - rewards[worst] <= pair_threshold:
            return []
        return [{"id": group["id"], "prompt": group["prompt"], "chosen": group["completions"][best],
                 "rejected": group["completions"][worst]}]
    mean = sum(rewards) / len(rewards)
    return [{"id": group["id"], "prompt": group["prompt"], "completion": c, "desirable": r > mean}
            for c, r in zip(group["completions"], rewards)]


def prompt_stream(n_pool: int, seed: int, start: int, count: int) -> list[int]:
    """Indices `start .. start+count-1` of an endless stream of epoch-wise permutations of the pool."""
    out = []
    perms: dict[int, list[int]] = {}
    for idx in range(start, start + count):
        epoch, pos = divmod(idx, n_pool)
        if epoch not in perms:
            order = list(range(n_pool))
            random.Random(seed * 7919 + epoch).shuffle(order)
            perms[epoch] = order
        out.append(perms[epoch][pos])
    return out


def _warn(message: str) -> None:
    print(f"[humanline] warning: {message}", file=sys.stderr, flush=True)


def build_sampler(cfg: Config, tokenizer, accelerator, reward_fn=None) -> Callable:
    """reward_fn: the built `rollout.reward` (built here from the config when None)."""
    from humanline.memory import is_out_of_memory
    from humanline.rewards import RewardContractError, build_reward, score_completions
    from humanline.rollout import GenerationConfig, generate
    from humanline.setup import load_named

    r = cfg.rollout
    pool = load_named("rollout.prompts", r.prompts, kind="prompts").records
    if not pool:
        raise UserError(f"rollout.prompts: '{r.prompts}' holds no prompts")
    reward_fn = reward_fn if reward_fn is not None else build_reward(r.reward, "rollout.reward")
    per_process = r.prompts_per_step
    procs, rank = accelerator.num_processes, accelerator.process_index

    def sample(step: int, n_steps: int, model) -> tuple[list[list[Unit]], dict]:
        per_step: list[list[Unit]] = []
        stats = {"samples": 0, "time/generation": 0.0, "time/reward": 0.0, "dropped_groups": 0, "sample_reward": 0.0}
        rewards_seen: list[float] = []
        chosen_all = []
        for i in range(n_steps):
            start = ((step + i) * procs + rank) * per_process
            chosen_all.append([pool[j] for j in prompt_stream(len(pool), cfg.train.seed, start, per_process)])
        records = [rec for chunk in chosen_all for rec in chunk]
        gen = GenerationConfig(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, n=r.n,
                               stop=list(r.stop), batch_size=r.batch_size, cache=r.cache,
                               seed=(cfg.train.seed * 1_000_003 + step) * 31 + rank)
        t0 = time.perf_counter()
        try:
            with accelerator.autocast():  # sample in the training forward's precision (bf16 on GPUs by default)
                rollout = generate(accelerator.unwrap_model(model), tokenizer, [rec.prompt for rec in records], gen)
        except Exception as exc:  # rollout.on_error decides: stop (naming the prompts) or skip these steps
            if is_out_of_memory(exc):  # not a prompt's fault: skipping would skip every step; the trainer reports it
                raise
            ids = [str(rec.prompt_id) for rec in records]
            message = (f"generation failed at step {step + 1} for prompt ids {ids[:8]}"
                       f"{' ...' if len(ids) > 8 else ''}: {type(exc).__name__}: {exc}")
            if r.on_error == "fail":
                raise RuntimeError(message + " (rollout.on_error=skip skips such steps)") from exc
            _warn(f"{message}; skipping steps {step + 1}-{step + n_steps} (rollout.on_error=skip)")
            stats.update(generation_failures=len(records), dropped_groups=len(records))
            return [[] for _ in range(n_steps)], stats
        t1 = time.perf_counter()
        flat_prompts = [rec.prompt for rec in records for _ in range(r.n)]  # as given: reward models template them
        flat_texts = [t for texts in rollout.texts for t in texts]
        flat_ids = [rec.prompt_id for rec in records for _ in range(r.n)]
        metadata = {"answer": [rec.answer for rec in records for _ in range(r.n)]}
        for key in sorted({k for rec in records for k in (rec.metadata or {})}):
            metadata[key] = [(rec.metadata or {}).get(key) for rec in records for _ in range(r.n)]
        try:
            scored = score_completions(reward_fn, flat_prompts, flat_texts, metadata, flat_ids, on_error=r.on_error)
        except RewardContractError as exc:  # the reward's bug: no on_error setting helps
            raise UserError(f"{exc} (at step {step + 1})") from exc
        except UserError as exc:
            raise UserError(f"{exc} (at step {step + 1}; rollout.on_error=skip drops and counts such samples)") from exc
        if scored.failures:
            _warn(f"step {step + 1}: {len(scored.failures)} samples without a reward, dropped "
                  f"(rollout.on_error=skip); first: {scored.failures[0]}")
        t2 = time.perf_counter()
        groups = []
        for g, rec in enumerate(records):
            pairs = [(ids, s) for ids, s in zip(rollout.completion_ids[g], scored.scores[g * r.n:(g + 1) * r.n])
                     if s is not None and ids]
            rewards_seen.extend(s for _, s in pairs)
            groups.append({"id": str(rec.prompt_id), "prompt": rollout.prompt_ids[g],
                           "completions": [ids for ids, _ in pairs], "rewards": [s for _, s in pairs]})
        for i in range(n_steps):
            units = []
            for group in groups[i * per_process:(i + 1) * per_process]:
                made = group_units(cfg.objective.name, group, pair_threshold=cfg.data.pair_threshold)
                stats["dropped_groups"] += int(not made)
                units.extend(made)
            per_step.append(units)
        stats.update({
            "samples": len(flat_texts),
            "time/generation": t1 - t0,
            "generation/tokens_per_s": rollout.tokens_per_s,
            "time/reward": t2 - t1,
            "reward_failures": len(scored.failures),
            "sample_reward": sum(rewards_seen) / max(len(rewards_seen), 1),
        })
        return per_step, stats

    return sample
