"""Sums and means across the run's processes (with one process, the values as they are), and the gradient norm
over all of them."""

from __future__ import annotations

import torch


def reduce_sum(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over processes (every process gets the sum)."""
    if accelerator.num_processes == 1:
        return tensor
    return accelerator.reduce(tensor.clone(), reduction="sum")


def mean_across_processes(accelerator, metrics: dict) -> dict:
    """Average logged objective metrics over processes (keys may differ, e.g. KTO's per-class rewards)."""
    if accelerator.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object  # deferred: accelerate is heavy to import, and one process needs none

    gathered = gather_object([metrics])
    keys = {k for m in gathered for k in m}
    return {k: sum(m[k] for m in gathered if k in m) / sum(k in m for m in gathered) for k in keys}


def clip_grad_norm(model: torch.nn.Module, accelerator, max_norm: float) -> torch.Tensor:
    """Clip the gradient norm to `max_norm` (0: no clipping); returns the norm before clipping, a 0-dim tensor
    left on the device (the loop reads it back with the step's other metrics); every process calls it."""
    params = [p for p in model.parameters() if p.requires_grad]
    if max_norm > 0:
        norm = accelerator.clip_grad_norm_(params, max_norm)
    else:
        grads = [p.grad.detach().norm() for p in params if p.grad is not None]
        norm = torch.stack(grads).norm() if grads else torch.zeros(())
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor over the shards' norms, made one plain tensor
        norm = norm.full_tensor()
    return norm if isinstance(norm, torch.Tensor) else torch.tensor(float(norm))
