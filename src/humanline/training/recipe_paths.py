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
from typing import Any

PATH_FIELDS = (("data", "train"), ("data", "eval"), ("rollout", "prompts"), ("eval", "prompts"), ("model", "name"))
REWARD_FIELDS = (("rollout", "reward"), ("eval", "reward"))


def resolve_recipe_paths(raw: dict, recipe: str | Path) -> None:
    """Rewrite, in place, the relative paths of `raw` (a recipe's sections as read from `recipe`) to paths that
    work from the current directory (see the module docstring)."""
    base = Path(recipe).parent
    for section, key in PATH_FIELDS:
        block = raw.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            block[key] = resolve(block[key], base)
    for section, key in REWARD_FIELDS:
        block = raw.get(section)
        if isinstance(block, dict) and key in block:
            block[key] = _reward(block[key], base)


def resolve(value: str, base: Path) -> str:
    """`value` read from `base` when it exists there, else (as written) from the working directory."""
    path = Path(value)
    if not value or path.is_absolute() or value.startswith(("~", "package:")):
        return value
    beside = base / path
    if beside.exists():
        return _short(beside)
    return value


def _reward(spec: Any, base: Path) -> Any:
    """A reward spec with its file part resolved: `reward_model:PATH` and `FILE.py:function`, also in lists."""
    if isinstance(spec, list):
        return [_reward(item, base) for item in spec]
    if isinstance(spec, dict) and isinstance(spec.get("type"), str):
        return {**spec, "type": _reward(spec["type"], base)}
    if not isinstance(spec, str):
        return spec
    if spec.startswith("reward_model:"):
        return "reward_model:" + resolve(spec[len("reward_model:"):], base)
    file, sep, function = spec.rpartition(":")
    if sep and file.endswith(".py"):
        return f"{resolve(file, base)}:{function}"
    return spec


def _short(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (the value the recipe held, when run from
    the repository root), else absolute."""
    absolute = path.resolve()
    try:
        return str(absolute.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(absolute)
