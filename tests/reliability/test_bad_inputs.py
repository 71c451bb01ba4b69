"""A corpus of bad inputs: every one exits with code 2 and one `humanline: error:` line, no traceback.

Each case writes a tiny recipe (and data or model files) under `tmp_path`, runs `humanline train` in this
process, and checks the error line names the file, line or field at fault. Config errors stop before any
model is built; data and environment errors stop before the first training step.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers_reliability import (
    DATA,
    assert_user_error,
    base_sections,
    one_thread,
    online_sections,
    run_cli,
    write_jsonl,
    write_recipe,
)
from humanline.training.objective_table import SPECS

CASES: dict = {}
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def case(name: str):
    """Register `fn(tmp, monkeypatch, model_folder) -> (argv after 'train', needles the error line must contain)`."""

    def register(fn):
        CASES[name] = fn
        return fn

    return register


def _recipe(tmp: Path, sections: dict | None = None, **changes) -> Path:
    return write_recipe(tmp, sections or base_sections(tmp / "run"), **changes)


def _pairs(tmp: Path, rows: list, name: str = "bad.jsonl") -> tuple[Path, Path]:
    """A pairwise data file: 7 valid rows then `rows` (so the bad one is on line 8 onwards)."""
    good = [{"id": f"g{i}", "prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(7)]
    data = write_jsonl(tmp / name, good + rows)
    return data, _recipe(tmp, data={"train": str(data)})


# ---------------------------------------------------------------- config


@case("config/unknown-field")
def _(tmp, mp, model):
    return [_recipe(tmp, train={"max_step": 3})], ["recipe.yaml", "'train.max_step'", "did you mean 'train.max_steps'"]


@case("config/unknown-section")
def _(tmp, mp, model):
    return [_recipe(tmp, trainer={"max_steps": 3})], ["recipe.yaml", "'trainer'"]


@case("config/section-not-mapping")
def _(tmp, mp, model):
    path = tmp / "recipe.yaml"
    path.write_text("model:\n  name: tiny\ntrain: 5\n")
    return [path], ["recipe.yaml", "'train'", "mapping"]


@case("config/wrong-type-int")
def _(tmp, mp, model):
    return [_recipe(tmp, train={"max_steps": "ten"})], ["'train.max_steps'", "integer", "'ten'"]


@case("config/float-for-int")
def _(tmp, mp, model):
    return [_recipe(tmp, train={"micro_batch_size": 2.5})], ["'train.micro_batch_size'", "integer"]


@case("config/wrong-type-bool")
def _(tmp, mp, model):
    return [_recipe(tmp, humanline={"enabled": "maybe"})], ["'humanline.enabled'", "true or false"]


@case("config/wrong-type-list-items")
def _(tmp, mp, model):
    return [_recipe(tmp, optim={"betas": ["a", "b"]})], ["'optim.betas'", "number"]


@case("config/betas-length")
def _(tmp, mp, model):
    return [_recipe(tmp, optim={"betas": [0.9]})], ["'optim.betas'", "two numbers"]


@case("config/sync-every-zero")
def _(tmp, mp, model):
    return [_recipe(tmp, humanline={"enabled": True, "sync_every": 0})], ["'humanline.sync_every'", ">= 1"]


@case("config/band-low-positive")
def _(tmp, mp, model):
    return [_recipe(tmp, humanline={"low": 0.5})], ["'humanline.low'", "< 0", "0.5"]


@case("config/negative-lr")
def _(tmp, mp, model):
    return [_recipe(tmp, optim={"lr": -1e-3})], ["'optim.lr'", "> 0"]


@case("config/eval-fraction-range")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"eval_fraction": 1.5})], ["'data.eval_fraction'", "[0, 1)"]


@case("config/nan-value")
def _(tmp, mp, model):
    path = _recipe(tmp)
    path.write_text(path.read_text().replace("objective:\n", "objective:\n  beta: .nan\n"))
    return [path], ["'objective.beta'", "finite"]


@case("config/inf-value")
def _(tmp, mp, model):
    return [_recipe(tmp), "--optim.max_grad_norm=.inf"], ["'optim.max_grad_norm'", "finite"]


@case("config/unknown-objective")
def _(tmp, mp, model):
    return [_recipe(tmp, objective={"name": "ppo"})], ["'objective.name'", " | ".join(SPECS), "'ppo'"]


@case("config/unknown-dtype")
def _(tmp, mp, model):
    return [_recipe(tmp, model={"dtype": "float8"})], ["'model.dtype'", "float32"]


@case("config/tiny-hidden-size-not-multiple-of-heads")
def _(tmp, mp, model):
    return [_recipe(tmp, model={"tiny_hidden_size": 18})], ["'model.tiny_hidden_size'", "multiple of 4"]


@case("config/negative-seed")
def _(tmp, mp, model):
    return [_recipe(tmp, train={"seed": -1})], ["'train.seed'"]


@case("config/unknown-tracker")
def _(tmp, mp, model):
    return [_recipe(tmp, logging={"trackers": ["tensorbored"]})], ["'logging.trackers'", "tensorboard"]


@case("config/tracker-not-installed")
def _(tmp, mp, model):
    import accelerate.utils

    mp.setattr(accelerate.utils, "is_wandb_available", lambda: False)
    return [_recipe(tmp, logging={"trackers": ["wandb"]})], ["logging.trackers", "wandb", "pip install"]


@case("config/invalid-yaml-with-line")
def _(tmp, mp, model):
    path = tmp / "broken.yaml"
    path.write_text("model:\n  name: tiny\ntrain:\n  max_steps: [1, 2\n  seed: 0\n")
    return [path], ["broken.yaml:5", "invalid YAML"]


@case("config/tab-indented-yaml")
def _(tmp, mp, model):
    path = tmp / "tabs.yaml"
    path.write_text("model:\n\tname: tiny\n")
    return [path], ["tabs.yaml:2", "invalid YAML"]


@case("config/top-level-list")
def _(tmp, mp, model):
    path = tmp / "list.yaml"
    path.write_text("- model\n- data\n")
    return [path], ["list.yaml", "mapping"]


@case("config/missing-file")
def _(tmp, mp, model):
    return [tmp / "nope.yaml"], ["nope.yaml", "cannot read"]


@case("config/override-bad-value")
def _(tmp, mp, model):
    return [_recipe(tmp), "--train.max_steps=abc"], ["'train.max_steps'", "integer"]


@case("config/override-bad-key")
def _(tmp, mp, model):
    return [_recipe(tmp), "--train.max.steps=3"], ["train.max.steps=3", "section.key=value"]


@case("config/override-unknown-field")
def _(tmp, mp, model):
    return [_recipe(tmp), "--humanline.sync_evry=2"], ["'humanline.sync_evry'", "humanline.sync_every"]


@case("config/max-length-leaves-no-room")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"max_prompt_length": 64, "max_length": 48})], ["'data.max_length'",
                                                                             "data.max_prompt_length"]


@case("config/lookahead-with-online-regime")
def _(tmp, mp, model):
    sections = online_sections(tmp / "run")
    path = _recipe(tmp, sections, train={"reference": "lookahead"}, humanline={"enabled": True})
    return [path], ["'train.reference'", "lookahead", "offline"]


@case("config/online-without-prompts")
def _(tmp, mp, model):
    sections = online_sections(tmp / "run")
    return [_recipe(tmp, sections, rollout={"prompts": None})], ["'rollout.prompts'", "train.regime=online"]


@case("config/online-without-max-steps")
def _(tmp, mp, model):
    sections = online_sections(tmp / "run")
    return [_recipe(tmp, sections, train={"max_steps": None})], ["'train.max_steps'", "online"]


@case("config/offline-without-data")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"train": None})], ["'data.train'"]


@case("config/gguf-file-with-tiny-model")
def _(tmp, mp, model):
    return [_recipe(tmp, model={"gguf_file": "model.gguf"})], ["'model.gguf_file'", "tiny"]


@case("config/unpaired-threshold-missing")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"unpaired_rule": "threshold"})], ["'data.unpaired_threshold'"]


@case("config/micro-batch-larger-than-data")
def _(tmp, mp, model):
    return [_recipe(tmp, train={"micro_batch_size": 1000})], ["train.micro_batch_size", "pairs.jsonl"]


# ---------------------------------------------------------------- data


@case("data/missing-file")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"train": str(tmp / "none.jsonl")})], ["none.jsonl", "no such file"]


@case("data/malformed-jsonl-line")
def _(tmp, mp, model):
    data, path = _pairs(tmp, ['{"prompt": "1+1=", "chosen": "2", '])
    return [path], ["bad.jsonl:8", "invalid JSON"]


@case("data/wrong-field-type")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [{"prompt": "1+1=", "chosen": 2, "rejected": "3"}])
    return [path], ["bad.jsonl:8", "'chosen'", "a number"]


@case("data/empty-completion")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [{"prompt": "1+1=", "chosen": "  ", "rejected": "3"}])
    return [path], ["bad.jsonl:8", "'chosen'", "empty completion"]


@case("data/chosen-equals-rejected")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [{"prompt": "1+1=", "chosen": "2", "rejected": "2"}])
    return [path], ["bad.jsonl:8", "'rejected'", "identical"]


@case("data/missing-field")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [{"prompt": "1+1=", "chosen": "2"}])
    return [path], ["bad.jsonl:8", "'rejected'", "missing"]


@case("data/row-not-an-object")
def _(tmp, mp, model):
    data, path = _pairs(tmp, ['["1+1=", "2", "3"]'])
    return [path], ["bad.jsonl:8", "JSON object"]


@case("data/prompt-ends-with-assistant")
def _(tmp, mp, model):
    prompt = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    data, path = _pairs(tmp, [{"prompt": prompt, "chosen": "2", "rejected": "3"}])
    return [path], ["bad.jsonl:8", "prompt[1].role", "user or tool"]


@case("data/unknown-role")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [{"prompt": [{"role": "human", "content": "1+1="}], "chosen": "2", "rejected": "3"}])
    return [path], ["bad.jsonl:8", "prompt[0].role", "human"]


@case("data/not-utf8")
def _(tmp, mp, model):
    data, path = _pairs(tmp, [])
    with open(data, "ab") as handle:
        handle.write(b'{"prompt": "\xff\xfe", "chosen": "a", "rejected": "b"}\n')
    return [path], ["bad.jsonl:8", "UTF-8"]


@case("data/nan-score")
def _(tmp, mp, model):
    rows = [{"id": f"g{i}", "prompt": f"{i}+1=", "completions": ["1", "2"], "scores": [1.0, 0.0]} for i in range(4)]
    data = write_jsonl(tmp / "groups.jsonl", rows + ['{"prompt": "9+1=", "completions": ["10", "11"], '
                                                     '"scores": [NaN, 0.0]}'])
    sections = base_sections(tmp / "run", "grpo")
    return [_recipe(tmp, sections, data={"train": str(data)})], ["groups.jsonl:5", "'scores'", "finite"]


@case("data/score-count-mismatch")
def _(tmp, mp, model):
    rows = [{"prompt": "9+1=", "completions": ["10", "11", "12"], "scores": [1.0, 0.0]}]
    data = write_jsonl(tmp / "groups.jsonl", rows)
    sections = base_sections(tmp / "run", "grpo")
    return [_recipe(tmp, sections, data={"train": str(data)})], ["groups.jsonl:1", "'scores'", "3 finite"]


@case("data/label-not-boolean")
def _(tmp, mp, model):
    rows = [{"prompt": "1+1=", "completion": "2", "label": "maybe"}]
    data = write_jsonl(tmp / "unpaired.jsonl", rows)
    sections = base_sections(tmp / "run", "kto")
    return [_recipe(tmp, sections, data={"train": str(data)})], ["unpaired.jsonl:1", "'label'", "true or false"]


@case("data/empty-file")
def _(tmp, mp, model):
    data = tmp / "empty.jsonl"
    data.write_text("\n\n")
    return [_recipe(tmp, data={"train": str(data)})], ["empty.jsonl", "no records"]


@case("data/format-cannot-train-objective")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"train": str(DATA / "unpaired.jsonl")})], ["data.train", "unpaired", "'dpo'"]


@case("data/forced-format-mismatch")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"format": "groups"})], ["pairs.jsonl:1", "'completions'", "missing"]


@case("data/groups-give-no-pairs")
def _(tmp, mp, model):
    rows = [{"prompt": f"{i}+1=", "completions": ["1", "2"], "scores": [0.5, 0.5]} for i in range(8)]
    data = write_jsonl(tmp / "flat.jsonl", rows)
    return [_recipe(tmp, data={"train": str(data)})], ["flat.jsonl", "no training units"]


@case("data/bad-split")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"split": "train[abc]"})], ["split", "train[abc]"]


@case("data/missing-eval-file")
def _(tmp, mp, model):
    return [_recipe(tmp, data={"eval": str(tmp / "held_out.jsonl")})], ["held_out.jsonl", "no such file"]


@case("data/csv-bad-json-cell")
def _(tmp, mp, model):
    data = tmp / "groups.csv"
    data.write_text('prompt,completions,scores\n1+1=,"[""2"", ""3""]","[1, 0]"\n2+2=,"[""4"", ""5""]","[1, 0"\n')
    sections = base_sections(tmp / "run", "grpo")
    return [_recipe(tmp, sections, data={"train": str(data)})], ["groups.csv:3", "'scores'", "invalid JSON"]


@case("data/missing-rollout-prompts-file")
def _(tmp, mp, model):
    sections = online_sections(tmp / "run")
    return [_recipe(tmp, sections, rollout={"prompts": str(tmp / "p.jsonl")})], ["p.jsonl", "no such file"]


@case("data/missing-reward-file")
def _(tmp, mp, model):
    sections = online_sections(tmp / "run")
    return [_recipe(tmp, sections, rollout={"reward": str(tmp / "r.py") + ":score"})], ["r.py", "not found"]


@case("data/missing-eval-prompts")
def _(tmp, mp, model):
    return ([_recipe(tmp, eval={"prompts": str(tmp / "ep.jsonl"), "reward": "exact_match"})],
            ["ep.jsonl", "no such file"])


# ---------------------------------------------------------------- environment


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A saved tiny model and tokenizer, as a user's local model folder."""
    from humanline.model.tiny import make_model, make_tokenizer

    folder = tmp_path_factory.mktemp("model")
    tokenizer = make_tokenizer()
    tokenizer.save_pretrained(folder)
    make_model(tokenizer, hidden_size=16, num_layers=1).save_pretrained(folder)
    return folder


