"""A run that fails before its first step leaves nothing behind.

Without this, a data or model error, or a reward that crashes in step 1, leaves an empty run folder, or one
holding a `config.yaml` and an empty `metrics.jsonl`: a folder that looks like a run but is none. `StartGuard`
notes what the run folder held before the run began; when the run fails before any step is logged, it removes
what the run wrote (`config.yaml`, `inputs.json`, `metrics.jsonl`, `run_info.json`, an empty `checkpoints/`; a
file already there with the same inode and modification time is kept, so a run refused or failed before clearing
a previous run leaves that run as it was) and the folders the run created, if empty.
A run that resumes is never touched: its folder holds a run by definition.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from humanline.training.run_dir import logged_steps

# what a run's start may write
WRITTEN = ("config.yaml", "inputs.json", "metrics.jsonl", "run_info.json", "checkpoints")


class StartGuard:
    def __init__(self, out: Path, *, resume: bool):
        self.out, self.inert = out, resume or int(os.environ.get("RANK", "0")) != 0  # the main process only
        self.created = [p for p in (out, *out.parents) if not p.exists()]  # deepest first
        self.before = {name: _stamp(out / name) for name in WRITTEN}

    def discard(self) -> None:
        """Remove what the failed start wrote (see the module docstring); never raises."""
        if self.inert or not self.out.is_dir() or logged_steps(self.out):
            return
        for name in WRITTEN:
            path = self.out / name
            if _stamp(path) is not None and _stamp(path) != self.before[name]:
                _remove_ours(path)
        for folder in self.created:
            try:
                folder.rmdir()  # only when empty: anything else is not ours
            except OSError:
                break


def removed_if_unstarted(method):
    """Decorate `Trainer.__init__` and `Trainer.train`: when either raises before a step is logged, the run
    folder is left as it was found (`StartGuard`)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if method.__name__ == "__init__":
            cfg = args[0] if args else kwargs["cfg"]
            self._start_guard = StartGuard(Path(cfg.train.output_dir), resume=bool(kwargs.get("resume")))
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            if getattr(self, "step", 0) == 0:
                self._start_guard.discard()
            raise
    return wrapper


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def _remove_ours(path: Path) -> None:
    try:
        path.rmdir() if path.is_dir() else path.unlink()  # a folder only when empty
    except OSError:
        pass
