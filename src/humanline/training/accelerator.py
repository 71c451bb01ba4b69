"""The run's accelerator and the device and sharding settings it is checked against.

`make_accelerator` builds accelerate's `Accelerator` (CPU, GPU, FSDP2 or DeepSpeed, as the launch configures);
what a launch cannot honour (float16 weights on a CPU, another ZeRO stage, FSDP version 1, a second unsharded
copy under FSDP) is refused first, in one line, before any model or data is loaded. Also here: the sharded
reference copy FSDP needs before the policy is sharded, the precision `auto` resolves to, and the
deterministic-kernel switches of `train.deterministic`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from humanline.devices import zero
from humanline.devices.fsdp import enable_on_cpu, sharded_copy
from humanline.errors import UserError, require
from humanline.settings.config import Config
from humanline.training.reference import needs_weight_copy

if TYPE_CHECKING:  # annotations only: accelerate loads with the run
    from accelerate import Accelerator


def make_accelerator(cfg: Config, strategy: str) -> Accelerator:
    """The run's `Accelerator`: on the CPU when no GPU is seen (or accelerate is told so), FSDP2 or DeepSpeed when
    the launch configures them (also on a CPU process group); settings that cannot work are refused first.
    strategy: the run's reference strategy, resolved (`humanline.training.reference.choose_reference`)."""
    from accelerate import Accelerator

    # Without an accelerator, torchrun/accelerate-launched processes only form a (gloo) group if cpu=True.
    on_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") or not torch.cuda.is_available()
    if on_cpu and cfg.model.dtype == "float16":  # refused before anything is loaded or written
        raise UserError("config field 'model.dtype': float16 weights train to NaN on a CPU within a few steps "
                        "(AdamW's updates overflow them); use float32 or bfloat16")
    check_deepspeed(cfg, strategy)  # before accelerate reads the DeepSpeed settings
    precision = mixed_precision(cfg.train.mixed_precision, on_cpu)
    try:
        accelerator = Accelerator(cpu=on_cpu, mixed_precision=precision, log_with=cfg.logging.trackers or None,
                                  project_dir=cfg.train.output_dir)
    except ValueError as exc:
        if "already been initialized" not in str(exc):
            raise
        raise UserError(_state_clash(on_cpu, precision)) from None
    if on_cpu:  # launched with an FSDP or DeepSpeed accelerate config: accelerate's path, also on a CPU group
        enable_on_cpu(accelerator) or zero.enable_on_cpu(accelerator)
    zero.configure(accelerator, cfg.train.micro_batch_size, cfg.train.grad_accum, cfg.optim.max_grad_norm)
    check_distributed(cfg, accelerator)
    return accelerator


def fsdp_reference_copy(strategy: str, accelerator: Accelerator, model: torch.nn.Module) -> torch.nn.Module | None:
    """Under FSDP, the reference's weight copy (`strategy` `copy` or `frozen`), sharded like the policy: an
    FSDP module cannot be copied once sharded, so the copy is taken from the model before it is prepared."""
    if not accelerator.is_fsdp2:
        return None
    return sharded_copy(accelerator, model) if needs_weight_copy(strategy, model) else None


DEEPSPEED_STAGES = ("2", "3")  # ZeRO stages of recipes/accelerate/deepspeed_zero{2,3}.yaml


