"""TRL + humanline vs plain TRL: the step time of the same TRL trainer on the same batches (CPU).

    python benchmarks/trl_humanline_overhead.py [--quick] [--objectives dpo,kto,grpo] [--models tiny,small]
                                                [--rounds 5] [--threads 1]

Per objective and model, two TRL trainers are built alike from the same saved initial weights (TRL loads
them by path and builds its own reference model from that path, its default): `plain`, and `humanline` =
the same plus `make_humanline(trainer, HumanlineArgs(sync_every=1))` (clip, a sync before every update:
the most syncing there is). Both are stepped by one function made of TRL's own pieces, on identical
micro-batches (our collated batches in TRL's layout): `training_step` per micro-batch (TRL's
`compute_loss`, backward), gradient clipping, the `on_pre_optimizer_step` callbacks (humanline's sync),
AdamW and scheduler steps, `on_step_end`. GRPO runs on fixed completions (TRL cannot step without
generating): plain TRL's reference pass, which it makes at generation time, is timed as part of its step;
humanline makes it inside `compute_loss` instead (and skips TRL's). Rounds alternate the order of the two
sides; the ratio is the median over rounds of humanline's time / plain's time in the same round (target
<= 1.10). Models, both with the tiny character tokenizer: tiny (hidden 64, 2 layers; 8 units per step of
the tiny recipes' records, ~30 tokens each) and small (hidden 256, 8 layers, 8.4M parameters; 4 units per
step of random words, <= 128 tokens; GRPO: 4 groups of 4). Writes
benchmarks/results/trl_humanline_overhead.json.
"""

from __future__ import annotations

import random
import time

import common
import torch
import trl_side

MODELS = {  # our config's `model:` section for each name
    "tiny": {"name": "tiny", "tiny_hidden_size": 64, "tiny_layers": 2},
    "small": {"name": "tiny", "tiny_hidden_size": 256, "tiny_layers": 8},
}
KINDS = {"dpo": "pairwise", "kto": "unpaired", "grpo": "groups"}


def trl_layout(objective: str, batch: dict) -> dict:
    """Our collated DPO/KTO micro-batch as TRL's collator lays it out (GRPO: grpo_vs_trl.trl_inputs)."""
    out = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
           "completion_mask": batch["completion_mask"].long()}
    if objective == "kto":
        out.update({"KL_input_ids": batch["kl_input_ids"], "KL_attention_mask": batch["kl_attention_mask"],
                    "KL_completion_mask": batch["kl_completion_mask"].long(), "label": batch["desirable"]})
    return out


