"""humanline: perceptual (humanline) DPO, KTO and GRPO — reference syncing and asymmetric clipping of token
log-ratios, for offline, online and sparse-online alignment of causal language models.

The functional API is what the sub-packages export: `humanline.core` (the transforms, log-prob helpers, masked
reductions, prospect theory) and `humanline.objectives` (the pure losses), each by its own `__all__`, so a new
loss is exported here by its line in `humanline/objectives/__init__.py` alone."""

from humanline import core, objectives
from humanline.core import *  # noqa: F403 - the names of core.__all__
from humanline.errors import UserError
from humanline.objectives import *  # noqa: F403 - the names of objectives.__all__
from humanline.version import __version__

__all__ = ["__version__", "UserError", *core.__all__, *objectives.__all__]


# name -> module of the heavier entry points (torch models, accelerate), imported on first use
_LAZY = {"Trainer": "humanline.training.loop", "load_config": "humanline.training.config_loading",
         "evaluate_generations": "humanline.evaluation.generations"}


def __getattr__(name: str):  # lazy: keep `import humanline` light for users of the functional API
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'humanline' has no attribute {name!r}")