def _model_copy(tmp: Path, source: Path) -> Path:
    target = tmp / "model"
    shutil.copytree(source, target)
    return target


@case("env/model-folder-missing")
def _(tmp, mp, model):
    return [_recipe(tmp, model={"name": str(tmp / "no-model")})], ["model.name", "no-model", "does not exist"]


@case("env/model-folder-empty")
def _(tmp, mp, model):
    (tmp / "empty-model").mkdir()
    return [_recipe(tmp, model={"name": str(tmp / "empty-model")})], ["model.name", "empty-model"]


@case("env/model-weights-missing")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    (folder / "model.safetensors").unlink()
    return [_recipe(tmp, model={"name": str(folder)})], ["model.name", "cannot load the model"]


@case("env/training-sequences-longer-than-the-model-context")
def _(tmp, mp, model):
    recipe = _recipe(tmp, model={"name": str(model)}, data={"max_length": 600})
    return [recipe], ["data.max_length", "at most 512", "context of model", "600"]


@case("env/rollouts-longer-than-the-model-context")
def _(tmp, mp, model):
    recipe = _recipe(tmp, online_sections(tmp / "run"), model={"name": str(model)},
                     data={"max_prompt_length": 256, "max_length": 600}, rollout={"max_new_tokens": 300})
    return [recipe], ["rollout.max_new_tokens", "256 + 300 = 556", "context of model", "512"]


