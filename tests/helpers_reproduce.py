"""Data for `reproduce`'s tiny-model runs: sums, their groups (one right and one wrong answer each), held-out
prompts."""

from __future__ import annotations

from humanline.experiments.reproduce.task import sum_records
from humanline.files import write_jsonl


def tiny_reproduce_data(tmp_path) -> dict:
    """`reproduce`'s data record (paths) for 12 training sums and 4 held-out ones, written under `tmp_path`."""
    train, held_out = sum_records(seed=0, n_train=12, n_held_out=4)
    groups = [{"prompt": r["prompt"], "completions": [f"\\boxed{{{r['answer']}}}", "no idea"], "scores": [1.0, 0.0]}
              for r in train]
    return {"groups": str(write_jsonl(tmp_path / "groups.jsonl", groups)),
            "prompts": str(write_jsonl(tmp_path / "train.jsonl", train)),
            "eval_prompts": str(write_jsonl(tmp_path / "eval.jsonl", held_out))}
