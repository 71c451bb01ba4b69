"""GRPO training step on fixed completions: our Trainer vs TRL's GRPOTrainer loss, interleaved.

    python benchmarks/grpo_vs_trl.py [--quick] [--models tiny,smollm2] [--rounds 5] [--threads 1]

TRL's GRPOTrainer cannot run a training step without generating, so its side is driven by hand on the same
fixed completions (our tokenised groups, prompts left-padded and completions right-padded as TRL lays them
out): collation into that layout with the group advantages, the reference model's per-token log-probs
(`_get_per_token_logps_and_entropies` on `ref_model`, as in TRL's `_generate_and_score_completions`),
`compute_loss` (TRL's GRPO loss, entropy included, as TRL computes it), backward, gradient clipping to 1, TRL's
own optimizer and scheduler step, all timed (generation and reward scoring are excluded); our side is a full
`Trainer` step on an offline group dataset (collation, advantages in the loss, logging), with a frozen
reference model: both sides timed over the same span. Both: KL
coefficient 0.01, clip eps 0.01, token-mean loss, float32, 4 completions per prompt (tiny: 4 groups per
step; SmolLM2-135M: 2 groups, i.e. 8 sequences of <= 128 tokens). Writes benchmarks/results/grpo_vs_trl.json.
"""

from __future__ import annotations

import contextlib
import tempfile
import time

import common
import torch
import trl_side


def trl_grpo(model_dir: str, records: list[dict], *, rows: int, group: int, steps: int, dtype: str = "float32",
             gradient_checkpointing: bool = False):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="hl-bench-trl-"), per_device_train_batch_size=rows,
        gradient_accumulation_steps=1, num_generations=group, max_steps=steps, learning_rate=1e-6,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, beta=0.01, epsilon=0.01,
        use_bias_correction_kl=False,  # the method's KL (docs/method.md §4); make_humanline refuses True
        loss_type="bnpo", gradient_checkpointing=gradient_checkpointing, bf16=False, fp16=False, report_to=[],
        save_strategy="no", disable_tqdm=True, seed=0, use_cpu=not torch.cuda.is_available(),
        model_init_kwargs={"dtype": dtype},
    )
    dataset = Dataset.from_list([{"prompt": r["prompt"]} for r in records])
    trainer = GRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(model_dir))
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def trl_inputs(units: list[dict], pad_id: int, device) -> dict:
    """TRL's layout of one step's groups: prompts left-padded, completions right-padded, group advantages."""
    prompts = [u["prompt"] for u in units for _ in u["completions"]]
    completions = [c for u in units for c in u["completions"]]
    width_p, width_c = max(map(len, prompts)), max(map(len, completions))
    prompt_ids = torch.full((len(prompts), width_p), pad_id)
    prompt_mask = torch.zeros(len(prompts), width_p, dtype=torch.long)
    completion_ids = torch.full((len(prompts), width_c), pad_id)
    completion_mask = torch.zeros(len(prompts), width_c, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[i, width_p - len(p):], prompt_mask[i, width_p - len(p):] = torch.tensor(p), 1
        completion_ids[i, : len(c)], completion_mask[i, : len(c)] = torch.tensor(c), 1
    rewards = torch.tensor([s for u in units for s in u["rewards"]]).view(len(units), -1)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).view(-1)
    out = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
           "completion_mask": completion_mask, "advantages": advantages,
           "num_items_in_batch": completion_mask.sum()}
    return {k: v.to(device) for k, v in out.items()}


