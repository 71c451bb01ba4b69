"""A recipe's relative paths are read from its own folder first, then from the working directory, so the
shipped recipes run from any directory; a local file found in neither place is one line naming both."""

from __future__ import annotations

from pathlib import Path

from helpers_train import ROOT
from humanline.cli import main
from humanline.training.config_loading import load_config

# the recipes that ship their data (recipes/paper/ names data the user makes first)
RECIPES = sorted([*(ROOT / "recipes" / "tiny").glob("*.yaml"), *(ROOT / "recipes" / "smollm2").glob("*.yaml")])


def test_every_shipped_recipe_finds_its_files_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for recipe in RECIPES:
        cfg = load_config(recipe)
        for value in (cfg.data.train, cfg.data.eval, cfg.rollout.prompts, cfg.eval.prompts):
            if value and (recipe.parent / "data" / Path(value).name).is_file():  # shipped, not made by a script
                assert Path(value).is_file(), (recipe.name, value)
        reward = cfg.rollout.reward
        if isinstance(reward, str) and ".py:" in reward:
            assert Path(reward.rpartition(":")[0]).is_file(), (recipe.name, reward)


def test_a_tiny_recipe_trains_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = ROOT / "recipes" / "tiny" / "grpo_online.yaml"  # data, prompts and a reward file beside it
    assert main(["train", str(recipe), "--output-dir", "run", "--train.max_steps=1", "--eval.max_prompts=2",
                 "--logging.progress=false"]) == 0
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def _recipe(folder: Path, train: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "r.yaml"
    path.write_text(f"data:\n  train: {train}\n")
    return path


def test_the_recipe_folder_comes_first_then_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = (ROOT / "recipes" / "tiny" / "data" / "pairs.jsonl").read_text()
    (tmp_path / "conf" / "d").mkdir(parents=True)
    (tmp_path / "conf" / "d" / "a.jsonl").write_text(source)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.jsonl").write_text(source)
    (tmp_path / "d" / "only_here.jsonl").write_text(source)
    assert load_config(_recipe(tmp_path / "conf", "d/a.jsonl")).data.train == "conf/d/a.jsonl"
    assert load_config(_recipe(tmp_path / "conf", "d/only_here.jsonl")).data.train == "d/only_here.jsonl"
    # an override is a shell path: from the working directory, untouched
    cfg = load_config(_recipe(tmp_path / "conf", "d/a.jsonl"), ["data.train=d/a.jsonl"])
    assert cfg.data.train == "d/a.jsonl"


def test_a_missing_file_names_the_working_directory_and_the_recipe_folder_rule(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    recipe = _recipe(tmp_path / "conf", "data/missing.jsonl")
    assert load_config(recipe).data.train == "data/missing.jsonl"  # data a user has yet to make: loads
    assert main(["train", str(recipe), "--output-dir", "run", "--logging.progress=false"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("humanline: error: data.train: data/missing.jsonl: no such file or folder in the working "
                           f"directory {tmp_path} (nor, for a recipe's path, beside the recipe)")


def test_hub_names_and_known_models_pass_through(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text("model: {name: tiny}\ndata: {train: HuggingFaceH4/ultrafeedback_binarized}\n")
    cfg = load_config(path)
    assert (cfg.model.name, cfg.data.train) == ("tiny", "HuggingFaceH4/ultrafeedback_binarized")
