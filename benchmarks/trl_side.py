"""TRL's trainers set up to do the same work as ours, and the interleaved timing of both (benchmarks only).

Fairness rules applied everywhere: same initial weights (our loaded policy, saved once and given to TRL by
path so TRL builds its own frozen reference from it, as it does by default), same records in the same order
(TRL's sequential sampler, our schedule's identity permutation), same batch size and lengths (no record is
truncated by either side), float32 weights and no autocast on both sides, no gradient checkpointing, max grad
norm 1, learning rate 1e-6 constant, each trainer's own default optimizer (TRL: fused AdamW; ours: AdamW).
"""

from __future__ import annotations

import copy
import tempfile
import time

import common
import torch


def save_initial(run: common.OurRun) -> str:
    """Write our trainer's initial policy and tokenizer to a temporary folder for TRL to load."""
    folder = tempfile.mkdtemp(prefix="hl-bench-trl-model-", dir=run.workdir.name)
    model = copy.deepcopy(run.trainer.run.unwrapped)
    model.save_pretrained(folder)
    run.trainer.run.tokenizer.save_pretrained(folder)
    return folder


def trl_records(kind: str, records: list[dict]) -> list[dict]:
    """Our conversational records in TRL's column layout (completions as assistant message lists)."""
    def assistant(text: str) -> list[dict]:
        return [{"role": "assistant", "content": text}]

    if kind == "pairwise":
        return [{"prompt": r["prompt"], "chosen": assistant(r["chosen"]), "rejected": assistant(r["rejected"])}
                for r in records]
    if kind == "unpaired":
        return [{"prompt": r["prompt"], "completion": assistant(r["completion"]), "label": bool(r["label"])}
                for r in records]
    raise ValueError(kind)


def _common_args(outdir: str, batch: int, steps: int, max_length: int) -> dict:
    return dict(
        output_dir=outdir, per_device_train_batch_size=batch, gradient_accumulation_steps=1, max_steps=steps,
        learning_rate=1e-6, lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, max_length=max_length,
        gradient_checkpointing=False, bf16=False, fp16=False, report_to=[], save_strategy="no", disable_tqdm=True,
        train_sampling_strategy="sequential", dataloader_num_workers=0, seed=0, beta=0.1,
        use_cpu=not torch.cuda.is_available(),
    )


def dpo_trainer(model_dir: str, records: list[dict], *, batch: int, steps: int, max_length: int, callbacks,
                gradient_checkpointing: bool = False, dtype: str = "float32"):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    kwargs = _common_args(tempfile.mkdtemp(prefix="hl-bench-trl-"), batch, steps, max_length)
    kwargs["gradient_checkpointing"] = gradient_checkpointing
    args = DPOConfig(**kwargs, model_init_kwargs={"dtype": dtype})
    return DPOTrainer(model=model_dir, args=args, train_dataset=Dataset.from_list(trl_records("pairwise", records)),
                      processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=callbacks)


def kto_trainer(model_dir: str, records: list[dict], *, batch: int, steps: int, max_length: int, callbacks,
                gradient_checkpointing: bool = False, dtype: str = "float32"):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import KTOConfig, KTOTrainer

    kwargs = _common_args(tempfile.mkdtemp(prefix="hl-bench-trl-"), batch, steps, max_length)
    kwargs["gradient_checkpointing"] = gradient_checkpointing
    args = KTOConfig(**kwargs, model_init_kwargs={"dtype": dtype})
    return KTOTrainer(model=model_dir, args=args, train_dataset=Dataset.from_list(trl_records("unpaired", records)),
                      processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=callbacks)


def count_tokens(trainer) -> list[int]:
    """Wrap the trainer's collator so each batch's non-padding tokens (every sequence part) are recorded."""
    counts: list[int] = []
    collate = trainer.data_collator

    def counting(examples):
        batch = collate(examples)
        counts.append(sum(int(v.sum()) for k, v in batch.items() if k.endswith("attention_mask")))
        return batch

    trainer.data_collator = counting
    return counts


def make_alternator(ours: common.OurRun, *, warmup: int, per_round: int):
    """A TrainerCallback that times each TRL step (on_step_end to on_step_end, TRL's whole loop: data,
    forward, backward, clipping, optimizer, logging) and, after the warm-up and after every `per_round` TRL
    steps, runs as many of our steps. Our steps run inside the callback, outside TRL's timed span."""
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        def __init__(self):
            self.trl: list[tuple[float, float]] = []
            self.ours: list[tuple[float, float]] = []

        def _mark(self):
            self.wall, self.cpu = time.perf_counter(), time.process_time()

        def on_train_begin(self, args, state, control, **kwargs):
            self._mark()

        def on_step_end(self, args, state, control, **kwargs):
            self.trl.append((time.perf_counter() - self.wall, time.process_time() - self.cpu))
            n = state.global_step
            if n == warmup or (n > warmup and (n - warmup) % per_round == 0):
                for _ in range(warmup if n == warmup else per_round):
                    self.ours.append(ours.step_times())
            self._mark()

    return Alternate()


def summarise(name: str, times: list[tuple[float, float]], tokens: list[int], *, warmup: int,
              per_round: int) -> dict:
    """Medians over the timed steps, and per-round totals (for paired ratios)."""
    timed, toks = times[warmup:], tokens[warmup: len(times)]
    rounds = []
    for start in range(0, len(timed), per_round):
        chunk, chunk_tokens = timed[start: start + per_round], toks[start: start + per_round]
        rounds.append({"wall": sum(w for w, _ in chunk), "cpu": sum(c for _, c in chunk), "tokens": sum(chunk_tokens)})
    return {
        "trainer": name,
        "steps_timed": len(timed),
        "s_per_step": common.median([w for w, _ in timed]),
        "cpu_s_per_step": common.median([c for _, c in timed]),
        "tokens_per_s": common.median([t / w for (w, _), t in zip(timed, toks)]),
        "tokens_per_cpu_s": common.median([t / c for (_, c), t in zip(timed, toks)]),
        "tokens_per_step": common.median(toks),
        "rounds": rounds,
    }


