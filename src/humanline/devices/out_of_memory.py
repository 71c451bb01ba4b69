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
    names = [f"train.micro_batch_size={cfg.train.micro_batch_size} (raise train.grad_accum to keep the batch)",
             f"data.max_length={cfg.data.max_length}"]
    if cfg.train.regime != "offline":
        names += [f"rollout.batch_size={cfg.rollout.batch_size}",
                  f"rollout.max_new_tokens={cfg.rollout.max_new_tokens}"]
    if cfg.eval.prompts:
        names.append(f"eval.n={cfg.eval.n}")
    if not cfg.model.gradient_checkpointing:
        names.append("or set model.gradient_checkpointing=true")
    return ", ".join(names)


def raise_if_out_of_memory(exc: BaseException, cfg: Config, where: str, checkpoints: list | None) -> None:
    """Raise `OutOfMemory` from `exc` when it is an allocation failure; return otherwise (the caller re-raises).

    where: the moment ("at step 3"); checkpoints: the complete checkpoints (None while building the run).
    """
    if not is_out_of_memory(exc):
        return
    detail = " ".join(str(exc).split())[:160] or type(exc).__name__
    kept = ""
    if checkpoints is not None:
        kept = (f"; the last checkpoint ({checkpoints[-1].name}) is intact: continue with --resume (it keeps the run's "
                f"settings; it may set model.gradient_checkpointing=true or lower rollout.batch_size)" if checkpoints
                else "; no checkpoint was written")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # give the cached blocks back before the process reports and exits
    raise OutOfMemory(f"out of memory {where} ({type(exc).__name__}: {detail}): lower "
                      f"{settings_to_lower(cfg, checkpoints is None)}{kept}") from exc


@contextmanager
def memory_guard(cfg: Config, where: str) -> Iterator[None]:
    """`raise_if_out_of_memory` around a block that builds the run (no checkpoint exists yet)."""
    try:
        yield
    except Exception as exc:
        raise_if_out_of_memory(exc, cfg, where, None)
        raise
