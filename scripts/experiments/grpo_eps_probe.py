"""The demo's GRPO with PPO clip eps_low = eps_high = EPS instead of 0.01, on the tuning seeds 3-6.

    python scripts/experiments/grpo_eps_probe.py EPS REGIME[,REGIME...] OUT
    e.g. ... 0.2 offline,offline+humanline,offline+humanline-k16,online runs/eps0.2

One process, one thread (the objective's settings are changed in this process, so no worker processes).
"""

import sys
from pathlib import Path

from humanline.demo import run as demo
from humanline.demo.results import write_outputs

if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    eps, regimes, out = float(sys.argv[1]), sys.argv[2].split(","), Path(sys.argv[3])
    demo.OBJECTIVES["grpo"]["objective"].update(eps_low=eps, eps_high=eps)
    settings = demo.DemoSettings(objectives=["grpo"], regimes=regimes, seeds=4, first_seed=3, workers=1)
    results = demo.run_all(settings, out, log=lambda message: print(message, flush=True))
    print(write_outputs(results, out, 0.0))
