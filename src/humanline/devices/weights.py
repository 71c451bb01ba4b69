"""Copying a model's weights into another model of the same shape, in place: the one copy behind a synced
reference (`training.reference.CopyReference`), a bfloat16 sampling copy (`sampling.sampler.Sampler`) and the
asynchronous sampler's shared slot (both ends: `training.async_sampling`, `sampling.process`)."""

from __future__ import annotations

import torch


@torch.no_grad()
def copy_weights_(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """`target`'s parameters and buffers <- `source`'s, in place, each cast to the target's dtype and device
    (a bfloat16 copy rounds). The two models must have the same structure (checked: `zip(strict=True)`)."""
    for mine, theirs in zip(target.parameters(), source.parameters(), strict=True):
        mine.copy_(theirs.detach())
    for mine, theirs in zip(target.buffers(), source.buffers(), strict=True):
        mine.copy_(theirs)
