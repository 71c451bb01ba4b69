"""The demo with some of one objective's settings changed, on chosen seeds (default: the tuning seeds 3-6).

    python scripts/experiments/probe.py OBJECTIVE SETTINGS REGIME[,REGIME...] OUT [FIRST_SEED SEEDS]
    SETTINGS: comma-separated section.field=value, e.g. objective.eps_low=0.2,objective.eps_high=0.2 or optim.lr=2e-4
    e.g. ... grpo objective.eps_low=0.2,objective.eps_high=0.2 offline,offline+humanline-k16,online runs/eps0.2

The settings change `experiments.demo.run.OBJECTIVES` in this process, so it runs one process of one thread (no
worker processes, which would not see the change); run two probes side by side to use two cores.
"""

import sys
from pathlib import Path

from humanline.experiments.demo import run as demo
from humanline.experiments.demo.results import write_outputs
from humanline.training.yaml_io import parse

if __name__ == "__main__":
    if len(sys.argv) not in (5, 7):
        raise SystemExit(__doc__)
    objective, settings_text, regimes, out = sys.argv[1], sys.argv[2], sys.argv[3].split(","), Path(sys.argv[4])
    first_seed, seeds = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) == 7 else (3, 4)
    for item in settings_text.split(","):
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        demo.OBJECTIVES[objective].setdefault(section, {})[name] = parse(value, key)  # 2e-4 is a number
    settings = demo.DemoSettings(objectives=[objective], regimes=regimes, seeds=seeds, first_seed=first_seed,
                                 workers=1)
    results = demo.run_all(settings, out, log=lambda message: print(message, flush=True))
    print(write_outputs(results, out, 0.0))
