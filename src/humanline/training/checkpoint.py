"""Atomic checkpoints and the final model.

A checkpoint is written into `checkpoints/.tmp-step-N`, flushed to disk, completed with a `complete.json`
marker that lists every file with its size (and a SHA-256 for files up to 64 MiB: the trainer state, RNG
states, schedule and humanline state), then renamed to `checkpoints/step-N`; older ones are pruned only after
that. Loading takes the newest complete checkpoint whose files match the marker and load, and reports (then
skips) partial or corrupt ones; a run that cannot resume from any checkpoint stops with a `UserError` rather
than silently starting over. Contents: accelerate's state (model, optimizer, LR schedule, RNG states of every
process), the trainer's counters, and per process the reference state (lookahead cache or synced weights) and
the online sample buffer, so a resumed run continues exactly (`resume_run`: `--resume`). Weights with NaN or
inf are never written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
from pathlib import Path

import torch

from humanline.devices.fsdp import drop_tied_copies, is_sharded, unsharded_peft_copy
from humanline.errors import NonFiniteError, UserError
from humanline.files import apply_umask, fsync_path, publish_folder, sha256_file

COMPLETE = "complete.json"
# Errors that say the disk, not the program, is at fault: reported as a `UserError` with what is kept.
MIN_FREE = 64 * 2**20  # bytes: below this, a failed write is put down to a full disk
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
HASH_LIMIT = 64 * 2**20  # bytes: files up to this size are hashed, larger ones (weights, optimizer) only sized


class CheckpointManager:
    def __init__(self, root: Path, keep: int, accelerator):
        self.root, self.keep, self.accelerator = Path(root), keep, accelerator
        self._last_saved: int | None = None

    def complete(self) -> list[Path]:
        """`step-N` folders that carry a completion marker, oldest first (their files are not verified)."""
        if not self.root.exists():
            return []
        found = [p for p in self.root.glob("step-*") if (p / COMPLETE).exists() and p.name[5:].isdigit()]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def save(self, step: int, state: dict, parts: dict, logger) -> Path:
        """Write checkpoint `step` atomically, then prune to the newest `keep`. Saving a step twice is a no-op."""
        acc = self.accelerator
        final = self.root / f"step-{step}"
        if self._last_saved == step:
            return final
        _check_finite_weights(acc, f"checkpoint step-{step}")
        tmp = self.root / f".tmp-step-{step}"
        try:
            self._write(tmp, state, parts, final)
        except Exception as exc:
            reason = _disk_problem(exc, self.root)
            if reason is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back; the older checkpoints are untouched
            kept = ", ".join(p.name for p in self.complete()) or "none"
            raise UserError(f"cannot write checkpoint {final} ({reason}); complete checkpoints kept: {kept}; "
                            f"free space in {self.root} and continue with --resume") from exc
        if acc.is_main_process:
            for old in self.complete()[: -self.keep]:  # only now that `final` is complete
                shutil.rmtree(old, ignore_errors=True)
            for leftover in [*self.root.glob(".tmp-step-*"), *self.root.glob(".stale-step-*")]:
                shutil.rmtree(leftover, ignore_errors=True)  # from runs killed while saving
            logger.info(f"checkpoint saved: {final}")
        acc.wait_for_everyone()
        self._last_saved = step
        return final

    def _write(self, tmp: Path, state: dict, parts: dict, final: Path) -> None:
        acc = self.accelerator
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        with _quiet_tied_weights():
            acc.save_state(str(tmp))
        extra = {name: part.state_dict() for name, part in parts.items()}
        torch.save(extra, tmp / f"humanline_state_{acc.process_index}.pt")
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / "trainer_state.json").write_text(json.dumps(state))
            apply_umask(tmp)  # safetensors writes 0600: a checkpoint is the user's file like any other
            files = _manifest(tmp)
            _write_synced(tmp / COMPLETE, json.dumps({"step": int(final.name[5:]), "processes": acc.num_processes,
                                                      "files": files}))
            publish_folder(tmp, final, replace=True)

    def load_latest(self, parts: dict, logger) -> dict | None:
        """Restore the newest loadable checkpoint into the accelerator and `parts`; return the trainer state.

        Returns None when there is no checkpoint at all; raises `UserError` when there are some but none loads.
        """
        for partial in sorted(self.root.glob(".tmp-step-*")) if self.root.exists() else []:
            logger.warn(f"skipping incomplete checkpoint {partial} (the run was stopped while writing it)")
        found = self.complete()
        if self.root.exists():
            for unmarked in sorted(set(self.root.glob("step-*")) - set(found)):
                logger.warn(f"skipping incomplete checkpoint {unmarked} (no {COMPLETE} marker)")
        problems = []
        for path in reversed(found):
            problem = verify(path)
            if problem is None:
                try:
                    state = json.loads((path / "trainer_state.json").read_text())
                    extra = torch.load(path / f"humanline_state_{self.accelerator.process_index}.pt",
                                       weights_only=False)
                    self.accelerator.load_state(str(path))
                except Exception as exc:  # a corrupt checkpoint must not stop the resume: fall back
                    problem = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            if problem is not None:
                logger.warn(f"skipping corrupt checkpoint {path} ({problem}); trying an older one")
                problems.append(f"{path.name}: {problem}")
                continue
            for name, part in parts.items():
                if name in extra:  # a part newer than the checkpoint (the band) starts from its configured state
                    part.load_state_dict(extra[name])
            self._last_saved = int(path.name[5:])
            return state
        if found:
            raise UserError(f"--resume: no checkpoint in {self.root} can be loaded ({'; '.join(problems[:3])}); "
                            f"move that folder away to start again from step 0")
        return None


def newest_step(root: Path) -> int | None:
    """The step of the newest checkpoint under `root` that carries a completion marker (None: none)."""
    root = Path(root)
    steps = [int(p.name[5:]) for p in root.glob("step-*") if p.name[5:].isdigit() and (p / COMPLETE).exists()] \
        if root.is_dir() else []
    return max(steps, default=None)


def final_saved_after(out: Path, step: int) -> bool:
    """Whether run folder `out` holds a final model saved after its checkpoint of `step` (a run ends by saving
    that checkpoint, then the final model): then it is that step's final model and need not be saved again."""
    model, marker = out / "final" / "config.json", out / "checkpoints" / f"step-{step}" / COMPLETE
    return model.is_file() and marker.is_file() and model.stat().st_mtime_ns >= marker.stat().st_mtime_ns


