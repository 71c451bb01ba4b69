"""Worker for tests/train/test_fsdp.py: several tiny training runs, one after the other, in one launch.

    python tests/fsdp_worker.py CASES.json                      # one process
    accelerate launch --config_file recipes/accelerate/fsdp.yaml --num_processes 2 tests/fsdp_worker.py CASES.json

CASES.json: `{"root": folder, "cases": [{"name": ..., "recipe": path or null, "overrides": {section: {field:
value}}}, ...]}`. Each case is a `Trainer(load_config(recipe, overrides)).train()` into `root/name`, as
`humanline train recipe` with those overrides would run it (metrics.jsonl and final/ as any run).
Per process the worker also writes `root/name/samples_RANK.json` (the completion ids each online buffer
sampled, by step) and, for a `copy` reference, `root/name/sync_RANK.json`: at every step, whether the
reference's whole weights (gathered from the shards) equal the policy's from just before that step's update
(sync steps) or stay as they were (other steps).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402

from humanline.sampling import sampler as online  # noqa: E402
from humanline.training.config_loading import load_config  # noqa: E402
from humanline.training.loop import Trainer  # noqa: E402


def _full(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on every rank (sharded ones all-gathered; every rank calls this together)."""
    out = {}
    for name, p in model.named_parameters():
        p = p.detach()
        out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).cpu().clone()
    return out


def _record_samples(rank: int, log: dict) -> None:
    generate = online.Sampler.generate

    def recording(self, step, records, model, draw=0, version=None):
        rollout, stats = generate(self, step, records, model, draw, version)
        log[str(step)] = rollout.completion_ids if rollout is not None else None
        return rollout, stats

    online.Sampler.generate = recording


def _check_syncs(trainer: Trainer, checks: list[dict]) -> None:
    """Wrap `trainer.train_step` to check, after each step, the reference's whole weights against the policy's."""
    from humanline.devices.fsdp import reshard

    policy, reference, step_once = trainer.run.unwrapped, trainer.run.reference, trainer.train_step
    before = {"ref": _full(reference.model)}

    def checked_step() -> dict:
        step = trainer.step
        reshard(policy)
        pre_update = _full(policy)
        logged = step_once()
        reshard(policy)
        post_update, ref_now = _full(policy), _full(reference.model)
        synced = reference.sync.at(step)
        expected = pre_update if synced else before["ref"]
        checks.append({
            "step": step, "synced": synced,
            "equal": all(torch.equal(ref_now[k], expected[k]) for k in expected),
            # the update moved the policy away, so a reference copied after the update would be told apart
            "moved": max(float((post_update[k] - pre_update[k]).abs().max()) for k in pre_update),
            "from_post": max(float((ref_now[k] - post_update[k]).abs().max()) for k in post_update),
        })
        before["ref"] = ref_now
        return logged

    trainer.train_step = checked_step


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    samples: dict = {}
    _record_samples(rank, samples)
    for case in spec["cases"]:
        out = Path(spec["root"]) / case["name"]
        overrides = json.loads(json.dumps(case["overrides"]))
        overrides.setdefault("train", {})["output_dir"] = str(out)
        samples.clear()
        trainer = Trainer(load_config(case.get("recipe"), overrides), overwrite=True)
        checks: list[dict] = []
        if trainer.run.reference.name == "copy":
            _check_syncs(trainer, checks)
        trainer.train()
        if checks:
            (out / f"sync_{rank}.json").write_text(json.dumps(checks))
        (out / f"samples_{rank}.json").write_text(json.dumps(samples))


if __name__ == "__main__":
    main()