@case("env/gguf-file-missing")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    return [_recipe(tmp, model={"name": str(folder), "gguf_file": "m.Q4.gguf"})], ["model.gguf_file", "m.Q4.gguf",
                                                                                  "not found"]


@case("env/gguf-not-installed")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    (folder / "m.gguf").write_bytes(b"GGUF")
    mp.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail as if it were not installed
    return [_recipe(tmp, model={"name": str(folder), "gguf_file": "m.gguf"})], ["'gguf'", "pip install",
                                                                               "humanline[gguf]"]


@case("env/gguf-file-corrupt")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    (folder / "m.gguf").write_bytes(b"GGUF")  # the magic bytes, then nothing
    return [_recipe(tmp, model={"name": str(folder), "gguf_file": "m.gguf"})], ["model.name", "cannot load"]


@case("env/peft-not-installed")
def _(tmp, mp, model):
    mp.setitem(sys.modules, "peft", None)
    return [_recipe(tmp, model={"lora": True})], ["'peft'", "humanline[peft]", "model.lora"]


@case("env/lora-target-modules-not-in-model")
def _(tmp, mp, model):
    return [_recipe(tmp, model={"lora": True, "lora_target_modules": ["c_attn"]})], ["model.lora_target_modules",
                                                                                     "c_attn"]


