"""What a run folder (`train.output_dir`) holds, and what a new run does with one that is not empty.

A run writes `config.yaml` (its settings as it started), `inputs.json` (what it reads, with fingerprints:
`humanline.training.run_inputs`), `segments.jsonl` (what each `--resume` changed:
`humanline.training.resume_settings`), `metrics.jsonl`, `run_info.json`, `checkpoints/step-N/` and `final/`;
`humanline report` and `humanline eval` add `report.md`, `curves.png` and `eval.json`. Rules (HF Trainer's
`overwrite_output_dir` convention; metrics of two runs are never mixed):

- The folder *holds a run* when it has a complete checkpoint or a final model: something `--resume` can
  continue, or a finished run. A new run then stops with one line unless it is given `--resume` (continue
  from the newest complete checkpoint; later metric lines are dropped) or `--overwrite` (the previous run's
  files are removed first).
- Anything else a run leaves behind (a `config.yaml`, or metric lines of steps no checkpoint holds: a run that
  failed or was killed before its first checkpoint) cannot be continued: a new run removes it and starts
  clean, so its `metrics.jsonl` holds exactly its own steps.
- Only the names above are removed (and TensorBoard's `humanline/` event folder): other files in the folder
  are the user's and are left alone, whatever `--overwrite` says.
- One process trains in a folder at a time (`hold_folder`: an advisory lock on the folder itself, held from
  before anything is removed until `train()` returns; no file is written for it): a second run, a resumed
  one included, into a folder another process trains in stops with one line, before it changes anything.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from humanline.errors import UserError
from humanline.training.checkpoint import COMPLETE

RUN_FILES = ("metrics.jsonl", "config.yaml", "inputs.json", "segments.jsonl", "run_info.json", "checkpoints", "final",
             ".tmp-final", ".stale-final", "report.md", "curves.png", "eval.json")
TRACKER_FOLDER = "humanline"  # accelerate's TensorBoard tracker writes output_dir/<project name>/events.*


def make_writable_dir(path: str, what: str) -> Path:
    """Create folder `path` (and its parents) and check it is writable; `what` names it in the one-line error
    (a config field or a flag)."""
    import os

    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what}: cannot create '{path}' ({exc.strerror})") from exc
    if not os.access(out, os.W_OK):
        raise UserError(f"{what}: '{path}' is not writable")
    return out


def check_creatable_dir(path: str, what: str) -> Path:
    """Check that folder `path` exists or can be created, and is writable, without creating it (a command creates
    it when it writes its first file: a failed command leaves no empty folder); `what` names it in the error."""
    out = Path(path)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise UserError(f"{what}: cannot create '{path}' ('{existing}' is a file, not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what}: '{path}' is not writable ('{existing}' is not)")
    return out


def held_run(out: Path) -> list[str]:
    """What makes `out` hold a run: its complete checkpoints and final model, as short names (empty if none)."""
    found = []
    folder = out / "checkpoints"
    if folder.is_dir():
        steps = sorted(int(p.name[5:]) for p in folder.glob("step-*")
                       if p.name[5:].isdigit() and (p / COMPLETE).exists())
        found += [f"checkpoint step-{steps[-1]}"] if steps else []
    if (out / "final").is_dir():
        found.append("a final model")
    return found


def logged_steps(out: Path) -> int:
    """How many step lines `out/metrics.jsonl` holds (unreadable lines are not counted)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    count = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            count += isinstance(json.loads(line), dict)
        except ValueError:
            continue
    return count


def check_output_dir(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse, before anything is built, a run into a folder that holds one (see the module docstring)."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other: --resume continues the run in "
                        f"'{out}', --overwrite deletes it")
    if resume or overwrite or not out.is_dir():
        return
    held = held_run(out)
    if held and trained_in_elsewhere(out):  # --resume would only meet the lock: say what is going on
        raise _busy(out)
    if held:
        raise UserError(f"train.output_dir '{out}' holds a run ({', '.join(held)}): pass --resume to continue it, "
                        f"or --overwrite to start again (Trainer(..., resume=True | overwrite=True) from Python)")


_HELD: dict[str, int] = {}  # folder (resolved) -> the descriptor through which this process locks it


def hold_folder(out: Path) -> None:
    """Lock run folder `out` for this process (flock on the folder; released by `release_folder` or at exit).
    Another process holding it: one line naming the folder. This process holding it already (an earlier
    `Trainer` here that never finished `train()`): nothing to do. Without `fcntl` (Windows) nothing is locked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return
    key = str(out.resolve())
    if key in _HELD:
        return
    fd = os.open(key, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise _busy(out) from exc
    _HELD[key] = fd


def trained_in_elsewhere(out: Path) -> bool:
    """Whether another process holds run folder `out` (`hold_folder`'s lock), without taking it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        return False
    if str(out.resolve()) in _HELD:
        return False
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a lock it took
    return False


def _busy(out: Path) -> UserError:
    return UserError(f"train.output_dir '{out}': another process is training in it (a run, a reproduction, or a "
                     f"worker of one left running): stop it first (`fuser -v {out}` names it), or choose another "
                     f"--output-dir")


def release_folder(out: Path) -> None:
    """Release `hold_folder`'s lock (a no-op where this process holds none)."""
    fd = _HELD.pop(str(out.resolve()), None)
    if fd is not None:
        os.close(fd)


def clear_previous_run(out: Path, accelerator) -> None:
    """Remove what an earlier run wrote into `out` (main process; the others wait), saying what went."""
    if accelerator.is_main_process:
        steps = logged_steps(out)
        removed = [name for name in RUN_FILES if _remove(out / name)]
        if _is_tracker_folder(out / TRACKER_FOLDER) and _remove(out / TRACKER_FOLDER):
            removed.append(TRACKER_FOLDER)
        if removed and removed != ["config.yaml"]:
            logged = f", {steps} logged steps" if steps else ""
            print(f"[humanline] {out}: removed the previous run's files ({', '.join(removed)}{logged})",
                  file=sys.stderr, flush=True)
    accelerator.wait_for_everyone()


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            return True
        if path.exists() or path.is_symlink():
            path.unlink()
            return True
    except OSError as exc:
        raise UserError(f"train.output_dir: cannot remove the previous run's {path} ({exc.strerror or exc}); "
                        f"remove it yourself or choose another --output-dir") from exc
    return False


def _is_tracker_folder(path: Path) -> bool:
    """A folder that holds nothing but TensorBoard event files (so never a folder of the user's)."""
    if not path.is_dir():
        return False
    files = [p for p in path.rglob("*") if p.is_file()]
    return bool(files) and all(p.name.startswith("events.out.tfevents") for p in files)
