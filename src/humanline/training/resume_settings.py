"""What `--resume` continues: the run folder's own settings, and the few fields a resumed segment may change.

A run folder keeps the settings its run started with in `config.yaml`, which a resume never rewrites, what it
reads in `inputs.json` (paths and fingerprints, and config.yaml's own SHA-256: `humanline.training.run_inputs`),
and one line per resumed segment in `segments.jsonl`:

    {"segment": 2, "step": 12, "changes": {"train.max_steps": [40, 60]},
     "inputs": {"data.train": {"data/pairs.jsonl": {"size": 5046, "sha256": "1a2b..."}}}, "time": "2026-11-26T10:04:05"}

(`step`: the checkpoint the segment continued from; `changes`: field -> [before, after]; `inputs`: the
fingerprints checked). The run's settings now are `config.yaml` (refused when edited by hand) with every
segment's changes applied in order, its inputs found from the working directory (`read_run`). A resume may
change only the fields of `RESUMABLE`: where the run ends, bookkeeping, and memory settings that leave the
method as it was. Any other difference, an input file's content included, would mix two settings in one run, so
it is refused, before anything in the folder changes, with the field, both values and how to start a new run
instead. Paths compare as the files they name: `x`, `./x` and `/abs/x` are one file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from humanline.errors import UserError
from humanline.settings.config import Config
from humanline.training import yaml_io
from humanline.training.config_loading import load_config_on
from humanline.training.recipe_paths import PATH_FIELDS, REWARD_FIELDS, resolve_recipe_paths
from humanline.training.run_dir import run_markers
from humanline.training.run_inputs import (
    INPUTS,
    canonical,
    check_config_unedited,
    check_inputs,
    locate,
    read_inputs,
    record_inputs,
    segment_prints,
    write_inputs,
)

SEGMENTS = "segments.jsonl"

# The fields a resume may change, and why each leaves the run's updates as they were. The one list: the
# checks, the log and docs/usage.md read it.
RESUMABLE = {
    "train.max_steps": "where the run ends: at least the steps done; the LR warm-up stays laid out over the "
                       "run's first train.max_steps",
    "train.epochs": "where the run ends when train.max_steps is null",
    "train.save_every": "checkpoint cadence",
    "train.keep_checkpoints": "how many checkpoints are kept",
    "train.eval_every": "evaluation cadence (an evaluation changes neither the policy nor the training RNG)",
    "train.max_bad_steps": "how many non-finite steps in a row abort the run",
    "train.allow_collapse": "the exit code of a run that collapsed (the run itself is the same)",
    "train.output_dir": "the run folder itself (a moved folder)",
    "model.gradient_checkpointing": "memory only: activations computed again in the backward pass, the same numbers",
    "rollout.batch_size": "prompts per generate call, memory and speed only (samples from the same distribution, "
                          "other draws)",
    "logging.log_every": "console cadence",
    "logging.progress": "progress bar",
    "logging.trackers": "experiment trackers",
}


@dataclass
class RunSettings:
    """A run folder's settings: as it started (`first`), and now (`now`: every segment's changes applied)."""

    first: Config
    now: Config
    segments: int  # how many segments the run has had (1: never resumed)
    inputs: dict | None = None  # `inputs.json` (None: a run started before inputs were recorded)


INPUT_FIELDS = {f"{section}.{key}" for section, key in PATH_FIELDS + REWARD_FIELDS}


def read_run(out: Path) -> RunSettings | None:
    """The settings recorded in run folder `out` (None: no `config.yaml`, a run that never started), with its
    inputs' paths as they are found from the working directory. A hand-edited `config.yaml` is refused."""
    path = out / "config.yaml"
    if not path.is_file():
        return None
    inputs = read_inputs(out)
    check_config_unedited(out, inputs)
    raw = yaml_io.read(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a run's settings (a mapping of sections), got {type(raw).__name__}")
    if inputs is None:  # a run started before inputs were recorded: its paths, read as a recipe's
        resolve_recipe_paths(raw, path)
    locate(raw, inputs, out)
    first = load_config_on(raw, [], str(path))
    raw = first.to_dict()
    records = _segment_records(out)
    for record in records:
        for dotted, (_, after) in record.get("changes", {}).items():
            section, key = dotted.split(".", 1)
            raw[section][key] = after
    now = load_config_on(raw, [], f"{path} with {out / SEGMENTS}") if records else first
    return RunSettings(first, now, 1 + len(records), inputs)


@dataclass
class Segment:
    """What a run's start knows before anything is built: the run's recorded settings (None: a new run, or a
    folder without them), what this segment changes, and the inputs it reads (`run_inputs`)."""

    recorded: RunSettings | None
    changes: dict[str, list]
    inputs: list[dict]


def start_segment(cfg: Config, out: Path, *, resume: bool, trust_inputs: bool = False) -> Segment:
    """Check a resume of the run in `out` with `cfg` (a run there, unedited settings, only `RESUMABLE` changes,
    unchanged inputs: each refusal one line, the folder untouched); a new run's inputs are fingerprinted.
    A run without its record of settings and inputs (`config.yaml`, `inputs.json`: removed, or a run started
    before inputs were recorded) cannot be checked, so it resumes only with `trust_inputs` (--trust-inputs)."""
    if not resume:
        return Segment(None, {}, record_inputs(cfg, out))
    require_a_run(out)
    recorded = read_run(out)
    missing = "config.yaml" if recorded is None else INPUTS if recorded.inputs is None else None
    if missing and not trust_inputs:
        raise UserError(f"--resume: '{out}' has no {missing}, so the run's inputs cannot be checked against what it "
                        f"started with: pass --trust-inputs to take them as they are now (then recorded), or start "
                        f"a new run")
    changes = resume_changes(recorded, cfg, out) if recorded is not None else {}
    inputs = check_inputs(cfg, recorded.inputs if recorded is not None else None, out)
    return Segment(recorded, changes, inputs)


def record_start(segment: Segment, cfg: Config, out: Path, step: int, logger, main: bool) -> None:
    """Once the run is built and resumed: a new run writes `config.yaml` and `inputs.json`; a resumed one appends
    its line to `segments.jsonl` (and records its inputs if the run had no `inputs.json`)."""
    recorded = segment.recorded
    if recorded is None:  # a new run (or a folder without its settings): they are the run's record
        logger.write_config()
        if main:
            write_inputs(out, segment.inputs)
        return
    logger.info(f"--resume: segment {recorded.segments + 1} of the run, changed: {describe(segment.changes)}")
    if note := stale_queue_note(cfg, segment.changes):
        logger.warn(note)
    if not main:
        return
    if recorded.inputs is None:
        logger.info(f"{out}: no {INPUTS} (a run started before inputs were recorded): its inputs and config.yaml "
                    f"are recorded now and checked by later resumes")
        write_inputs(out, segment.inputs)
    record_segment(out, recorded.segments + 1, step, segment.changes, segment.inputs)


def require_a_run(out: Path) -> None:
    """`--resume` into a folder that holds no humanline run (none of its records: `run_dir.run_markers`) is
    refused: starting a new run there is what the command without --resume does."""
    if run_markers(out):
        return
    raise UserError(f"--resume: train.output_dir '{out}' holds no run to continue (no inputs.json, run_info.json or "
                    f"checkpoint of a humanline run there); to start a run, leave out --resume")


def settings_to_resume(out: Path, overrides: list[str]) -> Config:
    """`humanline train --resume RUN_DIR [--section.key=value ...]`: the run's settings now, with `overrides`
    (which `resume_changes` then checks) and `out` as the run folder."""
    run = read_run(out)
    if run is None:
        raise UserError(f"--resume {out}: no config.yaml there, so no run to continue; to start a run in that "
                        f"folder instead, give a recipe: humanline train RECIPE --output-dir DIR")
    raw = run.now.to_dict()
    raw["train"]["output_dir"] = str(out)
    return load_config_on(raw, overrides, f"{out / 'config.yaml'} with --resume")


def _segment_records(out: Path) -> list[dict]:
    path = out / SEGMENTS
    if not path.is_file():
        return []
    records, lines = [], path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):  # torn by a kill while it was written: that segment never trained
                continue
            raise UserError(f"{path}:{number}: not valid JSON; the run's settings cannot be read back") from None
        records.append(record)
    return records