@case("env/tokenizer-without-pad-and-eos")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update({"pad_token": None, "eos_token": None})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return [_recipe(tmp, model={"name": str(folder)})], ["model.name", "neither a pad nor an eos"]


@case("env/tokenizer-without-chat-template")
def _(tmp, mp, model):
    folder = _model_copy(tmp, model)
    (folder / "chat_template.jinja").unlink()
    return [_recipe(tmp, model={"name": str(folder)})], ["pairs.jsonl", "chat template"]


@case("env/output-dir-under-a-file")
def _(tmp, mp, model):
    blocker = tmp / "a-file"
    blocker.write_text("not a folder")
    return [_recipe(tmp, train={"output_dir": str(blocker / "run")})], ["'train.output_dir'", "a-file"]


@case("env/output-dir-not-writable")
def _(tmp, mp, model):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere; env/output-dir-under-a-file covers the failure")
    locked = tmp / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    return [_recipe(tmp, train={"output_dir": str(locked / "run")})], ["'train.output_dir'", "locked"]


@case("env/resume-with-only-corrupt-checkpoints")
def _(tmp, mp, model):
    ckpt = tmp / "run" / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / "complete.json").write_text('{"step": 2}')
    (ckpt / "trainer_state.json").write_text("{")
    return [_recipe(tmp), "--resume", "--trust-inputs"], ["checkpoints", "step-2"]


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path, monkeypatch, capsys, model_folder):
    monkeypatch.chdir(tmp_path)
    argv, needles = CASES[name](tmp_path, monkeypatch, model_folder)
    code, lines = run_cli(["train", *argv], capsys)
    assert_user_error(code, lines, *needles)


