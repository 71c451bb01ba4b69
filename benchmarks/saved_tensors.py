"""Bytes saved for backward per trained token: ours vs TRL's DPOTrainer, on the same batch (any device, CPU too).

What a training forward saves for backward is the activation memory of a step; on the CPU it can be counted
exactly (`humanline.diagnostics.memory.saved_tensor_bytes`), with no GPU. The model is Llama-shaped with a
Qwen2-sized vocabulary (151,936 words, where full-vocabulary logits dominate) and a small backbone, randomly
initialised and shared by both sides (same folder). Both run one DPO micro-batch of the same records; the
reference pass runs without gradient on both sides and saves nothing. Parameters are not counted.

    python benchmarks/saved_tensors.py                      # DPO, 8 pairs, checkpointing off and on
    python benchmarks/saved_tensors.py --hidden 896 --layers 4
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import common
import torch


def make_model_folder(folder: Path, *, vocab: int, hidden: int, layers: int) -> Path:
    """A random Llama with `vocab` output words and the tiny character tokenizer (ids < 100 are used)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from humanline.model.tiny import make_tokenizer

    tokenizer = make_tokenizer()
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 64),
                         max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def ours(folder: Path, records: list[dict], *, max_length: int, checkpointing: bool) -> dict:
    from humanline.diagnostics.memory import saved_tensor_bytes
    from humanline.training.step import micro_batch_loss

    run = common.our_trainer("dpo", "tiny", records, batch=len(records), max_length=max_length, steps=1,
                             extra={"train": {"reference": "frozen"}},
                             model_section={"name": str(folder), "gradient_checkpointing": checkpointing})
    trainer = run.trainer
    batch = trainer.run.schedule(0)[0]
    ref = trainer.run.reference.logps(0, 0, batch)
    model = trainer.run.unwrapped
    saved = saved_tensor_bytes(lambda: micro_batch_loss(trainer.context(0), 0, batch, ref),
                               exclude=model.parameters())
    saved.result[0].loss.backward()  # the measured graph is a real one
    tokens = int(batch["completion_mask"].sum())
    return _row("humanline", saved, tokens, checkpointing, training=model.training)


def trl(folder: Path, records: list[dict], *, max_length: int, checkpointing: bool) -> dict:
    import trl_side

    from humanline.diagnostics.memory import saved_tensor_bytes
    from humanline.model.loading import enable_checkpointing

    trainer = trl_side.dpo_trainer(str(folder), records, batch=len(records), steps=1, max_length=max_length,
                                   callbacks=[], gradient_checkpointing=checkpointing)
    model = trainer.model
    if checkpointing:  # HF's Trainer turns it on inside train(); the measurement calls compute_loss directly
        enable_checkpointing(model)
    model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    saved = saved_tensor_bytes(lambda: trainer.compute_loss(model, batch), exclude=model.parameters())
    saved.result.backward()
    tokens = int(batch["completion_mask"].sum())
    return _row("trl", saved, tokens, checkpointing, training=model.training)


def _row(side: str, saved, tokens: int, checkpointing: bool, *, training: bool) -> dict:
    return {"trainer": side, "checkpointing": checkpointing, "training_mode": training, "tokens": tokens,
            "saved_MiB": saved.bytes / 2**20, "tensors": saved.tensors, "bytes_per_token": saved.bytes / tokens,
            "largest": f"{saved.largest[0]} {saved.largest[1]}" if saved.largest else ""}


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    common.set_threads(args.threads, gpu_ok=True)
    from humanline.model.tiny import make_tokenizer

    records = common.synthetic_records("pairwise", args.pairs, tokenizer=make_tokenizer(), max_length=args.max_length)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hl-saved-") as tmp:
        folder = make_model_folder(Path(tmp) / "model", vocab=args.vocab, hidden=args.hidden, layers=args.layers)
        for checkpointing in (False, True):
            for side in (trl, ours):
                rows.append(side(folder, records, max_length=args.max_length, checkpointing=checkpointing))
            rows.append({"trainer": "ours/TRL", "checkpointing": checkpointing,
                         "bytes_per_token": rows[-1]["bytes_per_token"] / rows[-2]["bytes_per_token"]})
    columns = ["trainer", "checkpointing", "training_mode", "tokens", "saved_MiB", "tensors", "bytes_per_token",
               "largest"]
    common.print_table(rows, columns, f"Saved for backward, one DPO micro-batch of {args.pairs} pairs "
                                      f"(vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers)")
    common.finish("saved_tensors", args, {"rows": rows})


if __name__ == "__main__":
    main()
