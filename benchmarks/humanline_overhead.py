"""Humanline overhead: DPO step time with humanline (k = 1, clip) vs plain DPO with a frozen reference.

    python benchmarks/humanline_overhead.py [--quick] [--models tiny,smollm2] [--rounds 4] [--threads 1]

All configurations are our Trainer on the same records in the same order, stepped alternately in one
process (SmolLM2-135M: 4 pairs of <= 128 tokens per step; tiny: 8 pairs):
  frozen     plain DPO, a frozen reference model (one no-grad reference forward per micro-batch)
  lookahead  humanline DPO, k = 1: the policy itself computes the next step's reference log-probs before the
             update (one no-grad forward per micro-batch, no weight copy), then clipping
  copy       humanline DPO, k = 1 with a weight copy synced in place every step (online-style reference)
  cache      plain DPO, reference log-probs precomputed once before training (no reference forward per step)
  drift      lookahead with the drift rule (sync_every: auto) held at windows of 1 step (sync_max 1): the same
             forwards as lookahead, plus the rule's statistic (mean |log-ratio|, summed on the device every
             micro-batch, read back at every sync): its cost is drift's time / lookahead's (target: <= 1.02)
Reports median step times and the median over rounds of each configuration's time / frozen's time
(target for lookahead: <= 1.05), and drift's / lookahead's. Writes benchmarks/results/humanline_overhead.json.
"""

from __future__ import annotations

import common

CONFIGS = {
    "frozen": {"train": {"reference": "frozen"}, "humanline": {"enabled": False}},
    "lookahead": {"train": {"reference": "lookahead"}, "humanline": {"enabled": True, "sync_every": 1}},
    "copy": {"train": {"reference": "copy"}, "humanline": {"enabled": True, "sync_every": 1}},
    "cache": {"train": {"reference": "cache"}, "humanline": {"enabled": False}},
    "drift": {"train": {"reference": "lookahead"},
              "humanline": {"enabled": True, "sync_every": "auto", "sync_min": 1, "sync_max": 1}},
}


def measure(model: str, *, batch: int, max_length: int, rounds: int, per_round: int, warmup: int = 1) -> dict:
    tokenizer, _ = common.load_policy(model)
    steps = warmup + rounds * per_round
    records = common.bench_records(model, "pairwise", steps * batch, tokenizer=tokenizer, max_length=max_length)
    runs = {name: common.our_trainer("dpo", model, records, batch=batch, max_length=max_length, steps=steps,
                                     extra=extra) for name, extra in CONFIGS.items()}
    times = common.alternate(runs, rounds=rounds, per_round=per_round, warmup=warmup)
    rows = []
    for name, t in times.items():
        timed = t[warmup:]
        rows.append({
            "model": model, "config": name,
            "s/step": common.median([w for w, _ in timed]), "cpu s/step": common.median([c for _, c in timed]),
            "ratio vs frozen": common.paired_time_ratio(t, times["frozen"], warmup=warmup, per_round=per_round),
            "cpu ratio vs frozen": common.paired_time_ratio(t, times["frozen"], warmup=warmup, per_round=per_round,
                                                            cpu=True),
            "ratio vs lookahead": common.paired_time_ratio(t, times["lookahead"], warmup=warmup, per_round=per_round),
        })
    return {"model": model, "batch": batch, "max_length": max_length, "rounds": rounds, "per_round": per_round,
            "warmup_steps": warmup, "rows": rows, "times": times}


def main() -> None:
    parser = common.rounds_parser(__doc__, models="tiny,smollm2", rounds=4, quick_per_round=4,
                                  per_round_help="steps per config per round (0: 8 tiny, 2 smollm2)")
    args = common.parse_rounds(parser)
    results = []
    columns = ["model", "config", "s/step", "cpu s/step", "ratio vs frozen", "cpu ratio vs frozen",
               "ratio vs lookahead"]
    for model in args.models.split(","):
        results.append(measure(model, batch=8 if model == "tiny" else 4, max_length=args.max_length,
                               rounds=args.rounds, per_round=args.per_round or (8 if model == "tiny" else 2)))
        common.print_table(results[-1]["rows"], columns, f"humanline overhead ({model})")
    common.print_table([r for res in results for r in res["rows"]], columns,
                       "DPO step time by reference strategy (medians; ratios: median over rounds, paired)")
    common.finish("humanline_overhead", args, {"results": results})


if __name__ == "__main__":
    main()