def check_deepspeed(cfg: Config, strategy: str) -> None:
    """A run launched with a DeepSpeed accelerate config (`ACCELERATE_USE_DEEPSPEED=true`): the package, the ZeRO
    stage, and what humanline's loop cannot do under DeepSpeed, each refused in one line (docs/scaling.md).
    strategy: the run's reference strategy, resolved (a ZeRO-3 run has no whole weights to copy)."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")
    where = f"the accelerate config's DeepSpeed ZeRO stage {stage or '(not set)'}"
    if stage not in DEEPSPEED_STAGES:
        raise UserError(f"{where}: expected one of {', '.join(DEEPSPEED_STAGES)} (recipes/accelerate/"
                        f"deepspeed_zero2.yaml, deepspeed_zero3.yaml)")
    try:
        require("deepspeed", "deepspeed")
    except UserError:
        raise UserError("the accelerate config asks for DeepSpeed, but the 'deepspeed' package is not installed "
                        "(pip install deepspeed), or use FSDP2: recipes/accelerate/fsdp.yaml") from None
    if cfg.train.grad_accum != 1:
        raise UserError(f"config field 'train.grad_accum': {cfg.train.grad_accum} under DeepSpeed, which steps the "
                        f"optimizer inside every backward it is handed as a boundary; use train.grad_accum=1 (and "
                        f"a larger train.micro_batch_size), or FSDP2")
    if stage != "3":
        return
    if cfg.train.regime != "offline" or cfg.eval.prompts:
        what = f"train.regime={cfg.train.regime}" if cfg.train.regime != "offline" else "eval.prompts"
        raise UserError(f"{where}: ZeRO-3 partitions every weight, and sampling ({what}) needs them whole; "
                        f"humanline gathers them for FSDP2 only: use recipes/accelerate/fsdp.yaml, or ZeRO-2")
    if strategy in ("copy", "frozen") and not cfg.model.lora:
        raise UserError(f"{where}: ZeRO-3 partitions every weight, so train.reference={strategy} has no whole "
                        f"weights to copy; use train.reference=lookahead (humanline) or cache, or FSDP2")


def check_distributed(cfg: Config, accelerator: Accelerator) -> None:
    """Settings that a sharded (FSDP) run cannot honour, refused before anything is loaded."""
    if accelerator.is_fsdp2 and cfg.train.regime != "offline" and cfg.rollout.dtype != "policy":
        raise UserError(f"config field 'rollout.dtype': '{cfg.rollout.dtype}' keeps a second, unsharded copy of "
                        f"the policy, which FSDP does not support; under FSDP use train.mixed_precision: bf16 "
                        f"(what auto picks on a GPU) instead: the weights gathered for sampling are then bfloat16")
    if accelerator.distributed_type.name == "FSDP" and not accelerator.is_fsdp2:
        raise UserError("the accelerate config asks for FSDP version 1 (fsdp_version: 1); humanline supports "
                        "FSDP2 (fsdp_version: 2, recipes/accelerate/fsdp.yaml)")



def deterministic_kernels() -> None:
    """`train.deterministic`: the same kernels and reduction orders in every process, so a resumed run
    repeats an uninterrupted one bit for bit on a GPU too. What varies otherwise on CUDA: backward kernels that
    accumulate with atomics in whatever order threads finish (attention's backward, the backward of
    `index_select` / `gather`, `index_add_`, e.g. GRPO's group sums and the shared-prompt cache expansion), and
    settings a process may inherit (TF32 matmuls, cuDNN autotuning). Attention then runs PyTorch's flash kernel
    (deterministic under this mode) or the plain math one: the memory-efficient and cuDNN kernels are switched
    off. Process-wide: it stays on after the run. A few CUDA ops raise under it (e.g. a floating-point
    `cumsum`, which top-p sampling uses)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for deterministic results
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)


def _state_clash(on_cpu: bool, precision: str) -> str:
    """The message for accelerate's process-wide state, set up earlier in this process for another device or
    precision (an earlier Trainer, or another library's trainer): accelerate cannot change it in place."""
    from accelerate.state import AcceleratorState

    state = AcceleratorState()  # the existing state, unchanged
    wanted = "the CPU" if on_cpu else "the GPU"
    causes = ["config field 'train.mixed_precision'"]
    if (state.device.type == "cpu") != on_cpu:
        causes.append("the device: ACCELERATE_USE_CPU=true pins a run to the CPU")
    return (f"this process already set up accelerate for {state.device} with mixed precision "
            f"'{state.mixed_precision}' (an earlier trainer in the same process); this run needs {wanted} with "
            f"mixed precision '{precision}' ({'; '.join(causes)}). Start the run in a fresh process, or match "
            f"the earlier run's settings")


def mixed_precision(setting: str, on_cpu: bool) -> str:
    """`train.mixed_precision` for accelerate: `auto` is bf16 autocast on a CUDA GPU that supports it (with
    the weights in `model.dtype`, float32 by default: the standard mixed-precision set-up), else none."""
    if setting != "auto":
        return setting
    return "bf16" if not on_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"

