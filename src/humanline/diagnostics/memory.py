"""Bytes that autograd keeps for the backward pass: a device-independent measure of activation memory.

Peak accelerator memory needs an accelerator; what a training forward *saves for backward* does not, and it
is where a step's activation memory goes (full-vocabulary logits, attention inputs, MLP activations). Counted
on the CPU it predicts the GPU's activation memory up to allocator effects, so it can be checked anywhere:

    saved = saved_tensor_bytes(lambda: loss_fn(model, batch), exclude=model.parameters())
    saved.bytes / tokens     # bytes per trained token
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch


@dataclass
class SavedTensors:
    result: Any  # what the measured function returned (keep it alive until backward if you need one)
    bytes: int  # distinct storages saved for backward, parameters excluded
    tensors: int  # how many distinct storages
    largest: tuple[tuple[int, ...], str] | None  # shape and dtype of the largest saved tensor


def saved_tensor_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> SavedTensors:
    """Run `fn()` and count the storage bytes autograd saved for backward during it.

    A storage saved several times (a tensor and its views) counts once; storages of `exclude` (the model's
    parameters: they exist anyway, saving them costs nothing) are left out.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}
    largest: list = [0, None]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.layout == torch.strided and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in skip and key not in seen:
                seen[key] = storage.nbytes()
                if storage.nbytes() > largest[0]:
                    largest[:] = [storage.nbytes(), (tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))]
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    return SavedTensors(result, sum(seen.values()), len(seen), largest[1])
