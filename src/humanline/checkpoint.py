"""Atomic checkpoints and the final model.

A checkpoint is written into `checkpoints/.tmp-step-N`, completed with a `complete.json` marker, then renamed
to `checkpoints/step-N`; older ones are pruned only after that. Loading takes the newest complete checkpoint
that loads, and reports (then skips) partial or corrupt ones. Contents: accelerate's state (model, optimizer,
LR schedule, RNG states of every process), the trainer's counters, and per process the reference state
(lookahead cache or synced weights) and the online sample buffer, so a resumed run continues exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

COMPLETE = "complete.json"


class CheckpointManager:
    def __init__(self, root: Path, keep: int, accelerator):
        self.root, self.keep, self.accelerator = Path(root), keep, accelerator

    def _complete(self) -> list[Path]:
        if not self.root.exists():
            return []
        found = [p for p in self.root.glob("step-*") if (p / COMPLETE).exists() and p.name[5:].isdigit()]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def save(self, step: int, state: dict, parts: dict, logger) -> Path:
        acc = self.accelerator
        final = self.root / f"step-{step}"
        if final.exists():
            return final
        tmp = self.root / f".tmp-step-{step}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        extra = {name: part.state_dict() for name, part in parts.items()}
        torch.save(extra, tmp / f"humanline_state_{acc.process_index}.pt")
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / "trainer_state.json").write_text(json.dumps(state))
            (tmp / COMPLETE).write_text(json.dumps({"step": step, "processes": acc.num_processes}))
            tmp.rename(final)
            for old in self._complete()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            logger.info(f"checkpoint saved: {final}")
        acc.wait_for_everyone()
        return final

    def load_latest(self, parts: dict, logger) -> dict | None:
        """Restore the newest loadable checkpoint into the accelerator and `parts`; return the trainer state."""
        for partial in self.root.glob(".tmp-step-*") if self.root.exists() else []:
            logger.warn(f"ignoring incomplete checkpoint {partial} (the run was stopped while writing it)")
        for path in reversed(self._complete()):
            try:
                state = json.loads((path / "trainer_state.json").read_text())
                extra = torch.load(path / f"humanline_state_{self.accelerator.process_index}.pt", weights_only=False)
                self.accelerator.load_state(str(path))
            except Exception as exc:  # a corrupt checkpoint must not stop the resume: fall back
                logger.warn(f"checkpoint {path} is unreadable ({type(exc).__name__}: {exc}); trying an older one")
                continue
            for name, part in parts.items():
                part.load_state_dict(extra[name])
            return state
        return None


def save_final_model(trainer, target: Path) -> Path:
    """`save_pretrained` of the policy (LoRA adapters merged, adapter also kept) and tokenizer, atomically."""
    acc = trainer.accelerator
    acc.wait_for_everyone()
    model = acc.unwrap_model(trainer.run.model)
    state = acc.get_state_dict(trainer.run.model)
    if acc.is_main_process:
        tmp = target.parent / f".tmp-{target.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        if hasattr(model, "merge_and_unload"):  # peft: keep the adapter, save the merged plain model
            model.save_pretrained(tmp / "adapter")
            model = model.merge_and_unload()
            state = None
        model.save_pretrained(tmp, state_dict=state)
        trainer.run.tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    acc.wait_for_everyone()
    return target
