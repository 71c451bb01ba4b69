"""Property-based tests over the config schema: for any field, a value of the wrong type, out of
range, non-finite, empty or unknown is rejected with one line naming the field and what was expected, or it
is a valid value; never an internal error.

The fast test runs in this process: loading (as a Python dict or as a `--section.key=value` string, which goes
through the YAML reader) and the start-up resolution of rewards. The slow test takes a sample through the real
CLI in a subprocess, where a valid value trains for real (exit 0, or 3 when it diverges).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers_reliability import ERROR_PREFIX, ROOT, base_sections, online_sections, write_recipe
from humanline.errors import UserError
from humanline.settings.config import Config
from humanline.training.build import build_rewards
from humanline.training.config_loading import load_config

DATA = ROOT / "recipes" / "tiny" / "data"
FIELDS = [(s.name, f.name) for s in dataclasses.fields(Config) for f in dataclasses.fields(s.default_factory())]
BASES = {  # minimal valid configs the fuzzed field is set on
    "offline": {"data": {"train": str(DATA / "pairs.jsonl")}},
    "online": {"train": {"regime": "online", "max_steps": 2},
               "rollout": {"prompts": str(DATA / "prompts.jsonl"), "reward": "exact_match"},
               "objective": {"name": "grpo"}},
}
ODD = [0, -1, 1, 2, 3, 7, 64, 10**12, 2**31, 2**63, -(2**63), 1e-300, 1e300, -0.0, 0.5, 1.5, float("nan"),
       float("inf"), float("-inf"), "", " ", "nosuch", "1e-6", "nan", "none", "tiny", "dpo", "grpo", "online",
       "sparse", "clip", "copy", "token", "bf16", "exact_match", "a:b", "[1, 2", "\t", "é", [], [""], [0.9, 0.999],
       {}, {"type": "regex"}, {"type": "nosuch"}, [{"type": "exact_match", "weight": float("nan")}], [[[[1]]]]]
VALUES = st.one_of(st.sampled_from(ODD), st.none(), st.booleans(), st.integers(-(10**13), 10**13),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.lists(st.one_of(st.integers(-3, 3), st.floats(), st.text(max_size=3)), max_size=3),
                   st.dictionaries(st.text(max_size=4), st.integers(-2, 2), max_size=2))


def _as_cli_text(value) -> str:
    """How a user would type `value` after `--section.key=`: strings as they are, anything else as YAML."""
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _assert_names_field(message: str, field: str) -> None:
    assert "\n" not in message, message
    assert field in message, f"{field!r} not named in {message!r}"
    assert "expected" in message or "unknown" in message or "nested too deeply" in message, message


def _check(field: tuple[str, str], value, base: str, as_text: bool) -> None:
    section, name = field
    overrides = {k: dict(v) for k, v in BASES[base].items()}
    dotted = f"{section}.{name}"
    try:
        if as_text:
            flat = [f"--{s}.{k}={_as_cli_text(v)}" for s, values in overrides.items() for k, v in values.items()]
            cfg = load_config(None, [*flat, f"--{dotted}={_as_cli_text(value)}"])
        else:
            overrides.setdefault(section, {})[name] = value
            cfg = load_config(None, overrides)
        build_rewards(cfg)  # what start-up resolves before any model: rewards of rollout and eval
    except UserError as exc:
        _assert_names_field(str(exc), dotted)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=VALUES, base=st.sampled_from(sorted(BASES)),
       as_text=st.booleans())
def test_any_value_of_any_field_is_valid_or_one_line_naming_the_field(field, value, base, as_text):
    _check(field, value, base, as_text)


@pytest.mark.parametrize("base", sorted(BASES))
def test_every_odd_value_in_every_field(base):
    """The hand-picked odd values, each in each field, as a Python value and as command-line text: the
    exhaustive part of the property (a random draw meets a given field-value pair rarely)."""
    for field in FIELDS:
        for value in ODD:
            for as_text in (False, True):
                _check(field, value, base, as_text)


@pytest.mark.parametrize("field", ["optim.lr", "train.max_steps", "rollout.temperature", "eval.n"])
def test_the_property_is_not_vacuous(field):
    """Each of these is rejected for a NaN, a string and 10**12 (so the property above sees both outcomes)."""
    section, name = field.split(".")
    for bad in (float("nan"), "many", 10**12 if name != "lr" else -1):
        overrides = {**BASES["offline"], section: {name: bad}}
        with pytest.raises(UserError) as info:
            load_config(None, overrides)
        _assert_names_field(str(info.value), field)


SMALL_INTS = st.one_of(st.integers(-3, 100), st.sampled_from([10**12, 2**31, 2**63]))
CLI_VALUES = st.one_of(st.sampled_from(ODD), st.none(), st.booleans(), SMALL_INTS,
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6))


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS), value=CLI_VALUES, online=st.booleans())
def test_cli_sample_exits_0_2_or_3_with_one_line(field, value, online, tmp_path_factory):
    """Through `python -m humanline train` (integers kept small enough that a valid run stays short)."""
    tmp = tmp_path_factory.mktemp("schema")
    sections = online_sections(tmp / "run") if online else base_sections(tmp / "run")
    recipe = write_recipe(tmp, sections)
    dotted = f"{field[0]}.{field[1]}"
    proc = subprocess.run([sys.executable, "-m", "humanline", "train", str(recipe),
                           f"--{dotted}={_as_cli_text(value)}"], cwd=tmp, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode in (0, 2, 3), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if proc.returncode == 0:
        assert (tmp / "run" / "metrics.jsonl").exists() or field == ("train", "output_dir")
        return
    errors = [line for line in lines if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]
    if proc.returncode == 2:  # a data or model error names its file instead of the field
        assert dotted in errors[0] or any(x in errors[0] for x in (".jsonl", ".yaml", "recipe", str(tmp))), errors[0]
