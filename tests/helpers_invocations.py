"""Bad invocations of `humanline train` for tests/reliability/test_bad_invocations.py: command-line arguments
and recipe files. Each case is `fn(tmp, run) -> argv` with its expected exit code and the needles its one error
line must hold (the table: input, code, message fragments); `run(tmp)` copies a finished run into `tmp/proj` and
returns its run folder (`tmp/proj/runs/x`)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from helpers_reliability import DATA, base_sections, online_sections

CASES: dict = {}


def case(name: str, *needles: str, code: int = 2):
    """Register `fn(tmp, run) -> argv`: run `humanline ARGV` in `tmp`; it must exit with `code` and its error line
    hold every needle. `run(tmp)` copies the finished run into `tmp/proj` (its run folder is `tmp/proj/runs/x`)."""

    def register(fn):
        assert name not in CASES, f"case {name} registered twice"
        CASES[name] = (fn, needles, code)
        return fn

    return register


def _recipe(tmp: Path, sections: dict | None = None, name: str = "recipe.yaml", **changes) -> Path:
    sections = sections or base_sections(tmp / "out")
    for section, values in changes.items():
        sections.setdefault(section, {}).update(values)
    path = tmp / name
    path.write_text(yaml.safe_dump(sections, sort_keys=False))
    return path


def _text(tmp: Path, text: str | bytes, name: str = "recipe.yaml") -> Path:
    path = tmp / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def _groups(tmp: Path) -> Path:
    rows = [{"id": f"g{i}", "prompt": f"{i}+1=", "completions": [str(i + 1), "x"], "scores": [1.0, 0.0]}
            for i in range(4)]
    path = tmp / "groups.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------- train: command-line arguments

for _name, _args, _fix in [
    ("space-instead-of-equals", ["--optim.lr", "1e-3"], "--optim.lr=1e-3"),
    ("section-without-key", ["--model=tiny"], "--model.name=tiny"),
    ("section-without-key-spaced", ["--model", "tiny"], "--model.name=tiny"),
    ("plain-option", ["--steps", "10"], "--train.max_steps=10"),
    ("plain-option-equals", ["--lr=1e-4"], "--optim.lr=1e-4"),
    ("key-without-section", ["--max_steps=3"], "--train.max_steps=3"),
    ("dotted-without-value", ["--train.max_steps"], "--train.max_steps=VALUE"),
]:
    case(f"cli/{_name}", "write overrides as --section.key=value", _fix)(
        lambda tmp, run, args=_args: ["train", _recipe(tmp), *args])

for _name, _override, _needles in [
    ("not-a-number", "--optim.lr=abc", ("command line (--optim.lr=abc)", "'optim.lr'", "a number")),
    ("negative-lr", "--optim.lr=-1", ("'optim.lr'", "> 0")),
    ("huge-lr", "--optim.lr=1e6", ("'optim.lr'", "at most 1")),
    ("nan-lr", "--optim.lr=.nan", ("'optim.lr'", "finite")),
    ("three-part-key", "--train.max.steps=3", ("train.max.steps=3", "section.key=value")),
    ("unknown-section", "--trainer.max_steps=3", ("'trainer'",)),
    ("unknown-field", "--train.max_step=3", ("'train.max_step'", "did you mean 'train.max_steps'")),
    ("sync-every-zero", "--humanline.sync_every=0", ("'humanline.sync_every'", ">= 1")),
    ("negative-steps", "--train.max_steps=-1", ("'train.max_steps'",)),
    ("eval-fraction-one", "--data.eval_fraction=1", ("'data.eval_fraction'", "[0, 1)")),
    ("unknown-objective", "--objective.name=ppo", ("'objective.name'", "'ppo'")),
    ("unknown-dtype", "--model.dtype=float8", ("'model.dtype'", "float32")),
    ("unknown-regime", "--train.regime=onlin", ("'train.regime'", "offline")),
    ("zero-micro-batch", "--train.micro_batch_size=0", ("'train.micro_batch_size'",)),
    ("zero-samples", "--rollout.n=0", ("'rollout.n'",)),
    ("unknown-tracker", "--logging.trackers=[tensorbored]", ("'logging.trackers'", "tensorboard")),
    ("empty-output-dir", "--train.output_dir=", ("'train.output_dir'",)),
    ("no-room-for-completions", "--data.max_length=16", ("'data.max_length'", "data.max_prompt_length")),
    ("one-beta", "--optim.betas=[0.9]", ("'optim.betas'", "two numbers")),
    ("warmup-ratio-one", "--optim.warmup_ratio=1", ("'optim.warmup_ratio'", "[0, 1)")),
    ("keep-checkpoints-text", "--train.keep_checkpoints=abc", ("'train.keep_checkpoints'", "integer")),
    ("missing-data", "--data.train=missing.jsonl", ("missing.jsonl", "no such file")),
    ("missing-model-folder", "--model.name=./nosuch", ("./nosuch",)),
    ("bool-as-text", "--data.shuffle=maybe", ("'data.shuffle'", "true or false")),
]:
    case(f"cli/{_name}", *_needles)(lambda tmp, run, override=_override: ["train", _recipe(tmp), override])


@case("cli/two-recipes", "unexpected argument", "one recipe at most")
def _(tmp, run):
    return ["train", _recipe(tmp), _recipe(tmp, name="other.yaml")]


@case("cli/resume-and-output-dir-disagree", "name two run folders")
def _(tmp, run):
    return ["train", "--resume", tmp / "a", "--output-dir", tmp / "b"]


@case("cli/resume-without-anything", "expected a recipe", "--resume RUN_DIR")
def _(tmp, run):
    return ["train", "--resume"]


@case("cli/blank-output-dir", "--output-dir", "expected a folder")
def _(tmp, run):
    return ["train", _recipe(tmp), "--output-dir", " "]


@case("cli/resume-and-overwrite", "--resume and --overwrite exclude each other")
def _(tmp, run):
    return ["train", _recipe(tmp), "--resume", "--overwrite"]


# ---------------------------------------------------------------- train: recipe files

for _name, _content, _needles in [
    ("empty", "", ("the recipe is empty",)),
    ("comments-only", "# to do\n", ("the recipe is empty",)),
    ("empty-mapping", "{}\n", ("the recipe is empty",)),
    ("top-level-list", "- model\n- data\n", ("mapping",)),
    ("top-level-scalar", "5\n", ("mapping",)),
    ("invalid-yaml", "model:\n  name: tiny\ntrain:\n  max_steps: [1, 2\n", ("recipe.yaml:", "invalid YAML")),
    ("duplicate-key", "model:\n  name: tiny\n  name: tiny\n", ("duplicate key 'name'",)),
    ("tab-indented", "model:\n\tname: tiny\n", ("recipe.yaml:2", "invalid YAML")),
    ("section-not-mapping", "model:\n  name: tiny\ntrain: 5\n", ("'train'", "mapping")),
    ("utf16", "model: {name: tiny}\n".encode("utf-16"), ("not UTF-8", "UTF-16")),
    ("deeply-nested", "a: " + "[" * 40 + "]" * 40 + "\n", ("nested too deeply",)),
]:
    case(f"recipe/{_name}", *_needles)(lambda tmp, run, content=_content: ["train", _text(tmp, content)])

for _name, _changes, _needles in [
    ("unknown-field", {"train": {"max_step": 3}}, ("'train.max_step'", "did you mean 'train.max_steps'")),
    ("unknown-section", {"trainer": {"max_steps": 3}}, ("'trainer'",)),
    ("huge-lr", {"optim": {"lr": 1e6}}, ("'optim.lr'", "at most 1")),
    ("lr-as-text", {"optim": {"lr": "fast"}}, ("'optim.lr'", "a number")),
    ("steps-as-text", {"train": {"max_steps": "ten"}}, ("'train.max_steps'", "integer")),
    ("band-low-positive", {"humanline": {"low": 0.5}}, ("'humanline.low'", "< 0")),
    ("hidden-size", {"model": {"tiny_hidden_size": 18}}, ("'model.tiny_hidden_size'", "multiple of 4")),
    ("no-data", {"data": {"train": None}}, ("'data.train'",)),
    ("threshold-rule-without-threshold", {"data": {"unpaired_rule": "threshold"}}, ("'data.unpaired_threshold'",)),
    ("micro-batch-past-data", {"train": {"micro_batch_size": 1000}}, ("train.micro_batch_size", "pairs.jsonl")),
    ("gguf-with-tiny", {"model": {"gguf_file": "m.gguf"}}, ("'model.gguf_file'", "tiny")),
]:
    case(f"recipe/{_name}", *_needles)(lambda tmp, run, changes=_changes: ["train", _recipe(tmp, **changes)])


@case("recipe/missing-file", "nope.yaml", "cannot read")
def _(tmp, run):
    return ["train", tmp / "nope.yaml"]


@case("recipe/a-folder", "cannot read config file")
def _(tmp, run):
    (tmp / "folder.yaml").mkdir()
    return ["train", tmp / "folder.yaml"]


@case("recipe/eval-fraction-one-prompt-id", "'data.eval_fraction'", "share one prompt id", "set data.eval")
def _(tmp, run):
    rows = [json.loads(line) for line in (DATA / "pairs.jsonl").read_text().splitlines()[:40]]
    data = tmp / "one_id.jsonl"
    data.write_text("".join(json.dumps({**r, "id": "same"}) + "\n" for r in rows))
    return ["train", _recipe(tmp, data={"train": str(data), "eval_fraction": 0.1})]


@case("recipe/reward-model-not-a-folder", "reward_model './no_rm': no such folder")
def _(tmp, run):
    return ["train", _recipe(tmp, online_sections(tmp / "out"), rollout={"reward": "reward_model:./no_rm"})]


@case("recipe/reward-file-missing", "nothere.py")
def _(tmp, run):
    return ["train", _recipe(tmp, online_sections(tmp / "out"), rollout={"reward": "nothere.py:score"})]


@case("recipe/online-without-prompts", "'rollout.prompts'", "train.regime=online")
def _(tmp, run):
    return ["train", _recipe(tmp, online_sections(tmp / "out"), rollout={"prompts": None})]


@case("recipe/lookahead-online", "'train.reference'", "lookahead")
def _(tmp, run):
    return ["train", _recipe(tmp, online_sections(tmp / "out"), train={"reference": "lookahead"},
                             humanline={"enabled": True})]


@case("recipe/malformed-data-line", "bad.jsonl:2", "invalid JSON")
def _(tmp, run):
    data = tmp / "bad.jsonl"
    data.write_text((DATA / "pairs.jsonl").read_text().splitlines()[0] + '\n{"prompt": "1+1=", "chosen": \n')
    return ["train", _recipe(tmp, data={"train": str(data)})]
