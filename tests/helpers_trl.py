"""Both sides of the TRL parity tests: our `Trainer` and a TRL trainer fed the very same micro-batches.

Our side is a tiny offline humanline run (float64 weights). The TRL side starts from a copy of the same
initial weights, is made humanline with `make_humanline`, and runs TRL's own `train()` loop (gradient
accumulation, clipping, callbacks, AdamW, constant learning rate); only its data plumbing is replaced: its
`_prepare_inputs` returns our schedule's micro-batches, converted to TRL's layout (for GRPO: fixed
completions with our group advantages, in place of TRL's generation). Both sides record the loss of every
micro-batch, the clipped gradients before every update, and the logged inside-band fraction.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field

import torch

from helpers_train import DATA, TRAIN_DATA, tiny_config
from humanline.objectives import group_advantages
from humanline.training import step as step_stages
from humanline.training.loop import Trainer

LR = 5e-3
BAND = (-0.05, 0.05)  # narrow, so that the clipping is active within a few tiny-model steps
GROUP = 4  # completions per prompt in recipes/tiny/data/groups.jsonl


@dataclass
class Record:
    losses: list[float] = field(default_factory=list)  # per micro-batch, before the 1/grad_accum scaling
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)  # per step, after clipping
    inside: list[float] = field(default_factory=list)  # per step
    metrics: list[dict[str, float]] = field(default_factory=list)  # per step: every humanline/* metric logged


def sync_settings(k: int | str, width: float = 1.0) -> dict:
    """The sync fields of a case: a fixed k, or "auto": the drift rule at a mean |log-ratio| of 0.5, which makes it
    choose windows of 1 to 4 steps on these tiny runs (`width`: the trust region's narrower side, which the
    setting is a share of)."""
    return {"sync_every": k} if k != "auto" else {"sync_every": "auto", "sync_drift": 0.5 / width, "sync_max": 4}


def trust_width(objective: str, low: float, high: float, eps: float | None) -> float:
    """The narrower side of the trust region (humanline.core.humanline.Humanline.trust_width): the band, and
    GRPO's own ratio clip [1 - eps, 1 + eps]."""
    sides = [-low, high] + ([-math.log1p(-eps), math.log1p(eps)] if objective == "grpo" else [])
    return min(sides)


def ours(objective: str, out, *, k: int | str, steps: int, mb: int, ga: int, grpo_beta: float = 0.01,
         lora: bool = False) -> Trainer:
    """Our Trainer, float64, offline humanline (lookahead reference), clipped to BAND; LoRA if `lora`."""
    cfg = tiny_config(objective, out, hl=True, steps=steps, model={"lora": lora},
                      humanline={**sync_settings(k, trust_width(objective, *BAND, 0.01)), "low": BAND[0],
                                 "high": BAND[1]},
                      optim={"lr": LR, "max_grad_norm": 1.0}, train={"micro_batch_size": mb, "grad_accum": ga})
    cfg.objective.grpo_beta = grpo_beta
    trainer = Trainer(cfg)
    trainer.run.unwrapped.double()  # parameters change dtype in place: the optimizer keeps them
    return trainer


def run_ours(trainer: Trainer, steps: int) -> Record:
    record = Record()
    real_micro_loss, optimizer = step_stages.micro_batch_loss, trainer.run.optimizer
    real_step = optimizer.step

    def micro_loss(*args, **kwargs):
        out, extra = real_micro_loss(*args, **kwargs)
        record.losses.append(float(out.loss.detach()))
        return out, extra

    def step(*args, **kwargs):
        record.grads.append(_grads(trainer.run.unwrapped))
        return real_step(*args, **kwargs)

    step_stages.micro_batch_loss, optimizer.step = micro_loss, step
    try:
        for s in range(steps):
            metrics = trainer.train_step()
            record.inside.append(metrics["humanline/inside_band"])
            record.metrics.append({k: v for k, v in metrics.items() if k.startswith("humanline/")})
    finally:
        step_stages.micro_batch_loss = real_micro_loss
    return record


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def trl_batch(objective: str, batch: dict) -> dict:
    """One of our collated micro-batches in the layout TRL's collator (DPO, KTO) or generation (GRPO) makes."""
    if objective == "dpo":
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                "completion_mask": batch["completion_mask"].long()}
    if objective == "kto":
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                "completion_mask": batch["completion_mask"].long(), "KL_input_ids": batch["kl_input_ids"],
                "KL_attention_mask": batch["kl_attention_mask"],
                "KL_completion_mask": batch["kl_completion_mask"].long(), "label": batch["desirable"]}
    return grpo_batch(batch)


