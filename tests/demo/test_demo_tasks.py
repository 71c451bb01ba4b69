"""Demo ingredients: built-in tasks and their rewards, the cached tiny base policies, offline scored groups."""

from __future__ import annotations

import json
import random

import pytest
import torch

from humanline.errors import UserError
from humanline.experiments.demo import policies as demo_base
from humanline.experiments.demo.offline import sample, scored_groups, write_offline_groups
from humanline.experiments.demo.policies import (
    BaseConfig,
    config_hash,
    encode_example,
    ensure_policies,
    load_policy,
    policy_dirs,
)
from humanline.experiments.demo.run import DemoSettings, run_config
from humanline.experiments.demo.tasks import (
    arithmetic_reward,
    letters_reward,
    letters_score,
    make_task,
)
from humanline.sampling import decode

# A few SFT steps of a one-layer model: enough to exercise training, caching and loading in about a second.
TINY = BaseConfig(hidden_size=32, num_layers=1, num_heads=4, steps=3, batch_size=4)


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A cache folder holding TINY's base and weak checkpoints, trained once for this module."""
    root = tmp_path_factory.mktemp("demo-cache")
    return root, ensure_policies(TINY, root=root)


# ------------------------------------------------------------------------------------------------- tasks


@pytest.mark.parametrize("name", ["arithmetic", "letters"])
def test_task_generation_is_deterministic_for_a_seed(name):
    first, again, other = make_task(name, seed=3), make_task(name, seed=3), make_task(name, seed=4)
    assert first.train == again.train and first.held_out == again.held_out
    assert [r["id"] for r in first.train] != [r["id"] for r in other.train]


@pytest.mark.parametrize("name", ["arithmetic", "letters"])
def test_train_and_held_out_prompts_are_disjoint_and_unique(name):
    task = make_task(name, seed=0, n_train=500, n_held_out=200)
    train = {r["prompt"][0]["content"] for r in task.train}
    held_out = {r["prompt"][0]["content"] for r in task.held_out}
    assert len(train) == 500 and len(held_out) == 200
    assert not train & held_out
    assert len({r["id"] for r in task.train + task.held_out}) == 700


