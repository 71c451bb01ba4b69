"""What every objective returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    """`loss`: scalar tensor to back-propagate. `metrics`: detached 0-dim tensors, keyed by name."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def check_token_inputs(name: str, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Shape checks shared by the objectives (ValueError naming the argument); returns the mask as bool."""
    if log_ratio.dim() != 2:
        raise ValueError(f"{name}: log-ratio must be (B, T), got shape {tuple(log_ratio.shape)}")
    if mask.shape != log_ratio.shape:
        raise ValueError(f"{name}: mask shape {tuple(mask.shape)} != log-ratio shape {tuple(log_ratio.shape)}")
    return mask.bool()
