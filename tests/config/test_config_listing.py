"""`humanline config` lists every field with its default and its comment from the settings' source, as a
recipe that reads as the defaults; `humanline --version` prints the package version."""

from __future__ import annotations

import dataclasses
import inspect

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
    assert docs["gradient_checkpointing"].startswith("recompute activations")  # not dtype's continuation
    assert field_docs(ObjectiveConfig)["tau"].startswith("IPO's regulariser tau (> 0)")
    assert field_docs(HumanlineConfig)["low"] == ("the band's lower bound: token log-ratios below it are clipped to it "
                                                  "(log eps_P, < 0); HALOs default -1.0")


@dataclasses.dataclass
class _Commented:
    first: int = 1  # the first field
    # and its second line
    second: int = 2  # the second field
    # a block written above its field
    third: int = 3
    last: int = 4  # the last field


def test_a_comment_block_above_a_field_without_its_own_comment_is_that_fields():
    """The comment lines after a field continue its comment, unless the next field's line has no comment of its
    own: then they are written above that field (objective.correction's meaning was shown against reduction)."""
    assert field_docs(_Commented) == {"first": "the first field and its second line", "second": "the second field",
                                      "third": "a block written above its field", "last": "the last field"}
    objective = field_docs(ObjectiveConfig)
    assert objective["reduction"] == ("GRPO: how token losses are averaged: token (over every token of the "
                                      "micro-batch, HALOs) | sequence (each sequence's token mean, then over "
                                      "sequences)")
    assert objective["correction"].startswith("GRPO in sampled regimes: what becomes of tokens drawn by an older")


def test_every_field_has_a_meaning_on_its_own_line():
    """`humanline config` prints a meaning for every field, and each field's line carries its comment (so no
    comment block can be read as another field's)."""
    for section in dataclasses.fields(Config):
        block = type(getattr(Config(), section.name))
        source = inspect.getsource(block)
        for name, doc in field_docs(block).items():
            assert doc, f"{section.name}.{name} has no meaning in `humanline config`"
            line = next(ln for ln in source.splitlines() if ln.startswith(f"    {name}:"))
            assert "  # " in line, f"{section.name}.{name}: its comment is not on its own line"


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
    assert out.startswith("humanline:\n  enabled: false  # humanline on") and "model:" not in out
    assert main(["config", "humanlin"]) == 2
    assert "unknown section 'humanlin'" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"humanline {__version__}\n"


def test_every_field_says_what_it_means_beyond_its_limits_and_values():
    """`lora_r: at most 4096`, `desirable_weight: KTO`, `max_prompts: 0: all` named limits or an objective, not a
    meaning: each comment must hold at least three words besides its parentheses and quoted names."""
    import dataclasses
    import re

    from humanline.settings.config import Config
    from humanline.settings.field_docs import field_docs

    weak = []
    for section in dataclasses.fields(Config):
        for name, doc in field_docs(type(getattr(Config(), section.name))).items():
            words = re.findall(r"[A-Za-z]{3,}", re.sub(r"`[^`]*`|\([^)]*\)", "", doc))
            if len(words) < 3:
                weak.append(f"{section.name}.{name}: {doc}")
    assert weak == []
