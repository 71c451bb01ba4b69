"""Shared helpers for the reliability tests: tiny recipes written to disk and in-process CLI runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import yaml

from humanline.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "recipes" / "tiny" / "data"
ERROR_PREFIX = "humanline: error:"
MAX_ERROR = 300  # characters of an error line, prefix included (docs/usage.md, "Exit codes": --debug shows more)


def one_thread():
    """Generator for an autouse fixture: torch on 1 thread while a test module runs.

    On these shared 2-core machines, 2 intra-op threads under contention make a tiny matmul ~100x slower
    (41 ms vs 0.3 ms measured); results are compared within one thread setting only.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def base_sections(out: Path, objective: str = "dpo") -> dict:
    """A 1-step offline run of the smallest tiny model (1 layer, hidden 16): fails or finishes in ~1 s."""
    data = {"dpo": "pairs.jsonl", "kto": "unpaired.jsonl", "grpo": "groups.jsonl"}[objective]
    return {
        "model": {"name": "tiny", "tiny_hidden_size": 16, "tiny_layers": 1},
        "data": {"train": str(DATA / data), "max_prompt_length": 32, "max_length": 48},
        "objective": {"name": objective},
        "optim": {"lr": 1e-3, "warmup_ratio": 0.0},
        "train": {"micro_batch_size": 4, "max_steps": 1, "output_dir": str(out)},
        "logging": {"progress": False, "log_every": 0},
    }


def online_sections(out: Path) -> dict:
    """A 1-step online GRPO run on the tiny prompts, scored by `recipes/tiny/rewards.py:digits`."""
    sections = base_sections(out, "grpo")
    sections["data"].pop("train")
    sections["train"].update({"regime": "online", "micro_batch_size": 2})
    sections["rollout"] = {"prompts": str(DATA / "prompts.jsonl"), "prompts_per_step": 2, "n": 2,
                           "max_new_tokens": 3, "reward": str(ROOT / "recipes" / "tiny" / "rewards.py") + ":digits"}
    return sections


def online_config(out: Path, steps: int, **changes: dict):
    """The checked config of `online_sections` run for `steps` steps, each section updated with `changes`."""
    from humanline.training.config_loading import load_config

    sections = online_sections(out)
    sections["train"]["max_steps"] = steps
    for section, values in changes.items():
        sections.setdefault(section, {}).update(values)
    return load_config(None, sections)


def step_losses(out: Path) -> dict[int, float]:
    """Each logged step's loss in the run folder `out`."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def write_recipe(folder: Path, sections: dict, **changes: dict) -> Path:
    """Write `sections` updated per section with `changes` (a None value deletes the key) to a YAML file."""
    merged = copy.deepcopy(sections)
    for section, values in changes.items():
        target = merged.setdefault(section, {})
        for key, value in values.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows are dicts (dumped as JSON) or raw strings (written as they are, for malformed lines)."""
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """Run `humanline ARGV` in this process; returns (exit code, stderr lines)."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip()]


def assert_user_error(code: int, lines: list[str], *needles: str, expected_code: int = 2) -> str:
    """Exit code `expected_code`, no traceback, and exactly one `humanline: error:` line of at most `MAX_ERROR`
    characters, the last one, containing every needle. Returns that line."""
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1, f"expected one error line, got {len(errors)}:\n{text}"
    assert lines[-1] == errors[0], f"the error line is not the last line:\n{text}"
    assert code == expected_code, f"exit code {code}, expected {expected_code}:\n{text}"
    assert len(errors[0]) <= MAX_ERROR, f"{len(errors[0])} characters: {errors[0]}"
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]
