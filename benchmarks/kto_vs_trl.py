"""KTO training throughput: our Trainer vs TRL's KTOTrainer, interleaved in one process.

    python benchmarks/kto_vs_trl.py [--quick] [--models tiny,smollm2] [--rounds 5] [--threads 1]

Same model, records, order, batch size (tiny: 8 examples, SmolLM2-135M: 4 examples of <= 128 tokens, each with its
mismatched KL pair), float32, device and reference strategy (a frozen reference model on both sides). TRL runs its own
`train()` loop; a callback times every TRL step and, every few steps, runs as many of our steps (`Trainer.train_step`,
what `train()` runs). Reports medians of non-padding tokens per second (wall clock and process CPU time) and the
median over rounds of the paired ratio ours / TRL. Writes benchmarks/results/kto_vs_trl.json.
"""

import trl_side

if __name__ == "__main__":
    trl_side.main("kto", __doc__)
