"""Humanline for TRL: make a `DPOTrainer`, `KTOTrainer` or `GRPOTrainer` humanline with one call.

    from humanline.integrations.trl import HumanlineArgs, make_humanline

    trainer = DPOTrainer(model=..., args=DPOConfig(...), train_dataset=..., processing_class=tokenizer)
    make_humanline(trainer, HumanlineArgs(sync_every=1, low=-1.5, high=1.5))
    trainer.train()

What it changes (docs/method.md §3, docs/trl.md): the reference is synced to the policy's *pre-update* weights every
`sync_every` optimizer steps (hard copy; TRL's `ref_model` weights or a peft adapter copy hold it), and every
token log-ratio is clipped to `[low, high]` (or passed through humanline's stochastic rejection) before TRL
sums it into rewards, ratios or KL terms. TRL's data pipeline, optimizer, logging and the rest of its loss
are untouched. Logged: `humanline/inside_band`, `humanline/log_ratio_mean`, `humanline/syncs`.

Supported: TRL >=1.16,<1.17 (checked, see `_trl_guard`), single process or DDP, full fine-tuning or peft,
TRL's model-based or precomputed reference (both are replaced by the synced one), gradient accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

from humanline.core.transforms import clip_log_ratio, reject_log_ratio, validate_band
from humanline.integrations._trl_guard import (
    SUPPORTED_TRL,
    HumanlineTRLError,
    check_internals,
    check_setup,
    check_version,
)
from humanline.integrations._trl_losses import GRPOLoss, HumanlineLoss, PreferenceLoss, skip_generation_reference
from humanline.integrations._trl_reference import REFERENCE_ADAPTER, SyncCallback, SyncedReference

__all__ = ["HumanlineArgs", "HumanlineTRLError", "SUPPORTED_TRL", "make_humanline", "REFERENCE_ADAPTER"]

TRANSFORMS = ("clip", "reject", "none")


@dataclass
class HumanlineArgs:
    """Humanline settings for a TRL trainer (names as in humanline's `humanline:` config section)."""

    sync_every: int = 1  # k: the reference takes the policy's pre-update weights every k optimizer steps
    transform: str = "clip"  # clip | reject (stochastic) | none (syncing only): docs/method.md §3.1, §3.3
    low: float = -1.5  # log eps_P < 0 (HALOs default -1.0)
    high: float = 1.5  # log eps_R > 0
    gamma_p: float = 0.5  # transform="reject": Beta(gamma_p, 1)
    gamma_r: float = 0.01  # transform="reject": Beta(gamma_r, 1)
    seed: int = 0  # transform="reject": draws are seeded by (seed, step, micro-batch, process)
    allow_untested_trl: bool = False  # try a TRL outside SUPPORTED_TRL (the per-step checks stay on)

    def __post_init__(self):
        if not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ValueError(f"HumanlineArgs.sync_every must be an integer >= 1, got {self.sync_every!r}")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"HumanlineArgs.transform must be one of {', '.join(TRANSFORMS)}, got {self.transform!r}")
        validate_band(self.low, self.high)
        if not (self.gamma_p > 0 and self.gamma_r > 0):
            raise ValueError(f"HumanlineArgs.gamma_p and gamma_r must be > 0, got {self.gamma_p}, {self.gamma_r}")


def make_transform(args: HumanlineArgs):
    """`f(raw (B, T), mask (B, T), generator) -> (B, T)`: the token log-ratio that replaces `raw` in the loss."""
    if args.transform == "clip":
        return lambda raw, mask, gen: clip_log_ratio(raw, low=args.low, high=args.high)
    if args.transform == "reject":
        return lambda raw, mask, gen: reject_log_ratio(raw, mask, gamma_p=args.gamma_p, gamma_r=args.gamma_r,
                                                       generator=gen)
    return lambda raw, mask, gen: raw


def trainer_kind(trainer) -> str:
    """"dpo", "kto" or "grpo" for TRL's trainers (and subclasses, e.g. the trl.experimental KTO alias)."""
    from trl import DPOTrainer, GRPOTrainer, KTOTrainer

    for kind, cls in (("dpo", DPOTrainer), ("kto", KTOTrainer), ("grpo", GRPOTrainer)):
        if isinstance(trainer, cls):
            return kind
    raise TypeError(f"make_humanline supports TRL's DPOTrainer, KTOTrainer and GRPOTrainer, "
                    f"got {type(trainer).__name__}")


def make_humanline(trainer, humanline: HumanlineArgs | None = None):
    """Make `trainer` (a TRL DPO/KTO/GRPO trainer, before `train()`) humanline, in place; returns it.

    Raises `HumanlineTRLError` when the installed TRL is outside `SUPPORTED_TRL` or its internals differ from
    what the hooks need, and `ValueError` for configurations the integration does not support (DeepSpeed,
    FSDP, `sync_ref_model=True`, DPO's `sft` loss or `use_weighting`, GRPO losses other than the PPO-clipped ones).
    """
    args = humanline or HumanlineArgs()
    if getattr(trainer, "humanline", None) is not None:
        raise ValueError("make_humanline: this trainer is already humanline")
    check_version(args.allow_untested_trl)
    kind = trainer_kind(trainer)
    check_internals(trainer, kind)
    check_setup(trainer, kind)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    reference = SyncedReference(policy, trainer.ref_model, trainer.accelerator.unwrap_model)
    sync = SyncCallback(reference, args.sync_every)
    loss_cls = GRPOLoss if kind == "grpo" else PreferenceLoss
    loss: HumanlineLoss = loss_cls(trainer, transform=make_transform(args), band=(args.low, args.high),
                                   reference=reference, sync=sync, seed=args.seed,
                                   stochastic=args.transform == "reject")
    reference.sync()  # step 0 compares the policy with itself (again at train begin, after any resume)
    trainer.compute_loss = loss  # the instance attribute shadows TRL's method; `loss.original` is TRL's
    trainer.add_callback(sync)
    if kind == "grpo":
        skip_generation_reference(trainer)
    trainer.humanline = loss
    return trainer
