"""Trainer overhead: our Trainer's DPO step vs a bare PyTorch loop doing the same arithmetic.

    python benchmarks/trainer_overhead.py [--quick] [--models tiny,smollm2] [--rounds 4] [--threads 1]

The bare loop runs, per step, on the same model weights and the same (pre-collated) batches: our forward
(`part_logps`), the DPO loss, backward, gradient-norm clipping, AdamW step, zero_grad; with the reference
either precomputed (`cache`) or a frozen model's no-grad forward per step (`frozen`). Our side is a full
`Trainer` step with the same reference strategy: collation, the humanline transform hook (identity here),
metrics, logging to metrics.jsonl, finite checks, the LR schedule. Both are stepped alternately in one
process. Target: trainer time / bare time <= 1.10. Writes benchmarks/results/trainer_overhead.json.
"""

from __future__ import annotations

import copy
import time

import common
import torch


class BareLoop:
    """The minimal DPO step: forward, loss, backward, clip, optimizer step."""

    def __init__(self, run: common.OurRun, steps: int, reference: str):
        from humanline.model.forward import batch_logps_no_grad

        trainer = run.trainer
        self.model = copy.deepcopy(trainer.run.unwrapped)
        self.model.train()
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-6)
        self.batches = [trainer.run.schedule(s)[0] for s in range(steps)]  # grad_accum 1: one micro-batch
        self.ref_model = None
        self.refs = None
        if reference == "frozen":
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        else:
            self.refs = [batch_logps_no_grad(self.model, b)["main"] for b in self.batches]
        self.beta = trainer.cfg.objective.beta
        self.step_index = 0

    def step(self) -> tuple[float, float]:
        from humanline.model.forward import batch_logps_no_grad, completion_mask, part_logps
        from humanline.objectives import dpo_loss

        wall, cpu = time.perf_counter(), time.process_time()
        batch = self.batches[self.step_index]
        ref = batch_logps_no_grad(self.ref_model, batch)["main"] if self.ref_model else self.refs[self.step_index]
        mask = completion_mask(batch)
        log_ratio = part_logps(self.model, batch) - ref
        half = log_ratio.shape[0] // 2
        out = dpo_loss(log_ratio[:half], log_ratio[half:], mask[:half], mask[half:], beta=self.beta)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_index += 1
        return time.perf_counter() - wall, time.process_time() - cpu


def measure(model: str, reference: str, *, batch: int, max_length: int, rounds: int, per_round: int,
            warmup: int = 1) -> list[dict]:
    tokenizer, _ = common.load_policy(model)
    steps = warmup + rounds * per_round
    records = common.bench_records(model, "pairwise", steps * batch, tokenizer=tokenizer, max_length=max_length)
    ours = common.our_trainer("dpo", model, records, batch=batch, max_length=max_length, steps=steps,
                              extra={"train": {"reference": reference}})
    bare = BareLoop(ours, steps, reference)
    times = common.alternate({"bare": bare, "trainer": ours}, rounds=rounds, per_round=per_round, warmup=warmup)
    rows = []
    for name, t in times.items():
        timed = t[warmup:]
        rows.append({
            "model": model, "reference": reference, "loop": name,
            "s/step": common.median([w for w, _ in timed]), "cpu s/step": common.median([c for _, c in timed]),
            "ratio vs bare": common.paired_time_ratio(t, times["bare"], warmup=warmup, per_round=per_round),
            "cpu ratio vs bare": common.paired_time_ratio(t, times["bare"], warmup=warmup, per_round=per_round,
                                                          cpu=True),
        })
    return rows


def main() -> None:
    parser = common.rounds_parser(__doc__, models="tiny,smollm2", rounds=4, quick_per_round=5,
                                  quick_also=", cache reference",
                                  per_round_help="steps per loop per round (0: 10 tiny, 2 smollm2)")
    parser.add_argument("--references", default="cache,frozen")
    args = common.parse_rounds(parser, references="cache")
    columns = ["model", "reference", "loop", "s/step", "cpu s/step", "ratio vs bare", "cpu ratio vs bare"]
    rows = []
    for model in args.models.split(","):
        for reference in args.references.split(","):
            rows += measure(model, reference, batch=8 if model == "tiny" else 4, max_length=args.max_length,
                            rounds=args.rounds, per_round=args.per_round or (10 if model == "tiny" else 2))
            common.print_table(rows[-2:], columns, f"trainer overhead ({model}, {reference})")
    common.print_table(rows, columns, "DPO step: Trainer vs bare loop (medians; ratios: median over rounds, paired)")
    common.finish("trainer_overhead", args, {"results": rows})


if __name__ == "__main__":
    main()
