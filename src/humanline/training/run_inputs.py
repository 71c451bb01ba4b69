"""What a run reads, fingerprinted: a resume trains on the inputs the run started with, from any directory.

`inputs.json` in the run folder, written when the run starts:

    {"config.yaml": {"size": 812, "sha256": "9f2c..."}, "output_dir": "/home/me/repo/runs/x",
     "inputs": [{"field": "data.train", "given": "recipes/tiny/data/pairs.jsonl",
                 "path": "/home/me/repo/recipes/tiny/data/pairs.jsonl",
                 "from_run": "../../recipes/tiny/data/pairs.jsonl", "kind": "file", "size": 5046, "sha256": "1a2b..."},
                ...]}

The inputs are the local files and folders that `data.train`, `data.eval`, `rollout.prompts`, `eval.prompts`,
`model.name` and the file part of `rollout.reward` / `eval.reward` (`FILE.py:function`, `reward_model:FOLDER`,
in lists too) name. A value that names no local path (a hub name, `reasoning_gym:...`, `tiny`, an alias,
`package:NAME`, `module:function`) is compared as the string it is, like every other setting
(`humanline.training.resume_settings.resume_changes`).

- Paths: `given` is the spelling the run started with (config.yaml holds it too; messages show it), `path` the
  absolute path, `from_run` the path relative to the run folder. A resume reads an input at `path`, else at
  `from_run` (a run folder moved together with its inputs), so it works from any directory; two spellings of one
  file (`x`, `./x`, `/abs/x`) are the same input.
- Fingerprints: a file, its size and SHA-256. Files over `FULL_HASH_LIMIT` (weights, big data) are hashed in
  `SAMPLES` blocks of 1 MiB spread evenly, the first and the last included: rewriting such a file changes the
  hash, an edit of a few bytes between the blocks that keeps the size may not. A folder (a model, a `datasets`
  folder), the same for every file below it (names starting with `.`, caches, skipped), combined into one
  SHA-256 over the sorted names, sizes and hashes. Content only: a copied or touched file is the same input.
- On resume, `config.yaml` must still have its recorded SHA-256 (a hand edit is refused, never applied or ignored
  unrecorded) and every input its recorded fingerprint: no input may change within a run, so a changed one is
  refused with one line naming it. Each segment's line in `segments.jsonl` holds the fingerprints it checked.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from humanline.errors import UserError
from humanline.files import sha256_file, write_json
from humanline.model.loading import ALIASES
from humanline.settings.config import Config
from humanline.training.recipe_paths import PATH_FIELDS, REWARD_FIELDS, map_paths

INPUTS = "inputs.json"
FULL_HASH_LIMIT = 256 * 2**20  # bytes: hashed whole up to this size (about half a second)
SAMPLES, BLOCK = 16, 2**20  # larger files: this many blocks of this many bytes
NAMES = ("tiny", *ALIASES)  # model names that are never a folder (`humanline.model.loading.model_config_for`)
NEW_RUN = "train on the new inputs in a new run (another --output-dir, or --overwrite)"
ENTRY_KEYS = {"field", "given", "path", "from_run", "kind", "size", "sha256"}  # of each input in inputs.json


def local_paths(cfg: Config) -> list[tuple[str, str]]:
    """(field, path as written) for every input of `cfg` that names an existing local file or folder, read from
    the working directory."""
    found: list[tuple[str, str]] = []
    for section, key in PATH_FIELDS + REWARD_FIELDS:
        def note(path: str, field: str = f"{section}.{key}") -> str:
            if _is_local(field, path):
                found.append((field, path))
            return path

        # the field's own value, not a copy of the whole config: a YAML alias bomb in a field no check has read
        # yet (`dataclasses.asdict` would expand it) must not hang the start of a run
        map_paths((section, key), getattr(getattr(cfg, section), key), note)
    return found


def canonical(field: str, value: Any) -> Any:
    """`value` of `field` with each local path it names made absolute and resolved: two spellings of one file
    compare equal. Other values (names, other fields) are returned as they are."""
    section, key = field.split(".", 1)
    return map_paths((section, key), value, lambda p: str(target(field, p)) if _is_local(field, p) else p)


def target(field: str, given: str) -> Path:
    """The file or folder that `given`, a local path in `field`, stands for, absolute: itself, or for a model a
    run folder's `final/` model (`humanline.model.loading.resolve_model_path`: not its checkpoints and logs)."""
    path = Path(given).expanduser().resolve()
    final = path / "final"
    return final if field == "model.name" and (final / "config.json").is_file() else path


