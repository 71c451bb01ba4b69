"""File modes of what a run writes: the user's umask, as any file they create (0644 under the usual 022).

Temporary files made for atomic writes (`tempfile.mkstemp`) and safetensors' writer create files 0600, which
would leave `eval.json` or a final model unreadable to the user's group once renamed into place.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

_LOCK = threading.Lock()


def umask_mode() -> int:
    """The mode a new file gets from the process umask (0o644 under umask 022)."""
    with _LOCK:  # reading the umask means setting it: keep other threads of this process from seeing the change
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def apply_umask(path: str | Path) -> None:
    """Give the file `path`, or every file below the folder `path`, the umask's mode."""
    mode, path = umask_mode(), Path(path)
    for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
        os.chmod(file, mode)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` atomically: a reader (or a kill) sees the old file or the new one, never half of
    one. The temporary file lies in the same folder (made if missing) and gets the umask's mode. Returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())  # mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, record: dict, *, allow_nan: bool = True) -> Path:
    """`record` as indented JSON (UTF-8), written atomically (`write_text_atomic`). `allow_nan=False`: strict
    JSON, a NaN or infinity is a ValueError and the file is left as it was."""
    return write_text_atomic(path, json.dumps(record, indent=2, ensure_ascii=False, allow_nan=allow_nan) + "\n")


def write_jsonl(path: str | Path, records: list[dict]) -> Path:
    """`records` one JSON object per line, written atomically (`write_text_atomic`)."""
    return write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
