"""The precision a model computes in under `train.mixed_precision`, as accelerate sets it up: one place for the
processes that compute with a copy of the policy outside the trainer's `Accelerator` (the asynchronous sampler).
"""

from __future__ import annotations

import contextlib
from types import MethodType

import torch


def autocast_for(precision: str, device_type: str):
    """The autocast accelerate enters for `precision` ("no" | "bf16" | "fp16"; its
    `get_mixed_precision_context_manager`, without autocast kwargs): a bf16 / fp16 autocast on `device_type`."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    return torch.autocast(device_type, dtype=dtypes[precision]) if precision in dtypes else contextlib.nullcontext()


def with_precision_forward(model: torch.nn.Module, precision: str, device_type: str) -> torch.nn.Module:
    """`model` with the forward accelerate's `prepare` gives a model under `precision`: its class's forward under
    `autocast_for`, the outputs converted to float32 (accelerate's `convert_outputs_to_fp32`). The wrapper lives on
    the instance, so a copy of the policy sent to another process (the sampler process of `train.async_sampling`)
    loses it; this puts the same one back, so that both processes compute the same numbers."""
    model.__dict__.pop("forward", None)
    if precision not in ("bf16", "fp16"):
        return model
    from accelerate.utils import convert_outputs_to_fp32

    wrapped = autocast_for(precision, device_type)(type(model).forward)
    model.forward = MethodType(convert_outputs_to_fp32(wrapped), model)
    return model
