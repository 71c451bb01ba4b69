"""Humanline for TRL: make a `DPOTrainer`, `KTOTrainer` or `GRPOTrainer` humanline with one call.

    from humanline.integrations.trl import HumanlineArgs, make_humanline

    trainer = DPOTrainer(model=..., args=DPOConfig(...), train_dataset=..., processing_class=tokenizer)
    make_humanline(trainer, HumanlineArgs(sync_every=1, low=-1.5, high=1.5))
    trainer.train()

What it changes (docs/method.md §3, docs/trl.md): the reference is synced to the policy's *pre-update* weights every
`sync_every` optimizer steps (hard copy; TRL's `ref_model` weights or a peft adapter copy hold it), and every
token log-ratio is clipped to `[low, high]` (or passed through humanline's stochastic rejection) before TRL
sums it into rewards, ratios or KL terms. TRL's data pipeline, optimizer, logging and the rest of its loss
are untouched. Transform, band (fixed or auto), seeded draws, sync rule and metrics are humanline's own
`Humanline` object (`humanline.core.humanline`), the one our Trainer uses; so are the metric names
(`humanline/inside_band`, `below_band`, `above_band`, `log_ratio_mean`, `low`, `high`, `steps_since_sync`,
`syncs`).

Supported: TRL >=1.16,<1.17 (checked, see `_trl_guard`), single process or DDP, full fine-tuning or peft,
TRL's model-based or precomputed reference (both are replaced by the synced one), gradient accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from humanline.core.humanline import Humanline, HumanlineConfig, settings_problems
from humanline.devices.fsdp import sharded_copy
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


@dataclass
class HumanlineArgs(HumanlineConfig):
    """Humanline settings for a TRL trainer: the fields of a recipe's `humanline:` block (`HumanlineConfig`:
    sync_every, transform, low, high, gamma_p, gamma_r, band, band_quantiles, band_rate), on by default, plus
    what only the bridge needs."""

    enabled: bool = True  # make_humanline refuses False (there is nothing to install)
    seed: int = 0  # transform="reject": draws are seeded by (seed, step, micro-batch, part, process)
    allow_untested_trl: bool = False  # try a TRL outside SUPPORTED_TRL (the per-step checks stay on)

    def __post_init__(self):
        for name, expected, value in settings_problems(self, prefix="HumanlineArgs.")[:1]:
            raise ValueError(f"{name} must be {expected}, got {value!r}")


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
    FSDP version 1, `sync_ref_model=True`, DPO's `sft` loss or `use_weighting`, GRPO losses other than the
    PPO-clipped ones, GRPO's `use_bias_correction_kl=True` with `beta > 0`, prompt-learning peft adapters).
    """
    args = humanline or HumanlineArgs()
    if not args.enabled:
        raise ValueError("make_humanline: HumanlineArgs.enabled is False; leave the trainer as it is instead")
    if getattr(trainer, "humanline", None) is not None:
        raise ValueError("make_humanline: this trainer is already humanline")
    check_version(args.allow_untested_trl)
    kind = trainer_kind(trainer)
    check_internals(trainer, kind)
    check_setup(trainer, kind)
    accelerator = trainer.accelerator
    policy = accelerator.unwrap_model(trainer.model)
    # FSDP2: a reference humanline copies itself is sharded like the policy (TRL shards its own ref_model)
    shard = partial(sharded_copy, accelerator) if getattr(accelerator, "is_fsdp2", False) else None
    reference = SyncedReference(policy, trainer.ref_model, accelerator.unwrap_model, shard=shard)
    # GRPO's loss clips the same ratio itself (TRL's epsilon): an auto band holds its bounds there, and a drift
    # rule measures against that clip too, as in ours
    clip = (trainer.epsilon_low, trainer.epsilon_high) if kind == "grpo" else None
    humanline_ = Humanline(args, seed=args.seed, ratio_clip=clip,
                           process_index=accelerator.process_index, device=accelerator.device)
    loss_cls = GRPOLoss if kind == "grpo" else PreferenceLoss
    sync = SyncCallback(reference, humanline_)
    loss: HumanlineLoss = loss_cls(trainer, humanline=humanline_, reference=reference, sync=sync)
    sync.reduce_sum = loss.reduce_sum
    reference.sync()  # step 0 compares the policy with itself (again at train begin, after any resume)
    trainer.compute_loss = loss  # the instance attribute shadows TRL's method; `loss.original` is TRL's
    trainer.add_callback(sync)
    if kind == "grpo":
        skip_generation_reference(trainer)
    trainer.humanline = loss
    return trainer
