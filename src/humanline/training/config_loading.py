"""Reading a config: a YAML recipe plus `--section.key=value` overrides into a checked `Config`.

`load_config` builds the dataclasses of `humanline.settings.config` field by field (types coerced, unknown fields
named with a close match) and runs the start-up checks (`humanline.training.config_checks.validate`), which raise
a `UserError` naming the field (`humanline.low`) and the allowed range. YAML is read strictly
(`humanline.training.yaml_io`): `1e-6` is a number, duplicate keys and non-UTF-8 files are errors.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from pathlib import Path
from typing import Any, get_type_hints

from humanline.errors import UserError, short_repr
from humanline.settings.config import Config
from humanline.training import yaml_io
from humanline.training.config_checks import validate
from humanline.training.recipe_paths import resolve_recipe_paths


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate.

    `overrides` is a list of `section.key=value` strings (values parsed as YAML) or a nested dict.
    """
    raw: Any = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        raw = yaml_io.read(path)
        if raw is None or raw == {}:  # not "missing data.train": the file itself holds no settings
            raise UserError(f"{path}: the recipe is empty (expected sections such as model:, data:, objective:, "
                            f"train:; `humanline config` lists every field, recipes/ holds examples)")
        if not isinstance(raw, dict):
            raise UserError(f"{path}: expected a mapping of sections (model:, data:, ...), got {type(raw).__name__}")
        resolve_recipe_paths(raw, path)  # the recipe's relative paths: from its folder first (not the overrides')
    given: dict[str, str] = {}  # dotted key -> where it came from, for the fields not read from the recipe
    if isinstance(overrides, dict):
        yaml_io.check_depth(overrides, "overrides")
        given = {k: "overrides" for k in _dotted(overrides, raw)}
        merge_dicts(raw, overrides)
    else:
        given = _apply_command_line(raw, overrides or [])
    cfg = _build(Config, raw, source, "", given)
    validate(cfg)
    return cfg


def load_config_on(base: dict, overrides: list[str], source: str) -> Config:
    """A config from `base` (a whole config as a nested dict: a run's recorded settings) with
    `section.key=value` overrides, checked like `load_config`'s; `source` names `base` in errors."""
    raw = copy.deepcopy(base)
    cfg = _build(Config, raw, source, "", _apply_command_line(raw, overrides))
    validate(cfg)
    return cfg


def _apply_command_line(raw: dict, overrides: list[str]) -> dict[str, str]:
    """Merge `--section.key=value` overrides into `raw`; returns where each field they set came from (an error
    in one names the flag, not the recipe)."""
    given: dict[str, str] = {}
    for item in overrides:
        parsed = _parse_override(item)
        given |= dict.fromkeys(_dotted(parsed, raw), f"command line ({_flag(item)})")
        merge_dicts(raw, parsed)
    return given


def _parse_override(item: str) -> dict:
    text = item[2:] if item.startswith("--") else item
    if "=" not in text:
        raise UserError(f"override {short_repr(item)}: expected section.key=value")
    key, value = text.split("=", 1)
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"override {short_repr(item)}: expected section.key=value (e.g. --humanline.sync_every=4)")
    # A value that is not valid YAML is taken as the string it is (a path with odd characters, say).
    parsed = yaml_io.parse(value, f"override --{key}", lenient=True) if value != "" else None
    return {parts[0]: {parts[1]: parsed}}


def _flag(item: str) -> str:
    """An override as the user typed it on the command line (`--section.key=value`)."""
    text = short_repr(item if item.startswith("--") else f"--{item}")
    return text[1:-1] if text[:1] == text[-1:] == "'" else text


def _dotted(extra: dict, base: dict, prefix: str = "") -> list[str]:
    """The dotted keys `extra` sets: each leaf, and each section the recipe `base` does not have (so an error
    about either is blamed on the override, not on the recipe)."""
    out = []
    for key, value in extra.items():
        dotted = f"{prefix}{key}"
        inner = base.get(key) if isinstance(base, dict) else None
        if isinstance(value, dict) and isinstance(inner, dict):
            out += _dotted(value, inner, f"{dotted}.")
        else:
            out += [dotted] + (_dotted(value, {}, f"{dotted}.") if isinstance(value, dict) else [])
    return out


def merge_dicts(base: dict, extra: dict) -> None:
    """Recursively merge `extra` into `base` (nested dicts merge, other values replace)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_dicts(base[key], value)
        else:
            base[key] = value


def _build(cls, raw: dict, recipe: str, prefix: str, given: dict[str, str]):
    """`cls` from `raw`; an error names where the field came from: `given[dotted]` (an override) or `recipe`."""
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        source = given.get(dotted, recipe)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else f" (known: {', '.join(names)})"
            raise UserError(f"{source}: unknown config field '{dotted}'{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"{source}: config section '{dotted}' must be a mapping, got {short_repr(value)}")
            kwargs[key] = _build(hint, value, recipe, f"{dotted}.", given)
        else:
            kwargs[key] = _coerce(value, hint, f"{source}: config field '{dotted}'")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    text = str(hint)
    if value is None:
        if "None" in text or hint is Any:
            return None
        raise UserError(f"{where}: expected {_expected(text)}, got null")
    if hint is Any:
        return value
    if text.startswith("list") or "list[" in text:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {short_repr(value)}")
        inner = getattr(hint, "__args__", (Any,))[0]
        return [_coerce(item, inner, f"{where}[{i}]") for i, item in enumerate(value)]
    if text.startswith("bool") or hint is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {short_repr(value)}")
        return value
    if "int" in text and "str" in text:  # a number or a named setting (humanline.sync_every: 4 or auto)
        if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
            raise UserError(f"{where}: expected an integer or a name, got {short_repr(value)}")
        return value
    if "int" in text and "float" not in text:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {short_repr(value)}")
        return value
    if "float" in text:
        return _finite(value, where)
    if "str" in text:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise UserError(f"{where}: expected a string, got {short_repr(value)}")
        if value == "":
            raise UserError(f"{where}: expected a non-empty string, got ''")
        return str(value)
    return value


def _finite(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: expected a number (such as 0.5 or 1e-6), got {short_repr(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):  # .nan/.inf parse as YAML floats but no field has a use for them
        raise UserError(f"{where}: expected a finite number, got {short_repr(value)}")
    return number


def _expected(text: str) -> str:
    """What a field of type `text` expects, for the error about a null value."""
    if "list" in text:
        return "a list"
    if "bool" in text:
        return "true or false"
    if "int" in text and "float" not in text:
        return "an integer"
    return "a number" if "float" in text else "a string"
