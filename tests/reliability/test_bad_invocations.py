"""A corpus of bad invocations across the commands: command-line arguments of `train`, recipe files, resume
situations, and `data convert`, `eval` and `inspect` calls. Every one exits 2 with one `humanline: error:` line
that names what to fix, no traceback, and leaves the working folder exactly as it was: no file written, changed
or removed, no folder made. Each case runs in this process, in its own folder; resume cases copy one finished
1-step run of the 1-layer tiny model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from helpers_reliability import DATA, assert_user_error, base_sections, one_thread, online_sections, run_cli

CASES: dict = {}
_one_thread = pytest.fixture(scope="module", autouse=True)(one_thread)


def case(name: str, *needles: str):
    """Register `fn(tmp, run) -> argv`: run `humanline ARGV` in `tmp`; the error line must hold every needle.
    `run(tmp)` copies the finished run into `tmp/proj` (its run folder is `tmp/proj/runs/x`)."""

    def register(fn):
        CASES[name] = (fn, needles)
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


# ---------------------------------------------------------------- train: resume situations


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@case("resume/no-such-folder", "no config.yaml there", "--output-dir")
def _(tmp, run):
    return ["train", "--resume", tmp / "nothing"]


@case("resume/empty-folder", "no config.yaml there")
def _(tmp, run):
    (tmp / "empty").mkdir()
    return ["train", "--resume", tmp / "empty"]


@case("resume/recipe-without-a-run", "holds no run to continue", "leave out --resume")
def _(tmp, run):
    return ["train", _recipe(tmp), "--resume"]


@case("resume/recipe-file-as-run-dir", "holds no run to continue", "leave out --resume")
def _(tmp, run):
    return ["train", "--resume", _recipe(tmp)]


@case("resume/recipe-with-other-output-dir", "holds no run to continue")
def _(tmp, run):
    return ["train", _recipe(tmp), "--resume", "--output-dir", tmp / "other"]


for _name, _old, _new in [
    ("edited-beta", "beta: 0.1", "beta: 0.5"),
    ("edited-lr", "lr: 0.001", "lr: 0.5"),
    ("edited-steps", "max_steps: 1", "max_steps: 5"),
    ("added-comment", "model:", "# mine\nmodel:"),
    ("broken-yaml", "model:", "model: [\n"),
]:
    case(f"resume/config-{_name}", "config.yaml was edited after the run started", "undo it")(
        lambda tmp, run, old=_old, new=_new: (_edit(run(tmp) / "config.yaml", old, new),
                                              ["train", "--resume", tmp / "proj" / "runs" / "x"])[1])


@case("resume/config-removed", "no config.yaml there")
def _(tmp, run):
    (run(tmp) / "config.yaml").unlink()
    return ["train", "--resume", tmp / "proj" / "runs" / "x"]


@case("resume/data-swapped", "data.train: file 'data/pairs.jsonl'", "changed since the run started")
def _(tmp, run):
    out = run(tmp)
    data = out.parents[1] / "data" / "pairs.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    data.write_text("".join(json.dumps({**r, "chosen": r["rejected"], "rejected": r["chosen"]}) + "\n" for r in rows))
    return ["train", "--resume", out, "--train.max_steps=2"]


@case("resume/data-appended", "data.train", "changed since the run started", "another --output-dir")
def _(tmp, run):
    out = run(tmp)
    data = out.parents[1] / "data" / "pairs.jsonl"
    data.write_text(data.read_text() + data.read_text().splitlines()[0] + "\n")
    return ["train", "--resume", out, "--train.max_steps=2"]


@case("resume/data-gone", "data.train: the run's file 'data/pairs.jsonl' is gone", "restore it")
def _(tmp, run):
    out = run(tmp)
    (out.parents[1] / "data" / "pairs.jsonl").unlink()
    return ["train", "--resume", out, "--train.max_steps=2"]


for _name, _override, _field in [
    ("changed-lr", "--optim.lr=0.5", "optim.lr"),
    ("changed-beta", "--objective.beta=0.3", "objective.beta"),
    ("changed-eval-fraction", "--data.eval_fraction=0.5", "data.eval_fraction"),
    ("changed-seed", "--train.seed=7", "train.seed"),
    ("changed-model", "--model.tiny_layers=2", "model.tiny_layers"),
]:
    case(f"resume/{_name}", f"--resume: {_field} is", "start a new run", "--overwrite")(
        lambda tmp, run, override=_override: ["train", "--resume", run(tmp), "--train.max_steps=2", override])


@case("resume/other-data-file", "--resume: data.train is", "start a new run")
def _(tmp, run):
    out = run(tmp)
    other = tmp / "other.jsonl"
    other.write_text("".join((DATA / "pairs.jsonl").read_text().splitlines(keepends=True)[:100]))
    return ["train", "--resume", out, "--train.max_steps=2", f"--data.train={other}"]


@case("resume/bad-override", "'train.max_steps'", "integer")
def _(tmp, run):
    return ["train", "--resume", run(tmp), "--train.max_steps=many"]


@case("resume/zero-steps", "'train.max_steps'")
def _(tmp, run):
    return ["train", "--resume", run(tmp), "--train.max_steps=0"]


@case("resume/segments-damaged", "segments.jsonl:1", "not valid JSON")
def _(tmp, run):
    out = run(tmp)
    (out / "segments.jsonl").write_text('{"segment": 2, "st\n{"segment": 3, "step": 1, "changes": {}}\n')
    return ["train", "--resume", out, "--train.max_steps=2"]


@case("resume/inputs-damaged", "inputs.json", "start a new run")
def _(tmp, run):
    out = run(tmp)
    (out / "inputs.json").write_text("[1, 2]\n")
    return ["train", "--resume", out, "--train.max_steps=2"]


@case("resume/two-folders", "name two run folders")
def _(tmp, run):
    return ["train", "--resume", run(tmp), "--output-dir", tmp / "elsewhere"]


@case("resume/with-overwrite", "--resume and --overwrite exclude each other")
def _(tmp, run):
    return ["train", "--resume", run(tmp), "--overwrite"]


@case("resume/recipe-disagrees", "--resume: optim.lr is", "but 0.5 now")
def _(tmp, run):
    out = run(tmp)
    sections = yaml.safe_load((out / "config.yaml").read_text())
    sections["data"]["train"] = str(out.parents[1] / "data" / "pairs.jsonl")  # the run's file, named another way
    sections["optim"]["lr"] = 0.5
    return ["train", _recipe(tmp, sections, train={"output_dir": str(out), "max_steps": 2}), "--resume"]


@case("resume/new-run-into-it", "holds a run", "pass --resume to continue it")
def _(tmp, run):
    return ["train", _recipe(tmp, train={"output_dir": str(run(tmp))})]


# ---------------------------------------------------------------- data convert

for _name, _output in [("same-name", "groups.jsonl"), ("dot-slash", "./groups.jsonl"),
                       ("absolute", "{tmp}/groups.jsonl"), ("symlink", "link.jsonl")]:
    @case(f"convert/output-is-input-{_name}", "is the input file", "write to another file")
    def _(tmp, run, output=_output):
        os.symlink(_groups(tmp), tmp / "link.jsonl")
        return ["data", "convert", "groups.jsonl", output.format(tmp=tmp), "--to", "pairwise", "--overwrite"]


@case("convert/output-exists", "exists: pass --overwrite to replace it")
def _(tmp, run):
    (tmp / "pairs.jsonl").write_text("mine\n")
    return ["data", "convert", _groups(tmp), tmp / "pairs.jsonl", "--to", "pairwise"]


@case("convert/output-is-a-folder", "is a folder", "name the .jsonl file")
def _(tmp, run):
    (tmp / "out").mkdir()
    return ["data", "convert", _groups(tmp), tmp / "out", "--to", "pairwise"]


@case("convert/output-not-jsonl", "name the output *.jsonl")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), tmp / "pairs.csv", "--to", "pairwise"]


@case("convert/input-missing", "none.jsonl", "no such file")
def _(tmp, run):
    return ["data", "convert", tmp / "none.jsonl", tmp / "pairs.jsonl", "--to", "pairwise"]


@case("convert/input-bad-line", "bad.jsonl:2", "invalid JSON")
def _(tmp, run):
    _text(tmp, '{"prompt": "1+1=", "completions": ["2", "3"], "scores": [1, 0]}\n{"prompt": \n', "bad.jsonl")
    return ["data", "convert", tmp / "bad.jsonl", tmp / "pairs.jsonl", "--to", "pairwise"]


@case("convert/input-empty", "empty.jsonl", "no records")
def _(tmp, run):
    _text(tmp, "\n", "empty.jsonl")
    return ["data", "convert", tmp / "empty.jsonl", tmp / "pairs.jsonl", "--to", "pairwise"]


@case("convert/impossible", "cannot convert unpaired records to pairwise", "supported:")
def _(tmp, run):
    return ["data", "convert", DATA / "unpaired.jsonl", tmp / "pairs.jsonl", "--to", "pairwise"]


# ---------------------------------------------------------------- eval

EVAL = ["--prompts", str(DATA / "eval_prompts.jsonl"), "--reward", "exact_match", "--n", "1", "--max-new-tokens", "1"]


@case("eval/earlier-result-of-a-name", "'eval-tiny.json' holds an earlier result", "--overwrite")
def _(tmp, run):
    (tmp / "eval-tiny.json").write_text("{}\n")
    return ["eval", "tiny", *EVAL]


@case("eval/earlier-result-of-a-run", "eval.json' holds an earlier result", "--output FILE")
def _(tmp, run):
    out = run(tmp)
    (out / "eval.json").write_text("{}\n")
    return ["eval", out, *EVAL]


@case("eval/output-is-a-folder", "--output", "is a folder")
def _(tmp, run):
    (tmp / "results").mkdir()
    return ["eval", "tiny", *EVAL, "--output", tmp / "results"]


@case("eval/prompts-missing", "none.jsonl", "no such file")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", tmp / "none.jsonl"]


@case("eval/k-zero", "--k", ">= 1")
def _(tmp, run):
    return ["eval", "tiny", *EVAL, "--k", "0"]


@case("eval/greedy-with-samples", "--temperature", "--n 1")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", DATA / "eval_prompts.jsonl", "--temperature", "0", "--n", "2"]


@case("eval/unknown-model", "model 'no-such-model'")
def _(tmp, run):
    return ["eval", "no-such-model", *EVAL]


@case("eval/unknown-reward", "--reward", "no_such_reward")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", DATA / "eval_prompts.jsonl", "--reward", "no_such_reward"]


@case("eval/reward-model-not-a-folder", "reward_model './no_rm': no such folder")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", DATA / "eval_prompts.jsonl", "--reward", "reward_model:./no_rm"]


# ---------------------------------------------------------------- inspect


@case("inspect/data-missing", "none.jsonl", "no such file")
def _(tmp, run):
    return ["inspect", "data", tmp / "none.jsonl", "--model", "tiny", "--output-dir", tmp / "out"]


@case("inspect/data-unknown-model", "model 'no-such-model'")
def _(tmp, run):
    return ["inspect", "data", DATA / "pairs.jsonl", "--model", "no-such-model", "--output-dir", tmp / "out"]


@case("inspect/output-under-a-file", "--output-dir", "is a file, not a folder")
def _(tmp, run):
    _text(tmp, "x", "file")
    return ["inspect", "data", DATA / "pairs.jsonl", "--model", "tiny", "--output-dir", tmp / "file" / "out"]


@case("inspect/filter-quantile", "--filter-below")
def _(tmp, run):
    return ["inspect", "data", DATA / "pairs.jsonl", "--model", "tiny", "--filter-below", "1.5",
            "--output-dir", tmp / "out"]


PERCEPTION = ["inspect", "perception", "--policy", "tiny", "--reference", "tiny"]


@case("inspect/perception-gamma", "--gamma", "(0, 1]")
def _(tmp, run):
    return [*PERCEPTION, "--prompts", DATA / "prompts.jsonl", "--gamma", "2", "--output-dir", tmp / "out"]


@case("inspect/perception-n-zero", "--n", ">= 1")
def _(tmp, run):
    return [*PERCEPTION, "--prompts", DATA / "prompts.jsonl", "--n", "0", "--output-dir", tmp / "out"]


@case("inspect/perception-prompts-missing", "none.jsonl", "no such file")
def _(tmp, run):
    return [*PERCEPTION, "--prompts", tmp / "none.jsonl", "--output-dir", tmp / "out"]


# ---------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """proj/: data/pairs.jsonl and a finished 1-step run runs/x started from proj/ (frozen reference: a resume
    may train longer)."""
    from humanline.cli import main

    proj = tmp_path_factory.mktemp("finished") / "proj"
    (proj / "data").mkdir(parents=True)
    shutil.copy(DATA / "pairs.jsonl", proj / "data" / "pairs.jsonl")
    sections = base_sections(Path("runs/x"))
    sections["data"]["train"] = "data/pairs.jsonl"
    sections["train"]["reference"] = "frozen"
    here = os.getcwd()
    os.chdir(proj)
    try:
        assert main(["train", str(_recipe(proj, sections))]) == 0
    finally:
        os.chdir(here)
    return proj


def _state(folder: Path) -> dict[str, str]:
    """Every path below `folder`: a folder, a link, or a file's SHA-256."""
    state = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            state[key] = f"link to {os.readlink(path)}"
        elif path.is_dir():
            state[key] = "folder"
        else:
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_invocation_is_one_line_exit_2_and_leaves_nothing(name, tmp_path, monkeypatch, capsys, finished):
    def run(tmp: Path) -> Path:
        proj = tmp / "proj"
        shutil.copytree(finished, proj, symlinks=True)
        inputs = proj / "runs" / "x" / "inputs.json"
        inputs.write_text(inputs.read_text().replace(str(finished.resolve()), str(proj.resolve())))
        return proj / "runs" / "x"

    monkeypatch.chdir(tmp_path)
    make, needles = CASES[name]
    argv = make(tmp_path, run)
    before = _state(tmp_path)
    code, lines = run_cli(argv, capsys)
    assert_user_error(code, lines, *needles)
    assert _state(tmp_path) == before, "the invocation changed the folder"


def test_the_corpus_is_large_and_covers_every_kind():
    assert len(CASES) >= 100
    assert {name.split("/")[0] for name in CASES} == {"cli", "recipe", "resume", "convert", "eval", "inspect"}
