"""`run_info.json`: what a run ran on (software versions, the code's git commit when humanline runs from a
checkout, device, precision, distribution, the reference strategy and the forward path the policy took), for
reading its figures and reproducing it."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import torch

from humanline.model.capabilities import forward_path
from humanline.version import __version__


def describe_run(model: torch.nn.Module, unwrapped: torch.nn.Module, accelerator, reference_name: str) -> dict:
    """The facts of a run after its first step (the forward path is known once a batch went through)."""
    import accelerate  # deferred: heavy, and only their version strings are read here
    import transformers

    param = next(model.parameters())
    return {
        "humanline": __version__, "code": code_commit(),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "accelerate": accelerate.__version__,
        "device": str(param.device), "device_name": _device_name(param.device), "dtype": str(param.dtype),
        "mixed_precision": str(accelerator.mixed_precision), "processes": accelerator.num_processes,
        "distributed": str(accelerator.distributed_type).rsplit(".", 1)[-1],
        "gradient_checkpointing": _checkpointing(unwrapped),
        "reference": reference_name, "forward_path": forward_path(model),
    }


def record_run_info(model: torch.nn.Module, unwrapped: torch.nn.Module, accelerator, reference_name: str,
                    output_dir: str | Path, logger) -> dict:
    """After a run's first step: describe it, log its forward path, and write `run_info.json` (main process)."""
    info = describe_run(model, unwrapped, accelerator, reference_name)
    logger.info(f"forward: {info['forward_path'] or 'not run yet (no completion tokens)'}")
    if accelerator.is_main_process:
        write_run_info(info, output_dir)
    return info


def write_run_info(info: dict, output_dir: str | Path) -> Path:
    path = Path(output_dir) / "run_info.json"
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


def code_commit(where: str | Path | None = None) -> str | None:
    """The git commit of the humanline source a run imports (or of the checkout holding `where`), with `+modified`
    when tracked files differ from it; None when it is not a git checkout (an installed wheel) or git is missing."""
    here = Path(where) if where is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        changed = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+modified" if changed.stdout.strip() else "")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()


def _checkpointing(model) -> bool:
    """Whether transformers' activation (gradient) checkpointing is on (the property was renamed in 5.x)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or hasattr(model, name):
            return bool(getattr(model, name))
    return False