def round_ratios(ours: dict, trl: dict, key: str) -> list[float]:
    """(our tokens per second) / (TRL's tokens per second), round by round (both sides timed in the round)."""
    return [(o["tokens"] / o[key]) / (t["tokens"] / t[key]) for o, t in zip(ours["rounds"], trl["rounds"])]


def paired_ratio(ours: dict, trl: dict, key: str) -> float:
    """Median over rounds of (our tokens per second) / (TRL's tokens per second) in the same round."""
    return common.median(round_ratios(ours, trl, key))


def spread(values: list[float]) -> str:
    """`min-max` of per-round values, for the table (one number alone means nothing about the noise)."""
    return f"{min(values):.3g}-{max(values):.3g}" if values else ""


KINDS = {"dpo": "pairwise", "kto": "unpaired"}


def compare(objective: str, model: str, *, batch: int, max_length: int, rounds: int, per_round: int,
            warmup: int = 1) -> dict:
    """Interleaved DPO/KTO comparison on `model`: TRL's trainer.train() and our Trainer, alternating."""
    tokenizer, _ = common.load_policy(model)
    steps = warmup + rounds * per_round
    records = common.bench_records(model, KINDS[objective], steps * batch, tokenizer=tokenizer, max_length=max_length)
    ours = common.our_trainer(objective, model, records, batch=batch, max_length=max_length, steps=steps,
                              extra={"train": {"reference": "frozen"}})
    model_dir = save_initial(ours)
    alternate = make_alternator(ours, warmup=warmup, per_round=per_round)
    build = {"dpo": dpo_trainer, "kto": kto_trainer}[objective]
    trl = build(model_dir, records, batch=batch, steps=steps, max_length=max_length, callbacks=[alternate])
    trl_tokens = count_tokens(trl)
    trl.train()
    our_tokens = [ours.tokens(s) for s in range(steps)]
    if trl_tokens[:steps] != our_tokens:
        print(f"warning: token counts differ (TRL {trl_tokens[:steps]} vs ours {our_tokens})", flush=True)
    ours_sum = summarise("humanline", alternate.ours, our_tokens, warmup=warmup, per_round=per_round)
    trl_sum = summarise("trl", alternate.trl, trl_tokens, warmup=warmup, per_round=per_round)
    return {
        "objective": objective, "model": model, "batch": batch, "max_length": max_length, "reference": "frozen model",
        "rounds": rounds, "per_round": per_round, "warmup_steps": warmup,
        "same_tokens": trl_tokens[:steps] == our_tokens,
        "humanline": ours_sum, "trl": trl_sum,
        "ratio_tokens_per_s": ours_sum["tokens_per_s"] / trl_sum["tokens_per_s"],
        "ratio_tokens_per_s_paired": paired_ratio(ours_sum, trl_sum, "wall"),
        "ratio_tokens_per_cpu_s_paired": paired_ratio(ours_sum, trl_sum, "cpu"),
        "ratio_rounds": round_ratios(ours_sum, trl_sum, "wall"),
    }


def table_rows(result: dict) -> list[dict]:
    rows = []
    for side in ("trl", "humanline"):
        s = result[side]
        rows.append({"objective": result["objective"], "model": result["model"], "trainer": side,
                     "s/step": s["s_per_step"], "cpu s/step": s["cpu_s_per_step"], "tokens/step": s["tokens_per_step"],
                     "tokens/s": s["tokens_per_s"], "tokens/cpu-s": s["tokens_per_cpu_s"]})
    rows.append({"objective": result["objective"], "model": result["model"], "trainer": "ours/TRL",
                 "tokens/s": result["ratio_tokens_per_s_paired"],
                 "tokens/cpu-s": result["ratio_tokens_per_cpu_s_paired"],
                 "rounds min-max": spread(result.get("ratio_rounds", []))})
    return rows


COLUMNS = ["objective", "model", "trainer", "s/step", "cpu s/step", "tokens/step", "tokens/s", "tokens/cpu-s",
           "rounds min-max"]


def main(objective: str, doc: str) -> None:
    parser = common.rounds_parser(doc, models="tiny,smollm2", rounds=5,
                                  per_round_help="steps per side per round (0: 8 tiny, 2 smollm2)")
    parser.add_argument("--batch", type=int, default=0, help="units per step (0: 8 tiny, 4 smollm2)")
    args = common.parse_rounds(parser)
    results = []
    for model in args.models.split(","):
        per_round = args.per_round or (8 if model == "tiny" else 2)
        batch = args.batch or (8 if model == "tiny" else 4)
        results.append(compare(objective, model, batch=batch, max_length=args.max_length, rounds=args.rounds,
                               per_round=per_round))
        common.print_table(table_rows(results[-1]), COLUMNS, f"{objective.upper()}: ours vs TRL (medians)")
    rows = [r for res in results for r in table_rows(res)]
    common.print_table(rows, COLUMNS, f"{objective.upper()}: ours vs TRL {common.trl_version()}, interleaved, medians; "
                       f"ratio rows: median over rounds of paired throughput ratios")
    common.finish(f"{objective}_vs_trl", args, {"results": results})
