"""What each forward optimisation buys: per-token log-probs of a DPO batch, four ways, interleaved.

    python benchmarks/forward_variants.py [--quick] [--model smollm2|tiny] [--reps 4] [--threads 1]

On one batch (SmolLM2-135M: 4 pairs of <= 128 tokens, i.e. 8 right-padded rows), time a policy forward +
backward and a no-grad (reference) forward for:
  full         logits at every position, then `token_logps` (no `logits_to_keep`)
  keep_suffix  logits from the earliest completion token on (`logits_to_keep` as an int: the old path)
  selected     logits only where a completion token is predicted (2D boolean `logits_to_keep`), padded rows
  packed_width_L  selected + padding-free packing, rows no wider than the batch (several sequences per row,
               `position_ids` restart)
  packed       the same, row width chosen by the cost model (`humanline.model.forward._choose_rows`): current
All four return the same log-probs (checked here, and in tests/test_forward_packing.py). Writes
benchmarks/results/forward_variants.json.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import common
import torch


def _variants(model, batch: dict) -> dict:
    import humanline.model.forward as fwd
    from humanline.core.logps import token_logps
    from humanline.model.capabilities import model_hidden_size

    ids, attn, cm = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].bool()
    scored = cm[:, 1:]
    lengths = attn.sum(1).tolist()

    def full():
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits
        return token_logps(logits, ids, cm)[0]

    def keep_suffix():
        return fwd.full_logits_logps(model, ids, attn, cm)

    def run_layout(layout):
        logits = model(**layout.model_inputs()).logits
        out = fwd.selected_logps(logits, layout.targets)
        return out.new_zeros(scored.numel()).index_put((layout.scatter,), out).view(scored.shape)

    def selected():
        return run_layout(fwd.padded_layout(ids, attn, scored))

    def packed_width_l():
        return run_layout(fwd.packed_layout(ids, scored, lengths) or fwd.padded_layout(ids, attn, scored))

    hidden = model_hidden_size(model)

    def packed():
        return run_layout(fwd.packed_layout(ids, scored, lengths, hidden) or fwd.padded_layout(ids, attn, scored))

    return {"full": full, "keep_suffix": keep_suffix, "selected": selected, "packed_width_L": packed_width_l,
            "packed": packed}


def _time(fn, model, grad: bool) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    if grad:
        fn().sum().backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model, 3 repetitions")
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    if args.quick:
        args.model, args.reps = "tiny", 3
    common.set_threads(args.threads)
    from humanline.data.collate import collate_dpo
    from humanline.data.load import load_records
    from humanline.data.tokenization import encode_pairs

    tokenizer, model = common.load_policy(args.model)
    model.train()
    records = common.bench_records(args.model, "pairwise", args.batch, tokenizer=tokenizer, max_length=args.max_length)
    with tempfile.TemporaryDirectory() as tmp:
        path = common.write_jsonl(records, Path(tmp) / "train.jsonl")
        units = encode_pairs(load_records(str(path)).records, tokenizer, max_prompt_length=args.max_length - 1,
                             max_length=args.max_length).units
    batch = collate_dpo(units, tokenizer.pad_token_id)
    variants = _variants(model, batch)
    with torch.no_grad():
        outputs = {name: fn() for name, fn in variants.items()}
    agree = {name: float((out - outputs["full"]).abs().max()) for name, out in outputs.items()}
    times = {name: {"fwd_bwd": [], "no_grad": []} for name in variants}
    for _ in range(args.reps + 1):  # the first repetition warms up and is dropped
        for name, fn in variants.items():
            times[name]["fwd_bwd"].append(_time(fn, model, True))
            times[name]["no_grad"].append(_time(fn, model, False))
    rows = []
    for name, t in times.items():
        row = {"variant": name, "max |diff| vs full": agree[name]}
        for kind in ("fwd_bwd", "no_grad"):
            row[f"{kind} s"] = common.median([w for w, _ in t[kind][1:]])
            row[f"{kind} cpu s"] = common.median([c for _, c in t[kind][1:]])
        rows.append(row)
    for row in rows:
        row["fwd_bwd cpu speed-up vs full"] = rows[0]["fwd_bwd cpu s"] / row["fwd_bwd cpu s"]
    ids = batch["input_ids"]
    shape = {"rows": ids.shape[0], "columns": ids.shape[1], "real_tokens": int(batch["attention_mask"].sum()),
             "completion_tokens": int(batch["completion_mask"].sum())}
    columns = ["variant", "fwd_bwd s", "fwd_bwd cpu s", "no_grad s", "no_grad cpu s", "fwd_bwd cpu speed-up vs full",
               "max |diff| vs full"]
    common.print_table(rows, columns, f"log-probs of one DPO batch on {args.model} {shape} (medians of {args.reps})")
    common.finish("forward_variants", args, {"batch": shape, "results": rows})


if __name__ == "__main__":
    main()
