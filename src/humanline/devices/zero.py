"""DeepSpeed ZeRO as the training loop meets it.

- `enable_on_cpu`: accelerate (1.15) enables DeepSpeed only on accelerators; launched with a DeepSpeed config on
  the CPU it would train with DDP. There the run's accelerator is switched to accelerate's DeepSpeed path (the
  process group stays gloo; DeepSpeed's CPU accelerator uses it).
- `configure`: the DeepSpeed settings humanline's loop decides itself. It hands accelerate no data loader, so
  the micro-batch size is set here; gradient accumulation and clipping are set from the run's config, so that
  the accelerate config cannot disagree with them.
"""

from __future__ import annotations

import os


def enable_on_cpu(accelerator) -> bool:
    """Switch a CPU process group launched with a DeepSpeed accelerate config (`ACCELERATE_USE_DEEPSPEED=true`)
    from DDP to accelerate's DeepSpeed path, before anything is prepared. Returns whether it did."""
    from accelerate.state import PartialState  # deferred: accelerate is heavy to import
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return False
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = DeepSpeedPlugin()  # read from the ACCELERATE_DEEPSPEED_* variables the launcher set
    plugin.set_mixed_precision(accelerator.mixed_precision)
    plugin.select(_from_accelerator_state=True)
    state = accelerator.state
    state.deepspeed_plugins = plugin
    state.distributed_type = DistributedType.DEEPSPEED
    PartialState._shared_state["distributed_type"] = DistributedType.DEEPSPEED  # gather/reduce helpers read this
    return True


def configure(accelerator, micro_batch_size: int, grad_accum: int, max_grad_norm: float) -> None:
    """Set DeepSpeed's micro-batch size, accumulation steps and gradient clipping from the run's config."""
    if accelerator.distributed_type.name != "DEEPSPEED":
        return
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    config["train_micro_batch_size_per_gpu"] = micro_batch_size
    config["gradient_accumulation_steps"] = grad_accum
    config["gradient_clipping"] = max_grad_norm
    config.pop("train_batch_size", None)  # derived by DeepSpeed from the three above and the processes


def zero_stage(accelerator) -> int | None:
    """The ZeRO stage of a DeepSpeed run, else None."""
    if accelerator.distributed_type.name != "DEEPSPEED":
        return None
    return int(accelerator.state.deepspeed_plugin.zero_stage)
