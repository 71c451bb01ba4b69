"""reasoning-gym tasks as a prompt source (`reasoning_gym:NAME?...`) and their verifiers as the reward."""

from __future__ import annotations

import argparse
import sys

import pytest

pytest.importorskip("reasoning_gym")

from humanline.commands import data as data_command  # noqa: E402
from humanline.data import load_records  # noqa: E402
from humanline.data.reasoning_gym import (  # noqa: E402
    INSTRUCTIONS,
    answer_completion,
    extract_answer,
    parse_task_source,
)
from humanline.errors import UserError  # noqa: E402
from humanline.evaluation.generations import default_reward_spec, is_verifiable  # noqa: E402
from humanline.sampling.reward_spec import build_reward  # noqa: E402
from humanline.settings.config import Config  # noqa: E402
from humanline.training.config_checks import validate  # noqa: E402

# 1-digit sums of two terms: at most 10 x 10 x 2 distinct questions, so 300 entries repeat many of them
SMALL = "reasoning_gym:chain_sum?size=200&held_out=100&min_terms=2&max_terms=2&max_digits=1"


def records(source: str) -> list:
    return load_records(source, kind="prompts").records


def scores(source: str, completions: list[str]) -> list[float]:
    recs = records(source)[: len(completions)]
    return build_reward("reasoning_gym")([r.prompt for r in recs], completions,
                                          reasoning_gym=[r.metadata["reasoning_gym"] for r in recs])


def test_the_source_yields_prompts_with_the_answer_format_and_their_entry():
    recs = records("reasoning_gym:leg_counting?size=5&held_out=2&seed=3&min_animals=1&max_animals=2")
    assert len(recs) == 5
    first = recs[0]
    assert first.prompt.endswith("\n\n" + INSTRUCTIONS["tag"]) and "legs" in first.prompt
    assert first.prompt_id == "leg_counting-3-0" and first.answer.isdigit()
    assert first.metadata["reasoning_gym"] == {"task": "leg_counting", "index": 0, "format": "tag", "extract": "strict",
                                               "config": {"min_animals": 1, "max_animals": 2, "seed": 3, "size": 7}}
    boxed = records("reasoning_gym:leg_counting?size=5&held_out=2&seed=3&min_animals=1&max_animals=2&format=boxed")[0]
    assert boxed.prompt.endswith("\\boxed{}.") and boxed.prompt.split("\n\n")[:-1] == first.prompt.split("\n\n")[:-1]


def test_train_and_held_out_splits_are_disjoint_by_construction():
    train = records(SMALL)
    held = records(SMALL + "&split=held_out")
    questions = {r.prompt for r in train}
    assert len(train) == 200 and 0 < len(held) < 100  # repeated questions were dropped from the held-out split
    assert not questions & {r.prompt for r in held}
    assert not {r.prompt_id for r in train} & {r.prompt_id for r in held}
    assert min(r.metadata["reasoning_gym"]["index"] for r in held) >= 200


@pytest.mark.parametrize("source, wrong", [
    ("reasoning_gym:chain_sum?size=4&held_out=0&min_terms=2&max_terms=3", lambda a: str(int(a) + 1)),
    ("reasoning_gym:basic_arithmetic?size=4&held_out=0&min_terms=2&max_terms=2&max_digits=1&operators=[\"+\"]",
     lambda a: str(int(a) + 1)),
    ("reasoning_gym:leg_counting?size=4&held_out=0&min_animals=1&max_animals=2", lambda a: str(int(a) + 2)),
])
def test_the_reward_scores_a_right_answer_1_and_a_wrong_one_0(source, wrong):
    recs = records(source)
    right = [answer_completion(r.answer) for r in recs]
    assert scores(source, right) == [1.0] * 4
    assert scores(source, [f"Let me think. <answer>{wrong(r.answer)}</answer>" for r in recs]) == [0.0] * 4
    assert scores(source, ["no answer here", "<answer></answer>", "", "42"]) == [0.0] * 4