def resume_run(checkpoints: CheckpointManager, parts: dict, counters, logger, max_steps: int) -> int:
    """`--resume`: restore the newest complete checkpoint into `parts` and `counters` (a `Counters`), cut the
    metrics log back to it; returns the step to continue from (0, with an emptied log, when there is none).
    A `train.max_steps` below the steps done, or past what a cached reference holds, is refused first."""
    state = checkpoints.load_latest(parts, logger)
    if state is None:
        logger.info("--resume: no complete checkpoint found, starting from step 0")
        logger.truncate(0)  # lines of a run that never saved a checkpoint: it is run again
        return 0
    step = counters.load(state)
    if step > max_steps:  # before anything in the folder changes
        raise UserError(f"--resume: train.max_steps={max_steps} is below the {step} steps the run has done "
                        f"(checkpoint step-{step}): give --train.max_steps={step} or more")
    _check_reference_covers(parts["reference"], step, max_steps)
    logger.truncate(step)  # steps logged after that checkpoint will be run again
    logger.info(f"resumed from step {step}")
    return step


def _check_reference_covers(reference, step: int, max_steps: int) -> None:
    """A cache reference holds the initial policy's log-probs of the steps before the first segment's
    train.max_steps only (computed at step 0); a lookahead reference the window it is in (checkpoints of older
    versions: up to their train.max_steps). A resumed run asked to go further cannot continue exactly."""
    name, cache = getattr(reference, "name", ""), getattr(reference, "cache", None)
    if name not in ("cache", "lookahead") or cache is None or step >= max_steps or step == 0:
        return
    steps = {s for s, _ in cache}
    if name == "lookahead" and step not in steps:
        raise UserError(f"--resume: the checkpoint at step {step} holds no lookahead reference log-probs for "
                        f"step {step + 1} (an older version computed them up to its train.max_steps only): "
                        f"resume with train.max_steps={step}, or start a new run (another --output-dir, or "
                        f"--overwrite)")
    if name == "cache" and max_steps - 1 not in steps:
        last = max(steps, default=step - 1) + 1
        raise UserError(f"--resume: train.reference=cache holds the initial policy's log-probs for the run's "
                        f"first {last} steps only (computed at step 0): give train.max_steps <= {last}, or start a "
                        f"new run (another --output-dir, or --overwrite) with train.reference=frozen to be able to "
                        f"train longer")


