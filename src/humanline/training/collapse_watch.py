"""The end of a run: did its policy stop learning? (`humanline.evaluation.collapse` holds the criteria.)

`WeightSample` copies the first `SAMPLE` elements of every trainable tensor to the host when the segment starts
training and compares them at its end: one read each time, none per step (the step keeps its one host read).
Weights that changed by less than `MOVE_FLOOR` of their size (the norm of the difference over the norm of the
sample), over updates that were taken, did not move: an lr too small for their precision (at lr 1e-30 only
elements that were exactly 0 change, by 1e-30; AdamW's smallest real lrs, ~1e-8, move them by ~1e-7 of their
size in one update). The verdict is written into `run_info.json` (`end`), where `humanline report` reads the
weights' part back; the rest it reads from metrics.jsonl as the run did.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from humanline.evaluation.collapse import collapse_reasons, read_rows

SAMPLE = 1024  # elements of each trainable tensor compared (the first ones)
MOVE_FLOOR = 1e-9  # weights that changed by less than this share of their size did not move


class WeightSample:
    """The trainable weights of `trainer`'s policy as this segment starts training, and its counts then."""

    def __init__(self, trainer):
        self.step, self.skipped = trainer.step, int(trainer.counters.totals["skipped_steps"])
        self.before = _sample(trainer.run.unwrapped)

    def end(self, trainer) -> dict:
        """`{"step", "updates", "weights_moved"}` at the end of the segment (`weights_moved` None: no update was
        taken, or no weight is held here, as under ZeRO-3)."""
        updates = trainer.step - self.step - (int(trainer.counters.totals["skipped_steps"]) - self.skipped)
        after = _sample(trainer.run.unwrapped) if updates > 0 and self.before is not None else None
        moved = None if after is None else bool((after - self.before).norm() > MOVE_FLOOR * self.before.norm())
        return {"step": trainer.step, "updates": updates, "weights_moved": moved}


def end_of_run(trainer, sample: WeightSample) -> list[str]:
    """Why the run collapsed (empty: it did not), from its metrics and `sample`; recorded in `run_info.json` and
    warned about (main process; the others return an empty list)."""
    end = sample.end(trainer)
    if not trainer.run.accelerator.is_main_process:
        return []
    out = Path(trainer.cfg.train.output_dir)
    reasons = collapse_reasons(read_rows(out / "metrics.jsonl"), end)
    info_path = out / "run_info.json"
    try:
        info = json.loads(info_path.read_text())
        info["end"] = {**end, "collapse": reasons}
        info_path.write_text(json.dumps(info, indent=2) + "\n")
    except (OSError, ValueError):
        pass  # the record is for `humanline report`; the verdict itself is returned and said
    if reasons:
        trainer.run.logger.warn(f"the run collapsed: {'; '.join(reasons)}")
    return reasons


def _sample(model: torch.nn.Module) -> torch.Tensor | None:
    parts = []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        local = param.to_local() if hasattr(param, "to_local") else param  # FSDP2: this process's shard
        if local.numel():
            parts.append(local.detach().reshape(-1)[:SAMPLE].to(torch.float64))
    return torch.cat(parts).cpu() if parts else None