def fingerprint(path: Path) -> dict:
    """`{"kind": "file" | "folder", "size": bytes, "sha256": ...}` of a file or folder (module docstring)."""
    if path.is_dir():
        listing = [(str(f.relative_to(path)), *_file_print(f)) for f in _files(path)]
        digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()
        return {"kind": "folder", "size": sum(size for _, size, _ in listing), "sha256": digest}
    size, digest = _file_print(path)
    return {"kind": "file", "size": size, "sha256": digest}


def record_inputs(cfg: Config, out: Path) -> list[dict]:
    """The entries of `inputs.json` for the inputs of `cfg` (paths read from the working directory)."""
    entries = []
    for field, given in local_paths(cfg):
        path = target(field, given)
        entries.append({"field": field, "given": given, "path": str(path),
                        "from_run": os.path.relpath(path, out.resolve()), **fingerprint(path)})
    return entries


def write_inputs(out: Path, entries: list[dict]) -> None:
    """Write `inputs.json`: the entries, the SHA-256 of the `config.yaml` written just before, and the run
    folder's absolute path (config.yaml's `train.output_dir` may be relative to where the run started)."""
    config = out / "config.yaml"
    write_json(out / INPUTS, {"config.yaml": {"size": config.stat().st_size, "sha256": sha256_file(config)},
                              "output_dir": str(out.resolve()), "inputs": entries})


def read_inputs(out: Path) -> dict | None:
    """`inputs.json` of run folder `out` (None: a run started before inputs were recorded)."""
    path = out / INPUTS
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        if isinstance(record["config.yaml"]["sha256"], str) and all(
                isinstance(e, dict) and ENTRY_KEYS <= set(e) for e in record["inputs"]):
            return record
    except (ValueError, KeyError, TypeError):
        pass
    raise UserError(f"{path}: not the record a run writes (damaged?); the run's inputs cannot be checked: start a "
                    f"new run with another --output-dir")


def check_config_unedited(out: Path, record: dict | None) -> None:
    """Refuse a `config.yaml` that no longer has the SHA-256 recorded when the run started (one line)."""
    config = out / "config.yaml"
    if record is None or sha256_file(config) == record["config.yaml"]["sha256"]:
        return
    raise UserError(f"--resume: {config} was edited after the run started (its SHA-256 is not the one in "
                    f"{INPUTS}): undo it, give a change a resume allows as --section.key=value (docs/usage.md, "
                    f"Resuming a run), or start a new run with another --output-dir")


def locate(raw: dict, record: dict | None, out: Path) -> None:
    """Rewrite, in place, the inputs in `raw` (a run's settings as config.yaml holds them) to paths that work
    from the working directory (`located`), and `train.output_dir` to the folder's absolute path at the start."""
    if record is None:
        return
    if isinstance(raw.get("train"), dict) and record.get("output_dir"):
        raw["train"]["output_dir"] = record["output_dir"]  # where it was: a moved folder shows as a change
    where = {(e["field"], e["given"]): str(located(e, out)) for e in record["inputs"]}
    for section, key in PATH_FIELDS + REWARD_FIELDS:
        field = f"{section}.{key}"
        block = raw.get(section)
        if isinstance(block, dict) and key in block:
            block[key] = map_paths((section, key), block[key], lambda p, f=field: where.get((f, p), p))


