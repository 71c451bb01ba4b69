"""Bad invocations for tests/reliability/test_bad_invocations.py, continued: resume situations, `data convert`,
`eval` and `inspect` (the registry and the `train` cases: helpers_invocations)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from helpers_invocations import CASES, _groups, _recipe, _text, case
from helpers_reliability import DATA

__all__ = ["CASES"]


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
