"""Validation at load time and a strict YAML reader, through the CLI.

Every case exits with code 2 and one line naming the field, file or flag and what was expected, before any
model is built: `load_model` is replaced by a function that fails the test if it is ever called.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers_reliability import (
    ROOT,
    assert_user_error,
    base_sections,
    one_thread,
    online_sections,
    run_cli,
    write_recipe,
)
from humanline.training.config_loading import load_config

_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)
HUGE = 10**12


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if a model is loaded: these errors must come first."""
    import humanline.training.build

    def load_model(*args, **kwargs):
        pytest.fail("a model was built before the error was reported")

    monkeypatch.setattr(humanline.training.build, "load_model", load_model)


def _write(tmp: Path, text: str | bytes) -> Path:
    path = tmp / "recipe.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _base_yaml(tmp: Path, **changes) -> str:
    return write_recipe(tmp, base_sections(tmp / "run"), **changes).read_text()


# ---------------------------------------------------------------- numbers, duplicate keys, encodings, nesting


def test_scientific_notation_without_a_dot_is_a_number(tmp_path, capsys):
    text = _base_yaml(tmp_path).replace("lr: 0.001", "lr: 1e-3").replace("warmup_ratio: 0.0", "warmup_ratio: 0e0")
    assert "lr: 1e-3" in text
    path = _write(tmp_path, text)
    cfg = load_config(path, ["--optim.weight_decay=1e-2", "--objective.beta=5E-1", "--humanline.high=1.0e1"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.objective.beta, cfg.humanline.high) == (1e-3, 1e-2, 0.5, 10.0)
    assert load_config(path, ["--train.micro_batch_size=2"]).train.micro_batch_size == 2  # ints stay ints
    code, lines = run_cli(["train", path, "--optim.lr=1e-6"], capsys)
    assert code == 0, "\n".join(lines)


def test_duplicate_key_is_rejected_with_both_lines(tmp_path, capsys, no_model):
    text = _base_yaml(tmp_path).replace("  lr: 0.001\n", "  lr: 0.001\n  lr: 0.5\n")
    path = _write(tmp_path, text)
    first = text.splitlines().index("  lr: 0.001") + 1
    code, lines = run_cli(["train", path], capsys)
    assert_user_error(code, lines, f"recipe.yaml:{first + 1}:", "duplicate key 'lr'", f"first given on line {first}")


def test_duplicate_section_is_rejected(tmp_path, capsys, no_model):
    path = _write(tmp_path, _base_yaml(tmp_path) + "optim:\n  lr: 0.5\n")
    code, lines = run_cli(["train", path], capsys)
    assert_user_error(code, lines, "recipe.yaml:", "duplicate key 'optim'")


@pytest.mark.parametrize("encoding, needles", [
    ("latin-1", ["recipe.yaml:1:", "not UTF-8", "0xe9"]),
    ("utf-16", ["recipe.yaml:1:", "not UTF-8", "UTF-16 byte-order mark"]),
])
def test_a_recipe_that_is_not_utf8_is_named(tmp_path, capsys, no_model, encoding, needles):
    text = "# café au lait\n" + _base_yaml(tmp_path)
    code, lines = run_cli(["train", _write(tmp_path, text.encode(encoding))], capsys)
    assert_user_error(code, lines, *needles)


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    path = _write(tmp_path, ("\ufeff" + _base_yaml(tmp_path)).encode("utf-8"))
    assert load_config(path).optim.lr == 1e-3


@pytest.mark.parametrize("depth", [40, 5000])
def test_deep_nesting_is_one_line_not_a_recursion_error(tmp_path, capsys, no_model, depth):
    nested = "[" * depth + "]" * depth
    path = _write(tmp_path, _base_yaml(tmp_path) + f"rollout:\n  reward: {nested}\n")
    code, lines = run_cli(["train", path], capsys)
    assert_user_error(code, lines, "recipe.yaml", "nested too deeply")
    code, lines = run_cli(["train", _write(tmp_path, _base_yaml(tmp_path)), f"--rollout.stop={nested}"], capsys)
    assert_user_error(code, lines, "--rollout.stop", "nested too deeply")


# ---------------------------------------------------------------- values rejected only late, or never


BOUNDS = [
    ({"model": {"tiny_layers": HUGE}}, ["'model.tiny_layers'", "[1, 64]"]),
    ({"model": {"tiny_hidden_size": HUGE}}, ["'model.tiny_hidden_size'", "4096"]),
    ({"model": {"tiny_layers": 64, "tiny_hidden_size": 4096}}, ["model.tiny_layers", "model.tiny_hidden_size",
                                                                 "2e+08"]),
    ({"rollout": {"n": HUGE}}, ["'rollout.n'", "1024"]),
    ({"rollout": {"prompts_per_step": HUGE}}, ["'rollout.prompts_per_step'", "65536"]),
    ({"rollout": {"batch_size": HUGE}}, ["'rollout.batch_size'", "65536"]),
    ({"rollout": {"max_new_tokens": HUGE}}, ["'rollout.max_new_tokens'", "512", "tiny model's context"]),
    ({"eval": {"n": HUGE}}, ["'eval.n'", "1024"]),
    ({"eval": {"max_new_tokens": 100_000}}, ["'eval.max_new_tokens'", "512"]),
    ({"train": {"micro_batch_size": HUGE}}, ["'train.micro_batch_size'", "65536"]),
    ({"train": {"grad_accum": HUGE}}, ["'train.grad_accum'", "65536"]),
    ({"train": {"max_steps": HUGE}}, ["'train.max_steps'", "1000000000"]),
    ({"train": {"epochs": HUGE}}, ["'train.epochs'", "1000000"]),
    ({"data": {"max_length": HUGE}}, ["'data.max_length'", "1048576"]),
    ({"model": {"lora_r": HUGE}}, ["'model.lora_r'", "4096"]),
    ({"objective": {"advantage_eps": -0.5}}, ["'objective.advantage_eps'", ">= 0", "-0.5"]),
    ({"rollout": {"temperature": 0, "n": 4}}, ["'rollout.temperature'", "> 0 when rollout.n = 4", "greedy"]),
    ({"eval": {"temperature": 0}}, ["'eval.temperature'", "> 0 when eval.n = 4", "eval.n: 1"]),
    ({"data": {"train": ""}}, ["'data.train'", "non-empty string"]),
    ({"data": {"eval": "  "}}, ["'data.eval'", "data file"]),
    ({"rollout": {"prompts": ""}}, ["'rollout.prompts'", "non-empty"]),
    ({"eval": {"prompts": "p.jsonl"}}, ["'eval.reward'", "when eval.prompts is set"]),
    ({"eval": {"reward": "nosuch"}}, ["eval.reward", "unknown reward 'nosuch'"]),
    ({"rollout": {"reward": "nosuch"}}, ["rollout.reward", "unknown reward 'nosuch'"]),
    ({"eval": {"reward": "no_module_here:score"}}, ["'eval.reward'", "cannot import no_module_here"]),
]


@pytest.mark.parametrize("changes, needles", BOUNDS, ids=[str(c) for c, _ in BOUNDS])
def test_rejected_at_load_time_naming_the_field(tmp_path, capsys, no_model, changes, needles):
    code, lines = run_cli(["train", write_recipe(tmp_path, base_sections(tmp_path / "run"), **changes)], capsys)
    assert_user_error(code, lines, *needles)


def test_online_buffer_size_is_bounded(tmp_path, capsys, no_model):
    sections = online_sections(tmp_path / "run")
    recipe = write_recipe(tmp_path, sections, train={"regime": "sparse", "sample_every": 10_000},
                          rollout={"prompts_per_step": 1000, "n": 8})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "rollout.prompts_per_step x rollout.n x train.sample_every", "1048576")


