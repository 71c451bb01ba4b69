"""LoRA through peft: only adapters train, the humanline lookahead reference needs no weight copy, and the
final model is saved merged so plain transformers loads it."""

from __future__ import annotations

import json

import torch

from helpers_train import tiny_config
from humanline.training.loop import Trainer


def test_lora_humanline_run_trains_adapters_and_saves_a_merged_model(tmp_path):
    cfg = tiny_config("dpo", tmp_path, hl=True, steps=3,
                      model={"lora": True, "lora_r": 4, "lora_alpha": 8,
                             "lora_target_modules": ["q_proj", "v_proj"]})
    trainer = Trainer(cfg)
    model = trainer.run.unwrapped
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert trainer.run.reference.name == "lookahead"
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer.train()
    for name, p in model.named_parameters():
        if name in base_before:
            assert torch.equal(p, base_before[name]), f"frozen base weight {name} changed"
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("log_ratio/mean", 0.0) != 0.0 for r in rows if r["step"] > 1), "adapters did not move"
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert not any("lora" in k for k in merged.state_dict())
    assert (tmp_path / "final" / "adapter" / "adapter_config.json").exists()


def test_lora_frozen_reference_is_the_base_with_adapters_off(tmp_path):
    """No weight copy for a frozen LoRA reference; losses equal those of a deep-copied frozen reference."""
    from humanline.training.reference import AdapterOffReference, FrozenReference

    cfg = tiny_config("dpo", tmp_path, steps=3, train={"reference": "frozen"},
                      model={"lora": True, "lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj"]})
    trainer = Trainer(cfg)
    assert isinstance(trainer.run.reference, AdapterOffReference)
    copied = FrozenReference(trainer.run.unwrapped)
    for step in range(3):
        batch = trainer.run.schedule(step)[0]
        torch.testing.assert_close(trainer.run.reference.logps(step, 0, batch)["main"],
                                   copied.logps(step, 0, batch)["main"], rtol=0, atol=1e-6)
        trainer.train_step()
