"""Step one demo run through `Trainer.train_step` and save the policy at chosen steps (`save_pretrained`), for
`humanline inspect perception` with P = theta_s and R = theta_(s-k) (the synced reference) or the base.

    python scripts/experiments/save_thetas.py OBJECTIVE REGIME OUT STEPS DEMO_DIR BASE
    e.g. ... dpo offline+humanline runs/thetas 36,40 runs/demo ~/.cache/humanline/demo/arithmetic-<hash>/base

DEMO_DIR is a demo output folder (its data/ holds the prompts and offline groups); BASE the demo's base policy.
"""

import sys
from pathlib import Path

import torch

from humanline.experiments.demo.run import DemoSettings, run_config
from humanline.training.loop import Trainer


def main(objective: str, regime: str, out: Path, steps: list[int], demo: Path, base: str) -> None:
    torch.set_num_threads(1)  # as in the demo: the same numbers on any core count
    data = {"base": base, "prompts": str(demo / "data/train_prompts.jsonl"),
            "eval_prompts": str(demo / "data/eval_prompts.jsonl"), "groups": str(demo / "data/offline_groups.jsonl")}
    cfg = run_config(DemoSettings(), data, objective, regime, 0, out / "run")
    cfg.train.eval_every = 0
    trainer = Trainer(cfg, overwrite=True)
    while trainer.step < max(steps):
        trainer.train_step()
        if trainer.step in steps:
            folder = out / f"theta{trainer.step}"
            trainer.run.unwrapped.save_pretrained(folder)
            trainer.run.tokenizer.save_pretrained(folder)
            print("saved", folder, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 7:
        raise SystemExit(__doc__)
    a = sys.argv
    main(a[1], a[2], Path(a[3]), [int(s) for s in a[4].split(",")], Path(a[5]), a[6])
