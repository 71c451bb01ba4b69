"""Evaluation: pass@k estimator, Wilson interval, reward/pass/win-rate wiring, reproducibility, eval.json, CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from helpers_train import DATA, ROOT, tiny_config
from humanline.commands import evaluate as eval_command
from humanline.data.records import PromptRecord
from humanline.errors import UserError
from humanline.evaluation.generations import evaluate_generations, is_verifiable, pass_at_k, wilson_interval, write_eval
from humanline.model.tiny import make_model, make_tokenizer
from humanline.sampling.rewards import ExactMatchReward
from humanline.sampling.rollout import GenerationConfig, Rollout


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok, seed=0)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # n - c = 1 < k: every 2-subset holds a correct sample
        (10, 1, 5, 0.5),  # 1 - C(9,5)/C(10,5) = 1 - 126/252
        (8, 3, 4, 1 - 5 / 70),  # 1 - C(5,4)/C(8,4)
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_wilson_interval_known_value():
    """5 successes of 10: the textbook Wilson 95% interval is [0.2366, 0.7634]."""
    low, high = wilson_interval(0.5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    for p, n in [(0.0, 5), (1.0, 5), (0.9, 3), (0.125, 40)]:
        low, high = wilson_interval(p, n)
        assert 0.0 <= low <= p <= high <= 1.0


class ScriptedBackend:
    """A rollout backend returning fixed texts, so evaluation arithmetic can be checked by hand."""

    def __init__(self, texts: list[list[str]]):
        self.texts = texts

    def generate(self, model, tokenizer, prompt_token_ids, cfg):
        ids = [[tokenizer(t, add_special_tokens=False)["input_ids"] for t in g] for g in self.texts]
        reasons = [["eos"] * len(g) for g in self.texts]
        return Rollout(prompt_token_ids, ids, self.texts, sum(len(c) for g in ids for c in g), 0.01, reasons)


RECORDS = [PromptRecord("14 + 26 = ?", "A", answer="40"), PromptRecord("2 + 3 = ?", "B", answer="5")]
SCRIPT = [["40", "38", "40", "x"], ["1", "2", "3", "4"]]


def test_reward_and_pass_at_k_by_hand(model, tok):
    """Correct: A 2 of 4, B 0 of 4. pass@1 = (2/4 + 0)/2 = 0.25; pass@2 = (1 - C(2,2)/C(4,2) + 0)/2 = (5/6)/2.
    Rewards 1,0,1,0,0,0,0,0: mean 0.25, population std sqrt(0.25 * 0.75)."""
    result = evaluate_generations(
        model, tok, RECORDS, ExactMatchReward(), gen=GenerationConfig(n=4), k=2, verifiable=True,
        backend=ScriptedBackend(SCRIPT),
    )
    assert result["pass@1"] == pytest.approx(0.25)
    assert result["pass@2"] == pytest.approx(5 / 12)
    # per-prompt pass@1 values 0.5 and 0: sample std 0.3536, stderr 0.3536 / sqrt(2) = 0.25
    assert result["pass@1_stderr"] == pytest.approx(0.25)
    assert result["reward"]["mean"] == pytest.approx(0.25)
    assert result["reward"]["std"] == pytest.approx(math.sqrt(0.1875))
    assert result["length"]["chars"]["mean"] == pytest.approx((2 + 2 + 2 + 1 + 4) / 8)
    gens = result["generations"]
    assert [g["prompt_id"] for g in gens] == ["A", "B"] and gens[0]["rewards"] == [1.0, 0.0, 1.0, 0.0]
    assert gens[0]["answer"] == "40" and gens[1]["completions"] == SCRIPT[1]


def test_win_rate_by_hand(model, tok):
    """Baseline A "38" scores 0: policy 1,0,1,0 -> 2 wins, 2 ties -> 0.75. Baseline B "5" scores 1: policy all 0
    -> 4 losses -> 0. Rate over prompts = (0.75 + 0) / 2 = 0.375."""
    result = evaluate_generations(
        model, tok, RECORDS, ExactMatchReward(), gen=GenerationConfig(n=4), baseline_texts=["38", "5"],
        backend=ScriptedBackend(SCRIPT),
    )
    win = result["win_rate"]
    assert win["rate"] == pytest.approx(0.375)
    assert (win["wins"], win["ties"], win["losses"], win["num_prompts"]) == (2, 2, 4, 2)
    assert win["ci95_low"] <= win["rate"] <= win["ci95_high"]
    assert (win["ci95_low"], win["ci95_high"]) == pytest.approx(wilson_interval(0.375, 2))
    assert result["generations"][1]["baseline"] == "5" and result["generations"][1]["baseline_reward"] == 1.0
    assert "pass@1" not in result


def _length_reward(prompts, completions, **metadata):
    return [float(len(c)) for c in completions]


def test_real_generation_reproducible_for_fixed_seed(model, tok):
    records = [PromptRecord(f"prompt {i}", f"p{i}", answer=str(i)) for i in range(3)]
    gen = GenerationConfig(max_new_tokens=6, n=3, seed=11)

    def run(g):
        out = evaluate_generations(model, tok, records, _length_reward, gen=g, k=2, baseline_texts=["abc"] * 3)
        out.pop("timing")
        return out

    first, second = run(gen), run(gen)
    assert first == second
    assert run(GenerationConfig(max_new_tokens=6, n=3, seed=12))["generations"] != first["generations"]
    assert first["win_rate"]["ci95_low"] <= first["win_rate"]["rate"] <= first["win_rate"]["ci95_high"]
    assert first["length"]["tokens"]["max"] <= 6
    assert sum(first["length"]["finish_reasons"].values()) == 9


def test_evaluate_rejects_k_above_n(model, tok):
    with pytest.raises(UserError, match="pass@4"):
        evaluate_generations(model, tok, RECORDS, ExactMatchReward(), gen=GenerationConfig(n=2), k=4, verifiable=True)


def test_reward_failures_skipped_and_reported(model, tok):
    def picky(prompts, completions, **metadata):
        return [float("nan") if c == "x" else 1.0 for c in completions]

    result = evaluate_generations(
        model, tok, RECORDS, picky, gen=GenerationConfig(n=4), on_error="skip", backend=ScriptedBackend(SCRIPT)
    )
    assert result["reward"]["num_failed"] == 1 and result["reward"]["count"] == 7
    assert "prompt id 'A'" in result["failures"][0]
    assert result["generations"][0]["rewards"] == [1.0, 1.0, 1.0, None]


def test_write_eval_is_atomic_json(tmp_path):
    path = tmp_path / "sub" / "eval.json"
    result = {"reward": {"mean": 0.5}, "generations": [{"prompt": "π ≈ 3.14"}]}
    write_eval(result, path)
    assert json.loads(path.read_text(encoding="utf-8")) == result
    assert [p.name for p in path.parent.iterdir()] == ["eval.json"]  # no temp file left behind
    with pytest.raises(ValueError):
        write_eval({"bad": float("nan")}, path)
    assert json.loads(path.read_text(encoding="utf-8")) == result  # a failed write keeps the old file
    assert [p.name for p in path.parent.iterdir()] == ["eval.json"]


def _cli(argv):
    parser = argparse.ArgumentParser(prog="humanline")
    eval_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_writes_eval_json_for_a_run_directory(tmp_path, model, tok):
    run = tmp_path / "run"
    model.save_pretrained(run / "final")
    tok.save_pretrained(run / "final")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "1 + 1 = ?", "prompt_id": "a", "answer": "2"}\n{"prompt": "hi", "prompt_id": "b", "answer": "x"}\n'
    )
    argv = ["eval", str(run), "--prompts", str(prompts), "--n", "2", "--k", "2", "--max-new-tokens", "4"]
    assert _cli(argv) == 0
    out = json.loads((run / "eval.json").read_text())
    assert out["reward_spec"] == "math_verify" and out["num_prompts"] == 2 and out["n"] == 2
    assert {"pass@1", "pass@2", "reward", "length", "generations"} <= set(out)
    # Its own eval.json as baseline (first completion per prompt), same seed: sample 0 ties its baseline, sample 1
    # wins, ties or loses against it, so per prompt the win rate is (0.5 + cmp(r1, r0)) / 2.
    second = tmp_path / "second.json"
    assert _cli(argv + ["--baseline", str(run / "eval.json"), "--output", str(second)]) == 0
    redo = json.loads(second.read_text())
    assert redo["generations"] == [g | {"baseline": g["completions"][0], "baseline_reward": g["rewards"][0]}
                                   for g in out["generations"]]
    cmp = [(r1 > r0) + 0.5 * (r1 == r0) for r0, r1 in (g["rewards"] for g in out["generations"])]
    assert redo["win_rate"]["rate"] == pytest.approx(sum((0.5 + c) / 2 for c in cmp) / 2)
    assert redo["win_rate"]["ties"] >= 2


def test_cli_errors_are_user_errors(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi", "prompt_id": "a"}\n')
    with pytest.raises(UserError, match="neither a model folder"):
        _cli(["eval", str(tmp_path), "--prompts", str(prompts)])


@pytest.mark.parametrize("spec, verifiable", [
    ("math_verify", True), ("exact_match", True), ({"type": "exact_match"}, True),
    ({"type": "math_verify", "weight": 1.0}, True),
    ({"type": "exact_match", "weight": 8.0}, False),  # scores 0 or 8: "correct" would need its own threshold
    ("regex", False), ("reward_model:some/model", False), ("recipes/tiny/rewards.py:digits", False),
    ([{"type": "math_verify"}, {"type": "exact_match"}], False),  # a sum of two is not right/wrong
    (None, False),
])
def test_is_verifiable_means_the_reward_scores_right_or_wrong(spec, verifiable):
    assert is_verifiable(spec) is verifiable


def _train_with_eval(tmp_path, reward) -> list[dict]:
    from humanline.training.loop import Trainer

    cfg = tiny_config("dpo", tmp_path / "run", steps=1, eval={
        "prompts": str(DATA / "eval_prompts.jsonl"), "reward": reward, "n": 2, "max_prompts": 4, "max_new_tokens": 4})
    Trainer(cfg).train()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if "eval/reward_mean" in line]


def test_training_time_evaluation_reports_pass_at_1_for_a_verifiable_reward(tmp_path):
    """The defect: the evaluation during training never reported eval/pass@1. With exact_match every score is
    0 or 1, so pass@1 (mean over prompts of c / n) equals the mean reward over the 4 x 2 samples."""
    (row,) = _train_with_eval(tmp_path, "exact_match")
    assert 0.0 <= row["eval/pass@1"] <= 1.0
    assert row["eval/pass@1"] == pytest.approx(row["eval/reward_mean"])


def test_training_time_evaluation_has_no_pass_at_1_for_a_graded_reward(tmp_path):
    (row,) = _train_with_eval(tmp_path, str(ROOT / "recipes" / "tiny" / "rewards.py") + ":digits")
    assert "eval/pass@1" not in row and math.isfinite(row["eval/reward_mean"])
