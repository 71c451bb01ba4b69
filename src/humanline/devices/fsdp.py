"""FSDP2 (`torch.distributed.fsdp.fully_shard`) as the training loop meets it: sharded parameters, in step.

Under FSDP every rank holds a shard of each parameter. A forward of a sharded module all-gathers each layer
and frees it again after, and its backward reduce-scatters the gradients: collective calls that every rank
must make in the same order. What follows from that, in one place:

- `enable_on_cpu`: accelerate (1.15) turns FSDP on only for GPU-type process groups; launched with an FSDP
  config on the CPU (gloo) it silently trains with DDP. There the run's accelerator is switched to
  accelerate's own FSDP2 path (the same `prepare`, state dicts and checkpoints as on GPUs).
- `full_weights`: generation runs a rank-dependent number of forwards (its own prompts, its own stopping
  points), which sharded layers cannot do in step. Every FSDP module is unsharded once (all-gathered; every
  rank calls this together), generation runs on the full weights without any collective, and the modules are
  resharded after.
- `sharded_copy`, `copy_shards_`: a second model (the reference) sharded like the policy; syncing it copies
  each rank's local shards in place, so all ranks together hold the policy's whole pre-update weights, with
  no communication and no full copy on any rank.
- `local_state` / `load_local_state`: a sharded model's own shards, for a per-process checkpoint file.
"""

from __future__ import annotations

import contextlib
import copy
import os

import torch


def _fsdp_module_type():
    from torch.distributed.fsdp import FSDPModule  # deferred: torch.distributed is not needed by a 1-process run

    return FSDPModule


def fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of `model` that `fully_shard` turned into FSDP units, root first (module order)."""
    if not torch.distributed.is_available():
        return []
    kind = _fsdp_module_type()
    return [m for m in model.modules() if isinstance(m, kind)]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` (or a module inside it) is sharded by FSDP2, or partitioned by DeepSpeed ZeRO-3 (whose
    forwards gather each layer, collectively, as FSDP's do)."""
    return bool(fsdp_modules(model)) or any(hasattr(p, "ds_id") for p in model.parameters())


def enable_on_cpu(accelerator) -> bool:
    """Switch a CPU process group launched with an FSDP accelerate config (`ACCELERATE_USE_FSDP=true`, as
    `accelerate launch --config_file recipes/accelerate/fsdp.yaml` sets) from DDP to accelerate's FSDP path,
    before anything is prepared. Returns whether it did. On GPUs accelerate does this itself."""
    from accelerate.state import PartialState  # deferred: accelerate is heavy to import
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin()  # read from the FSDP_* variables the launcher set
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    state = accelerator.state
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # gather/reduce helpers read this one
    return True


@contextlib.contextmanager
def full_weights(model: torch.nn.Module):
    """Within the block every parameter of a sharded `model` is whole (plain tensors), on every rank, and
    forwards of it make no collective call: any number of them per rank (generation). Every rank must enter
    the block together (it all-gathers). A model that is not sharded is left as it is."""
    units = fsdp_modules(model)
    if not units:
        yield model
        return
    # The root's lazy set-up (which unit is the root) runs at its first forward; generation may come before any
    # forward and call the layers one by one (humanline.sampling.decode), which needs it done.
    units[0]._get_fsdp_state()._lazy_init()
    for unit in units:
        unit.unshard()
    # A forward would otherwise free the gathered weights after each unit (and gather them anew, collectively).
    # FSDP2 can set this flag but not read it back: keep its own record of it, to restore.
    states = [unit._get_fsdp_state() for unit in units]
    saved = [(s, s._auto_reshard_after_forward, [(g, g.post_forward_mesh_info) for g in s._fsdp_param_groups])
             for s in states]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield model
    finally:
        for state, auto, groups in saved:
            state._auto_reshard_after_forward = auto
            for group, info in groups:
                group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter of `model`, so that its registered parameters are the shards again."""
    for unit in fsdp_modules(model):
        unit.reshard()


def sharded_copy(accelerator, model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the not-yet-prepared `model`, sharded like accelerate shards the policy (the same
    FSDP units, so that each rank's shards of the copy and of the policy line up parameter by parameter)."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model  # deferred: accelerate is heavy to import

    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return fsdp2_prepare_model(accelerator, ref)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A rank's own shard of a DTensor parameter (a plain tensor is its own shard)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@torch.no_grad()
def copy_shards_(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """Copy `source`'s parameters and buffers into `target` in place, shard by shard (both sharded alike)."""
    reshard(source)
    reshard(target)
    for dst, src in zip(target.parameters(), source.parameters(), strict=True):
        _local(dst).copy_(_local(src).detach())
    for dst, src in zip(target.buffers(), source.buffers(), strict=True):
        dst.copy_(src)


def local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shards of `model`'s parameters (and its buffers), on the CPU, by parameter name."""
    reshard(model)
    state = {name: _local(p).detach().cpu().clone() for name, p in model.named_parameters()}
    state.update({f"buffer:{name}": b.detach().cpu().clone() for name, b in model.named_buffers()})
    return state


@torch.no_grad()
def load_local_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what `local_state` saved on this rank (the same number of processes) back into `model`."""
    reshard(model)
    for name, p in model.named_parameters():
        _local(p).copy_(state[name])
    for name, b in model.named_buffers():
        b.copy_(state[f"buffer:{name}"])


def unsharded_peft_copy(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A plain copy, on the CPU, of the sharded peft `model` holding `state` (its gathered full state dict):
    peft saves and merges adapters through the tensors themselves, which a sharded model only has in shards."""
    import peft  # deferred: an optional dependency (LoRA runs only)
    from transformers import AutoModelForCausalLM

    config = model.get_base_model().config
    base = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    copy_ = peft.get_peft_model(base, model.peft_config[model.active_adapter])
    copy_.load_state_dict(state)
    return copy_


def drop_tied_copies(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (a gathered full state dict of `model`) without the later names of tied parameters (an output
    layer tied to the input embedding): gathered, they are separate tensors, and `save_pretrained` would store
    both, where it stores a tied weight once."""
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            state.pop(name, None)
    return state


@torch.no_grad()
def copy_local_pairs_(pairs_of, *models: torch.nn.Module) -> None:
    """Copy, for each `(target, source)` tensor pair that `pairs_of()` lists, this rank's shard of the source
    into the target's, in place. `models` are resharded first, and only then are the pairs read: gathered
    parameters are other tensors than the shards."""
    for model in models:
        reshard(model)
    for target, source in pairs_of():
        _local(target).copy_(_local(source).detach())
