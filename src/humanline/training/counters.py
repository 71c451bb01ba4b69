"""The run's running counts: samples, skipped and empty steps, tokens, costs, the non-finite streak (humanline
counts its own syncs: `humanline/syncs`).

They are logged every step and kept in each checkpoint (`state` / `load`), so a resumed run counts on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Cumulative costs logged every step (they survive a busy machine, unlike wall-clock): completion tokens sampled,
# sequence tokens through forwards (policy and reference) and backwards, and this process's CPU seconds in steps.
COSTS = ("cost/generated_tokens", "cost/forward_tokens", "cost/backward_tokens", "cost/cpu_seconds")


def _zero_totals() -> dict:
    return {"samples_generated": 0, "skipped_steps": 0, "empty_steps": 0, "stale_steps": 0, "tokens": 0,
            **{key: 0 for key in COSTS}}


@dataclass
class Counters:
    totals: dict = field(default_factory=_zero_totals)
    bad_streak: int = 0  # consecutive steps with a non-finite loss or gradient (`faults.skip_non_finite`)
    dead_streak: int = 0  # consecutive updates with a gradient norm of exactly 0 (`faults.check_alive`)

    def count_sampled(self, stats: dict) -> None:
        """A new online buffer: its samples and generated tokens."""
        self.totals["samples_generated"] += int(stats.get("samples", 0))
        self.totals["cost/generated_tokens"] += int(stats.get("generated_tokens", 0))

    def count_trained(self, micro_batches: list[dict]) -> int:
        """Count a trained step's tokens; returns its completion tokens.

        Sequence tokens (prompt + completion) go through the policy with gradient, and through no-grad
        forwards: every reference strategy scores each trained micro-batch once (now, at a sync, or when it
        was sampled), and KTO's mismatched part goes through the policy without gradient too."""
        tokens = sum(_total(b, "completion_mask") for b in micro_batches)
        self.totals["tokens"] += tokens
        main = sum(_total(b, "attention_mask") for b in micro_batches)
        kl = sum(_total(b, "kl_attention_mask") for b in micro_batches if "kl_attention_mask" in b)
        self.totals["cost/backward_tokens"] += main
        self.totals["cost/forward_tokens"] += 2 * (main + kl)
        return tokens

    def nothing_to_train(self, step: int, logger, staleness: int | None = None) -> dict:
        """Nothing to train on at this step: every group was dropped (online), or (`staleness` given) its samples
        are past the drop bound. Say so, count it, take no optimizer step."""
        self.totals["skipped_steps"] += 1
        if staleness is not None:  # `stale_steps`: steps dropped whole for the age of their samples
            self.totals["stale_steps"] += 1
            logger.warn(f"step {step + 1}: its samples are {staleness} versions old, past objective.max_staleness "
                        f"(objective.correction=drop): no update")
            return {"skipped": 1.0, "empty_steps": float(self.totals["empty_steps"]),
                    "stale_steps": float(self.totals["stale_steps"])}
        self.totals["empty_steps"] += 1
        logger.warn(f"step {step + 1}: every group was dropped (equal rewards within each group, or no "
                    f"pair above data.pair_threshold): nothing to train on")
        return {"skipped": 1.0, "empty_steps": float(self.totals["empty_steps"])}

    def costs(self) -> dict:
        """The cumulative costs every step logs."""
        return {key: float(self.totals[key]) for key in COSTS}

    def state(self, step: int) -> dict:
        """The trainer state of a checkpoint (`trainer_state.json`)."""
        return {"step": step, "totals": self.totals, "bad_streak": self.bad_streak, "dead_streak": self.dead_streak}

    def load(self, state: dict) -> int:
        """Take the counts of a checkpoint's trainer state; returns its step."""
        self.bad_streak = state["bad_streak"]
        self.dead_streak = state.get("dead_streak", 0)  # older checkpoints: none counted
        self.totals.update(state["totals"])  # older checkpoints lack newer counters
        return state["step"]


def _total(batch: dict, key: str) -> int:
    """The sum of a mask of `batch`, from the host's copy when the batch has one (`data.collate.to_device`):
    counting never reads the device."""
    host = batch.get("host", {})
    return int(host[key].numpy().sum()) if key in host else int(batch[key].sum())
