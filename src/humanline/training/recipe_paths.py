"""Where a recipe's relative paths point: the recipe's own folder first, then the working directory.

A recipe names its data, prompts, reward file and model folder relative to where it lives (the shipped recipes
say `data/pairs.jsonl`, `rewards.py:digits`), so it runs from any directory. A path not found beside the recipe
is read from the working directory, as older recipes wrote it (`recipes/tiny/data/pairs.jsonl` from the
repository root); so is one found in neither place (data yet to be made, a hub name, `tiny`): the one line
about a missing file then names the working directory and says that the recipe's folder came first
(`humanline.data.sources.relative_to_cwd`). Command-line overrides are not touched: they are read from the
working directory, as shell paths are. `train.output_dir` is no recipe input and stays relative to the working
directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

PATH_FIELDS = (("data", "train"), ("data", "eval"), ("rollout", "prompts"), ("eval", "prompts"), ("model", "name"))
REWARD_FIELDS = (("rollout", "reward"), ("eval", "reward"))


def resolve_recipe_paths(raw: dict, recipe: str | Path) -> None:
    """Rewrite, in place, the relative paths of `raw` (a recipe's sections as read from `recipe`) to paths that
    work from the current directory (see the module docstring)."""
    base = Path(recipe).parent
    for section, key in PATH_FIELDS + REWARD_FIELDS:
        block = raw.get(section)
        if isinstance(block, dict) and key in block:
            block[key] = map_paths((section, key), block[key], lambda value: resolve(value, base))


def map_paths(field: tuple[str, str], value: Any, fn: Callable[[str], str]) -> Any:
    """`value` of field `field` (section, key) with `fn` applied to each path it may name: the whole value of a
    `PATH_FIELDS` field, the file part of a `REWARD_FIELDS` spec (`reward_model:PATH`, `FILE.py:function`, also
    in lists and `{type: ...}` mappings). Other fields and values are returned as they are."""
    if field in REWARD_FIELDS:
        return _reward(value, fn)
    return fn(value) if field in PATH_FIELDS and isinstance(value, str) else value


def resolve(value: str, base: Path) -> str:
    """`value` read from `base` when it exists there, else (as written) from the working directory."""
    path = Path(value)
    if not value or path.is_absolute() or value.startswith(("~", "package:")):
        return value
    beside = base / path
    if beside.exists():
        return _short(beside)
    return value


def _reward(spec: Any, fn: Callable[[str], str]) -> Any:
    """A reward spec with `fn` applied to its file part: `reward_model:PATH` and `FILE.py:function`, also in
    lists and mappings."""
    if isinstance(spec, list):
        return [_reward(item, fn) for item in spec]
    if isinstance(spec, dict) and isinstance(spec.get("type"), str):
        return {**spec, "type": _reward(spec["type"], fn)}
    if not isinstance(spec, str):
        return spec
    if spec.startswith("reward_model:"):
        return "reward_model:" + fn(spec[len("reward_model:"):])
    file, sep, function = spec.rpartition(":")
    if sep and file.endswith(".py"):
        return f"{fn(file)}:{function}"
    return spec


def _short(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (the value the recipe held, when run from
    the repository root), else absolute."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)