def grpo_batch(batch: dict) -> dict:
    """Rows prompt+completion (right-padded) -> TRL's prompts left-padded, completions right-padded."""
    ids, completion = batch["input_ids"], batch["completion_mask"]
    real = batch["attention_mask"].bool()
    prompts = [ids[i][real[i] & ~completion[i]] for i in range(len(ids))]
    completions = [ids[i][completion[i]] for i in range(len(ids))]
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    out = {"prompt_ids": torch.zeros(len(ids), width_p, dtype=torch.long),
           "prompt_mask": torch.zeros(len(ids), width_p, dtype=torch.long),
           "completion_ids": torch.zeros(len(ids), width_c, dtype=torch.long),
           "completion_mask": torch.zeros(len(ids), width_c, dtype=torch.long)}
    for i, (p, c) in enumerate(zip(prompts, completions)):
        out["prompt_ids"][i, width_p - len(p):], out["prompt_mask"][i, width_p - len(p):] = p, 1
        out["completion_ids"][i, : len(c)], out["completion_mask"][i, : len(c)] = c, 1
    out["advantages"] = group_advantages(batch["rewards"], batch["group_ids"], eps=0.01)
    out["num_items_in_batch"] = out["completion_mask"].sum()
    return out


def records(objective: str, n: int) -> list[dict]:
    """TRL-format records (only used to build TRL's dataset; the batches come from our schedule)."""
    rows = [json.loads(line) for line in (DATA / TRAIN_DATA[objective]).read_text().splitlines()[:n]]

    def assistant(text):
        return [{"role": "assistant", "content": text}]

    if objective == "dpo":
        return [{"prompt": r["prompt"], "chosen": assistant(r["chosen"]), "rejected": assistant(r["rejected"])}
                for r in rows]
    if objective == "kto":
        return [{"prompt": r["prompt"], "completion": assistant(r["completion"]), "label": r["label"]} for r in rows]
    return [{"prompt": r["prompt"]} for r in rows]


def trl_trainer(objective: str, init: torch.nn.Module, tokenizer, out, *, mb: int, ga: int, steps: int,
                reference: str = "model", grpo_beta: float = 0.01):
    """A TRL trainer on a copy of `init`, configured like `ours` (AdamW, constant lr, clip 1, no warm-up).

    reference (DPO, KTO): "model" (a ref_model copy of `init`), "precompute" (precompute_ref_log_probs=True,
    so TRL keeps no reference model) or "peft" (`init` is a peft model; TRL gives it no ref_model).
    GRPO: TRL's reference model when grpo_beta != 0, none when it is 0.
    """
    from datasets import Dataset

    common = dict(output_dir=str(out), per_device_train_batch_size=mb, gradient_accumulation_steps=ga,
                  max_steps=steps, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                  max_grad_norm=1.0, optim="adamw_torch", report_to=[], save_strategy="no", logging_steps=1,
                  disable_tqdm=True, use_cpu=True, gradient_checkpointing=False, dataloader_num_workers=0, seed=0,
                  bf16=False, fp16=False)  # GRPOConfig defaults to bf16 autocast
    dataset = Dataset.from_list(records(objective, 64))
    if objective == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        # By path: TRL builds its own reference model from the policy's path (a tiny model has none).
        folder = out / "init"
        init.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        args = GRPOConfig(**{**common, "per_device_train_batch_size": mb * GROUP}, num_generations=GROUP,
                          beta=grpo_beta, epsilon=0.01, loss_type="bnpo", temperature=1.0,
                          use_bias_correction_kl=False,  # TRL 1.16 default True weights the KL by the ratio
                          model_init_kwargs={"dtype": torch.float64})
        return GRPOTrainer(model=str(folder), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                           args=args, train_dataset=dataset, processing_class=tokenizer)
    model = copy.deepcopy(init)
    ref = copy.deepcopy(init) if reference == "model" else None  # "precompute", "peft": none
    precompute = reference == "precompute"
    if objective == "dpo":
        from trl import DPOConfig as Config
        from trl import DPOTrainer as Cls
    else:
        from trl import KTOConfig as Config
        from trl import KTOTrainer as Cls
    args = Config(**common, beta=0.1, precompute_ref_log_probs=precompute, train_sampling_strategy="sequential")
    return Cls(model=model, ref_model=ref, args=args, train_dataset=dataset, processing_class=tokenizer)


