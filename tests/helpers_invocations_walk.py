"""Bad invocations for tests/reliability/test_bad_invocations.py, the walk again: run folders that are not a run's,
resumes without a record, offline names, argparse errors as one line, and `data check`, `data convert`, `eval`,
`inspect`, `report`, `config`, `demo` and `reproduce` calls that must change nothing (the registry and the other
cases: helpers_invocations, helpers_invocations_more). Every case runs with HF_HUB_OFFLINE=1 (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from helpers_invocations import CASES, _groups, _recipe, _text, case
from helpers_invocations_more import EVAL  # noqa: F401  (registers the cases of helpers_invocations_more)
from helpers_reliability import DATA

__all__ = ["CASES"]

PROMPTS = str(DATA / "eval_prompts.jsonl")
PAIRS = str(DATA / "pairs.jsonl")


def _users_folder(tmp: Path) -> Path:
    """A folder of another tool: its config.yaml, checkpoints and notes."""
    out = tmp / "mine"
    (out / "checkpoints" / "other-tool").mkdir(parents=True)
    (out / "checkpoints" / "other-tool" / "model.safetensors").write_bytes(b"weights")
    (out / "config.yaml").write_text("lr: 3e-4\n")
    (out / "notes.txt").write_text("mine\n")
    return out


# ---------------------------------------------------------------- train: whose folder, and offline names

@case("train/a-folder-of-another-tool", "holds no humanline run", "config.yaml", "checkpoints/", "notes.txt")
def _(tmp, run):
    return ["train", _recipe(tmp), "--output-dir", _users_folder(tmp)]


@case("train/a-folder-of-another-tool-overwrite", "holds no humanline run", "choose another --output-dir")
def _(tmp, run):
    return ["train", _recipe(tmp), "--output-dir", _users_folder(tmp), "--overwrite"]


@case("train/only-a-config-yaml-of-the-user", "holds no humanline run (config.yaml)")
def _(tmp, run):
    (tmp / "mine").mkdir()
    (tmp / "mine" / "config.yaml").write_text("mine: 1\n")
    return ["train", _recipe(tmp), "--output-dir", tmp / "mine", "--overwrite"]


@case("train/a-metrics-file-of-another-tool", "holds no humanline run (metrics.jsonl)")
def _(tmp, run):
    (tmp / "mine").mkdir()
    (tmp / "mine" / "metrics.jsonl").write_text('{"epoch": 1}\n')
    return ["train", _recipe(tmp), "--output-dir", tmp / "mine"]


@case("train/resume-into-a-folder-of-another-tool", "holds no run to continue")
def _(tmp, run):
    return ["train", _recipe(tmp), "--output-dir", _users_folder(tmp), "--resume"]


@case("train/trust-inputs-without-resume", "--trust-inputs: only with --resume")
def _(tmp, run):
    return ["train", _recipe(tmp), "--trust-inputs"]


@case("train/unknown-model-offline", "model 'owner/typo-model'", "local Hugging Face cache", "HF_HUB_OFFLINE")
def _(tmp, run):
    return ["train", _recipe(tmp), "--model.name=owner/typo-model"]


@case("train/unknown-one-word-model-offline", "model 'typo-model'", "local Hugging Face cache")
def _(tmp, run):
    return ["train", _recipe(tmp), "--model.name=typo-model"]


@case("train/unknown-hub-dataset-offline", "owner/typo-data", "nor a hub dataset in the local cache")
def _(tmp, run):
    return ["train", _recipe(tmp), "--data.train=owner/typo-data"]


@case("train/allow-collapse-as-text", "'train.allow_collapse'", "true or false")
def _(tmp, run):
    return ["train", _recipe(tmp), "--train.allow_collapse=maybe"]


@case("train/output-dir-is-a-file", "train.output_dir", "a-file' is a file, not a folder")
def _(tmp, run):
    return ["train", _recipe(tmp), "--output-dir", _text(tmp, "x", "a-file")]


@case("resume/inputs-json-removed", "has no inputs.json", "--trust-inputs")
def _(tmp, run):
    out = run(tmp)
    (out / "inputs.json").unlink()
    return ["train", "--resume", out, "--train.max_steps=2"]


@case("resume/inputs-json-removed-and-data-swapped", "has no inputs.json", "--trust-inputs")
def _(tmp, run):
    out = run(tmp)
    (out / "inputs.json").unlink()
    data = out.parents[1] / "data" / "pairs.jsonl"
    data.write_text(data.read_text().splitlines()[0] + "\n")
    return ["train", "--resume", out, "--train.max_steps=2"]


# ---------------------------------------------------------------- argparse errors: one line, every command

for _name, _argv, _needles in [
    ("top/unknown-command", ["trian"], ("invalid choice: 'trian'", "`humanline --help`")),
    ("top/no-command", [], ("required: command",)),
    ("eval/n-not-a-number", ["eval", "tiny", "--prompts", PROMPTS, "--n", "abc"], ("eval: argument --n", "'abc'")),
    ("eval/no-prompts", ["eval", "tiny"], ("eval: the following arguments are required: --prompts",)),
    ("eval/no-model", ["eval", "--prompts", PROMPTS], ("required: MODEL_OR_RUN",)),
    ("eval/on-error-choice", ["eval", "tiny", "--prompts", PROMPTS, "--on-error", "ignore"],
     ("argument --on-error", "invalid choice")),
    ("eval/temperature-text", ["eval", "tiny", "--prompts", PROMPTS, "--temperature", "hot"],
     ("argument --temperature", "invalid float value")),
    ("eval/unknown-flag", ["eval", "tiny", "--prompts", PROMPTS, "--samples", "4"],
     ("eval: unrecognized arguments: --samples 4",)),
    ("eval/config-override", ["eval", "tiny", "--prompts", PROMPTS, "--optim.lr=1"],
     ("eval: config overrides (--optim.lr=1) only apply to 'train'",)),
    ("check/no-path", ["data", "check"], ("data check", "required: path")),
    ("check/format-choice", ["data", "check", PAIRS, "--format", "pairs"], ("argument --format", "invalid choice")),
    ("check/no-subcommand", ["data"], ("data: the following arguments are required: {check,convert}",)),
    ("check/max-length-text", ["data", "check", PAIRS, "--max-length", "long"], ("argument --max-length",)),
    ("convert/no-to", ["data", "convert", PAIRS, "out.jsonl"], ("required: --to",)),
    ("convert/mode-choice", ["data", "convert", PAIRS, "out.jsonl", "--to", "pairwise", "--mode", "every"],
     ("argument --mode", "invalid choice")),
    ("convert/threshold-text", ["data", "convert", PAIRS, "out.jsonl", "--to", "unpaired", "--threshold", "high"],
     ("argument --threshold", "invalid float value")),
    ("report/no-run-dir", ["report"], ("report: the following arguments are required: RUN_DIR",)),
    ("report/unknown-flag", ["report", "x", "--force"], ("report: unrecognized arguments: --force",)),
    ("inspect/no-model", ["inspect", "data", PAIRS], ("inspect data", "required: --model")),
    ("inspect/perception-n-text", ["inspect", "perception", "--policy", "tiny", "--reference", "tiny", "--prompts",
                                   PAIRS, "--n", "many"], ("argument --n", "invalid int value")),
    ("config/unknown-flag", ["config", "--all"], ("config: unrecognized arguments: --all",)),
    ("demo/objective-choice", ["demo", "--objective", "ppo"], ("argument --objective", "invalid choice")),
    ("demo/seeds-text", ["demo", "--seeds", "three"], ("argument --seeds", "invalid int value")),
    ("reproduce/unknown-model", ["reproduce", "llama"], ("argument model", "invalid choice: 'llama'")),
    ("reproduce/engine-choice", ["reproduce", "smollm2", "--engine", "sglang"], ("argument --engine",)),
]:
    case(_name, *_needles)(lambda tmp, run, argv=_argv: argv)


# ---------------------------------------------------------------- eval

for _name, _flags, _needles in [
    ("max-new-tokens-zero", ["--max-new-tokens", "0"], ("--max-new-tokens",)),
    ("top-p-zero", ["--top-p", "0"], ("--top-p",)),
    ("batch-size-zero", ["--batch-size", "0"], ("--batch-size",)),
    ("temperature-negative", ["--temperature", "-1"], ("--temperature",)),
    ("n-zero", ["--n", "0"], ("--n",)),
]:
    case(f"eval/{_name}", *_needles)(
        lambda tmp, run, flags=_flags: ["eval", "tiny", "--prompts", PROMPTS, "--reward", "exact_match", *flags])


@case("eval/baseline-missing", "--baseline: no such file or folder", "none.json")
def _(tmp, run):
    return ["eval", "tiny", *EVAL, "--baseline", tmp / "none.json"]


@case("eval/baseline-not-json", "not valid JSON")
def _(tmp, run):
    return ["eval", "tiny", *EVAL, "--baseline", _text(tmp, "{\n", "base.jsonl")]


@case("eval/baseline-misses-a-prompt", "no baseline completion for prompt id")
def _(tmp, run):
    return ["eval", "tiny", *EVAL, "--baseline", _text(tmp, '{"prompt_id": "nope", "completion": "1"}\n', "b.jsonl")]


@case("eval/unknown-hub-model-offline", "model 'owner/typo'", "local Hugging Face cache")
def _(tmp, run):
    return ["eval", "owner/typo", *EVAL]


@case("eval/a-run-without-its-final-model", "run folder without a final model")
def _(tmp, run):
    (tmp / "r").mkdir()
    (tmp / "r" / "run_info.json").write_text("{}")
    return ["eval", tmp / "r", *EVAL, "--output", tmp / "out.json"]


@case("eval/a-folder-that-is-no-model", "neither a model folder", "nor a run directory")
def _(tmp, run):
    (tmp / "stuff").mkdir()
    (tmp / "stuff" / "notes.txt").write_text("x")
    return ["eval", tmp / "stuff", *EVAL, "--output", tmp / "out.json"]


@case("eval/prompts-empty", "empty.jsonl", "no records")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", _text(tmp, "\n", "empty.jsonl")]


@case("eval/prompts-a-pairs-file-line-broken", "bad.jsonl:2", "invalid JSON")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", _text(tmp, '{"prompt": "1+1="}\n{"prompt": \n', "bad.jsonl")]


@case("eval/output-under-a-file", "--output", "is a file, not a folder")
def _(tmp, run):
    return ["eval", "tiny", *EVAL, "--output", _text(tmp, "x", "a-file") / "r.json"]


@case("eval/reward-file-missing", "nothere.py")
def _(tmp, run):
    return ["eval", "tiny", "--prompts", PROMPTS, "--reward", "nothere.py:score"]


# ---------------------------------------------------------------- data check and data convert

@case("check/missing-file", "none.jsonl", "no such file")
def _(tmp, run):
    return ["data", "check", tmp / "none.jsonl"]


@case("check/max-length-without-tokenizer", "--max-length and --max-prompt-length count tokens", "--tokenizer")
def _(tmp, run):
    return ["data", "check", PAIRS, "--max-length", "10"]


@case("check/bad-split", "split 'train[:x]'")
def _(tmp, run):
    return ["data", "check", PAIRS, "--split", "train[:x]"]


@case("check/unknown-tokenizer-offline", "model 'owner/typo'", "local Hugging Face cache")
def _(tmp, run):
    return ["data", "check", PAIRS, "--tokenizer", "owner/typo"]


@case("check/gguf-tokenizer-missing", "--tokenizer: no such file", "none.gguf")
def _(tmp, run):
    return ["data", "check", PAIRS, "--tokenizer", tmp / "none.gguf"]


@case("check/unsupported-file-type", "unsupported file type '.txt'")
def _(tmp, run):
    return ["data", "check", _text(tmp, "hello\n", "data.txt")]


@case("check/hub-dataset-offline", "owner/typo-data", "local cache", "HF_HUB_OFFLINE")
def _(tmp, run):
    return ["data", "check", "owner/typo-data"]


@case("convert/threshold-nan", "--threshold: expected a finite number, got nan")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), tmp / "pairs.jsonl", "--to", "pairwise", "--threshold", "nan"]


@case("convert/threshold-inf", "--threshold: expected a finite number, got inf")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), tmp / "u.jsonl", "--to", "unpaired", "--threshold", "inf"]


@case("convert/threshold-drops-every-record", "no pairwise record is left of 4 groups records", "nothing written",
      "--threshold 5")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), tmp / "pairs.jsonl", "--to", "pairwise", "--threshold", "5"]


@case("convert/every-record-invalid-in-the-format-given", "(every one is: is the file pairwise records?)")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), tmp / "u.jsonl", "--to", "unpaired", "--format", "pairwise"]


@case("convert/output-under-a-file", "is a file, not a folder")
def _(tmp, run):
    return ["data", "convert", _groups(tmp), _text(tmp, "x", "a-file") / "pairs.jsonl", "--to", "pairwise"]


@case("convert/hub-dataset-offline", "owner/typo-data", "local cache")
def _(tmp, run):
    return ["data", "convert", "owner/typo-data", tmp / "pairs.jsonl", "--to", "pairwise"]


# ---------------------------------------------------------------- report

def _metrics(tmp: Path, text: str) -> Path:
    run = tmp / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(text)
    return run


@case("report/no-such-folder", "no metrics.jsonl")
def _(tmp, run):
    return ["report", tmp / "nothing"]


@case("report/a-folder-without-metrics", "no metrics.jsonl")
def _(tmp, run):
    (tmp / "r").mkdir()
    return ["report", tmp / "r"]


@case("report/empty-metrics", "metrics.jsonl: empty")
def _(tmp, run):
    return ["report", _metrics(tmp, "")]


@case("report/a-broken-line", "metrics.jsonl:2", "not valid JSON")
def _(tmp, run):
    return ["report", _metrics(tmp, '{"step": 1, "loss": 0.7}\n{"step": 2, "lo\n')]


@case("report/a-line-without-a-step", "metrics.jsonl:1", "a 'step' number")
def _(tmp, run):
    return ["report", _metrics(tmp, '{"epoch": 1}\n')]


@case("report/metrics-not-utf8", "metrics.jsonl: cannot read it")
def _(tmp, run):
    run = _metrics(tmp, "")
    (run / "metrics.jsonl").write_bytes(b'{"step": 1, "x": "\xff"}\n')
    return ["report", run]


@case("report/an-earlier-report", "report.md exists", "--overwrite")
def _(tmp, run):
    out = run(tmp)
    (out / "report.md").write_text("# my notes\n")
    return ["report", out]


@case("report/an-earlier-plot", "curves.png exists", "--overwrite")
def _(tmp, run):
    out = run(tmp)
    (out / "curves.png").write_bytes(b"png")
    return ["report", out]


# ---------------------------------------------------------------- inspect, config, demo, reproduce

@case("inspect/an-earlier-inspection", "inspect_data.json exists", "--overwrite")
def _(tmp, run):
    (tmp / "out").mkdir()
    (tmp / "out" / "inspect_data.json").write_text("{}\n")
    return ["inspect", "data", PAIRS, "--model", "tiny", "--output-dir", tmp / "out"]


@case("inspect/an-earlier-filtered-file", "pairs.filtered.jsonl exists", "--overwrite")
def _(tmp, run):
    (tmp / "out").mkdir()
    (tmp / "out" / "pairs.filtered.jsonl").write_text("{}\n")
    return ["inspect", "data", PAIRS, "--model", "tiny", "--filter-below", "0.25", "--output-dir", tmp / "out"]


@case("inspect/an-earlier-perception", "perception.json exists", "--overwrite")
def _(tmp, run):
    (tmp / "out").mkdir()
    (tmp / "out" / "perception.json").write_text("{}\n")
    return ["inspect", "perception", "--policy", "tiny", "--reference", "tiny", "--prompts", PAIRS,
            "--output-dir", tmp / "out"]


for _name, _flags, _needles in [
    ("batch-size-zero", ["--batch-size", "0"], ("--batch-size", ">= 1")),
    ("bins-zero", ["--bins", "0"], ("--bins", ">= 1")),
    ("value-bound-negative", ["--value-bound", "-1"], ("--value-bound", "positive")),
    ("max-prompts-zero", ["--max-prompts", "0"], ("--max-prompts", ">= 1")),
]:
    case(f"inspect/perception-{_name}", *_needles)(
        lambda tmp, run, flags=_flags: ["inspect", "perception", "--policy", "tiny", "--reference", "tiny",
                                        "--prompts", PAIRS, *flags, "--output-dir", tmp / "out"])


@case("inspect/unknown-model-offline", "model 'owner/typo'", "local Hugging Face cache")
def _(tmp, run):
    return ["inspect", "data", PAIRS, "--model", "owner/typo", "--output-dir", tmp / "out"]


@case("config/unknown-section", "config: unknown section 'trainer'", "train")
def _(tmp, run):
    return ["config", "trainer"]


for _name, _argv, _needles in [
    ("demo/seeds-zero", ["demo", "--seeds", "0"], ("--seeds",)),
    ("demo/ablation-with-regimes", ["demo", "--ablation", "--regimes", "online"], ("--regimes", "ablation")),
    ("demo/unknown-regime", ["demo", "--regimes", "onlin"], ("onlin",)),
    ("demo/workers-zero", ["demo", "--workers", "0"], ("--workers",)),
    ("demo/lr-too-high", ["demo", "--lr", "5"], ("--lr",)),
    ("reproduce/seeds-zero", ["reproduce", "smollm2", "--seeds", "0"], ("--seeds",)),
    ("reproduce/lr-zero", ["reproduce", "smollm2", "--lr", "0"], ("--lr",)),
    ("reproduce/redraws-too-many", ["reproduce", "smollm2", "--redraws", "65"], ("--redraws", "[0, 64]")),
    ("reproduce/final-samples-negative", ["reproduce", "smollm2", "--final-samples", "-1"], ("--final-samples",)),
    ("reproduce/data-temperature-zero", ["reproduce", "smollm2", "--data-temperature", "0"], ("--data-temperature",)),
]:
    case(_name, *_needles)(lambda tmp, run, argv=_argv: [*argv, "--output-dir", tmp / "out"])


@case("eval/output-a-json-of-the-user", "'mine.json' holds an earlier result", "--overwrite")
def _(tmp, run):
    (tmp / "mine.json").write_text('{"mine": true}\n')
    return ["eval", "tiny", *EVAL, "--output", "mine.json"]
