"""`humanline reproduce --task`: the named tasks and reasoning-gym sources, disjoint splits, the reward each run
and evaluation uses, and the cache keys (the sums task keeps its old ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from humanline.data.reasoning_gym import extract_answer
from humanline.errors import UserError
from humanline.experiments.reproduce import data as D
from humanline.experiments.reproduce.runs import run_config
from humanline.experiments.reproduce.settings import ReproduceSettings
from humanline.experiments.reproduce.task import TASKS, task_of
from humanline.sampling.reward_spec import build_reward

pytest.importorskip("reasoning_gym")

DATA = {"groups": "/data/offline_groups.jsonl", "prompts": "/data/train_prompts.jsonl",
        "eval_prompts": "/data/eval_prompts.jsonl"}


@pytest.mark.parametrize("name", ["add", "chain"])
def test_a_named_task_gives_disjoint_splits_that_its_verifier_scores(name):
    train, held_out = TASKS[name].records(60, 20)
    assert len(train) == 60 and len(held_out) == 20
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all("<answer></answer>" in r["prompt"] for r in train)  # the format is stated in the prompt
    reward = build_reward(TASKS[name].reward)
    rows = held_out[:4]
    meta = [r["metadata"]["reasoning_gym"] for r in rows]
    right = [f"<answer>{r['answer']}</answer>" for r in rows]
    stated = [f"The sum is = {r['answer']}, I think" for r in rows]  # lenient: the number after "="
    wrong = [f"<answer>{int(float(r['answer'])) + 1}</answer>" for r in rows]
    prompts = [r["prompt"] for r in rows]
    assert reward(prompts, right, reasoning_gym=meta) == [1.0] * 4
    assert reward(prompts, stated, reasoning_gym=meta) == [1.0] * 4
    assert all(score < 1.0 for score in reward(prompts, wrong, reasoning_gym=meta))


def test_lenient_extraction_falls_back_to_the_number_after_equals_then_the_last_number():
    assert extract_answer("4 + 5 = 9, so 10", "lenient") == "9"
    assert extract_answer("it is 12 or maybe 13.", "lenient") == "13"
    assert extract_answer("<answer>3</answer> and = 4", "lenient") == "3"  # the asked format first
    assert extract_answer("no number", "lenient") is None
    assert extract_answer("4 + 5 = 9", "strict") is None  # strict: only the asked format


def test_a_reasoning_gym_source_is_a_task_and_bad_ones_name_the_flag():
    task = task_of("reasoning_gym:products?min_digits=1&max_digits=1&extract=lenient")
    assert (task.reward, task.stop, task.max_new_tokens) == ("reasoning_gym", (), 48)
    with pytest.raises(UserError, match="--task: unknown task 'sum'"):
        task_of("sum")
    with pytest.raises(UserError, match="leave size, held_out and split out"):
        task_of("reasoning_gym:products?size=10")
    with pytest.raises(UserError, match="--task"):
        ReproduceSettings(task="nope").check()


def test_a_small_task_holds_out_a_third_of_its_questions_and_too_small_a_one_is_refused():
    train, held_out = TASKS["add"].records(1200, 128)  # 1-digit sums: 121 distinct questions
    assert len(held_out) == 40 and len({r["prompt"] for r in held_out}) == 40
    assert len(train) > 1000 and len({r["prompt"] for r in train}) == 81
    with pytest.raises(UserError, match="only 10 distinct questions"):
        task_of("reasoning_gym:count_bits?min_n=1&max_n=10").records(100, 32)


def test_runs_of_a_reasoning_gym_task_use_its_reward_lengths_and_no_stop(tmp_path):
    s = ReproduceSettings(model="tiny", task="add", steps=8, evals=2)
    cfg = run_config(s, DATA, "grpo", "online", 0, tmp_path)
    assert (cfg.rollout.reward, cfg.eval.reward, cfg.rollout.stop) == ("reasoning_gym", "reasoning_gym", [])
    assert (cfg.rollout.max_new_tokens, cfg.data.max_prompt_length, cfg.data.max_length) == (48, 96, 144)
    sums = run_config(ReproduceSettings(model="tiny", steps=8, evals=2), DATA, "grpo", "online", 0, tmp_path)
    assert (sums.rollout.reward, sums.rollout.stop, sums.rollout.max_new_tokens) == ("math_verify", ["\n"], 32)


def test_each_task_keys_its_own_data_and_the_sums_keep_theirs():
    sums, add = ReproduceSettings(), ReproduceSettings(task="add")
    assert D.offline_key(sums) == D.offline_key(ReproduceSettings(max_new_tokens=32))  # the old default length
    assert D.offline_key(add) != D.offline_key(sums)
    assert D.offline_key(add) != D.offline_key(ReproduceSettings(task="chain"))


def test_the_default_output_folder_names_the_task_and_the_source():
    from argparse import Namespace

    from humanline.commands.reproduce import default_output

    def out(**kw):
        return default_output(Namespace(**{"model": "smollm2", "task": "sums", "offline_source": "base",
                                           "quick": False, **kw}))

    assert out() == "runs/reproduce-smollm2"
    assert out(task="add", offline_source="mix:base=0.5,reference=0.5") == \
        "runs/reproduce-smollm2-add-mix_base_0.5_reference_0.5"
    assert out(task="reasoning_gym:products?min_digits=1", quick=True) == "runs/reproduce-smollm2-products-quick"
    assert Path(out(task="chain")).name == "reproduce-smollm2-chain"
