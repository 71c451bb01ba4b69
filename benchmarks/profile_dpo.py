"""Profile one DPO optimizer step of our trainer with torch.profiler (SmolLM2-135M by default).

    python benchmarks/profile_dpo.py [--model tiny|smollm2] [--reference frozen|lookahead] [--quick]

Prints the operators by self CPU time and the share of the step spent in each phase (reference forward,
policy forward, log-prob selection, backward, optimizer); writes `benchmarks/results/profile_dpo.json`.
"""

from __future__ import annotations

import common
from torch.profiler import ProfilerActivity, profile, record_function


def _wrap_phases(run) -> None:
    """Label the trainer's phases in the profile by wrapping the functions that implement them."""
    import humanline.core.logps as logps_mod
    import humanline.model.forward as fwd
    import humanline.training.step as train_mod

    trainer = run.trainer

    def labelled(name, fn):
        def inner(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)
        return inner

    fwd.selected_logps = labelled("phase: selected log-softmax", logps_mod.selected_logps)
    ref = trainer.run.reference
    ref.logps = labelled("phase: reference logps", ref.logps)
    if hasattr(ref, "sync"):
        ref.sync = labelled("phase: reference sync/lookahead", ref.sync)
    train_mod.micro_batch_loss = labelled("phase: policy forward + loss", train_mod.micro_batch_loss)
    trainer.run.accelerator.backward = labelled("phase: backward", trainer.run.accelerator.backward)
    train_mod.clip_grad_norm = labelled("phase: clip grad norm", train_mod.clip_grad_norm)
    opt = trainer.run.optimizer
    opt.step = labelled("phase: optimizer step", opt.step)


def main() -> None:
    parser = common.parser(__doc__, quick="tiny model")
    parser.add_argument("--model", default="smollm2", choices=["tiny", "smollm2"])
    parser.add_argument("--reference", default="frozen", choices=["frozen", "lookahead"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=128)
    args = parser.parse_args()
    if args.quick:
        args.model = "tiny"
    common.set_threads(args.threads)
    tokenizer, _ = common.load_policy(args.model)
    records = common.bench_records(args.model, "pairwise", args.batch * 4, tokenizer=tokenizer,
                                   max_length=args.max_length)
    hl = args.reference == "lookahead"
    extra = {"train": {"reference": args.reference}, "humanline": {"enabled": hl, "sync_every": 1}}
    run = common.our_trainer("dpo", args.model, records, batch=args.batch, max_length=args.max_length, steps=4,
                             extra=extra)
    run.step()  # warm-up (step 0 also has no lookahead cache yet)
    _wrap_phases(run)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        seconds, _ = run.step()
    events = prof.key_averages()
    table = events.table(sort_by="self_cpu_time_total", row_limit=25)
    print(table)
    total_us = seconds * 1e6
    phases = [{"phase": e.key.removeprefix("phase: "), "ms": e.cpu_time_total / 1e3,
               "share": e.cpu_time_total / total_us}
              for e in events if e.key.startswith("phase: ")]
    phases.sort(key=lambda r: -r["ms"])
    common.print_table(phases, ["phase", "ms", "share"], f"{args.model} DPO step: {seconds:.3f} s")
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:25]
    ops = [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in top]
    common.finish("profile_dpo", args, {"step_s": seconds, "phases": phases, "top_ops": ops})


if __name__ == "__main__":
    main()