def trl_step(trainer, units: list[dict], pad_id: int, phase=None) -> tuple[float, float]:
    """One TRL GRPO step on `units`, timed over the same span as ours: collation (TRL's layout and the group
    advantages) included. `phase(name)`: a context manager per part (gpu_profile.py labels them)."""
    phase = phase or (lambda name: contextlib.nullcontext())
    wall, cpu = time.perf_counter(), time.process_time()
    with phase("collate"):
        inputs = trl_inputs(units, pad_id, trainer.accelerator.device)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad(), phase("reference"):
        ref, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, input_ids, attention_mask, inputs["completion_ids"].size(1),
            batch_size=input_ids.size(0))
    with phase("forward+loss"):
        loss = trainer.compute_loss(trainer.model, {**inputs, "ref_per_token_logps": ref})
    with phase("backward"):
        trainer.accelerator.backward(loss)
    with phase("clip"):
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), 1.0)
    with phase("optimizer"):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(model: str, *, groups: int, max_length: int, rounds: int, per_round: int, warmup: int = 1) -> dict:
    tokenizer, _ = common.load_policy(model)
    steps = warmup + rounds * per_round
    records = common.bench_records(model, "groups", steps * groups, tokenizer=tokenizer, max_length=max_length)
    ours = common.our_trainer("grpo", model, records, batch=groups, max_length=max_length, steps=steps,
                              extra={"train": {"reference": "frozen"}})
    group = len(records[0]["completions"])
    trl = trl_grpo(trl_side.save_initial(ours), records, rows=groups * group, group=group, steps=steps)
    schedule = ours.trainer.run.schedule
    units = [schedule.step_units(s) for s in range(steps)]
    trl_tokens = [sum(len(u["prompt"]) * len(u["completions"]) + sum(map(len, u["completions"])) for u in step)
                  for step in units]
    our_tokens = [ours.tokens(s) for s in range(steps)]
    trl_times, our_times = [], []
    for start in [0] * warmup + list(range(warmup, steps, per_round)):
        count = warmup if start == 0 else per_round
        trl_times += [trl_step(trl, units[len(trl_times)], tokenizer.pad_token_id) for _ in range(count)]
        our_times += [ours.step() for _ in range(count)]
    if trl_tokens != our_tokens:
        print(f"warning: token counts differ (TRL {trl_tokens} vs ours {our_tokens})", flush=True)
    ours_sum = trl_side.summarise("humanline", our_times, our_tokens, warmup=warmup, per_round=per_round)
    trl_sum = trl_side.summarise("trl", trl_times, trl_tokens, warmup=warmup, per_round=per_round)
    return {
        "objective": "grpo", "model": model, "groups_per_step": groups, "group_size": group,
        "max_length": max_length, "reference": "frozen model", "rounds": rounds, "per_round": per_round,
        "warmup_steps": warmup, "same_tokens": trl_tokens == our_tokens, "humanline": ours_sum, "trl": trl_sum,
        "ratio_tokens_per_s": ours_sum["tokens_per_s"] / trl_sum["tokens_per_s"],
        "ratio_tokens_per_s_paired": trl_side.paired_ratio(ours_sum, trl_sum, "wall"),
        "ratio_tokens_per_cpu_s_paired": trl_side.paired_ratio(ours_sum, trl_sum, "cpu"),
        "ratio_rounds": trl_side.round_ratios(ours_sum, trl_sum, "wall"),
    }


def main() -> None:
    parser = common.rounds_parser(__doc__, models="tiny,smollm2", rounds=5,
                                  per_round_help="steps per side per round (0: 8 tiny, 2 smollm2)")
    parser.add_argument("--groups", type=int, default=0, help="groups of 4 per step (0: 4 tiny, 2 smollm2)")
    args = common.parse_rounds(parser)
    results = []
    for model in args.models.split(","):
        per_round = args.per_round or (8 if model == "tiny" else 2)
        groups = args.groups or (4 if model == "tiny" else 2)
        results.append(compare(model, groups=groups, max_length=args.max_length, rounds=args.rounds,
                               per_round=per_round))
        common.print_table(trl_side.table_rows(results[-1]), trl_side.COLUMNS, "GRPO: ours vs TRL (medians)")
    rows = [r for res in results for r in trl_side.table_rows(res)]
    common.print_table(rows, trl_side.COLUMNS, f"GRPO step on fixed completions: ours vs TRL {common.trl_version()} "
                       "(TRL side: ref log-probs + compute_loss + backward + clip + optimizer, no generation)")
    common.finish("grpo_vs_trl", args, {"results": results})


if __name__ == "__main__":
    main()