def run_trl(trainer, objective: str, batches: list[dict]) -> Record:
    """`trainer.train()` on `batches` (our micro-batches in order), recording like `run_ours`."""
    from transformers import TrainerCallback

    record = Record()
    queue = [trl_batch(objective, b) for b in batches]
    trainer._prepare_inputs = lambda inputs: queue.pop(0)
    humanline_loss = trainer.compute_loss
    scale = trainer.args.gradient_accumulation_steps if objective == "grpo" else 1  # GRPO pre-divides

    def compute_loss(model, inputs, **kwargs):
        loss = humanline_loss(model, inputs, **kwargs)
        record.losses.append(float(loss.detach()) * scale)
        return loss

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            record.grads.append(_grads(trainer.model))

    trainer.compute_loss = compute_loss
    trainer.add_callback(Grads())
    trainer.train()
    assert not queue, f"{len(queue)} micro-batches were not consumed"
    record.inside = [h["humanline/inside_band"] for h in trainer.state.log_history if "humanline/inside_band" in h]
    record.metrics = [{k: v for k, v in h.items() if k.startswith("humanline/")} for h in trainer.state.log_history
                      if "humanline/syncs" in h]
    return record


def own_pipeline(objective: str, out, *, steps: int = 3, peft_config=None, **config):
    """A TRL trainer on a fresh tiny model with TRL's own data pipeline (tokenisation, collation; GRPO: real
    generation of 6-token completions scored by their number of distinct characters), float32. `config`
    overrides TRL's arguments."""
    from datasets import Dataset

    from humanline.model.tiny import make_model, make_tokenizer

    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    common = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=steps, learning_rate=LR,
                  lr_scheduler_type="constant", report_to=[], save_strategy="no", logging_steps=1,
                  disable_tqdm=True, use_cpu=True, gradient_checkpointing=False, bf16=False, fp16=False, seed=0)
    common.update(config)
    dataset = Dataset.from_list(records(objective, 32))
    if objective == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        folder = out / "init"
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        args = GRPOConfig(**{"num_generations": 2, "max_completion_length": 6, "beta": 0.01,
                             "use_bias_correction_kl": False, **common})
        return GRPOTrainer(model=str(folder), args=args, train_dataset=dataset, processing_class=tokenizer,
                           reward_funcs=lambda completions, **kw: [float(len(set(str(c)))) for c in completions],
                           peft_config=peft_config)
    if objective == "dpo":
        from trl import DPOConfig as Config
        from trl import DPOTrainer as Cls
    else:
        from trl import KTOConfig as Config
        from trl import KTOTrainer as Cls
    args = Config(**{"train_sampling_strategy": "sequential", **common})
    ref = None if peft_config is not None or args.precompute_ref_log_probs else copy.deepcopy(model)
    return Cls(model=model, ref_model=ref, args=args, train_dataset=dataset, processing_class=tokenizer,
               peft_config=peft_config)


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]
