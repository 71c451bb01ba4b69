"""One-off: rewrite the cache keys of a `humanline reproduce` output folder made before the one cache rule
(`humanline.experiments.reproduce.keys`, 2026-11-29), so that its data, evaluations and runs are found again.

    python scripts/migrate_reproduce_keys.py runs/reproduce-smollm2-add --task add --final-samples 8 [--dry-run]

Give the reproduce flags the folder was made with (those that shape its data: --task, --data-temperature,
--offline-source, --offline-prompts, --final-samples, ...). Each record whose key is the one the older rules gave
those settings is rewritten with the key the one rule gives them; a record with any other key is left as it is
and listed (made with other flags, or already migrated). Run summaries found by their older absolute-path key
carried the current key as `location_free_key`: it becomes their `key`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from humanline.cli import build_parser
from humanline.commands.reproduce import reproduce_settings
from humanline.experiments.reproduce import data as D
from humanline.experiments.reproduce.keys import file_hash
from humanline.experiments.reproduce.runs import FINAL_EVAL_SEED, final_eval_key
from humanline.files import write_json


def _old_hash(*parts) -> str:  # the data files' older rule
    return hashlib.sha256(json.dumps([D.DATA_VERSION, *parts], sort_keys=True).encode()).hexdigest()[:16]


def _old_json_hash(value) -> str:  # the final evaluations' older rule (a list)
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def old_offline_key(s) -> str:
    extra = [] if D.data_temperature(s) == s.temperature else [{"data_temperature": s.data_temperature}]
    extra += [] if s.offline_source == "base" else [{"offline_source": s.offline_source}]
    task = s.task_spec
    extra += [] if task.name == "sums" else [{"task": task.name, "source": task.source}]
    return _old_hash(s.model, s.train_prompts, s.offline_prompts, s.samples_per_prompt, s.answer_tokens,
                     s.temperature, list(task.stop), D.SHARD, *extra)


def old_final_eval_key(s, held_out: str, identity: str) -> str:
    return _old_json_hash([identity, held_out, s.final_samples, s.answer_tokens, s.temperature, list(s.task_spec.stop),
                           FINAL_EVAL_SEED])


def migrate(out: Path, s, dry_run: bool) -> list[str]:
    """Rewrite what the older rules keyed; returns one line per file looked at."""
    lines, parts = [], [D.QUALITY_SAMPLE]
    eval_parts = [s.eval_prompts, s.eval_samples, *parts]
    data = {"eval_prompts": str(out / "data" / "eval_prompts.jsonl")}
    held_out = file_hash(data["eval_prompts"]) if Path(data["eval_prompts"]).is_file() else None
    renames = {  # file -> (old key, new key) candidates
        out / "data" / "offline.json": [(old_offline_key(s), D.offline_key(s))],
        out / "data" / "base_eval.json": [(_old_hash(old_offline_key(s), *eval_parts), D.base_eval_key(s, True)),
                                          (_old_hash("no offline data", *eval_parts), D.base_eval_key(s, False))],
    }
    if held_out is not None:
        identity = f"base:{s.model}"
        renames[out / "data" / "base_final_eval.json"] = [(old_final_eval_key(s, held_out, identity),
                                                            final_eval_key(s, data, identity))]
    for summary_path in sorted((out / "runs").glob("*/summary.json")):
        summary = json.loads(summary_path.read_text())
        if "location_free_key" in summary:
            summary["key"] = summary.pop("location_free_key")
            lines.append(f"{summary_path}: key <- its location-free key {summary['key']}")
            if not dry_run:
                write_json(summary_path, summary)
        if held_out is not None:
            renames[summary_path.parent / "final_eval.json"] = [(old_final_eval_key(s, held_out, summary["key"]),
                                                                 final_eval_key(s, data, summary["key"]))]
    for path, candidates in renames.items():
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        new = next((n for o, n in candidates if record.get("key") == o), None)
        if new is None:
            lines.append(f"{path}: left as it is (key {record.get('key')}: other flags, or migrated already)")
            continue
        lines.append(f"{path}: key {record['key']} -> {new}")
        if not dry_run:
            write_json(path, {**record, "key": new})
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir", type=Path)
    p.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    known, flags = p.parse_known_args(argv)
    args = build_parser().parse_args(["reproduce", "smollm2", *flags])
    for line in migrate(known.output_dir, reproduce_settings(args), known.dry_run):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
