"""Rewards: math-verify, exact match, regex, callables, weighted sums, build_reward, failures, reward model."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from humanline.errors import UserError
from humanline.model.tiny import make_tokenizer
from humanline.sampling.reward_scoring import score_completions
from humanline.sampling.reward_spec import build_reward, load_callable
from humanline.sampling.rewards import (
    ExactMatchReward,
    MathVerifyReward,
    RegexReward,
    RewardModelReward,
    WeightedSum,
)


@pytest.fixture(scope="module")
def math_reward():
    return MathVerifyReward()


@pytest.mark.parametrize(
    "completion, gold, expected",
    [
        ("14 + 26 = 40, so \\boxed{40}", "40", 1.0),
        ("<answer>38</answer>", "40", 0.0),
        ("<think>26 + 14</think><answer>40</answer>", "40", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("The answer is $\\frac{1}{2}$.", "0.5", 1.0),
        ("\\boxed{x^2 + 1}", "1 + x^2", 1.0),
        ("I first guess \\boxed{38}, no wait", "40", 0.0),
        ("garbage \\boxed{", "40", 0.0),
        ("", "40", 0.0),
        ("<answer>forty</answer>", "40", 0.0),
    ],
)
def test_math_verify_scores_known_answers(math_reward, completion, gold, expected):
    assert math_reward(["q"], [completion], answer=[gold]) == [expected]


def test_math_verify_require_tags(math_reward):
    strict = MathVerifyReward(require_tags=True)
    assert math_reward(["q"], ["The answer is 40"], answer=["40"]) == [1.0]
    assert strict(["q", "q", "q"], ["The answer is 40", "\\boxed{40}", "<answer>40</answer>"], answer=["40"] * 3) == [
        0.0,
        1.0,
        1.0,
    ]


def test_math_verify_needs_gold(math_reward):
    with pytest.raises(ValueError, match="answer"):
        math_reward(["q"], ["\\boxed{1}"])
    result = score_completions(math_reward, ["q"], ["\\boxed{1}"], {"answer": [None]}, ["p7"], on_error="skip")
    assert result.scores == [None] and "'p7'" in result.failures[0]


def test_exact_match():
    em = ExactMatchReward()
    assert em(["q"] * 4, ["  40 \n", "40.", "4 0", "forty"], answer=["40", "40", "4  0", "40"]) == [1.0, 0.0, 1.0, 0.0]
    assert ExactMatchReward(strip=False)(["q"], [" 40"], answer=["40"]) == [0.0]
    num = ExactMatchReward(final_number=True)
    assert num(["q"] * 4, ["14 + 26 = 40", "= 1,000", "it is 41", "no number"], answer=["40", "1000", "40", "40"]) == [
        1.0,
        1.0,
        0.0,
        0.0,
    ]


def test_regex_format_reward():
    fmt = RegexReward(r"^<think>.*</think>\s*<answer>.*</answer>$", score=0.5)
    good = "<think>a\nb</think>\n<answer>4</answer>"
    assert fmt(["q", "q", "q"], [good, "<answer>4</answer>", good + " extra"]) == [0.5, 0.0, 0.0]
    with pytest.raises(UserError, match="pattern"):
        RegexReward("(unclosed")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def length(prompts, completions, **metadata):
                return [float(len(c)) for c in completions]

            def scaled(prompts, completions, factor=1.0, **metadata):
                return [factor * len(c) for c in completions]

            class Holder:
                @staticmethod
                def one(prompts, completions, **metadata):
                    return [1.0] * len(completions)

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "my_rewards.py"


def test_load_callable(user_module):
    assert load_callable("my_rewards:length")(["q", "q"], ["ab", "abcd"]) == [2.0, 4.0]
    assert load_callable("my_rewards:Holder.one")(["q"], ["x"]) == [1.0]
    assert load_callable(f"{user_module}:length")(["q"], ["abc"]) == [3.0]
    with pytest.raises(UserError, match="no attribute 'missing'"):
        load_callable("my_rewards:missing")
    with pytest.raises(UserError, match="not callable"):
        load_callable("my_rewards:NOT_CALLABLE")
    with pytest.raises(UserError, match="cannot import no_such_module_xyz"):
        load_callable("no_such_module_xyz:f")
    with pytest.raises(UserError, match="module:function"):
        load_callable("just_a_name")


def test_weighted_sum_hand_computed():
    """2 * exact + 0.5 * format: "40" -> 2*1 + 0.5*0 = 2.0; "<a>38</a>" -> 0 + 0.5*1 = 0.5; "<a>40</a>" -> 0.5."""
    fn = WeightedSum([(2.0, ExactMatchReward()), (0.5, RegexReward(r"<a>.*</a>"))])
    assert fn(["q"] * 3, ["40", "<a>38</a>", "<a>40</a>"], answer=["40"] * 3) == [2.0, 0.5, 0.5]
    with pytest.raises(UserError, match="weight"):
        WeightedSum([(float("nan"), ExactMatchReward())])


def test_build_reward_from_config_values(user_module):
    assert isinstance(build_reward("math_verify"), MathVerifyReward)
    assert isinstance(build_reward("exact_match"), ExactMatchReward)
    assert build_reward("my_rewards:length")(["q"], ["abc"]) == [3.0]
    bound = build_reward({"type": "my_rewards:scaled", "factor": 2.0})
    assert bound(["q"], ["abc"]) == [6.0]
    weighted = build_reward({"type": "exact_match", "weight": 3.0})
    assert weighted(["q"], ["40"], answer=["40"]) == [3.0]
    # 8 * accuracy + 1 * format: right and formatted = 9, wrong but formatted = 1
    combo = build_reward(
        [{"type": "math_verify", "weight": 8}, {"type": "regex", "pattern": r"<answer>.*</answer>", "weight": 1}]
    )
    assert combo(["q", "q"], ["<answer>40</answer>", "<answer>3</answer>"], answer=["40", "40"]) == [9.0, 1.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonsense", "reward: unknown reward 'nonsense'"),
        ([{"type": "exact_match"}, {"weight": 1}], r"reward\[1\].type"),
        ({"type": "exact_match", "weight": "heavy"}, "reward.weight"),
        ({"type": "regex"}, "bad arguments for reward type 'regex': expected pattern \\(required\\)"),
        ({"type": "exact_match", "bogus": 1}, "bad arguments"),
        (42, "expected a reward name"),
    ],
)
def test_build_reward_errors_name_the_field(spec, message):
    with pytest.raises(UserError, match=message):
        build_reward(spec)


def _flaky(prompts, completions, **metadata):
    if "boom" in completions:
        raise RuntimeError("reward server\nunavailable")
    return [float("nan") if c == "nan" else 1.0 for c in completions]


def test_score_completions_fail_names_prompt_id():
    with pytest.raises(UserError, match=r"prompt id 'p2'.*RuntimeError: reward server unavailable"):
        score_completions(_flaky, ["a", "b", "c"], ["ok", "boom", "ok"], {}, ["p1", "p2", "p3"])
    with pytest.raises(UserError, match=r"prompt id 'p3'.*non-finite"):
        score_completions(_flaky, ["a", "b", "c"], ["ok", "ok", "nan"], {}, ["p1", "p2", "p3"])


def test_score_completions_skip_marks_none_and_keeps_the_rest():
    result = score_completions(
        _flaky, ["a", "b", "c", "d"], ["ok", "boom", "nan", "ok"], {}, ["p1", "p2", "p3", "p4"], on_error="skip"
    )
    assert result.scores == [1.0, None, None, 1.0]
    assert len(result.failures) == 2
    assert "'p2'" in result.failures[0] and "'p3'" in result.failures[1]


def test_score_completions_wrong_length_and_non_numbers():
    def short(prompts, completions, **metadata):
        return [1.0]  # one score however many completions

    # a broken protocol is the reward's bug, not an item's failure: an error naming the reward and the counts,
    # also under on_error="skip" (re-scoring item by item hid it, and every group then scored 0)
    for on_error in ("fail", "skip"):
        with pytest.raises(UserError, match=r"reward .*short returned 1 scores for 2 completions"):
            score_completions(short, ["a", "b"], ["x", "y"], {}, ["p1", "p2"], on_error=on_error)
    with pytest.raises(UserError, match=r"returned float 0.5 for 2 completions; expected a list of 2 scores"):
        score_completions(lambda p, c, **m: 0.5, ["a", "b"], ["x", "y"], {}, ["p1", "p2"])

    def texty(prompts, completions, **metadata):
        return ["good" for _ in completions]

    with pytest.raises(UserError, match=r"prompt id 'p1'.*not a number"):
        score_completions(texty, ["a"], ["x"], {}, ["p1"])
    assert score_completions(lambda p, c, **m: [True, False], ["a", "b"], ["x", "y"], {}, [1, 2]).scores == [1.0, 0.0]
    assert score_completions(lambda p, c, **m: torch.tensor([0.5]), ["a"], ["x"], None, [1]).scores == [0.5]


def test_score_completions_passes_aligned_metadata():
    seen = {}

    def spy(prompts, completions, **metadata):
        seen.update(metadata)
        return [0.0] * len(completions)

    score_completions(spy, ["a", "b"], ["x", "y"], {"answer": ["1", "2"], "level": [3, 4]}, ["p1", "p2"])
    assert seen == {"answer": ["1", "2"], "level": [3, 4]}
    with pytest.raises(UserError, match="on_error"):
        score_completions(spy, ["a"], ["x"], {}, ["p1"], on_error="ignore")


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_reward_model_scores_chat_text_in_batches(reward_model_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    prompts = ["What is 2+2?", [{"role": "user", "content": "hi"}], "x"]
    completions = ["4", "hello there, friend", ""]
    rm = RewardModelReward(str(reward_model_dir), batch_size=2, device="cpu")
    scores = rm(prompts, completions)
    # expected: one unpadded forward per item on the chat-templated conversation
    tok = AutoTokenizer.from_pretrained(reward_model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    for prompt, completion, score in zip(prompts, completions, scores):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tok.apply_chat_template(messages + [{"role": "assistant", "content": completion}], tokenize=False)
        with torch.no_grad():
            logit = model(**tok(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0].item()
        assert math.isclose(score, logit, rel_tol=1e-4, abs_tol=1e-5)
    assert len(set(scores)) == 3  # distinct inputs give distinct scores (the model is not constant)
    via_spec = build_reward(f"reward_model:{reward_model_dir}")
    assert via_spec(prompts, completions) == pytest.approx(scores, abs=1e-5)


def test_reward_model_bad_path(tmp_path):
    with pytest.raises(UserError, match="no such folder .expected a local model folder"):
        RewardModelReward(str(tmp_path / "nowhere"))