def _disk_problem(exc: Exception, root: Path) -> str | None:
    """Why writing under `root` failed if the disk is to blame (full, read-only, no permission), else None.

    torch.save reports a full disk as an opaque RuntimeError, so a nearly full disk counts as well.
    """
    if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:
        return exc.strerror or str(exc)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return None
    return f"the disk is full: {free // 2**20} MiB free; {type(exc).__name__}" if free < MIN_FREE else None


def verify(path: Path) -> str | None:
    """Why checkpoint folder `path` does not match its completion marker, or None when it does."""
    try:
        files = json.loads((path / COMPLETE).read_text()).get("files")
    except (OSError, ValueError, AttributeError) as exc:
        return f"unreadable {COMPLETE}: {exc}"
    if files is None:
        return None  # written before markers listed their files
    for name, expected in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes, expected {expected['size']}"
        if "sha256" in expected and sha256_file(file) != expected["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _manifest(folder: Path) -> dict:
    """Every file under `folder` (relative name -> size, and SHA-256 when small), each flushed to disk first."""
    files = {}
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        fsync_path(file)
        entry = {"size": file.stat().st_size}
        if entry["size"] <= HASH_LIMIT:
            entry["sha256"] = sha256_file(file)
        files[str(file.relative_to(folder))] = entry
    return files


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _check_finite_weights(acc, what: str) -> None:
    """Raise `NonFiniteError` (on every process) if any prepared model holds a NaN or inf parameter."""
    # each process checks its own shard of a sharded (FSDP) parameter; the flag is summed over processes
    bad = any(not torch.isfinite(getattr(p, "to_local", lambda: p)()).all()
              for model in getattr(acc, "_models", []) for p in model.parameters())
    flag = torch.tensor(float(bad), device=acc.device)
    if acc.num_processes > 1:
        flag = acc.reduce(flag, reduction="sum")
    if flag.item() > 0:
        raise NonFiniteError(f"refusing to write {what}: the model weights hold NaN or inf")


def save_final_model(acc, model, tokenizer, target: Path) -> Path:
    """`save_pretrained` of the prepared `model` (LoRA adapters merged, adapter also kept) and `tokenizer`
    into `target`, atomically, on the main process (every process calls it: FSDP gathers the state)."""
    _check_finite_weights(acc, str(target))
    acc.wait_for_everyone()
    state = acc.get_state_dict(model)
    model = acc.unwrap_model(model)
    sharded = is_sharded(model)
    if acc.is_main_process:
        tmp = target.parent / f".tmp-{target.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        if hasattr(model, "merge_and_unload"):  # peft: keep the adapter, save the merged plain model
            if sharded:  # FSDP: the gathered state, in a plain copy that peft can save and merge
                model = unsharded_peft_copy(model, state)
            model.save_pretrained(tmp / "adapter")
            model = model.merge_and_unload()
            state = None
        elif state is not None:  # gathered (FSDP, DeepSpeed): tied weights arrive as separate tensors
            state = drop_tied_copies(model, state)
        model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        apply_umask(tmp)  # safetensors writes 0600
        for file in tmp.rglob("*"):
            if file.is_file():
                fsync_path(file)
        publish_folder(tmp, target, replace=True)
        shutil.rmtree(target.parent / f".stale-{target.name}", ignore_errors=True)
    acc.wait_for_everyone()
    return target


class _TiedWeightsNotice(logging.Filter):
    """Drops accelerate's "Removed shared tensor ... while saving" notice: a model with tied input and output
    embeddings stores the shared tensor once, and loading ties it again (the resume tests check weights exactly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


@contextlib.contextmanager
def _quiet_tied_weights():
    log = logging.getLogger("accelerate.utils.other")
    notice = _TiedWeightsNotice()
    log.addFilter(notice)
    try:
        yield
    finally:
        log.removeFilter(notice)
