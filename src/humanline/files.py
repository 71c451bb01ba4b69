"""File modes of what a run writes: the user's umask, as any file they create (0644 under the usual 022).

Temporary files made for atomic writes (`tempfile.mkstemp`) and safetensors' writer create files 0600, which
would leave `eval.json` or a final model unreadable to the user's group once renamed into place.
"""

from __future__ import annotations

import json
import os
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


def write_json(path: str | Path, record: dict) -> None:
    """Write `record` to `path` as indented JSON atomically: a reader (or a kill) sees the old file or the new one,
    never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