def test_the_answer_is_the_last_tag_else_the_last_box():
    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("\\boxed{3} and \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_answer("<answer>5</answer> \\boxed{6}") == "5"
    assert extract_answer("5") is None and extract_answer("\\boxed{7") is None
    source = "reasoning_gym:chain_sum?size=2&held_out=0"
    answer = records(source)[0].answer
    assert scores(source, [f"so \\boxed{{{answer}}}"]) == [1.0]


def test_a_prompt_file_written_from_a_task_scores_like_the_task(tmp_path, capsys):
    source = "reasoning_gym:leg_counting?size=6&held_out=3&split=held_out"
    out = tmp_path / "held.jsonl"
    parser = argparse.ArgumentParser()
    data_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "convert", source, str(out), "--to", "prompts"])
    assert args.func(args) == 0
    written = load_records(out, kind="prompts").records
    assert written == records(source)
    args = parser.parse_args(["data", "check", str(out)])
    assert args.func(args) == 0
    assert "prompts with a reference answer: " in capsys.readouterr().out
    assert scores(str(out), [answer_completion(r.answer) for r in written]) == [1.0] * len(written)
    assert default_reward_spec(written) == "reasoning_gym" and is_verifiable("reasoning_gym")


@pytest.mark.parametrize("source, message", [
    ("reasoning_gym:chian_sum", "unknown reasoning-gym task 'chian_sum' (close names: chain_sum"),
    ("reasoning_gym:chain_sum?min_digit=2", "unknown setting 'min_digit' of task chain_sum; expected one of size, "
                                            "held_out, seed, split, format, extract or the task's own: min_terms"),
    ("reasoning_gym:chain_sum?min_terms=5&max_terms=2", "task chain_sum refuses these settings: max_terms must"),
    ("reasoning_gym:chain_sum?size=0", "'size' expected an integer in [1, 1000000], got 0"),
    ("reasoning_gym:chain_sum?split=test", "'split' expected one of train, held_out, got 'test'"),
    ("reasoning_gym:chain_sum?extract=loose", "'extract' expected one of strict, lenient, got 'loose'"),
    ("reasoning_gym:chain_sum?held_out=0&split=held_out", "split=held_out needs held_out >= 1"),
    ("reasoning_gym:chain_sum?size", "'size' expected key=value"),
])
def test_a_bad_source_is_one_line_naming_what_is_expected(source, message):
    with pytest.raises(UserError) as info:
        records(source)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(source)


def test_without_reasoning_gym_installed_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    with pytest.raises(UserError, match=r"reasoning_gym:chain_sum: needs reasoning-gym: pip install "
                                        r"'humanline\[reasoning\]'"):
        records("reasoning_gym:chain_sum")
    with pytest.raises(UserError, match="reward reasoning_gym: needs reasoning-gym"):
        build_reward("reasoning_gym")


def test_the_reward_refuses_prompts_without_a_task_entry():
    with pytest.raises(ValueError, match="reasoning_gym needs prompts from a reasoning_gym:NAME source"):
        build_reward("reasoning_gym")(["What is 2+2?"], ["<answer>4</answer>"], answer=["4"])


def test_config_checks_the_syntax_and_that_evaluation_reads_the_held_out_split():
    cfg = Config()
    cfg.train.regime, cfg.train.max_steps, cfg.rollout.reward = "online", 2, "reasoning_gym"
    cfg.rollout.prompts = "reasoning_gym:chain_sum?size=10&held_out=5"
    cfg.eval.prompts = cfg.rollout.prompts + "&split=held_out"
    validate(cfg)
    cfg.eval.prompts = cfg.rollout.prompts
    with pytest.raises(UserError, match="config field 'eval.prompts': expected the held-out split of the task"):
        validate(cfg)
    cfg.eval.prompts = "reasoning_gym:chain_sum?size=20&held_out=5&split=held_out"  # overlaps the training 10
    with pytest.raises(UserError, match="'eval.prompts': expected the held-out split"):
        validate(cfg)
    cfg.eval.prompts, cfg.rollout.prompts = None, "reasoning_gym:chain_sum?seed=x"
    with pytest.raises(UserError, match="config field 'rollout.prompts': reasoning_gym:chain_sum.seed=x: 'seed'"):
        validate(cfg)
    assert parse_task_source("reasoning_gym:basic_arithmetic?operators=[\"+\",\"-\"]&seed=2").settings == {
        "operators": ["+", "-"]}
