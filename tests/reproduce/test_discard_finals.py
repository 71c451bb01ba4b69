"""`reproduce --discard-finals`: each run's final model is removed once its results are recorded, never before,
and a final evaluation it would need again is refused by name; the disk warning when final models are kept."""

from __future__ import annotations

import argparse
from collections import namedtuple

import pytest

from helpers_reproduce import tiny_reproduce_data
from humanline.commands import reproduce as command
from humanline.errors import UserError
from humanline.experiments.reproduce import runs as R
from humanline.experiments.reproduce.runs import run_name, train_run
from humanline.experiments.reproduce.settings import ReproduceSettings
from humanline.model.loading import model_config_for

TINY = dict(model="tiny", steps=2, evals=1, prompts_per_step=2, max_new_tokens=4, eval_samples=1)


def test_the_final_model_goes_only_after_its_final_evaluation_is_recorded(tmp_path):
    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    s = ReproduceSettings(**TINY, final_samples=2, discard_finals=True)
    first = train_run(s, data, "grpo", "offline", 0, out)
    run_dir = out / "runs" / run_name("grpo", "offline", 0)
    assert first["final_eval"]["samples"] == 2 and (run_dir / "final_eval.json").exists()
    assert not (run_dir / "final").exists() and (run_dir / "summary.json").exists()
    again = train_run(s, data, "grpo", "offline", 0, out)  # read back: nothing needs the model
    assert again["cached"] is True and again["final_eval"] == first["final_eval"]
    more = ReproduceSettings(**{**s.__dict__, "final_samples": 3})
    with pytest.raises(UserError, match=r"final model of .*grpo-offline-seed0 was removed \(--discard-finals\).*"
                                        r"--final-samples 3"):
        train_run(more, data, "grpo", "offline", 0, out)
    with pytest.raises(UserError, match="run folder without a final model"):  # `humanline eval RUN` and the rest
        model_config_for(str(run_dir))


def test_without_a_final_evaluation_the_model_goes_once_the_run_finished_and_kept_runs_can_be_trimmed(tmp_path):
    data, out = tiny_reproduce_data(tmp_path), tmp_path / "out"
    kept = ReproduceSettings(**TINY, final_samples=2)
    train_run(kept, data, "grpo", "offline", 0, out)
    run_dir = out / "runs" / run_name("grpo", "offline", 0)
    assert (run_dir / "final").is_dir()  # the default keeps it
    trim = ReproduceSettings(**{**kept.__dict__, "discard_finals": True})
    assert train_run(trim, data, "grpo", "offline", 0, out)["cached"] is True  # a finished run is trimmed too
    assert not (run_dir / "final").exists()
    plain = ReproduceSettings(**TINY, discard_finals=True)
    summary = train_run(plain, data, "grpo", "offline", 1, out)
    assert "final_eval" not in summary and summary["steps"] == 2
    assert not (out / "runs" / run_name("grpo", "offline", 1) / "final").exists()


def test_the_disk_warning_names_the_sizes_and_the_flag(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    assert R.disk_warning(run_dir, 10) is None  # no final model kept: nothing to warn about
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "final" / "model.safetensors").write_bytes(b"x" * 2**20)  # 1 MiB
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(R.shutil, "disk_usage", lambda path: usage(0, 0, 5 * 2**20))
    assert R.disk_warning(run_dir, 5) is None  # 5 runs x 1 MiB fit in 5 MiB
    warning = R.disk_warning(run_dir, 6)
    assert "6 runs left need about 0.0 GB" in warning and "--discard-finals" in warning
    assert str(run_dir / "final") in warning


def test_the_flag_reaches_the_settings():
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["reproduce", "smollm2", "--discard-finals", "--workers", "1"])
    assert command.reproduce_settings(args).discard_finals is True
    args = parser.parse_args(["reproduce", "smollm2", "--workers", "1"])
    assert command.reproduce_settings(args).discard_finals is False