def located(entry: dict, out: Path) -> Path:
    """Where recorded input `entry` is now: its place relative to the run folder `out` or its absolute path,
    the first that holds the recorded content (a project moved or copied with its run folder reads its own
    copy; a run folder moved alone, the original), else the first that exists (the check then says it changed),
    else the absolute path (gone: the check says so)."""
    places = [p for p in dict.fromkeys([(out / entry["from_run"]).resolve(), Path(entry["path"])]) if p.exists()]
    for place in places if len(places) > 1 else []:  # one place: nothing to choose (the check reads it)
        now = fingerprint(place)
        if (now["size"], now["sha256"]) == (entry["size"], entry["sha256"]):
            return place
    return places[0] if places else Path(entry["path"])


def check_inputs(cfg: Config, record: dict | None, out: Path) -> list[dict]:
    """Refuse (one line) a resume of run `out` whose inputs are not those it started with: one gone, one changed,
    or a local path in `cfg` the run did not read. Returns this segment's inputs (`segment_prints` puts them in
    `segments.jsonl`). A run without `inputs.json` is not checked: its inputs are recorded from now on."""
    if record is None:
        return record_inputs(cfg, out)
    checked = []
    for entry in record["inputs"]:
        place = located(entry, out)
        if not place.exists():
            raise UserError(f"--resume: {entry['field']}: the run's {entry['kind']} '{entry['given']}' is gone (not at "
                            f"{entry['path']}); restore it, or {NEW_RUN}",
                            details=f"looked for at {entry['path']} and {out / entry['from_run']}")
        now = fingerprint(place)
        if (now["size"], now["sha256"]) != (entry["size"], entry["sha256"]):
            raise UserError(f"--resume: {entry['field']}: {entry['kind']} '{entry['given']}' changed since the run "
                            f"started ({_short(entry)} then, {_short(now)} now): restore it, or {NEW_RUN}",
                            details=f"read at {place}")
        checked.append({**entry, "path": str(place.resolve())})
    known = {(e["field"], e["path"]) for e in checked}
    for field, given in local_paths(cfg):
        if (field, str(target(field, given))) not in known:
            raise UserError(f"--resume: {field}: '{given}' names a local file or folder the run did not read when it "
                            f"started; {NEW_RUN}")
    return checked


def segment_prints(entries: list[dict]) -> dict:
    """`{field: {path: "size sha256"}}`: the fingerprints a segment's line in `segments.jsonl` records."""
    out: dict = {}
    for e in entries:
        out.setdefault(e["field"], {})[e["given"]] = {"size": e["size"], "sha256": e["sha256"]}
    return out


def _is_local(field: str, path: str) -> bool:
    if not isinstance(path, str) or not path or path.startswith("package:"):
        return False
    if field == "model.name" and path in NAMES:
        return False
    try:
        return Path(path).expanduser().exists()
    except OSError:  # a name too long for a path, say
        return False


def _files(folder: Path) -> list[Path]:
    """Every file below `folder`, sorted, without hidden names (caches such as `.cache/`)."""
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _file_print(path: Path) -> tuple[int, str]:
    size = path.stat().st_size
    return size, (sha256_file(path) if size <= FULL_HASH_LIMIT else _sha256_sampled(path, size))


def _sha256_sampled(path: Path, size: int) -> str:
    """SHA-256 of `SAMPLES` blocks spread evenly over the file (the first and last included), and its size."""
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        for i in range(SAMPLES):
            handle.seek((size - BLOCK) * i // (SAMPLES - 1))
            digest.update(handle.read(BLOCK))
    return "sampled:" + digest.hexdigest()


def _short(entry: dict) -> str:
    return f"{entry['size']} bytes, SHA-256 {entry['sha256'].removeprefix('sampled:')[:12]}"