def char_records(kind: str, n: int, *, max_length: int, seed: int = 0) -> list[dict]:
    """`n` records for the character-level tiny tokenizer: a prompt and completion(s) of at most
    (max_length - 28) / 2 characters each (the ChatML template adds ~28 tokens), so no record is truncated.
    (common.synthetic_records budgets words for a subword tokenizer: with characters it redraws for minutes.)"""
    rng, budget = random.Random(seed), max(8, (max_length - 28) // 2)

    def text() -> str:
        words, target = [], rng.randint(budget // 3, budget)
        while len(" ".join(words + ["x"])) <= target:
            words.append(rng.choice(common.WORDS))
        return " ".join(words) or "ok"

    def row(i: int) -> dict:
        prompt = [{"role": "user", "content": text()}]
        if kind == "pairwise":
            return {"id": f"r{i}", "prompt": prompt, "chosen": text(), "rejected": text()}
        if kind == "unpaired":
            return {"id": f"r{i}", "prompt": prompt, "completion": text(), "label": bool(i % 2)}
        return {"id": f"r{i}", "prompt": prompt, "completions": [text() for _ in range(4)],
                "scores": [rng.random() for _ in range(4)]}

    return [row(i) for i in range(n)]


def build(objective: str, model_dir: str, records: list[dict], *, batch: int, steps: int, max_length: int):
    """A TRL trainer ready to be stepped by hand (optimizer and scheduler created, train mode)."""
    if objective == "grpo":
        import grpo_vs_trl

        group = len(records[0]["completions"])
        return grpo_vs_trl.trl_grpo(model_dir, records, rows=batch * group, group=group, steps=steps)
    make = {"dpo": trl_side.dpo_trainer, "kto": trl_side.kto_trainer}[objective]
    trainer = make(model_dir, records, batch=batch, steps=steps, max_length=max_length, callbacks=[])
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    return trainer


def grpo_reference(trainer, inputs: dict) -> dict:
    """Plain TRL GRPO: the reference log-probs its generation step computes (`_generate_and_score_completions`)."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        ref, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, input_ids, attention_mask, inputs["completion_ids"].size(1))
    return {**inputs, "ref_per_token_logps": ref}


def step(trainer, micro_batches: list[dict], prepare=None) -> tuple[float, float]:
    """One optimizer step of TRL's inner loop, by hand. Returns (wall, process CPU) seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    model = trainer.model
    for inputs in micro_batches:
        inputs = prepare(trainer, inputs) if prepare else inputs
        trainer._prepare_inputs = lambda _, ready=inputs: ready  # the data is ready (GRPO: no generation)
        trainer.training_step(model, inputs, None)
    trainer._clip_grad_norm(model)
    handler, args, state = trainer.callback_handler, trainer.args, trainer.state
    trainer.control = handler.on_pre_optimizer_step(args, state, trainer.control)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    model.zero_grad()
    state.global_step += 1
    trainer.control = handler.on_step_end(args, state, trainer.control)
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    for values in trainer._metrics["train"].values():  # TRL empties these when it logs; we never log
        if isinstance(values, list):
            values.clear()
    return elapsed


def micro_batches(objective: str, run, steps: int, device) -> list[list[dict]]:
    if objective == "grpo":
        import grpo_vs_trl

        pad = run.trainer.run.tokenizer.pad_token_id
        return [[grpo_vs_trl.trl_inputs(run.trainer.run.schedule.step_units(s), pad, device)] for s in range(steps)]
    return [[{k: v.to(device) for k, v in trl_layout(objective, b).items()} for b in run.trainer.run.schedule(s)]
            for s in range(steps)]


def compare(objective: str, model: str, *, batch: int, max_length: int, rounds: int, per_round: int,
            warmup: int = 2) -> dict:
    from humanline.integrations.trl import HumanlineArgs, make_humanline

    steps = warmup + rounds * per_round
    if model == "tiny":
        records = common.tiny_records(KINDS[objective], steps * batch)
    else:
        records = char_records(KINDS[objective], steps * batch, max_length=max_length)
    run = common.our_trainer(objective, model, records, batch=batch, max_length=max_length, steps=steps,
                             model_section=MODELS[model])
    model_dir = trl_side.save_initial(run)  # both sides load these weights by path
    plain = build(objective, model_dir, records, batch=batch, steps=steps, max_length=max_length)
    humanline = make_humanline(build(objective, model_dir, records, batch=batch, steps=steps,
                                     max_length=max_length), HumanlineArgs(sync_every=1))
    batches = micro_batches(objective, run, steps, plain.accelerator.device)
    prepare = {"plain": grpo_reference if objective == "grpo" else None, "humanline": None}
    sides = {"plain": plain, "humanline": humanline}
    times: dict[str, list] = {"plain": [], "humanline": []}
    for s in range(warmup):
        for name, trainer in sides.items():
            times[name].append(step(trainer, batches[s], prepare[name]))
    for r in range(rounds):
        order = ["plain", "humanline"] if r % 2 == 0 else ["humanline", "plain"]
        first = warmup + r * per_round
        for name in order:
            times[name] += [step(sides[name], batches[s], prepare[name]) for s in range(first, first + per_round)]
    if humanline.humanline.sync.syncs != steps:  # the humanline side did sync before every update
        raise RuntimeError(f"humanline synced {humanline.humanline.sync.syncs} times in {steps} steps")
    return summarise(objective, model, times, batch=batch, max_length=max_length, rounds=rounds,
                     per_round=per_round, warmup=warmup)


def summarise(objective: str, model: str, times: dict, **settings) -> dict:
    warmup, per_round = settings["warmup"], settings["per_round"]
    medians = {name: common.median([w for w, _ in t[warmup:]]) for name, t in times.items()}
    ratio = {kind: common.paired_time_ratio(times["humanline"], times["plain"], warmup=warmup,
                                            per_round=per_round, cpu=kind == "cpu") for kind in ("wall", "cpu")}
    return {"objective": objective, "model": model, **settings, "plain_s_per_step": medians["plain"],
            "humanline_s_per_step": medians["humanline"], "ratio_wall": ratio["wall"], "ratio_cpu": ratio["cpu"],
            "times": times}


COLUMNS = ["objective", "model", "plain s/step", "humanline s/step", "ratio (wall)", "ratio (cpu)"]


def row(result: dict) -> dict:
    return {"objective": result["objective"], "model": result["model"],
            "plain s/step": result["plain_s_per_step"], "humanline s/step": result["humanline_s_per_step"],
            "ratio (wall)": result["ratio_wall"], "ratio (cpu)": result["ratio_cpu"]}


def main() -> None:
    parser = common.rounds_parser(__doc__, models="tiny,small", rounds=7,
                                  per_round_help="steps per side per round (0: 8 tiny, 3 others)")
    parser.add_argument("--objectives", default="dpo,kto,grpo")
    parser.add_argument("--batch", type=int, default=0, help="units per step (0: 8 tiny, 4 others)")
    args = common.parse_rounds(parser)
    results = []
    for model in args.models.split(","):
        for objective in args.objectives.split(","):
            results.append(compare(objective, model, batch=args.batch or (8 if model == "tiny" else 4),
                                   max_length=args.max_length, rounds=args.rounds,
                                   per_round=args.per_round or (8 if model == "tiny" else 3)))
            common.print_table([row(results[-1])], COLUMNS)
    common.print_table([row(r) for r in results], COLUMNS,
                       f"TRL {common.trl_version()} + humanline (k = 1, clip) vs plain TRL, same batches; "
                       "ratio: median over rounds of humanline / plain step time")
    common.finish("trl_humanline_overhead", args, {"results": results})


if __name__ == "__main__":
    main()