def test_eval_reward_is_resolved_before_training(tmp_path, capsys, monkeypatch):
    """The defect: `eval.reward: nosuch` was rejected after every training step had run."""
    import humanline.training.loop

    monkeypatch.setattr(humanline.training.loop.Trainer, "train_step", lambda self: pytest.fail("a step ran"))
    prompts = ROOT / "recipes" / "tiny" / "data" / "eval_prompts.jsonl"
    recipe = write_recipe(tmp_path, base_sections(tmp_path / "run"), eval={"prompts": str(prompts),
                                                                           "reward": "nosuch"})
    code, lines = run_cli(["train", recipe], capsys)
    assert_user_error(code, lines, "eval.reward", "nosuch")


def test_empty_output_dir_flag_is_named(tmp_path, capsys, no_model):
    code, lines = run_cli(["train", write_recipe(tmp_path, base_sections(tmp_path / "run")), "--output-dir", ""],
                          capsys)
    assert_user_error(code, lines, "--output-dir", "expected a folder")


@pytest.mark.parametrize("flags, needles", [
    (["--n", "0"], ["--n:", "an integer >= 1", "got 0"]),
    (["--k", "0"], ["--k:", ">= 1"]),
    (["--temperature", "0", "--n", "4"], ["--temperature:", "--n = 4", "greedy"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens:", ">= 1"]),
    (["--top-p", "2"], ["--top-p:", "(0, 1]"]),
])
def test_eval_flags_are_named(tmp_path, capsys, flags, needles):
    """`humanline eval` checks its flags before it reads the prompts or loads a model."""
    code, lines = run_cli(["eval", tmp_path / "no-model", "--prompts", tmp_path / "no-prompts.jsonl", *flags],
                          capsys)
    line = assert_user_error(code, lines, *needles)
    assert "generation." not in line


def test_alias_bombs_and_self_references_are_one_line(tmp_path, capsys, no_model):
    """YAML aliases: nine levels of nine-fold sharing ("billion laughs": 9**9 leaves if expanded) must be
    measured and reported without expanding them, and an alias inside itself is infinitely deep."""
    names = "abcdefghi"
    anchors = ['  a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    anchors += [f"  {c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip(names, names[1:])]
    bomb = _base_yaml(tmp_path) + "rollout:\n  reward:\n  - bombs:\n" + "\n".join("  " + a for a in anchors)
    code, lines = run_cli(["train", _write(tmp_path, bomb + "\n")], capsys)
    assert_user_error(code, lines, "rollout.reward[0]", "expected a reward name such as 'math_verify'")
    looped = _base_yaml(tmp_path) + "rollout:\n  stop: &loop [*loop]\n"
    code, lines = run_cli(["train", _write(tmp_path, looped)], capsys)
    assert_user_error(code, lines, "recipe.yaml", "nested too deeply")


@pytest.mark.parametrize("text, needles", [
    ("optim: {lr: 0.1, lr: 0.2}\n", ["recipe.yaml:1:", "duplicate key 'lr'"]),  # same line, flow style
    ("model:\n  name: ti\x00ny\n", ["recipe.yaml:2:", "invalid YAML", "#x0000"]),
    ("a: 1\n---\nb: 2\n", ["recipe.yaml:2:", "invalid YAML"]),
    ("model: !!python/object/apply:os.system ['true']\n", ["recipe.yaml:1:", "invalid YAML"]),
])
def test_damaged_recipes_are_one_line_with_a_line_number(tmp_path, capsys, no_model, text, needles):
    code, lines = run_cli(["train", _write(tmp_path, text)], capsys)
    assert_user_error(code, lines, *needles)
