"""Files and folders written whole, in the user's mode, and their checksums: the package's one of each.

- Modes: the user's umask, as any file they create (0644 under the usual 022). Temporary files made for atomic
  writes (`tempfile.mkstemp`) and safetensors' writer create files 0600, which would leave `eval.json` or a
  final model unreadable to the user's group once renamed into place.
- Atomic writes: a file through a temporary beside it (`write_text_atomic`); a folder written into a temporary
  folder beside it (`folder_beside`), then renamed into place (`publish_folder`: checkpoints, the final model,
  converted GGUF models, the demo's cached policies).
- `sha256_file`: a file's SHA-256, read in blocks (checkpoint markers, run inputs, the reproduction's keys).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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


def sha256_file(path: str | Path, block: int = 2**20) -> str:
    """The SHA-256 of the file's bytes, hex, read `block` bytes at a time (a model's weights need not fit in
    memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file (or a folder's entries) to disk, so a rename never exposes data still in the page cache."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not support fsync on folders
        pass
    finally:
        os.close(fd)


@contextmanager
def folder_beside(target: Path) -> Iterator[Path]:
    """A fresh temporary folder beside `target` (the same file system, so `publish_folder` can rename it into
    place), removed at the end of the block unless published."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_folder(tmp: Path, target: Path, *, replace: bool = False) -> bool:
    """Rename the finished folder `tmp` to `target`, flushed to disk before and after: a reader, or a kill, finds
    no `target` or a whole one, never half of one. Returns whether `tmp` became `target`.

    replace: an older `target` (a stale or corrupt one of an earlier run) is moved aside first, to
    `.stale-NAME` beside it (removed by the next publish, or by its owner). Otherwise a `target` that is there
    already was published by another process first: it is kept, `tmp` removed, and False returned."""
    fsync_path(tmp)
    if replace and target.exists():
        stale = target.parent / f".stale-{target.name}"
        shutil.rmtree(stale, ignore_errors=True)
        target.rename(stale)
    try:
        tmp.rename(target)
    except OSError:
        if replace or not target.exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    fsync_path(target.parent)
    return True
