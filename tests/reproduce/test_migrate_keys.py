"""scripts/migrate_reproduce_keys.py: an output folder keyed by the older rules is rewritten to the one rule, once."""

from __future__ import annotations

import importlib.util
import json

from helpers_train import ROOT
from humanline.experiments.reproduce import data as D
from humanline.experiments.reproduce.runs import final_eval_key
from humanline.experiments.reproduce.settings import ReproduceSettings

spec = importlib.util.spec_from_file_location("migrate", ROOT / "scripts" / "migrate_reproduce_keys.py")
migrate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(migrate)


def test_old_keys_become_the_one_rules_and_others_are_left(tmp_path):
    s = ReproduceSettings(task="chain", data_temperature=1.3, final_samples=8)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "eval_prompts.jsonl").write_text('{"prompt": "q"}\n')
    held_out = migrate.file_hash(tmp_path / "data" / "eval_prompts.jsonl")
    old_eval = migrate._old_hash(migrate.old_offline_key(s), s.eval_prompts, s.eval_samples, D.QUALITY_SAMPLE)
    files = {"data/offline.json": migrate.old_offline_key(s), "data/base_eval.json": old_eval,
             "runs/a/final_eval.json": migrate.old_final_eval_key(s, held_out, "new-run-key")}
    for name, key in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(json.dumps({"key": key, "pass@1": 0.5}))
    summary = {"key": "old-abs-key", "location_free_key": "new-run-key"}
    (tmp_path / "runs/a/summary.json").write_text(json.dumps(summary))
    (tmp_path / "runs/b").mkdir()
    (tmp_path / "runs/b/summary.json").write_text(json.dumps({"key": "k"}))
    (tmp_path / "runs/b/final_eval.json").write_text(json.dumps({"key": "made-with-other-flags"}))

    lines = migrate.migrate(tmp_path, s, dry_run=False)
    read = {name: json.loads((tmp_path / name).read_text()) for name in
            ("data/offline.json", "data/base_eval.json", "runs/a/summary.json", "runs/a/final_eval.json",
             "runs/b/final_eval.json")}
    assert read["data/offline.json"]["key"] == D.offline_key(s) and read["data/offline.json"]["pass@1"] == 0.5
    assert read["data/base_eval.json"]["key"] == D.base_eval_key(s, True)
    assert read["runs/a/summary.json"] == {"key": "new-run-key"}
    data = {"eval_prompts": str(tmp_path / "data" / "eval_prompts.jsonl")}
    assert read["runs/a/final_eval.json"]["key"] == final_eval_key(s, data, "new-run-key")
    assert read["runs/b/final_eval.json"]["key"] == "made-with-other-flags"
    assert any("left as it is" in line for line in lines)
    again = migrate.migrate(tmp_path, s, dry_run=False)  # once: a second pass changes nothing
    assert not any("->" in line or "<-" in line for line in again)
