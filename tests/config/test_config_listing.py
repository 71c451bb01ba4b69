"""`humanline config` lists every field with its default and its comment from the settings' source, as a
recipe that reads as the defaults; `humanline --version` prints the package version."""

from __future__ import annotations

import dataclasses

import pytest

from humanline import __version__
from humanline.cli import main
from humanline.core.humanline import HumanlineConfig
from humanline.settings.config import Config, ModelConfig, ObjectiveConfig
from humanline.settings.field_docs import field_docs
from humanline.training import yaml_io


def test_field_docs_are_the_trailing_comment_and_the_comment_lines_below_it():
    docs = field_docs(ModelConfig)
    assert docs["name"] == '"tiny" (random small LlamaConfig), a hub name, or a local folder'
    assert docs["dtype"].startswith("float32 | bfloat16 | float16: weights' dtype. AdamW on float16 weights overflows "
                                    "within a few steps (refused on a CPU;")
    assert docs["gradient_checkpointing"] == ""  # a field without a comment takes nothing from its neighbours
    assert field_docs(ObjectiveConfig)["tau"].startswith("IPO's regulariser tau (> 0)")
    assert field_docs(HumanlineConfig)["low"] == "log eps_P (< 0); HALOs default -1.0"


def test_the_listing_names_every_field_and_loads_as_the_defaults(tmp_path, capsys):
    assert main(["config", "--list"]) == 0
    text = capsys.readouterr().out
    for section in dataclasses.fields(Config):
        for name in (f.name for f in dataclasses.fields(getattr(Config(), section.name))):
            assert f"\n  {name}: " in text, f"{section.name}.{name}"
    assert "  sync_every: 1  # k: reference takes the pre-update policy weights every k optimizer steps" in text
    recipe = tmp_path / "defaults.yaml"
    recipe.write_text(text)
    assert yaml_io.read(recipe) == Config().to_dict()


def test_one_section_and_an_unknown_one(capsys):
    assert main(["config", "humanline"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("humanline:\n  enabled: false\n") and "model:" not in out
    assert main(["config", "humanlin"]) == 2
    assert "unknown section 'humanlin'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"humanline {__version__}\n"
