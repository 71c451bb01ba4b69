"""The reproduction's keys under the experiments' one cache rule (`harness.cache`), and which run a run folder holds.

Every cached artefact of `humanline reproduce` (the offline data, the base policy's evaluations, each run, each
final-model evaluation) records `"key": cache_key(what it depends on)`, a dict, and is reused exactly when the key
it would be made with now is the one it holds (`data`, `runs`). Nothing else is read.

A run's key (`run_key`) hashes the config fields that differ from their defaults, with paths under the output
folder written relative to it (`<output>/...`, so the folder can move), and the content of the files they name (so
a run folder copied next to other data is not taken for a run on these). A run folder records its key and settings
in `reproduce.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from humanline.experiments.harness.cache import cache_key, file_hash
from humanline.settings.config import Config
from humanline.training.run_dir import held_run


def changed_fields(cfg: Config, out: Path | None = None) -> dict:
    """The config fields that differ from their defaults, by section (a field added later, at its default, leaves
    every finished run's key alone; one set away from it keys the run anew). The drift rule's settings act only
    under `humanline.sync_every: auto`, so elsewhere they are left out. With `out`, paths under it are written
    relative to it (`<output>/...`)."""
    fields, defaults = cfg.to_dict(), Config().to_dict()
    if fields["humanline"]["sync_every"] != "auto":
        for name in ("sync_drift", "sync_min", "sync_max"):
            fields["humanline"][name] = defaults["humanline"][name]
    changed = {}
    for section, values in fields.items():
        if isinstance(values, dict):
            values = {name: value for name, value in values.items() if value != defaults[section].get(name)}
        if values and values != defaults.get(section):
            changed[section] = values
    return changed if out is None else _relative(changed, str(out))


def _relative(value, root: str):
    if isinstance(value, dict):
        return {name: _relative(v, root) for name, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, root) for v in value]
    if isinstance(value, str) and (value == root or value.startswith(root + "/")):
        return "<output>" + value[len(root):]
    return value


def run_key(cfg: Config, out: Path) -> str:
    """The run's key: its changed fields with paths relative to the output folder `out` (the folder can move) and
    the content hash of each file under it that the config names (`files`, left out when there is none)."""
    fields = changed_fields(cfg, out)
    named = {path: out / path.removeprefix("<output>/") for path in _strings(fields) if path.startswith("<output>/")}
    files = {path: file_hash(file) for path, file in named.items() if file.is_file()}
    return cache_key({**fields, "files": files} if files else fields)


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def replace_hint(runs: int = 1) -> str:
    """What to do about `runs` run folders that hold runs made with other settings."""
    made, folder = ("it was", "the folder") if runs == 1 else ("they were", "those folders")
    return f"pass the flags {made} made with, or use another --output-dir, or remove {folder} to train anew with " \
           "these settings"


def recorded_keys(run_dir: Path) -> set[str]:
    """The keys that the run in `run_dir` was recorded under (its marker's and its summary's)."""
    found = set()
    for name in ("reproduce.json", "summary.json"):
        path = run_dir / name
        if path.exists() and isinstance(key := json.loads(path.read_text()).get("key"), str):
            found.add(key)
    return found


def other_settings(run_dir: Path, key: str, fields: dict) -> str | None:
    """What differs, when `run_dir` holds a run (a summary, a checkpoint, a final model) made with other settings
    than `key`; None when it holds none, or this one."""
    if not (run_dir / "summary.json").exists() and not held_run(run_dir):
        return None
    if key in recorded_keys(run_dir):
        return None
    marker = run_dir / "reproduce.json"
    before = json.loads(marker.read_text()).get("settings") if marker.exists() else None
    if not isinstance(before, dict):
        return "made before runs recorded their settings, or in another folder"
    there, here = _flat(before), _flat(json.loads(json.dumps(fields, default=str)))  # as the marker holds it
    differ = [f"{name} {there.get(name, '(default)')} there, {here.get(name, '(default)')} here"
              for name in sorted(set(there) | set(here)) if there.get(name) != here.get(name)]
    if not differ:
        return "the same settings, other content in the data files they name"
    return "; ".join(differ[:3]) + (f"; {len(differ) - 3} more" if len(differ) > 3 else "")


def _flat(fields: dict) -> dict:
    """`section.field` -> value of `changed_fields`' sections."""
    return {f"{section}.{name}": value for section, values in fields.items()
            for name, value in (values.items() if isinstance(values, dict) else [("", values)])}
