"""The draw of a sampled batch, in one place: prompts -> completions -> rewards -> units -> stats.

The trainer (`training.loop.Trainer`, at a step where a buffer is due) and the asynchronous sampler process
(`sampling.process`) both call `draw`, so that they make the same units from the same policy, seed and
settings by construction.

A sampling at step `at` draws the units of steps `first .. first + span - 1` (online: `first = at`, `span = 1`;
sparse: `span = sample_every`; stale: the queue's next step). Each step gets `rollout.prompts_per_step` prompts and
`rollout.n` completions per prompt; a group gives the objective's units (`ObjectiveSpec.units_from_group`: a DPO
pair when the scores differ by more than `data.pair_threshold`, KTO's labelled completions, a GRPO group whose
rewards are not all equal), and a group that gives none is dropped.

Equal units (`rollout.redraws` > 0): an offline step trains on `fill` units (`train.micro_batch_size x
train.grad_accum`), an online step on what its groups gave, often fewer. So a step still short of `fill` draws
again, from prompts of a stream of its own (`Sampler.prompts(..., draw=d)`), up to `rollout.redraws` times; then
each step keeps its first `fill` units. A step still short after the last redraw trains on what it has, and the
draw says so (`short`). Online and offline then compare at equal units per step (docs/method.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from humanline.data.records import Unit
from humanline.sampling.sampler import Sampler, units_per_step
from humanline.settings.config import DataConfig

SUMMED = ("samples", "generated_tokens", "time/generation", "time/reward", "reward_failures", "generation_failures",
          "dropped_groups", "engine/synced", "time/engine_sync")


@dataclass
class Draw:
    units: list[list[Unit]]  # the units of steps first .. first + span - 1
    stats: dict  # logged with the step (samples, tokens, seconds, sample_reward, dropped_groups, redraws, ...)
    short: list[tuple[int, int]] = field(default_factory=list)  # (step, units) of steps left below `fill`


def draw(sampler: Sampler, model, units_from_group: Callable[[Unit, DataConfig], list[Unit]], data: DataConfig, *,
         at: int, first: int, span: int, fill: int = 0, redraws: int = 0, version: int | None = None) -> Draw:
    """The units of steps `first .. first + span - 1`, sampled from `model` as it is now (seeded by `at`; its
    weights are those of step `version`, default `at`). `fill` > 0 and `redraws` > 0: top each step up to `fill`
    units, with at most `redraws` more draws."""
    steps = list(range(first, first + span))
    version = at if version is None else version
    units, stats = _one_draw(sampler, model, units_from_group, data, at, steps, 0, version)
    rewards = [(stats.pop("sample_reward", None), stats.get("samples", 0))]
    made = 0
    for d in range(1, redraws + 1 if fill else 1):
        wanting = [i for i, step_units in enumerate(units) if len(step_units) < fill]
        if not wanting:
            break
        more, extra = _one_draw(sampler, model, units_from_group, data, at, [steps[i] for i in wanting], d, version)
        rewards.append((extra.pop("sample_reward", None), extra.get("samples", 0)))
        for i, new in zip(wanting, more):
            units[i].extend(new)
        for key in SUMMED:
            if key in extra:
                stats[key] = stats.get(key, 0) + extra[key]
        stats.update(combined_mismatch(stats, extra))
        made = d
    if fill and redraws:
        units = [step_units[:fill] for step_units in units]
    short = [(steps[i], len(u)) for i, u in enumerate(units) if fill and redraws and len(u) < fill]
    weighed = [(r, n) for r, n in rewards if r is not None and n]
    if weighed:
        stats["sample_reward"] = sum(r * n for r, n in weighed) / sum(n for _, n in weighed)
    if fill and redraws:
        stats.update({"redraws": float(made), "units_short": float(sum(fill - n for _, n in short))})
    return Draw(units, stats, short)


def combined_mismatch(first: dict, second: dict) -> dict:
    """The mismatch statistics (`sampler.mismatch`) of two draws' tokens together: the mean weighted by tokens, the
    larger max."""
    n1, n2 = first.get("mismatch/tokens", 0.0), second.get("mismatch/tokens", 0.0)
    if not n2:
        return {}
    if not n1:
        return {k: v for k, v in second.items() if k.startswith("mismatch/")}
    return {"mismatch/mean": (first["mismatch/mean"] * n1 + second["mismatch/mean"] * n2) / (n1 + n2),
            "mismatch/max": max(first["mismatch/max"], second["mismatch/max"]), "mismatch/tokens": n1 + n2}


def short_lines(short: list[tuple[int, int]], fill: int, redraws: int) -> list[str]:
    """One warning line per step of `short` (`Draw.short`): left below `fill` units after the last redraw."""
    return [f"step {step + 1}: {n} of {fill} units after {redraws} redraws (rollout.redraws); it trains on those"
            for step, n in short]


def _one_draw(sampler: Sampler, model, units_from_group, data: DataConfig, at: int, steps: list[int],
              d: int, version: int) -> tuple[list[list[Unit]], dict]:
    """One pass for `steps`: their prompts (stream `d`), completions, rewards, units per step, and the stats."""
    records = sampler.prompts(steps, draw=d)
    rollout, stats = sampler.generate(at, records, model, draw=d, version=version)  # 1. sample
    groups, scoring = sampler.score(at, records, rollout)  # 2. score
    units, dropped = units_per_step(groups, units_from_group, data, len(steps))  # 3. units
    return units, {**stats, **scoring, "dropped_groups": float(dropped + stats.get("dropped_groups", 0))}
