"""The command line apart from the library: one module per subcommand, registered without string lookups, a
broken command failing loudly, and no argument parsing (or model/config imports) in the library layers."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import humanline.commands
from humanline import cli

PACKAGE = Path(cli.__file__).parent


def _subcommands(parser) -> dict:
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


# Module -> subcommand where the subcommand's name would shadow a builtin or stdlib module (eval, inspect)
SUBCOMMAND = {"evaluate": "eval", "inspection": "inspect"}


def test_every_command_module_registers_the_subcommand_it_is_named_after():
    modules = sorted(m.name for m in pkgutil.iter_modules(humanline.commands.__path__))
    assert modules == ["config", "data", "demo", "evaluate", "inspection", "report", "reproduce", "train"]
    assert sorted(_subcommands(cli.build_parser())) == sorted(SUBCOMMAND.get(m, m) for m in modules)
    assert sorted(m.__name__.rsplit(".", 1)[1] for m in cli.COMMANDS) == modules


def test_no_module_shadows_a_builtin_or_stdlib_name():
    import builtins
    import sys

    names = [p.stem for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__")]
    assert [n for n in names if n in sys.stdlib_module_names or hasattr(builtins, n)] == []


def test_a_command_whose_registration_breaks_fails_loudly(monkeypatch):
    """The old registry swallowed ImportError / AttributeError, so a broken command silently vanished."""
    def broken(subparsers):
        raise AttributeError("simulated bug in a command module")

    monkeypatch.setattr(cli.COMMANDS[-1], "add_parser", broken)
    with pytest.raises(AttributeError, match="simulated bug"):
        cli.main(["--help"])


def test_a_command_module_that_cannot_be_imported_stops_the_cli(monkeypatch):
    monkeypatch.delattr(humanline.commands, "report")
    monkeypatch.setitem(sys.modules, "humanline.commands.report", None)  # what a failed import leaves behind
    monkeypatch.delitem(sys.modules, "humanline.cli")
    with pytest.raises(ImportError, match="humanline.commands.report"):
        importlib.import_module("humanline.cli")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _parses_arguments(path: Path) -> bool:
    """Imports argparse, or registers subcommands / flags on a parser it was handed (the old `add_*_parser`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return "argparse" in _imports(path) or bool(calls & {"add_argument", "add_parser", "add_subparsers"})


def test_argument_parsing_lives_only_in_the_commands():
    library = [p for p in PACKAGE.rglob("*.py") if "commands" not in p.parts and p.name != "cli.py"]
    assert [str(p.relative_to(PACKAGE)) for p in library if _parses_arguments(p)] == []
    assert all(_parses_arguments(PACKAGE / "commands" / f"{m.__name__.rsplit('.', 1)[1]}.py") for m in cli.COMMANDS)


def test_the_data_layer_imports_neither_models_nor_config():
    offenders = {str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n in ("humanline.model.loading",
                                                                                     "humanline.settings.config"))
                 for p in (PACKAGE / "data").glob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_library_module_shadows_a_standard_library_module():
    """`humanline/inspect.py` did; the commands are named after their subcommand, inside their package."""
    top = [m.name for m in pkgutil.iter_modules([str(PACKAGE)])]
    assert [name for name in top if name in sys.stdlib_module_names] == []


def test_help_lists_every_subcommand_as_the_installed_entry_point_runs_it():
    out = subprocess.run([sys.executable, "-m", "humanline", "--help"], capture_output=True, text=True, check=True)
    assert "{train,eval,data,demo,reproduce,report,inspect,config}" in out.stdout


def _options(parser, prefix=()):
    """(command, option or argument, its action) for every argument of every subcommand."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*prefix, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(prefix), "/".join(action.option_strings) or action.dest, action


def test_every_option_of_every_command_has_help_text():
    """Eight had none (eval --max-new-tokens, --top-p, --seed; data convert --split; report's folder; inspect
    perception --max-new-tokens, --seed, --output-dir)."""
    missing = [f"{command} {name}" for command, name, action in _options(cli.build_parser())
               if not (action.help or "").strip()]
    assert missing == []


def test_a_long_error_line_keeps_its_start_and_its_fix_within_300_characters():
    line = "humanline: error: data.train: " + "x" * 400 + "; fix them, or drop them with --skip-invalid"
    short = cli.shortened(line)
    assert len(short) == 300 and short.startswith("humanline: error: data.train: xxx")
    assert short.endswith("xxx [...: --debug shows all]; fix them, or drop them with --skip-invalid")
    assert cli.shortened("a" * 500).endswith(cli.ELIDED) and len(cli.shortened("a" * 500)) == 300
    assert cli.shortened("short; fine") == "short; fine"


def test_debug_shows_the_details_and_the_whole_line(tmp_path, capsys):
    rows = ['{"prompt": "p", "chosen": "a", "rejected": "a"}'] * 7 + ['{"prompt": "p", "chosen": "a", "rejected": "b"}']
    (tmp_path / "pairs.jsonl").write_text("\n".join(rows) + "\n")
    argv = ["data", "convert", str(tmp_path / "pairs.jsonl"), str(tmp_path / "out.jsonl"), "--to", "unpaired"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "(7 of 8 records are invalid, pairwise format)" in err[0]
    assert cli.main(["--debug", *argv]) == 2
    err = capsys.readouterr().err
    assert f"  {tmp_path / 'pairs.jsonl'}:5: field 'rejected'" in err and "  ... and 2 more" in err
    assert "Traceback" in err
