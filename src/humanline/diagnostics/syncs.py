"""Host syncs: the operations that make the host wait for an accelerator, counted on any device.

On a GPU the host queues kernels and runs ahead of them. An operation whose result the host has to read (a
scalar for Python control flow, a tensor copied to host memory, an output whose size depends on the data)
makes it wait until the queue has drained, and the GPU then idles while the host queues the next kernels.
On a CPU nothing waits, but the same operations run, so they can be counted there:

    with SyncCounter(device) as syncs:
        trainer.train_step()
    syncs.total, syncs.by_kind          # e.g. 1, {"tolist": 1}

What counts, on tensors of `device`'s type (host-side work on CPU tensors of a GPU run is not a sync; on a
CPU run every tensor is on the counted device, so host-side bookkeeping must be plain Python or numpy to stay
out of the count):
- `item`: `aten::_local_scalar_dense` (`.item()`, `float(t)`, `int(t)`, `bool(t)`, `if t:`);
- `nonzero`, `masked_select`, `unique`, `bincount`, `repeat_interleave` without `output_size`, boolean `index`
  and `index_put` (their output size depends on the data), `equal` (returns a Python bool);
- `to_host`: a copy from an accelerator to the CPU; `to_device_blocking`: a host-to-device copy without
  `non_blocking=True` (it waits for the stream);
- `tolist`, `cpu`: calls of those methods on a tensor of the counted device that is already on the CPU (on an
  accelerator the dispatcher sees them as `to_host` copies; on the CPU they dispatch nothing).
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_DATA_DEPENDENT = {
    _aten._local_scalar_dense.default: "item",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten._unique.default: "unique",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.bincount.default: "bincount",
    _aten.equal.default: "equal",
}
_INDEX = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}


def _tensors(args, kwargs) -> list[torch.Tensor]:
    flat = list(args) + list(kwargs.values())
    out = []
    for a in flat:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, torch.Tensor)]
    return out


def kind_of(func, args, kwargs, device_type: str) -> str | None:
    """The sync an aten call `func(*args, **kwargs)` forces on `device_type`, or None."""
    tensors = _tensors(args, kwargs)
    if func in (_aten._to_copy.default, _aten.copy_.default):
        src = args[1] if func is _aten.copy_.default else args[0]
        dst_type = args[0].device.type if func is _aten.copy_.default else \
            torch.device(kwargs.get("device") or src.device).type
        if src.device.type != "cpu" and dst_type == "cpu":
            return "to_host"
        if src.device.type == "cpu" and dst_type != "cpu" and not kwargs.get("non_blocking", False) \
                and not (func is _aten.copy_.default and len(args) > 2 and args[2]):
            return "to_device_blocking"
        return None
    if not any(t.device.type == device_type for t in tensors):
        return None
    if func in _DATA_DEPENDENT:
        return _DATA_DEPENDENT[func]
    if func in _INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "boolean index"
        return None
    if func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "repeat_interleave"
    return None


class SyncCounter(TorchDispatchMode):
    """Counts the host syncs of the block it is entered for (module doc); `paused()` leaves a part out."""

    def __init__(self, device: torch.device | str = "cpu", *, record: bool = False):
        super().__init__()
        self.device_type = torch.device(device).type
        self.by_kind: Counter = Counter()
        self.record = record
        self.where: list[str] = []  # with record=True: the kind and the innermost project frame of each sync
        self._paused = 0
        self._patched: dict = {}

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def _count(self, kind: str) -> None:
        if self._paused:
            return
        self.by_kind[kind] += 1
        if self.record:
            self.where.append(f"{kind} at {_caller()}")

    def __torch_dispatch__(self, func, _types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = kind_of(func, args, kwargs, self.device_type)
        if kind is not None:
            self._count(kind)
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def paused(self):
        """Leave the block out of the count (e.g. an optimizer step, outside the window being checked)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __enter__(self):
        counter = self
        for name in ("tolist", "cpu"):
            original = getattr(torch.Tensor, name)
            self._patched[name] = original

            def wrapper(tensor, *args, _name=name, _original=original, **kwargs):
                if tensor.device.type == "cpu" and counter.device_type == "cpu":
                    counter._count(_name)
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, wrapper)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        self._patched = {}
        return super().__exit__(*exc)


def _caller() -> str:
    frames = [f for f in traceback.extract_stack()[:-3]
              if ("/src/humanline/" in f.filename or "/tests/" in f.filename) and "syncs.py" not in f.filename]
    frame = frames[-1] if frames else traceback.extract_stack()[-4]
    return f"{frame.filename.rsplit('/src/', 1)[-1]}:{frame.lineno}"
