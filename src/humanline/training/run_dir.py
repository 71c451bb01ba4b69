"""What a run folder (`train.output_dir`) holds, and what a new run does with one that is not empty.

A run writes `config.yaml` (its settings as it started), `inputs.json` (what it reads, with fingerprints:
`humanline.training.run_inputs`), `segments.jsonl` (what each `--resume` changed:
`humanline.training.resume_settings`), `metrics.jsonl`, `run_info.json`, `checkpoints/step-N/` and `final/`;
`humanline report` and `humanline eval` add `report.md`, `curves.png` and `eval.json`. These names
(`RUN_FILES`, `CHECKPOINT_NAMES` inside `checkpoints/`, and TensorBoard's `humanline/` event folder) are the
only ones a run ever removes. Rules (HF Trainer's `overwrite_output_dir` convention; metrics of two runs are
never mixed, and nothing that is not a run's is removed):

- A folder *is a humanline run's* when it holds humanline's own records (`run_markers`: an `inputs.json` or a
  `run_info.json` as a run writes them, or a complete checkpoint with its trainer state). A folder that is not
  empty and is no run's (a user's `config.yaml`, another tool's `checkpoints/`) is refused, with or without
  `--overwrite`, in one line listing what is there: a run writes only into an empty folder or a run's own.
- The folder *holds a run* when it is a run's and has a complete checkpoint or a final model: something
  `--resume` can continue, or a finished run. A new run then stops with one line unless it is given `--resume`
  (continue from the newest complete checkpoint; later metric lines are dropped) or `--overwrite` (the
  previous run's files are removed first).
- Anything else a run leaves behind (metric lines of steps no checkpoint holds: a run that failed or was killed
  before its first checkpoint) cannot be continued: a new run removes it and starts clean, so its
  `metrics.jsonl` holds exactly its own steps.
- Only the run's names are removed; anything else in the folder (a `notes.txt`, `checkpoints/other-tool/`) is
  the user's, left where it is and named in the line that says what was removed.
- One process trains in a folder at a time (`hold_folder`: an advisory lock on the folder itself, held from
  before anything is removed until `train()` returns; no file is written for it): a second run, a resumed
  one included, into a folder another process trains in stops with one line, before it changes anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from humanline.errors import UserError
from humanline.training.checkpoint import COMPLETE

# The one list of what a run (and `humanline report` / `eval` on it) writes at the top of its folder; `checkpoints/`
# is emptied of `CHECKPOINT_NAMES` only, and removed when nothing else is left in it.
RUN_FILES = ("metrics.jsonl", "config.yaml", "inputs.json", "segments.jsonl", "run_info.json", "final",
             ".tmp-final", ".stale-final", "report.md", "curves.png", "eval.json")
CHECKPOINTS = "checkpoints"
CHECKPOINT_NAMES = re.compile(r"^(step-|\.tmp-step-|\.stale-step-)\d+$")  # what `CheckpointManager` writes
TRACKER_FOLDER = "humanline"  # accelerate's TensorBoard tracker writes output_dir/<project name>/events.*
LISTED = 6  # names shown in a line about what a folder holds; the rest are counted


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
    """What makes `out` hold a run: its complete checkpoints and final model, as short names (empty if none).
    Only meaningful in a folder that is a run's (`run_markers`): another tool may write a `final/` too."""
    found = []
    steps = _checkpoint_steps(out)
    found += [f"checkpoint step-{steps[-1]}"] if steps else []
    if (out / "final").is_dir():
        found.append("a final model")
    return found


def _checkpoint_steps(out: Path) -> list[int]:
    """The steps of `out`'s complete checkpoints (a `complete.json` marker), oldest first."""
    folder = out / CHECKPOINTS
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in folder.glob("step-*") if p.name[5:].isdigit() and (p / COMPLETE).exists())


