"""Hub names without the wait: what the local Hugging Face cache holds, and whether the hub answers at all.

With no network, huggingface_hub retries each request for about a minute (5 tries, waits growing to 8 s) and
prints each retry, so a mistyped model or dataset name cost 29-55 s and a screen of noise before its one-line
error. A name that is neither built in, a local path, nor in the cache is therefore looked up on the hub only
when the hub answers a connection within `PROBE_SECONDS` (HF_HUB_OFFLINE=1: never); otherwise the caller fails
at once, in one line naming what was looked for and where. A cached name loads from the cache alone
(`local_only`) when the hub cannot be reached.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

PROBE_SECONDS = 1.0  # how long a connection to the hub may take before the hub counts as unreachable
_reachable: dict[str, bool] = {}  # endpoint -> the answer, probed once per process


def offline() -> bool:
    """HF_HUB_OFFLINE is set: the hub is never asked."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cache_folder() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached(repo_id: str, kind: str = "model") -> bool:
    """Whether the local cache holds a snapshot of `repo_id` (`kind`: model or dataset)."""
    snapshots = cache_folder() / f"{kind}s--{repo_id.replace('/', '--')}" / "snapshots"
    try:
        return snapshots.is_dir() and any(p.is_dir() for p in snapshots.iterdir())
    except OSError:
        return False


def reachable() -> bool:
    """Whether the hub (or the HTTPS proxy in the environment) accepts a connection within `PROBE_SECONDS`;
    False under HF_HUB_OFFLINE. The probe runs in a thread so that a hanging name lookup cannot outlast it."""
    if offline():
        return False
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT
    if endpoint not in _reachable:
        _reachable[endpoint] = _probe(_address(endpoint))
    return _reachable[endpoint]


def unreachable_why() -> str:
    """Why the hub was not asked, for a one-line error."""
    return "HF_HUB_OFFLINE is set" if offline() else f"no answer from it within {PROBE_SECONDS:g} s: no network?"


def local_only(name: str) -> dict:
    """`from_pretrained` keywords for `name`: a hub name read from the cache alone when the hub cannot be reached
    (no retries); nothing for a local folder or a reachable hub."""
    return {"local_files_only": True} if not Path(name).exists() and not reachable() else {}


def _address(endpoint: str) -> tuple[str, int]:
    proxy = next((os.environ[k] for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy") if os.environ.get(k)),
                 None)
    url = urlparse(proxy if proxy and "://" in proxy else f"http://{proxy}" if proxy else endpoint)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def _probe(address: tuple[str, int]) -> bool:
    answer: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=PROBE_SECONDS).close()
            answer.append(True)
        except (OSError, ValueError):
            answer.append(False)

    thread = threading.Thread(target=connect, daemon=True)  # a name lookup that hangs is left behind
    thread.start()
    thread.join(PROBE_SECONDS + 0.1)
    return bool(answer and answer[0])
