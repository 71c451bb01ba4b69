"""Stops at every moment, and a dead model: a signal while the run is being set up leaves the folder as it was
found and says so; a second SIGTERM during a step stops at once and names the last checkpoint and the command that
continues from it; a gradient norm of exactly 0 in `DEAD_STEPS` updates in a row ends the run with exit 3 (a far
too high optim.lr, refused at start-up above 1). The 1-layer tiny model, in this process.
"""

from __future__ import annotations

import os
import shlex
import signal

import pytest

from helpers_reliability import assert_user_error, base_sections, one_thread, run_cli, step_losses, write_recipe

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def _recipe(tmp_path, **train):
    return write_recipe(tmp_path, base_sections(tmp_path / "runs" / "x"),
                        train={"max_steps": 4, "save_every": 2, "reference": "frozen", **train})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_run_is_set_up_leaves_the_folder_as_found(tmp_path, monkeypatch, capsys, signum):
    """The signal comes once config.yaml, inputs.json and metrics.jsonl are written, just before step 1."""
    import humanline.training.resume_settings as resume_settings

    real = resume_settings.write_inputs

    def write_inputs(out, entries):
        real(out, entries)
        assert (out / "config.yaml").exists() and (out / "metrics.jsonl").exists()
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(resume_settings, "write_inputs", write_inputs)
    code, lines = run_cli(["train", _recipe(tmp_path)], capsys)
    name = signal.Signals(signum).name
    assert code == 128 + signum, "\n".join(lines)
    assert lines[-1] == (f"[humanline] stopped by {name} while the run was being set up, before the first step: "
                         f"nothing was trained and '{tmp_path / 'runs' / 'x'}' is left as it was found; run the "
                         f"same command again to start")
    assert not (tmp_path / "runs").exists()


def test_a_second_sigterm_during_a_step_names_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """Two SIGTERMs inside step 3 (checkpoints every 2 steps): no checkpoint of step 3 can be made, so the run
    stops at once, says the last checkpoint is step 2 and prints the command that continues from it (which then
    finishes the run)."""
    from humanline.training import step as stages

    out = tmp_path / "runs" / "x"
    real = stages.micro_batch_loss

    def loss(ctx, *args, **kwargs):
        if ctx.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(ctx, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(stages, "micro_batch_loss", loss)
        code, lines = run_cli(["train", _recipe(tmp_path)], capsys)
    assert code == 143, "\n".join(lines)
    assert lines[-1] == (f"[humanline] stopped by SIGTERM a second time, after step 2: the last checkpoint is step 2; "
                         f"continue from step 2 with: humanline train --resume {shlex.quote(str(out))}")
    assert sorted(step_losses(out)) == [1, 2]
    code, lines = run_cli(shlex.split(lines[-1].split("with: humanline ", 1)[1]), capsys)
    assert code == 0, "\n".join(lines)
    assert sorted(step_losses(out)) == [1, 2, 3, 4]


def test_a_second_sigterm_in_the_first_step_leaves_the_folder_as_found(tmp_path, monkeypatch, capsys):
    from humanline.training import step as stages

    real = stages.micro_batch_loss

    def loss(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "micro_batch_loss", loss)
    code, lines = run_cli(["train", _recipe(tmp_path)], capsys)
    assert code == 143, "\n".join(lines)
    assert "a second time, before the first step: nothing was trained" in lines[-1], lines[-1]
    assert not (tmp_path / "runs").exists()


def test_a_dead_model_ends_the_run_with_exit_3(tmp_path, monkeypatch, capsys):
    """optim.lr=1e6 (the bound lifted): every output saturates after step 1, the gradient norm is exactly 0 from
    step 2 on, and the run used to finish as "done" with exit 0."""
    from humanline.training import config_checks

    monkeypatch.setattr(config_checks, "MAX_LR", float("inf"), raising=False)
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"), optim={"lr": 1e6},
                          train={"max_steps": 8, "micro_batch_size": 8})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "training aborted: the gradient norm was exactly 0 in 3 steps in a row (steps 2-4)",
                      "stopped learning", "too high optim.lr (now 1e+06)", "lower optim.lr", expected_code=3)
    assert sorted(step_losses(tmp_path / "run")) == [1, 2, 3]  # the step that ended it is not logged


def test_check_alive_counts_zero_norms_in_a_row_only():
    from helpers_train import tiny_config
    from humanline.errors import DeadModelError
    from humanline.training.counters import Counters
    from humanline.training.faults import DEAD_STEPS, check_alive

    cfg, counters = tiny_config("dpo", "x"), Counters()
    for step, norm in enumerate([0.0, 0.0, 1e-30, 0.0, 0.0]):  # a tiny norm is alive: the streak starts again
        check_alive(counters, cfg, step, norm)
    assert counters.dead_streak == 2 == DEAD_STEPS - 1
    with pytest.raises(DeadModelError, match=r"steps 4-6"):
        check_alive(counters, cfg, 5, 0.0)
    counters = Counters()  # a step that could give no gradient (loss exactly 0, every token clipped) does not count
    for step, (norm, has_signal) in enumerate([(0.0, True), (0.0, False), (0.0, True), (0.0, True)]):
        check_alive(counters, cfg, step, norm, signal=has_signal)
    assert counters.dead_streak == 2


def test_a_step_without_signal_is_not_a_dead_model(tmp_path):
    """Offline GRPO whose groups all score alike: the loss is exactly 0 and so is the gradient, every step; that is
    data without signal, not a dead model: the run trains to its end."""
    import json

    from helpers_train import tiny_config
    from humanline.training.loop import Trainer

    data = tmp_path / "flat.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "completions": ["a", "b"], "scores": [1.0, 1.0]}) + "\n"
                            for i in range(8)))
    cfg = tiny_config("grpo", tmp_path / "run", steps=4, data={"train": str(data)})
    trainer = Trainer(cfg)
    rows = [trainer.train_step() for _ in range(4)]
    assert [r["grad_norm"] for r in rows] == [0.0] * 4 and [r["loss"] for r in rows] == [0.0] * 4


def test_a_learning_rate_past_the_bound_is_refused_at_start_up(tmp_path, capsys):
    code, lines = run_cli(["train", write_recipe(tmp_path, base_sections(tmp_path / "run")), "--optim.lr=1e6"], capsys)
    assert_user_error(code, lines, "config field 'optim.lr': expected at most 1", "1e-7 to 1e-3", "got 1000000.0")
    assert not (tmp_path / "run").exists()