def run_markers(out: Path) -> list[str]:
    """humanline's own records in `out`, which make it a run's folder (empty: none): `inputs.json` and
    `run_info.json` as a run writes them, a complete checkpoint with its trainer state."""
    found = [name for name, keys in (("inputs.json", ("config.yaml", "inputs")), ("run_info.json", ("humanline",)))
             if _is_record(out / name, keys)]
    steps = [s for s in _checkpoint_steps(out) if (out / CHECKPOINTS / f"step-{s}" / "trainer_state.json").is_file()]
    return found + ([f"checkpoints/step-{steps[-1]}"] if steps else [])


def _is_record(path: Path, keys: tuple[str, ...]) -> bool:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and all(key in record for key in keys)


def contents(out: Path) -> list[str]:
    """What `out` holds, as names (a folder with a trailing `/`), sorted; an empty file of a run's names (a run
    killed while setting up) counts as nothing, as does an empty `checkpoints/`."""
    if not out.is_dir():
        return []
    names = []
    for path in sorted(out.iterdir()):
        empty_file = path.is_file() and not path.is_symlink() and path.stat().st_size == 0
        if (path.name in RUN_FILES and empty_file) or (path.name == CHECKPOINTS and _is_empty_dir(path)):
            continue
        names.append(path.name + ("/" if path.is_dir() and not path.is_symlink() else ""))
    return names


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and next(path.iterdir(), None) is None


def listed(names: list[str]) -> str:
    """`a, b, c and 4 more`: names for a one-line message."""
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def check_not_foreign(out: Path) -> None:
    """Refuse a folder that is not empty and holds no humanline run (one line listing what is there): a run
    never writes into, nor clears, what is not a run's, whatever --overwrite says."""
    found = contents(out)
    if found and not run_markers(out):
        raise UserError(f"train.output_dir '{out}' is not empty and holds no humanline run ({listed(found)}): a run "
                        f"writes only into an empty folder or a run's own, so nothing there is removed; choose "
                        f"another --output-dir")


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
    if out.exists() and not out.is_dir():
        raise UserError(f"train.output_dir '{out}' is a file, not a folder; choose another --output-dir")
    if resume or not out.is_dir():
        return
    check_not_foreign(out)
    if overwrite:
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
                     f"worker of one left running): stop it first (`fuser -v DIR` names it), or choose another "
                     f"--output-dir")


def release_folder(out: Path) -> None:
    """Release `hold_folder`'s lock (a no-op where this process holds none)."""
    fd = _HELD.pop(str(out.resolve()), None)
    if fd is not None:
        os.close(fd)


def clear_previous_run(out: Path, accelerator) -> None:
    """Remove what an earlier run wrote into `out` (main process; the others wait), in one line saying what went
    and naming what was left because it is not the run's (`RUN_FILES`, `CHECKPOINT_NAMES`: nothing else)."""
    if accelerator.is_main_process:
        steps = logged_steps(out)
        removed = [name for name in RUN_FILES if _remove(out / name)]
        folder = out / CHECKPOINTS
        kept = []
        if folder.is_dir() and not folder.is_symlink():
            gone = [p for p in sorted(folder.iterdir()) if CHECKPOINT_NAMES.match(p.name) and _remove(p)]
            kept = [f"{CHECKPOINTS}/{p.name}" for p in sorted(folder.iterdir())]
            if not kept:
                folder.rmdir()
            if gone or not kept:
                removed.append(f"{CHECKPOINTS}/" if not kept else f"{CHECKPOINTS}/step-*")
        if _is_tracker_folder(out / TRACKER_FOLDER) and _remove(out / TRACKER_FOLDER):
            removed.append(TRACKER_FOLDER)
        kept = [name for name in contents(out) if name != f"{CHECKPOINTS}/"] + kept
        if removed:
            logged = f", {steps} logged steps" if steps else ""
            left = f"; left what is not the run's: {listed(kept)}" if kept else ""
            print(f"[humanline] {out}: removed the previous run's files ({', '.join(removed)}{logged}){left}",
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
