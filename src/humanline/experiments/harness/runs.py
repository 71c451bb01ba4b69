"""An experiment's runs: its plan as jobs, one run's folder and config, its metrics read back, and the time left.

An experiment's settings (`DemoSettings`, `ReproduceSettings`) hold `objectives`, `seeds`, `first_seed` and
`workers`, and a `plan()` of (objective, regime) pairs; each (objective, regime, seed) is one job of
`workers.run_jobs`: a run trained into `<output>/runs/<run_name>` from the config `checked_config` builds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

from humanline.errors import UserError
from humanline.experiments.harness.regimes import regime_overrides
from humanline.settings.config import Config
from humanline.training.config_loading import load_config, merge_dicts
from humanline.training.objective_table import SPECS


def plan(objectives: list[str], regimes_of: Callable[[str], list[str]]) -> list[tuple[str, str]]:
    """Every (objective, regime) to run, in order: each objective with each of its regimes."""
    return [(o, r) for o in objectives for r in regimes_of(o)]


def check_configs(settings: Any, run_config: Callable, out: Path) -> None:
    """Build every planned run's config (`run_config(settings, data, objective, regime, seed, run_dir)`) with
    placeholder data before any data or folder is made: a regime whose config cannot load fails first, as a
    UserError naming it."""
    unmade = {"base": "tiny", "groups": "groups.jsonl", "prompts": "prompts.jsonl", "eval_prompts": "eval.jsonl"}
    for objective, regime in settings.plan():
        run_config(settings, unmade, objective, regime, settings.first_seed, out / "runs" / "unmade")


def seeds(settings: Any) -> range:
    """The seeds of every (objective, regime): `first_seed` .. `first_seed + seeds - 1`."""
    return range(settings.first_seed, settings.first_seed + settings.seeds)


def jobs(settings: Any, data: dict, out: Path) -> list[tuple]:
    """`(settings, data, objective, regime, seed, out)` of every run, in order (the arguments of a `train_run`)."""
    return [(settings, data, o, r, seed, out) for o, r in settings.plan() for seed in seeds(settings)]


def run_name(objective: str, regime: str, seed: int, lr: float | None = None) -> str:
    """The run's folder name; a learning rate other than the objective's own (`--lr`) is part of it."""
    return f"{objective}-{regime.replace('+', '-')}{'' if lr is None else f'-lr{lr:g}'}-seed{seed}"


def units_per_step(objective: str, prompts_per_step: int) -> int:
    """Units of one optimizer step: a group per prompt (GRPO), a pair (DPO), the best and the worst (KTO: an
    objective on unpaired records)."""
    return 2 * prompts_per_step if SPECS[objective].kind == "unpaired" else prompts_per_step


def checked_config(overrides: dict, objective: dict, regime: str, lr: float | None) -> Config:
    """The checked config of one run: the experiment's `overrides` with the objective's config sections, the
    regime's (`regimes.regime_overrides`) and the learning rate (when given) on top; a regime that does not sample
    sparsely samples at every step."""
    merge_dicts(overrides, copy.deepcopy(objective))
    named = regime_overrides(regime)
    merge_dicts(overrides, named)
    if lr is not None:
        overrides["optim"]["lr"] = lr
    if overrides["train"]["regime"] != "sparse":
        overrides["train"]["sample_every"] = 1
    try:
        return load_config(None, overrides)
    except UserError as error:  # name the regime; where the objective's own band clashes (the name sets none), say
        # the name that loads
        own_band = "humanline.band" in str(error) and "band" not in named.get("humanline", {})
        fix = f" (a fixed band in the name: {regime}-band-1.5,1.5)" if own_band else ""
        raise UserError(f"--regimes: {regime!r}: {error}{fix}") from None


def metrics(run_dir: Path) -> list[dict]:
    """The rows of the run's `metrics.jsonl`."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_rows(rows: list[dict]) -> list[dict]:
    """The rows of optimizer steps (not of evaluations)."""
    return [r for r in rows if "time/step" in r]


def run_identity(objective: str, regime: str, seed: int, run_dir: Path) -> dict:
    """The first fields of a run's summary: which run it is, and where: `run_dir` relative to the experiment's
    output folder (`runs/<run_name>`), so that a summary copied elsewhere names no path of the machine that
    made it (readers join it to the output folder; an absolute one, from older summaries, joins as itself)."""
    return {"objective": objective, "regime": regime, "seed": seed,
            "run_dir": str(Path(run_dir.parent.name) / run_dir.name)}


def results_record(settings: Any, data: dict, runs: list, **more: Any) -> dict:
    """What `results.json` holds before the summary: the settings, the data record and the runs' summaries."""
    return {"settings": dataclasses.asdict(settings), "data": data, "runs": runs, **more}


class Progress:
    """The minutes a batch of runs has left: each run's expected seconds, scaled by how fast this machine goes."""

    def __init__(self, expected: list[float], workers: int):
        self.expected, self.workers, self.done, self.start = expected, workers, [], time.perf_counter()

    def minutes_left(self, finished: int) -> float:
        """Job `finished` (an index into `expected`) is done: about how many minutes the rest will take."""
        self.done.append(finished)
        spent = time.perf_counter() - self.start
        running = min(self.workers - 1, len(self.expected) - len(self.done))  # the other workers' runs, half done
        total = sum(self.expected)
        worked = sum(self.expected[j] for j in self.done) + 0.5 * running * total / len(self.expected)
        return spent / worked * (total - worked) / 60
