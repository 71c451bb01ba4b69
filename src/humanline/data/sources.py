"""Read raw rows, each with its file and line (or row), from JSONL, JSON, CSV, Parquet and `datasets`.

Readers never validate fields: they return `RawRow`s, and a row that cannot even be parsed (invalid JSON,
bad UTF-8) carries a `parse_error` so the loader reports it like any other problem. Only problems with the
whole source (missing file, unreadable Parquet, unknown split) raise `UserError` here.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from humanline import hub
from humanline.data import reasoning_gym
from humanline.data.records import Location
from humanline.errors import UserError

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# CSV cells are strings; these columns hold JSON lists/objects or booleans in the other formats.
_CSV_JSON = {"completions", "scores", "all_generated_responses", "all_rm_scores", "metadata"}
_CSV_MESSAGES = {"prompt", "chosen", "rejected", "completion"}
_CSV_BOOL = {"label", "desirable"}
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


@dataclass
class RawRow:
    location: Location
    value: Any = None
    parse_error: str | None = None  # the row (or one CSV cell) could not be parsed
    parse_field: str | None = None


def read_source(source: str, split: str) -> list[RawRow]:
    """All rows of split `split` (a name, no slice) of a file, a local `datasets` folder, a hub dataset, or a
    reasoning-gym task (`reasoning_gym:NAME?...`, humanline.data.reasoning_gym)."""
    if reasoning_gym.is_task_source(source):
        _single_split(source, split)
        return [RawRow(Location(source, i, "row"), row) for i, row in enumerate(reasoning_gym.task_rows(source))]
    path = Path(source)
    if path.is_file():
        return _read_file(path, str(source), split)
    if path.is_dir():
        return _read_folder(path, str(source), split)
    if path.suffix.lower() in SUFFIXES or "/" not in str(source) or str(source).startswith((".", "/", "~")):
        raise UserError(f"{source}: no such file or folder{relative_to_cwd(path)} (hub datasets are named owner/name)")
    return _read_hub(str(source), split)


def relative_to_cwd(path: Path) -> str:
    """For the one line about a missing relative path: the directory it was read from (a recipe's relative paths
    were tried beside the recipe first, `humanline.training.recipe_paths`)."""
    if path.is_absolute() or str(path).startswith("~"):
        return ""
    return f" in the working directory {Path.cwd()} (nor, for a recipe's path, beside the recipe)"


def _single_split(name: str, split: str) -> None:
    if split != "train":
        raise UserError(f"{name}: a single file holds one split, 'train'; got split '{split}' "
                        f"(select part of it with e.g. 'train[90%:]', or hold out prompts with data.eval_fraction)")


def _read_file(path: Path, name: str, split: str) -> list[RawRow]:
    suffix = path.suffix.lower()
    if suffix == ".json":
        return read_json(path, name, split)
    _single_split(name, split)
    if suffix == ".jsonl":
        return read_jsonl(path, name)
    if suffix == ".csv":
        return read_csv(path, name)
    if suffix == ".parquet":
        return read_parquet(path, name)
    raise UserError(f"{name}: unsupported file type '{suffix}' (expected {', '.join(SUFFIXES)})")


# No record format nests deeper than a few levels (a list of message objects); Python's own limit on the
# JSON parser's recursion differs between versions (3.12 parses 5,000 levels that 3.11 refuses).
MAX_DEPTH = 100


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests lists/objects more than `limit` levels deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _parse_json(text: str) -> tuple[Any, str | None]:
    too_deep = f"invalid JSON: nested too deeply (more than {MAX_DEPTH} levels)"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} (column {exc.colno})"
    except RecursionError:
        return None, too_deep
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        return None, f"invalid JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return (None, too_deep) if _too_deep(value) else (value, None)


def read_jsonl(path: Path, name: str) -> list[RawRow]:
    """One JSON object per line; blank lines are skipped; line numbers are 1-based."""
    rows = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            location = Location(name, number)
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                rows.append(RawRow(location, parse_error=f"not valid UTF-8 text (byte {exc.start + 1} of the line)"))
                continue
            if not text.strip():
                continue
            value, error = _parse_json(text.rstrip("\r\n"))
            rows.append(RawRow(location, value, error))
    return rows


def _read_text(path: Path, name: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise UserError(f"{name}:{line}: not valid UTF-8 text") from exc


def read_json(path: Path, name: str, split: str) -> list[RawRow]:
    """A JSON list of records, or an object mapping split names to such lists; JSON Lines are accepted too."""
    text = _read_text(path, name)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # a JSON Lines file named .json
            _single_split(name, split)
            return read_jsonl(path, name)
        raise UserError(f"{name}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
    except RecursionError as exc:
        raise UserError(f"{name}: invalid JSON: nested too deeply") from exc
    except ValueError as exc:
        raise UserError(f"{name}: invalid JSON: {exc}") from exc
    if _too_deep(value, MAX_DEPTH + 1):  # the list of records is one level more
        raise UserError(f"{name}: invalid JSON: nested too deeply (more than {MAX_DEPTH} levels in a record)")
    if isinstance(value, list):
        _single_split(name, split)
        return [RawRow(Location(name, line), item) for line, item in zip(_item_lines(text), value)]
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        if split not in value:
            raise UserError(f"{name}: no split '{split}' (splits: {', '.join(map(str, value))})")
        return [RawRow(Location(f"{name}[{split}]", i, "row"), item) for i, item in enumerate(value[split])]
    kind = "an object" if isinstance(value, dict) else type(value).__name__
    raise UserError(f"{name}: expected a JSON list of records (or an object mapping split names to lists), got {kind}")


def _item_lines(text: str) -> list[int]:
    """1-based line where each element of a top-level JSON array starts (the text is known to be valid)."""
    decoder, lines = json.JSONDecoder(), []
    pos, line, counted = text.index("[") + 1, 1, 0

    def skip(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    pos = skip(pos)
    while pos < len(text) and text[pos] != "]":
        line += text.count("\n", counted, pos)
        counted = pos
        lines.append(line)
        _, pos = decoder.raw_decode(text, pos)
        pos = skip(pos)
        if text[pos] == ",":
            pos = skip(pos + 1)
    return lines


def _csv_cell(column: str, cell: str | None) -> Any:
    if cell is None or (cell == "" and column not in _CSV_MESSAGES):
        return None
    if column in _CSV_BOOL:
        low = cell.strip().lower()
        return True if low in _TRUE else False if low in _FALSE else cell
    if column in _CSV_JSON or (column in _CSV_MESSAGES and cell.lstrip().startswith("[")):
        value, error = _parse_json(cell)
        if error is None:
            return value
        if column in _CSV_JSON:
            raise _CellError(column, error)
    return cell


def read_csv(path: Path, name: str) -> list[RawRow]:
    """A header row, then one record per row; list columns hold JSON (e.g. `["a", "b"]`)."""
    rows = []
    reader = csv.DictReader(io.StringIO(_read_text(path, name), newline=""))
    try:
        if reader.fieldnames is None:  # an empty file
            return rows
        duplicates = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1})
        if duplicates:
            raise UserError(f"{name}:1: the header repeats column(s) {', '.join(map(repr, duplicates))}")
        start = reader.line_num + 1
        for record in reader:
            location = Location(name, start)
            start = reader.line_num + 1
            rows.append(_csv_row(location, record))
    except csv.Error as exc:
        raise UserError(f"{name}:{reader.line_num}: invalid CSV: {exc}") from exc
    return rows


class _CellError(ValueError):
    def __init__(self, column: str, message: str):
        super().__init__(message)
        self.column = column


def _csv_row(location: Location, record: dict) -> RawRow:
    if None in record:
        return RawRow(location, parse_error=f"{len(record[None])} more cells than the header has columns")
    try:
        return RawRow(location, {k: _csv_cell(k, v) for k, v in record.items() if v is not None})
    except _CellError as exc:  # keep the raw cells so the row still counts when detecting the format
        return RawRow(location, {k: v for k, v in record.items() if v is not None}, str(exc), exc.column)


def read_parquet(path: Path, name: str) -> list[RawRow]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt or non-Parquet files
        raise UserError(f"{name}: cannot read Parquet ({str(exc).splitlines()[0]})") from exc
    return [RawRow(Location(name, i, "row"), row) for i, row in enumerate(table.to_pylist())]


def _dataset_rows(dataset: Any, name: str) -> list[RawRow]:
    return [RawRow(Location(name, i, "row"), row) for i, row in enumerate(dataset.to_list())]


def _read_folder(path: Path, name: str, split: str) -> list[RawRow]:
    """A `save_to_disk` folder (Dataset or DatasetDict), or a folder of per-split files (train.jsonl, ...)."""
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        import datasets

        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as exc:  # corrupt folders raise assorted errors
            raise UserError(f"{name}: cannot load the datasets folder ({str(exc).splitlines()[0]})") from exc
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise UserError(f"{name}: no split '{split}' (splits: {', '.join(loaded)})")
            return _dataset_rows(loaded[split], f"{name}[{split}]")
        _single_split(name, split)
        return _dataset_rows(loaded, name)
    for suffix in SUFFIXES:
        candidate = path / f"{split}{suffix}"
        if candidate.is_file():
            return _read_file(candidate, str(candidate), "train")
    found = sorted(p.name for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
    raise UserError(f"{name}: folder is neither a `datasets` save_to_disk folder nor holds a '{split}' file "
                    f"({'/'.join(f'{split}{s}' for s in SUFFIXES)}); data files there: {', '.join(found) or 'none'}")


def _read_hub(name: str, split: str) -> list[RawRow]:
    cached = hub.cached(name, "dataset")
    if not cached and not hub.reachable():  # without a network the hub retries for a minute
        raise UserError(f"{name}: not a local file or folder, nor a hub dataset in the local cache "
                        f"({hub.cache_folder()}); the hub was not asked ({hub.unreachable_why()})")
    import datasets

    try:
        with _from_cache(not hub.reachable()):
            dataset = datasets.load_dataset(name, split=split)
    except Exception as exc:  # network, authentication and missing-split errors all end here
        reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise UserError(f"{name}: cannot load from the hub ({reason})") from exc
    return _dataset_rows(dataset, f"{name}[{split}]")


@contextlib.contextmanager
def _from_cache(only: bool):
    """The hub unreachable: a cached dataset is read as under HF_HUB_OFFLINE (no retries); `datasets` and
    huggingface_hub read that switch at import, so both copies are set for the call."""
    import datasets
    from huggingface_hub import constants

    before = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    if only:
        datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = before
