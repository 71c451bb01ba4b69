"""Humanline transforms, log-prob helpers, masked reductions and prospect-theory functions."""

from humanline.core.logps import masked_mean, masked_sum, sequence_logps, token_logps
from humanline.core.prospect import capacity, decision_weights, value_function
from humanline.core.transforms import (
    clip_log_ratio,
    deterministic_band,
    inside_band_fraction,
    reject_log_ratio,
    rejection_keep_mask,
    validate_band,
)

__all__ = [
    "capacity",
    "clip_log_ratio",
    "decision_weights",
    "deterministic_band",
    "inside_band_fraction",
    "masked_mean",
    "masked_sum",
    "reject_log_ratio",
    "rejection_keep_mask",
    "sequence_logps",
    "token_logps",
    "validate_band",
    "value_function",
]
