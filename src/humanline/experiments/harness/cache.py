"""The experiments' one cache rule: a cached artefact (the demo's base policies; the reproduction's offline data,
evaluations and runs) records the key of what it depends on, a dict of plain values by name, and is reused
exactly when the key it would be made with now is the one it holds. A file it depends on enters by its content
(`file_hash`), never by its path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from humanline.files import sha256_file


def cache_key(parts: dict) -> str:
    """The key of a cached artefact: the first 16 hex digits of the SHA-256 of `parts` (what it depends on, by
    name) as sorted JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_hash(path: str | Path) -> str:
    """The first 16 hex digits of the SHA-256 of the file's bytes."""
    return sha256_file(path)[:16]
