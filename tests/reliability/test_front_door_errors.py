"""What a new user meets first: a run that trained on nothing says so loudly and exits 4; an unknown model is one
line naming what is expected; a typo in a command-line override is blamed on the command line; a run that never
started leaves no folder behind; the files a run writes follow the umask."""

from __future__ import annotations

import os
import stat

from helpers_reliability import assert_user_error, run_cli
from helpers_train import ROOT
from humanline.files import umask_mode

GRPO_ONLINE = ROOT / "recipes" / "tiny" / "grpo_online.yaml"
DPO = ROOT / "recipes" / "tiny" / "dpo_humanline.yaml"
QUIET = "--logging.progress=false"


def test_a_run_that_trained_on_nothing_warns_and_exits_4(tmp_path, capsys):
    # exact_match on the random tiny model: every completion scores 0, every group is dropped in every step
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", tmp_path / "run", "--rollout.reward=exact_match",
                           "--eval.reward=exact_match", "--train.max_steps=2", "--eval.max_prompts=2", QUIET], capsys)
    assert code == 4, lines
    assert lines[-1].startswith("humanline: warning: NOTHING WAS TRAINED in 2 of 2 steps: every group was dropped")
    assert "(exit code 4)" in lines[-1]


def test_a_run_that_trained_exits_0(tmp_path, capsys):
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", tmp_path / "run", "--train.max_steps=1",
                           "--eval.max_prompts=2", QUIET], capsys)
    assert code == 0 and not any("warning: NOTHING" in line for line in lines), lines


def test_a_typo_in_an_override_is_blamed_on_the_command_line(tmp_path, capsys):
    code, lines = run_cli(["train", DPO, "--output-dir", tmp_path / "run", "--humanline.sync_evry=4"], capsys)
    line = assert_user_error(code, lines, "unknown config field 'humanline.sync_evry'", "did you mean "
                             "'humanline.sync_every'")
    assert line.startswith("humanline: error: command line (--humanline.sync_evry=4): ") and str(DPO) not in line
    code, lines = run_cli(["train", DPO, "--output-dir", tmp_path / "run", "--optim.lr=abc"], capsys)
    assert_user_error(code, lines, "command line (--optim.lr=abc): config field 'optim.lr': expected a number")
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(DPO.read_text().replace("sync_every:", "sync_evry:"))
    code, lines = run_cli(["train", recipe, "--output-dir", tmp_path / "run", "--humanline.low=-1"], capsys)
    assert_user_error(code, lines, f"{recipe}: unknown config field 'humanline.sync_evry'")  # the recipe's own


def _bad_jsonl(path, good_line: str):
    path.write_text(good_line + '{"id": "x", "prompt": 3}\n')
    return path


def test_the_hint_to_skip_invalid_records_names_the_option_each_command_has(tmp_path, capsys):
    pairs = (ROOT / "recipes" / "tiny" / "data" / "pairs.jsonl").read_text()
    prompts = (ROOT / "recipes" / "tiny" / "data" / "eval_prompts.jsonl").read_text()
    bad_pairs, bad_prompts = _bad_jsonl(tmp_path / "p.jsonl", pairs), _bad_jsonl(tmp_path / "e.jsonl", prompts)
    code, lines = run_cli(["train", DPO, "--output-dir", tmp_path / "run", f"--data.train={bad_pairs}"], capsys)
    assert_user_error(code, lines, "or drop them with data.skip_invalid: true (--data.skip_invalid=true)")
    code, lines = run_cli(["data", "convert", bad_pairs, tmp_path / "out.jsonl", "--to", "unpaired"], capsys)
    assert_user_error(code, lines, "or drop them with --skip-invalid")
    code, lines = run_cli(["eval", "tiny", "--prompts", bad_prompts, "--reward", "exact_match"], capsys)
    line = assert_user_error(code, lines, "fix them")
    assert line.endswith("; fix them")  # eval has no such option
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", tmp_path / "run", f"--eval.prompts={bad_prompts}"],
                          capsys)
    line = assert_user_error(code, lines, "eval.prompts", "fix them")
    assert line.endswith("; fix them")  # data.skip_invalid is for the offline data


def test_an_unknown_model_or_run_folder_is_one_line_saying_what_a_model_name_may_be(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prompts = ROOT / "recipes" / "tiny" / "data" / "eval_prompts.jsonl"
    for name in ("nosuchmodel", "runs/nosuch"):
        code, lines = run_cli(["eval", name, "--prompts", prompts, "--reward", "exact_match"], capsys)
        line = assert_user_error(code, lines, f"model '{name}': not a built-in name (tiny, smollm2), a local folder "
                                              f"or run, nor in the local Hugging Face cache", "the hub was not asked")
        assert "couldn't connect" not in line and "huggingface.co" not in line


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "runs" / "x"
    code, lines = run_cli(["train", DPO, "--output-dir", out, f"--data.train={tmp_path / 'missing.jsonl'}"], capsys)
    assert_user_error(code, lines, "no such file")
    assert not (tmp_path / "runs").exists()  # the data error: not even the parent folder the run made
    code, lines = run_cli(["train", DPO, "--output-dir", out, "--model.name=owner/none"], capsys)
    assert_user_error(code, lines, "model 'owner/none'")
    assert not (tmp_path / "runs").exists()


def test_a_reward_that_crashes_in_step_1_leaves_the_folder_as_it_was(tmp_path, capsys):
    out = tmp_path / "run"  # made by the run, removed with what it wrote
    (tmp_path / "crash.py").write_text("def boom(prompts, completions, **_):\n    raise RuntimeError('down')\n")
    code, lines = run_cli(["train", GRPO_ONLINE, "--output-dir", out, f"--rollout.reward={tmp_path}/crash.py:boom",
                           "--train.max_steps=2", QUIET], capsys)
    assert code == 2 and "down" in lines[-1], lines
    assert not out.exists()


def test_eval_json_the_final_model_and_checkpoints_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        code, lines = run_cli(["train", DPO, "--output-dir", out, "--train.max_steps=1", "--train.save_every=1",
                               "--train.keep_checkpoints=1", QUIET], capsys)
        assert code == 0, lines
        checkpoint = sorted((out / "checkpoints").glob("step-*"))[-1]
        written = [p for p in checkpoint.rglob("*") if p.is_file()]
        assert written and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in written), written
        code, lines = run_cli(["eval", out, "--prompts", ROOT / "recipes/tiny/data/eval_prompts.jsonl",
                               "--reward", "exact_match", "--n", "1", "--max-new-tokens", "2"], capsys)
        assert code == 0, lines
        for path in (out / "eval.json", out / "final" / "model.safetensors", out / "final" / "config.json"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o644, path
    finally:
        os.umask(old)


def test_umask_mode_follows_the_umask():
    old = os.umask(0o027)
    try:
        assert umask_mode() == 0o640
    finally:
        os.umask(old)
