"""humanline: perceptual (humanline) DPO, KTO and GRPO — reference syncing and asymmetric clipping of token
log-ratios, for offline, online and sparse-online alignment of causal language models."""

from humanline.core import (
    capacity,
    clip_log_ratio,
    decision_weights,
    deterministic_band,
    inside_band_fraction,
    masked_mean,
    masked_sum,
    reject_log_ratio,
    rejection_keep_mask,
    sequence_logps,
    token_logps,
    value_function,
)
from humanline.errors import UserError
from humanline.objectives import (
    LossOutput,
    dpo_loss,
    group_advantages,
    grpo_loss,
    ipo_loss,
    kto_kl_ref,
    kto_loss,
)
from humanline.version import __version__

__all__ = [
    "__version__",
    "LossOutput",
    "UserError",
    "capacity",
    "clip_log_ratio",
    "decision_weights",
    "deterministic_band",
    "dpo_loss",
    "group_advantages",
    "grpo_loss",
    "inside_band_fraction",
    "ipo_loss",
    "kto_kl_ref",
    "kto_loss",
    "masked_mean",
    "masked_sum",
    "reject_log_ratio",
    "rejection_keep_mask",
    "sequence_logps",
    "token_logps",
    "value_function",
]


# name -> module of the heavier entry points (torch models, accelerate), imported on first use
_LAZY = {"Trainer": "humanline.training.loop", "load_config": "humanline.training.config_loading",
         "evaluate_generations": "humanline.evaluation.generations"}


def __getattr__(name: str):  # lazy: keep `import humanline` light for users of the functional API
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'humanline' has no attribute {name!r}")