def flat(cfg: Config) -> dict:
    """`section.field` -> value for every field of `cfg`, as `config.yaml` holds it (a tuple as a list)."""
    return {f"{section}.{key}": json.loads(json.dumps(value, default=str))
            for section, fields in cfg.to_dict().items() for key, value in fields.items()}


def resume_changes(run: RunSettings, cfg: Config, out: Path) -> dict[str, list]:
    """The fields in which `cfg` differs from the run's settings now, as field -> [run's value, cfg's value].

    Raises `UserError` (one line) when one of them is not in `RESUMABLE`; the folder is not touched."""
    before, after = flat(run.now), flat(cfg)
    changed = {k: [before[k], after[k]] for k in before if before[k] != after[k] and
               not (k in INPUT_FIELDS and canonical(k, before[k]) == canonical(k, after[k]))}  # one file, two names
    if "train.output_dir" in changed and Path(before["train.output_dir"]).resolve() == out.resolve():
        del changed["train.output_dir"]  # the same folder, written another way
    refused = [k for k in changed if k not in RESUMABLE]
    if refused:
        name = refused[0]
        more = f" (also changed: {', '.join(refused[1:])})" if len(refused) > 1 else ""
        raise UserError(f"--resume: {name} is {_show(before[name])} in the run but {_show(after[name])} now{more} (a "
                        f"resume keeps the run's settings: docs/usage.md, Resuming a run); to change it start a new "
                        f"run (another --output-dir, or --overwrite)", details=f"the run: {out}")
    return changed


def stale_queue_note(cfg: Config, changes: dict[str, list]) -> str | None:
    """A stale run resumed with a later end: its queue drew no batch at or past the old end, so the first steps
    there train on batches drawn by the resumed policy, as at a run's start (docs/method.md §3.6). None: not so."""
    before, after = changes.get("train.max_steps", [None, None])
    staleness = cfg.train.staleness  # 0 unless the regime is stale (`config_checks`)
    if not staleness or before is None or after is None or after <= before:
        return None
    return (f"train.max_steps {before} -> {after} in a stale run: the queue drew nothing for steps {before + 1} and "
            f"later, so steps {before + 1}-{min(before + staleness, after)} train on batches drawn by the resumed "
            f"policy (0 to {staleness} versions old, as at a run's start), not {staleness} versions old")


def describe(changes: dict[str, list]) -> str:
    """`train.max_steps 40 -> 60, logging.log_every 1 -> 5` (or `none`)."""
    return ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items()) or "none"


def record_segment(out: Path, number: int, step: int, changes: dict[str, list], inputs: list[dict]) -> None:
    """Append segment `number`'s line to `segments.jsonl` (flushed to disk before training goes on); `inputs`:
    the fingerprints checked (`run_inputs.check_inputs`)."""
    line = json.dumps({"segment": number, "step": step, "changes": changes, "inputs": segment_prints(inputs),
                       "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    with open(out / SEGMENTS, "a") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _show(value) -> str:
    return "null" if value is None else json.dumps(value) if not isinstance(value, str) else value
