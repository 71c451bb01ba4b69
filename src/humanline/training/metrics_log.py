"""Run logging: `metrics.jsonl` (one line per step), a stdout line every `log_every` steps, a progress bar,
accelerate trackers, and `config.yaml` with the resolved configuration.

`metrics.jsonl` is strict JSON: a non-finite value (a diverged loss or gradient norm) is written as `null`,
since JSON has no NaN or inf; the console line shows it as `nan` / `inf`, and the step's warning line and the
`skipped_steps` counter say that its update was skipped. Readers (`humanline report`, the demo) take numbers
only, so a `null` is a gap in a curve, never a crash.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import yaml

from humanline.settings.config import Config

STDOUT_KEYS = ("skipped", "dropped_groups", "loss", "eval/loss", "eval/rewards/accuracy", "eval/reward_mean",
               "eval/pass@1", "samples_generated", "rewards/accuracy", "rewards/margin", "reward", "kl",
               "humanline/inside_band", "grad_norm", "tokens_per_s")
# The progress bar's numbers, those the docs say to watch: the loss, the reward of the samples trained on (sampled
# regimes) and the pair accuracy (DPO, IPO), and the latest held-out reward or pass@1 once an evaluation ran
BAR_KEYS = ("loss", "reward", "rewards/accuracy")
BAR_EVAL_KEYS = ("eval/reward_mean", "eval/pass@1")


class MetricsLogger:
    def __init__(self, out_dir: Path, cfg: Config, accelerator, max_steps: int):
        self.main = accelerator.is_main_process
        self.accelerator = accelerator
        self.cfg = cfg
        self.start = time.perf_counter()
        self.max_steps = max_steps
        self.out_dir = out_dir
        self.file = None
        self.bar = None
        self.bar_numbers: dict = {}  # what the bar shows: the latest value of each of its keys
        self.evaluated: set[int] = set()  # steps whose evaluation the log holds (a resumed run's kept lines too)
        if self.main:
            out_dir.mkdir(parents=True, exist_ok=True)
            self.file = open(out_dir / "metrics.jsonl", "a", buffering=1)
            if cfg.logging.progress and sys.stderr.isatty():
                from tqdm.auto import tqdm

                self.bar = tqdm(total=max_steps, desc="train", dynamic_ncols=True)
        if cfg.logging.trackers:
            accelerator.init_trackers("humanline", config=_flat(cfg.to_dict()))

    def write_config(self) -> None:
        """Write the resolved config as `config.yaml` (once the run is known to start or continue: a refused
        `--resume` leaves the folder's config as it was)."""
        if self.main:
            (self.out_dir / "config.yaml").write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))

    def log(self, step: int, metrics: dict) -> dict:
        """Write one step's metrics; returns them as numbers (a non-finite value stays a float NaN/inf here)."""
        record = {"step": step, "elapsed_s": round(time.perf_counter() - self.start, 4)}
        record.update({k: _num(v) for k, v in metrics.items()})
        if any(k.startswith("eval/") for k in metrics):
            self.evaluated.add(step)
        if self.main:
            self.file.write(json.dumps({k: _json_value(v) for k, v in record.items()}, allow_nan=False) + "\n")
            self._show(step, record)
        if self.cfg.logging.trackers:
            finite = {k: v for k, v in record.items() if isinstance(v, float) and math.isfinite(v)}
            self.accelerator.log(finite, step=step)
        return record

    def _show(self, step: int, record: dict) -> None:
        """The console: every `log_every` steps a full step line, which stays on screen (above the bar on a
        terminal); on a terminal the bar also carries the step's key numbers (`BAR_KEYS`)."""
        every = self.cfg.logging.log_every
        line = None
        if every and step % every == 0:
            shown = " ".join(f"{k}={_fmt(record[k])}" for k in STDOUT_KEYS if k in record)
            line = f"step {step}/{self.max_steps} {shown}"
        if self.bar is None:
            if line is not None:
                print(line, flush=True)
            return
        self.bar_numbers.update({k.replace("rewards/", "pair_"): _fmt(record[k]) for k in BAR_KEYS + BAR_EVAL_KEYS
                                 if k in record})
        if line is not None:
            self.bar.write(line)  # tqdm clears the bar, prints the line to stdout, draws the bar again
        self.bar.n = min(step, self.max_steps)
        self.bar.set_postfix(self.bar_numbers, refresh=True)

    def truncate(self, step: int) -> None:
        """Drop metric lines after `step` (a resumed run repeats those steps); note which steps the kept lines
        evaluated (every process learns them: they decide whether an evaluation runs again)."""
        if self.main:
            path = Path(self.file.name)
            self.file.close()
            lines = [ln for ln in path.read_text().splitlines() if ln.strip() and _line_step(ln) <= step]
            path.write_text("".join(ln + "\n" for ln in lines))
            self.file = open(path, "a", buffering=1)
            self.evaluated = {int(_line_step(ln)) for ln in lines if _has_eval(ln)}
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list  # deferred: accelerate loads slowly

            self.evaluated = broadcast_object_list([self.evaluated])[0]

    def has_eval(self, step: int) -> bool:
        """Whether the log holds an evaluation of `step` (a resumed run does not evaluate a step twice)."""
        return step in self.evaluated

    def info(self, message: str) -> None:
        if self.main:
            self._say(f"[humanline] {message}")

    def warn(self, message: str) -> None:
        self._say(f"[humanline] warning: {message}")

    def _say(self, line: str) -> None:
        """A line on stderr; on a terminal above the bar (tqdm clears it first), not written over it."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.cfg.logging.trackers:
            self.accelerator.end_training()


def _num(value):
    """A float for anything numeric (tensors included); other values as they are."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _json_value(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _fmt(value) -> str:
    """Console form of a metric: 4 significant digits for numbers (nan / inf included), text as it is."""
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def _line_step(line: str) -> float:
    """The step of a metrics line; a damaged line (a run killed mid-write) counts as past every step."""
    try:
        return float(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return math.inf


def _has_eval(line: str) -> bool:
    try:
        return any(str(k).startswith("eval/") for k in json.loads(line))
    except (ValueError, TypeError):
        return False


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v if isinstance(v, (int, float, str, bool)) else str(v)
    return out