def test_corpus_is_large_enough():
    assert len(CASES) >= 30
    assert {name.split("/")[0] for name in CASES} == {"config", "data", "env"}


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_prints_the_traceback(tmp_path, capsys, where):
    path = _recipe(tmp_path, train={"max_steps": "ten"})
    argv = ["--debug", "train", path] if where == "before" else ["train", path, "--debug"]
    code, lines = run_cli(argv, capsys)
    text = "\n".join(lines)
    assert code == 2
    assert "Traceback (most recent call last)" in text
    assert lines[-1].startswith("humanline: error:") and "'train.max_steps'" in lines[-1]


def test_internal_error_keeps_traceback_and_ends_with_a_clear_line(tmp_path, capsys, monkeypatch):
    """A bug is not a user error: exit code 1, the traceback, then one line saying it is an internal error."""
    import humanline.training.loop

    def broken(self):
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(humanline.training.loop.Trainer, "train_step", broken)
    code, lines = run_cli(["train", _recipe(tmp_path)], capsys)
    text = "\n".join(lines)
    assert code == 1
    assert "Traceback (most recent call last)" in text and "ZeroDivisionError: simulated bug" in text
    assert lines[-1].startswith("humanline: internal error:")
    assert "ZeroDivisionError: simulated bug" in lines[-1] and "--debug" not in lines[-1]


# ---------------------------------------------------------------- inputs nobody listed


def _config_fields() -> list[tuple[str, str]]:
    import dataclasses

    from humanline.settings.config import Config

    return [(section.name, f.name) for section in dataclasses.fields(Config)
            for f in dataclasses.fields(section.default_factory())]


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=2)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(_config_fields()), value=ODD_VALUES)
def test_any_config_value_is_accepted_or_rejected_with_one_line(field, value):
    """Whatever a field holds, loading the config returns a Config or raises a one-line UserError."""
    from humanline.errors import UserError
    from humanline.training.config_loading import load_config

    section, name = field
    overrides = {"data": {"train": "data.jsonl"}}
    overrides.setdefault(section, {})[name] = value
    try:
        load_config(None, overrides)
    except UserError as exc:
        assert str(exc) and "\n" not in str(exc)


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["role", "content", "x"]),
                                                                          inner, max_size=2)),
    max_leaves=6,
)
FIELD_NAMES = st.sampled_from(["prompt", "chosen", "rejected", "completion", "label", "completions", "scores", "id"])
ROWS = st.one_of(st.dictionaries(FIELD_NAMES, JSON_VALUES, max_size=4).map(lambda r: json.dumps(r)),
                 st.text(max_size=20).filter(lambda t: "\n" not in t and "\r" not in t))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ROWS, min_size=1, max_size=6))
def test_random_data_lines_exit_0_or_2_without_traceback(rows, tmp_path_factory, capsys):
    """Random JSONL lines (valid objects with odd values, or junk) either train or fail with one clear line."""
    tmp = tmp_path_factory.mktemp("fuzz")
    data = tmp / "fuzz.jsonl"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8", errors="surrogatepass")
    recipe = _recipe(tmp, data={"train": str(data)}, train={"micro_batch_size": 1})
    code, lines = run_cli(["train", recipe], capsys)
    if code != 0:
        assert_user_error(code, lines, "fuzz.jsonl")
