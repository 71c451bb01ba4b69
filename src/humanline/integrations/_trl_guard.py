"""What the TRL integration relies on, checked before training and after every loss call.

The integration works by hooking TRL's trainers at a few internal points (docs/trl.md, "How it works").
When an installed TRL does not look like the one these points were read from, it fails with
`HumanlineTRLError` naming the supported range, instead of training without humanline.
"""

from __future__ import annotations

import warnings

SUPPORTED_TRL = ">=1.16,<1.17"  # the releases whose internals the hooks were written against and tested on
_SUPPORTED_MINOR = (1, 16)


class HumanlineTRLError(RuntimeError):
    """TRL's internals differ from what `humanline.integrations.trl` relies on."""


def internals_error(detail: str) -> HumanlineTRLError:
    return HumanlineTRLError(
        f"humanline.integrations.trl supports TRL {SUPPORTED_TRL} (installed: {installed_trl()}): {detail}. "
        f"Install a supported TRL (pip install 'trl{SUPPORTED_TRL}') or train with humanline's own Trainer."
    )


def installed_trl() -> str:
    try:
        import trl
    except ImportError:
        return "not installed"
    return str(getattr(trl, "__version__", "unknown"))


def check_version(allow_untested: bool) -> None:
    """Refuse a TRL outside the supported range unless `allow_untested` (then warn; the runtime checks stay)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(installed_trl()).release[:2]
    except InvalidVersion:
        release = ()
    if release == _SUPPORTED_MINOR:
        return
    if not allow_untested:
        raise internals_error("this TRL release was not tested (HumanlineArgs(allow_untested_trl=True) tries it, "
                              "with the per-step checks still on)")
    warnings.warn(f"humanline.integrations.trl: TRL {installed_trl()} is outside the tested range {SUPPORTED_TRL}; "
                  "the integration checks TRL's behaviour at every loss call", stacklevel=3)


_REQUIRED = {
    "dpo": ("_compute_loss", "compute_loss", "precompute_ref_logps", "ref_model", "_metrics"),
    "kto": ("_compute_loss", "compute_loss", "precompute_ref_logps", "ref_model", "_metrics"),
    "grpo": ("_compute_loss", "compute_loss", "_get_per_token_logps_and_entropies",
             "_generate_and_score_completions", "beta", "loss_type", "ref_model", "_metrics"),
}


def check_internals(trainer, kind: str) -> None:
    """The attributes the hooks read or swap exist, and `_metrics` is TRL's per-mode dict of lists."""
    missing = [name for name in _REQUIRED[kind] if not hasattr(trainer, name)]
    if missing:
        raise internals_error(f"{type(trainer).__name__} has no {', '.join(missing)}")
    metrics = trainer._metrics
    if not (isinstance(metrics, dict) and {"train", "eval"} <= set(metrics)):
        raise internals_error(f"{type(trainer).__name__}._metrics is not a dict with 'train' and 'eval' entries")


# GRPO losses whose ratio is TRL's PPO-clipped exp(policy - old): humanline's transform is defined for those.
GRPO_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo")


def check_setup(trainer, kind: str) -> None:
    """Configurations the integration does not support raise a ValueError saying why."""
    args = trainer.args
    if getattr(trainer, "is_deepspeed_enabled", False):
        raise ValueError("humanline.integrations.trl supports single-process, DDP and FSDP2 training, not DeepSpeed: "
                         "DeepSpeed steps the optimizer inside backward, where no callback runs between the last "
                         "backward and the update, so the pre-update sync has no place (and ZeRO-3 holds no whole "
                         "weights to copy). Use FSDP2 (recipes/accelerate/fsdp.yaml) instead.")
    if getattr(trainer, "is_fsdp_enabled", False) and not getattr(trainer.accelerator, "is_fsdp2", False):
        raise ValueError("humanline.integrations.trl supports FSDP version 2 (fsdp_version: 2, "
                         "recipes/accelerate/fsdp.yaml), not FSDP version 1: its flat parameters do not line up "
                         "with the reference's for a shard-by-shard sync")
    if getattr(args, "sync_ref_model", False):
        raise ValueError("sync_ref_model=True: TRL would also mix the reference after every update; humanline does "
                         "the syncing (pre-update, hard copy). Set sync_ref_model=False.")
    if kind == "dpo":
        losses = list(getattr(trainer, "loss_types", []) or [])
        if "sft" in losses or getattr(args, "use_weighting", False):
            raise ValueError("DPO loss_type 'sft' and use_weighting=True read the policy's own log-probs, not the "
                             "log-ratio humanline transforms; they are not supported")
    if kind == "grpo":
        if trainer.loss_type not in GRPO_LOSSES:
            raise ValueError(f"GRPO loss_type {trainer.loss_type!r} is not supported by the humanline integration "
                             f"(supported: {', '.join(GRPO_LOSSES)})")
        if trainer.beta != 0.0 and getattr(args, "use_bias_correction_kl", False):
            raise ValueError("GRPO use_bias_correction_kl=True (TRL's default) with beta > 0 multiplies the KL term "
                             "by the ratio; humanline's KL is the unweighted k3 estimate against the synced "
                             "reference (docs/method.md §4). Set use_bias_correction_kl=False (or beta=0)")
        if getattr(trainer, "off_policy_mask_threshold", None) is not None:
            raise ValueError("off_policy_mask_threshold compares against the old policy, which humanline replaces "
                             "with the synced reference; set it to None")