def test_arithmetic_records_have_the_data_layer_shape_and_right_answers():
    task = make_task("arithmetic", seed=0, operators="+-*", n_train=300, n_held_out=50)
    for record in task.train + task.held_out:
        assert set(record) == {"prompt", "answer", "id"}
        [message] = record["prompt"]
        assert message["role"] == "user" and message["content"].endswith("=")
        expression = message["content"][:-1]
        op = next(c for c in "+-*" if c in expression[1:])
        a, b = expression.split(op, 1) if op != "-" else expression.rsplit("-", 1)
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert int(record["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def test_arithmetic_reward_is_exact_match_after_stripping_whitespace():
    prompts = [[{"role": "user", "content": "23+58="}]] * 6
    completions = ["81", " 81\n", "82", "", "81 apples", [{"role": "assistant", "content": "81"}]]
    assert arithmetic_reward(prompts, completions, answer=["81"] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="one answer per completion"):
        arithmetic_reward(prompts[:2], ["81", "81"], answer=["81"])


def test_arithmetic_settings_are_validated():
    # One-digit operands: 9 * 9 = 81 distinct "+" problems, fewer than the 100 asked for.
    with pytest.raises(UserError, match="only 81 distinct problems"):
        make_task("arithmetic", digits=1, n_train=90, n_held_out=10)
    with pytest.raises(UserError, match="operators"):
        make_task("arithmetic", operators="/")
    with pytest.raises(UserError, match="unknown task 'poetry'"):
        make_task("poetry")


def test_arithmetic_sft_corruption_is_a_near_miss():
    task = make_task("arithmetic", seed=0, n_train=50, n_held_out=10)
    rng = random.Random(0)
    for record in task.train:
        assert task.sft_completion(record, rng, False) == record["answer"]
        delta = int(task.sft_completion(record, rng, True)) - int(record["answer"])
        assert delta in (-10, -2, -1, 1, 2, 10)


def test_letters_score_by_hand():
    """"bake" for "Write 4 from abekmo:" is perfect: length 4/4, letters 4/4 allowed, b-a-k-e alternates
    (3/3 pairs), no stutter (3/3) -> 1.0.
    "bbx" for (abk, 4): length 1 - |3-4|/4 = 0.75, allowed 2/3, alternate 0/2 (b-b, b-x are consonant pairs),
    distinct 1/2 (b-x) -> (0.75 + 2/3 + 0 + 0.5) / 4 = 0.4791666...
    "bab" for (abk, 4): (0.75 + 1 + 1 + 1) / 4 = 0.9375. An empty completion scores 0."""
    assert letters_score("bake", "abekmo", 4) == 1.0
    assert letters_score("bbx", "abk", 4) == pytest.approx((0.75 + 2 / 3 + 0 + 0.5) / 4)
    assert letters_score("bab", "abk", 4) == pytest.approx(0.9375)
    assert letters_score("  ", "abk", 4) == 0.0
    prompts = [[{"role": "user", "content": f"Write 4 from {letters}:"}] for letters in ("abekmo", "abk")]
    assert letters_reward(prompts, ["bake", "bab"]) == pytest.approx([1.0, 0.9375])


def test_letters_sft_words_are_perfect_and_corrupted_ones_are_not():
    task = make_task("letters", seed=1, n_train=200, n_held_out=10)
    rng = random.Random(0)
    prompts = [r["prompt"] for r in task.train]
    clean = [task.sft_completion(r, rng, False) for r in task.train]
    corrupt = [task.sft_completion(r, rng, True) for r in task.train]
    assert task.reward(prompts, clean) == [1.0] * len(clean)
    scores = task.reward(prompts, corrupt)
    assert all(0.5 < s < 1.0 for s in scores)  # each corruption is one graded flaw, not a zero


# -------------------------------------------------------------------------------------------- base policy


def test_cache_key_is_stable_and_covers_every_setting():
    # Pinned: a change here silently orphans every user's cache, so it must be deliberate (bump CACHE_VERSION).
    assert config_hash(BaseConfig()) == "3ab2e3726207"
    assert config_hash(BaseConfig()) == config_hash(BaseConfig(task="arithmetic"))
    assert config_hash(BaseConfig(steps=1201)) != config_hash(BaseConfig())
    assert config_hash(BaseConfig(weak_corruption=0.7)) != config_hash(BaseConfig())


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HUMANLINE_CACHE", str(tmp_path))
    dirs = policy_dirs(TINY)
    assert dirs.base == tmp_path / f"arithmetic-{config_hash(TINY)}" / "base"
    assert dirs.weak.parent == dirs.base.parent and dirs.weak.name == "weak"


def test_encode_example_masks_completion_and_eos_only():
    from humanline.model.tiny import make_tokenizer

    tok = make_tokenizer()
    ids, mask = encode_example(tok, [{"role": "user", "content": "1+2="}], "3")
    assert ids[-2:] == [tok.convert_tokens_to_ids("3"), tok.eos_token_id]
    assert mask == [False] * (len(ids) - 2) + [True, True]


def test_policies_are_trained_once_then_reused(tiny_cache, monkeypatch):
    root, dirs = tiny_cache
    meta = json.loads((dirs.base / demo_base.META_FILE).read_text())
    assert meta["corruption"] == 0.5 and meta["seed"] == 0 and meta["config"]["steps"] == 3
    assert json.loads((dirs.weak / demo_base.META_FILE).read_text())["corruption"] == 0.8
    assert not [p for p in dirs.base.parent.iterdir() if p.name.startswith(".")]  # no temp folders left

    def no_training(*args, **kwargs):
        raise AssertionError("a cached policy was retrained")

    monkeypatch.setattr(demo_base, "sft_train", no_training)
    assert ensure_policies(TINY, root=root) == dirs
    base, _ = load_policy(dirs.base)
    weak, _ = load_policy(dirs.weak)
    assert base.config.hidden_size == 32 and not base.training
    # Different seeds and corruption: the weak policy is a genuinely different model.
    assert not torch.equal(base.model.embed_tokens.weight, weak.model.embed_tokens.weight)


# ------------------------------------------------------------------------------------------------ offline


def test_offline_groups_are_scored_samples_of_the_given_policy(tiny_cache, tmp_path):
    model, tok = load_policy(tiny_cache[1].weak)
    task = make_task("arithmetic", seed=0, n_train=20, n_held_out=5)
    records = task.train[:3]
    groups = scored_groups(model, tok, task, records, n=4, max_new_tokens=4, seed=7)
    assert [g["id"] for g in groups] == [r["id"] for r in records]
    for group, record in zip(groups, records):
        assert group["prompt"] == record["prompt"] and group["answer"] == record["answer"]
        assert len(group["completions"]) == len(group["scores"]) == 4
        expected = task.reward([record["prompt"]] * 4, group["completions"], answer=[record["answer"]] * 4)
        assert group["scores"] == expected
    path = write_offline_groups(model, tok, task, tmp_path / "groups.jsonl", n=4, max_new_tokens=4, seed=7,
                                records=records)
    assert [json.loads(line) for line in path.read_text().splitlines()] == groups


def test_sampling_is_reproducible_and_leaves_the_global_rng_alone(tiny_cache):
    model, tok = load_policy(tiny_cache[1].base)
    prompts = [[{"role": "user", "content": "12+34="}], [{"role": "user", "content": "56+78="}]]
    state = torch.random.get_rng_state()
    first = sample(model, tok, prompts, n=3, max_new_tokens=5, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert sample(model, tok, prompts, n=3, max_new_tokens=5, seed=1) == first
    assert len(first.texts) == 6 and first.n == 3


def test_demo_samples_and_runs_use_transformers_generate(tiny_cache, monkeypatch):
    """The demo's tables were measured with `model.generate`: its sampler and its runs' config keep that decoder
    (the fast loop would draw other samples from the same distribution and move every number)."""
    def refuse(*args, **kwargs):
        raise AssertionError("humanline.sampling.decode.decode called")

    monkeypatch.setattr(decode, "decode", refuse)
    model, tok = load_policy(tiny_cache[1].base)
    assert len(sample(model, tok, [[{"role": "user", "content": "1+2="}]], n=2, max_new_tokens=3).texts) == 2
    data = {"base": str(tiny_cache[1].base), "groups": "g.jsonl", "prompts": "p.jsonl", "eval_prompts": "e.jsonl"}
    cfg = run_config(DemoSettings(), data, "grpo", "online", 0, tiny_cache[0])
    assert cfg.rollout.decoder == "generate"
