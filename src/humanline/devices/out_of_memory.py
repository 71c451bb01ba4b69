"""Allocation failures become one line naming the settings to lower, instead of a traceback.

`memory_guard` wraps building a run and running its steps. A CPU allocation failure (torch's
`DefaultCPUAllocator: can't allocate memory`, or Python's `MemoryError`) and an accelerator one
(`torch.OutOfMemoryError`, which `torch.cuda.OutOfMemoryError` is) raise `OutOfMemory`, a `UserError`, from
where they happened: nothing is saved on the way out, so the newest checkpoint is the last complete step.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from humanline.errors import OutOfMemory
from humanline.settings.config import Config

_CPU_MARKERS = ("DefaultCPUAllocator", "can't allocate memory")


def is_out_of_memory(exc: BaseException | None) -> bool:
    """True for an allocation failure, also when another error wraps it (its `__cause__` chain)."""
    oom_types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                                  getattr(torch.cuda, "OutOfMemoryError", None)) if t is not None)
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, MemoryError) or (oom_types and isinstance(exc, oom_types)):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc) for m in _CPU_MARKERS):
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def settings_to_lower(cfg: Config, building: bool) -> str:
    """The config fields that bound memory for this run, most effective first."""
    if building:
        return "model.name (a smaller model), model.dtype=bfloat16 or model.lora=true"
    names = [f"train.micro_batch_size={cfg.train.micro_batch_size}", f"data.max_length={cfg.data.max_length}"]
    if cfg.train.regime != "offline":
        names += [f"rollout.batch_size={cfg.rollout.batch_size}",
                  f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}"]
    if cfg.eval.prompts:
        names.append(f"eval.n={cfg.eval.n}")
    if not cfg.model.gradient_checkpointing:
        names.append("or set model.gradient_checkpointing=true")  # the same numbers, less memory
    return ", ".join(names)


def raise_if_out_of_memory(exc: BaseException, cfg: Config, where: str, checkpoints: list | None) -> None:
    """Raise `OutOfMemory` from `exc` when it is an allocation failure; return otherwise (the caller re-raises).

    where: the moment ("at step 3"); checkpoints: the complete checkpoints (None while building the run).
    """
    if not is_out_of_memory(exc):
        return
    text = " ".join(str(exc).split())
    cpu = [text.find(m) for m in _CPU_MARKERS if m in text]
    # the allocator's own words (not its source file, nor the byte count), or the start of the message
    detail = text[min(cpu):min(cpu) + 42] if cpu else f"{type(exc).__name__}: {text[:50]}".rstrip(": ")
    kept = ""
    if checkpoints is not None:
        kept = (f"; the last checkpoint ({checkpoints[-1].name}) is intact: --resume continues (it may set "
                f"model.gradient_checkpointing, rollout.batch_size)" if checkpoints else "; no checkpoint was written")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give the cached blocks back before the process reports and exits
    raise OutOfMemory(f"out of memory {where} ({detail}): lower {settings_to_lower(cfg, checkpoints is None)}{kept}",
                      details=f"{text}\nraising train.grad_accum as train.micro_batch_size is lowered keeps the batch; "
                              f"a resume keeps the run's other settings") from exc


@contextmanager
def memory_guard(cfg: Config, where: str) -> Iterator[None]:
    """`raise_if_out_of_memory` around a block that builds the run (no checkpoint exists yet)."""
    try:
        yield
    except Exception as exc:
        raise_if_out_of_memory(exc, cfg, where, None)
        raise
