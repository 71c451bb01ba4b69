"""Activation memory, measured as bytes saved for backward (device-independent): gradient checkpointing
takes effect for a model loaded from a folder, and a DPO micro-batch keeps no more per trained token than
TRL's DPOTrainer on the same records and model (a vocabulary large enough for logits to matter)."""

from __future__ import annotations

import json

import pytest

from helpers_train import DATA, tiny_config
from humanline.diagnostics.memory import saved_tensor_bytes
from humanline.model.loading import enable_checkpointing
from humanline.model.tiny import make_model, make_tokenizer
from humanline.training.loop import Trainer
from humanline.training.step import micro_batch_loss

VOCAB = 20_000  # logits of 20k words dwarf this backbone's activations, as 152k words do a 0.5B model's


@pytest.fixture(autouse=True)
def _on_the_cpu(monkeypatch):
    """Saved bytes are compared in float32 on the CPU on every test device: TRL's side is pinned there
    (`use_cpu=True`), and a GPU run of ours would autocast to bf16 (half the bytes, not a like-for-like count)."""
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny Llama with a 20,000-word output layer, saved like a hub model (loads in eval mode)."""
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, hidden_size=64, num_layers=2)
    model.resize_token_embeddings(VOCAB)
    folder = tmp_path_factory.mktemp("model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _ours(folder, tmp_path, checkpointing: bool) -> tuple[int, int, bool]:
    """(saved bytes, trained tokens, training mode) of our first micro-batch's training forward."""
    cfg = tiny_config("dpo", tmp_path, steps=1, model={"name": str(folder), "gradient_checkpointing": checkpointing},
                      train={"reference": "frozen", "micro_batch_size": 8})
    trainer = Trainer(cfg)
    batch = trainer.run.schedule(0)[0]
    ref = trainer.run.reference.logps(0, 0, batch)
    model = trainer.run.unwrapped
    saved = saved_tensor_bytes(lambda: micro_batch_loss(trainer.context(0), 0, batch, ref),
                               exclude=model.parameters())
    saved.result[0].loss.backward()
    return saved.bytes, int(batch["completion_mask"].sum()), model.training


def test_gradient_checkpointing_applies_to_a_model_loaded_from_a_folder(model_folder, tmp_path):
    plain, tokens, training = _ours(model_folder, tmp_path / "plain", checkpointing=False)
    checkpointed, same_tokens, _ = _ours(model_folder, tmp_path / "ckpt", checkpointing=True)
    assert training, "the policy must train in training mode (transformers checkpoints only then)"
    assert same_tokens == tokens
    assert checkpointed < 0.5 * plain, (checkpointed, plain)


def _trl(folder, records: list[dict], checkpointing: bool) -> tuple[int, int]:
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    args = trl.DPOConfig(output_dir=str(folder / "trl-out"), per_device_train_batch_size=len(records), max_length=64,
                         report_to=[], use_cpu=True, bf16=False, train_sampling_strategy="sequential", beta=0.1,
                         model_init_kwargs={"dtype": "float32"})
    trainer = trl.DPOTrainer(model=str(folder), args=args, train_dataset=Dataset.from_list(records),
                             processing_class=AutoTokenizer.from_pretrained(folder))
    model = trainer.model
    if checkpointing:  # HF's Trainer turns it on inside train(); compute_loss is called directly here
        enable_checkpointing(model)
    model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    saved = saved_tensor_bytes(lambda: trainer.compute_loss(model, batch), exclude=model.parameters())
    return saved.bytes, int(batch["completion_mask"].sum())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_saved_bytes_per_trained_token_do_not_exceed_trl(model_folder, tmp_path, checkpointing):
    rows = [json.loads(line) for line in (DATA / "pairs.jsonl").read_text().splitlines()[:8]]
    records = [{"prompt": r["prompt"], "chosen": [{"role": "assistant", "content": r["chosen"]}],
                "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in rows]  # TRL's layout
    trl_bytes, trl_tokens = _trl(model_folder, records, checkpointing)
    ours, tokens, _ = _ours(model_folder, tmp_path, checkpointing)
    assert tokens == trl_tokens, "both sides must train on the same completion tokens"
    assert ours / tokens <= trl_bytes / trl_tokens, (ours / tokens, trl_bytes / trl_tokens)
