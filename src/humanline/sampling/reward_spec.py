"""A reward from a config value: the grammar of reward specs (`rollout.reward`, `eval.reward`, `--reward`).

    math_verify                                   a kind of `rewards.REWARD_TYPES` by name
    reward_model:PATH                             a sequence-classification reward model
    module:function, path/to/file.py:function     a callable of the reward protocol
    {type: NAME, weight: W, **arguments}          a kind (or callable) with its arguments, weighted
    [spec, ...]                                   their weighted sum

`build_reward` reads one; each error names the config field and what was expected.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from pathlib import Path
from typing import Any, Callable

from humanline.data.sources import relative_to_cwd
from humanline.errors import UserError, short_repr
from humanline.sampling.reward_scoring import RewardFn, one_line
from humanline.sampling.rewards import REWARD_TYPES, RewardModelReward, WeightedSum


def load_callable(spec: str) -> RewardFn:
    """The callable named `module:function` (dotted attribute after the colon allowed) or `path/file.py:function`."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"reward '{spec}': expected 'module:function' or 'path/to/file.py:function'")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name)
            if not file.is_file():
                raise UserError(f"reward '{spec}': file {module_name} not found{relative_to_cwd(file)} (expected "
                                f"path/to/file.py:function)")
            mod_spec = importlib.util.spec_from_file_location(f"humanline_user_reward_{file.stem}", file)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"reward '{spec}': cannot import {module_name} ({one_line(exc)}); expected an "
                        f"importable module:function or path/to/file.py:function") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"reward '{spec}': {module_name} has no attribute '{attr}' (expected module:function)")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"reward '{spec}': '{attr}' is not callable (expected a function)")
    return obj


def _parameters(cls: Callable) -> str:
    """`pattern (required), score=1.0` for a reward type's constructor: what its spec may hold."""
    import inspect

    params = [p for p in inspect.signature(cls).parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return ", ".join(f"{p.name} (required)" if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)


def _from_name(name: str, kwargs: dict[str, Any], where: str) -> RewardFn:
    if name in REWARD_TYPES:
        try:
            return REWARD_TYPES[name](**kwargs)
        except TypeError as exc:
            expected = _parameters(REWARD_TYPES[name])
            raise UserError(f"{where}: bad arguments for reward type '{name}': expected {expected}, got "
                            f"{sorted(kwargs) or 'none'} ({one_line(exc)})") from exc
    if ":" in name:
        fn = load_callable(name)
        return functools.partial(fn, **kwargs) if kwargs else fn
    allowed = ", ".join([*REWARD_TYPES, "'module:function'", "'reward_model:PATH'"])
    raise UserError(f"{where}: unknown reward '{name}'; expected one of {allowed}")


def _from_dict(spec: dict[str, Any], where: str) -> tuple[float, RewardFn]:
    kwargs = dict(spec)
    name = kwargs.pop("type", None)
    if not isinstance(name, str):
        raise UserError(f"{where}.type: expected a reward name such as 'math_verify', got {short_repr(name)}")
    weight = kwargs.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise UserError(f"{where}.weight: expected a finite number, got {short_repr(weight)}")
    return float(weight), _from_name(name, kwargs, where)


def build_reward(spec: Any, where: str = "reward") -> RewardFn:
    """A reward from a config value.

    spec: a callable (returned as is); a string: "math_verify", "exact_match", "reward_model:PATH" or
    "module:function"; a dict {"type": NAME, "weight": W, **kwargs} (NAME as above, or "regex" with
    `pattern`); or a list of such dicts, summed with their weights. `where` names the config field in errors.
    """
    if callable(spec):
        return spec
    if isinstance(spec, str):
        if spec.startswith("reward_model:"):
            return RewardModelReward(spec[len("reward_model:") :])
        return _from_name(spec, {}, where)
    if isinstance(spec, dict):
        weight, fn = _from_dict(spec, where)
        return fn if weight == 1.0 else WeightedSum([(weight, fn)])
    if isinstance(spec, (list, tuple)) and spec:
        terms = []
        for i, item in enumerate(spec):
            if isinstance(item, str):
                item = {"type": item}
            if not isinstance(item, dict):
                raise UserError(f"{where}[{i}]: expected a reward name or {{type: ..., weight: ...}}, got "
                                f"{short_repr(item)}")
            terms.append(_from_dict(item, f"{where}[{i}]"))
        return WeightedSum(terms)
    raise UserError(f"{where}: expected a reward name, a {{type: ...}} mapping or a list of them, got "
                    f"{short_repr(spec)}")
