"""TRL's DPOTrainer, KTOTrainer and GRPOTrainer made humanline with one call (docs/trl.md), on the tiny model.

    python scripts/trl_humanline_example.py [--objective dpo|kto|grpo|all] [--steps 12] [--sync-every 1]

Runs in seconds on a CPU, offline: the tiny Llama and character tokenizer of `humanline.model.tiny` are saved to
a folder and loaded by TRL from there, as a hub model would be (that folder and TRL's output folders live in one
temporary folder, removed at the end); the data are the tiny recipes' arithmetic
records (recipes/tiny/data) in TRL's conversational format. GRPO generates its own completions (6 tokens)
and scores them with a toy reward (the share of digits in the completion). Prints TRL's loss and
the humanline metrics of every step.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from transformers import PrinterCallback  # noqa: E402

from humanline.integrations.trl import HumanlineArgs, make_humanline  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "recipes" / "tiny" / "data"


def tiny_model_folder(folder: str) -> str:
    """Save the tiny model and tokenizer once into `folder`, so TRL loads them by path (and builds its reference
    from it)."""
    from humanline.model.tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    make_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def dataset(objective: str):
    from datasets import Dataset

    name = {"dpo": "pairs.jsonl", "kto": "unpaired.jsonl", "grpo": "prompts.jsonl"}[objective]
    rows = [json.loads(line) for line in (DATA / name).read_text().splitlines()]

    def assistant(text: str) -> list[dict]:
        return [{"role": "assistant", "content": text}]

    if objective == "dpo":
        rows = [{"prompt": r["prompt"], "chosen": assistant(r["chosen"]), "rejected": assistant(r["rejected"])}
                for r in rows]
    elif objective == "kto":
        rows = [{"prompt": r["prompt"], "completion": assistant(r["completion"]), "label": r["label"]} for r in rows]
    else:
        rows = [{"prompt": r["prompt"]} for r in rows]
    return Dataset.from_list(rows)


def digits(completions, **kwargs) -> list[float]:
    """Share of digit characters in the completion (the answers are numbers): a toy reward that a random tiny
    model already gets partly right, so the groups' advantages are not all zero."""
    texts = [completion[-1]["content"] for completion in completions]
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in texts]


def build_trainer(objective: str, model: str, out: str, steps: int, lr: float):
    """A plain TRL trainer, configured as a TRL user would (CPU, float32, no gradient checkpointing)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    common = dict(output_dir=out, max_steps=steps, per_device_train_batch_size=8, learning_rate=lr,
                  lr_scheduler_type="constant",
                  logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
                  bf16=False, gradient_checkpointing=False)
    if objective == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOTrainer(model=model, args=DPOConfig(**common, beta=0.1), train_dataset=dataset("dpo"),
                          processing_class=tokenizer)
    if objective == "kto":
        from trl import KTOConfig, KTOTrainer

        return KTOTrainer(model=model, args=KTOConfig(**common, beta=0.1, train_sampling_strategy="sequential"),
                          train_dataset=dataset("kto"), processing_class=tokenizer)
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**common, num_generations=4, max_completion_length=6, beta=0.01, epsilon=0.2,
                      use_bias_correction_kl=False)
    return GRPOTrainer(model=model, reward_funcs=digits, args=args, train_dataset=dataset("grpo"),
                       processing_class=tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objective", default="all", choices=["dpo", "kto", "grpo", "all"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-2, help="large, so that a few steps move the ratios")
    parser.add_argument("--sync-every", type=int, default=1, help="k; 1, as README recommends")
    parser.add_argument("--low", type=float, default=-1.5)
    parser.add_argument("--high", type=float, default=1.5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="humanline-trl-example-") as scratch:  # removed at the end, whatever
        for objective, trainer in trainers(args, scratch):
            show(objective, trainer, args)


def trainers(args: argparse.Namespace, scratch: str):
    """Each objective's humanline TRL trainer, trained; its model and output folders live in `scratch`."""
    model = tiny_model_folder(str(Path(scratch) / "model"))
    for objective in (["dpo", "kto", "grpo"] if args.objective == "all" else [args.objective]):
        trainer = build_trainer(objective, model, str(Path(scratch) / objective), args.steps, args.lr)
        trainer.remove_callback(PrinterCallback)  # TRL's own per-step print; the table below replaces it
        make_humanline(trainer, HumanlineArgs(sync_every=args.sync_every, low=args.low, high=args.high))
        trainer.train()
        yield objective, trainer


def show(objective: str, trainer, args: argparse.Namespace) -> None:
    """The humanline metrics of every step of `trainer`."""
    print(f"\n{objective.upper()} + humanline (k = {args.sync_every}, band [{args.low}, {args.high}])")
    print("step  loss      inside band  log-ratio mean  syncs")
    for row in trainer.state.log_history:
        if "humanline/inside_band" in row:
            print(f"{row['step']:>4}  {row['loss']:<8.4f}  {row['humanline/inside_band']:<11.3f}  "
                  f"{row['humanline/log_ratio_mean']:<+14.4f}  {row['humanline/syncs']:.0f}")


if __name__ == "__main__":
    main()
