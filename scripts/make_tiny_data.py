"""Write the small arithmetic datasets used by recipes/tiny (deterministic; run from the repo root)."""

import json
import random
from pathlib import Path

OUT = Path("recipes/tiny/data")


def wrong(rng: random.Random, answer: int) -> int:
    return answer + rng.choice([-10, -2, -1, 1, 2, 10])


def main() -> None:
    rng = random.Random(0)
    OUT.mkdir(parents=True, exist_ok=True)
    problems = [(a, b) for a in range(10, 60) for b in range(10, 60)]
    rng.shuffle(problems)
    train, held_out = problems[:256], problems[256:320]

    def prompt(a, b):
        return [{"role": "user", "content": f"{a}+{b}="}]

    rows = {"pairs": [], "unpaired": [], "groups": [], "prompts": [], "eval_prompts": []}
    for i, (a, b) in enumerate(train):
        s = a + b
        rows["pairs"].append({"id": f"p{i}", "prompt": prompt(a, b), "chosen": str(s), "rejected": str(wrong(rng, s))})
        rows["unpaired"].append({"id": f"p{i}", "prompt": prompt(a, b),
                                 "completion": str(s if i % 2 else wrong(rng, s)), "label": bool(i % 2)})
        completions = [str(s), str(wrong(rng, s)), str(wrong(rng, s)), str(s if i % 3 else wrong(rng, s))]
        rows["groups"].append({"id": f"p{i}", "prompt": prompt(a, b), "completions": completions,
                               "scores": [float(c == str(s)) for c in completions]})
        rows["prompts"].append({"id": f"p{i}", "prompt": prompt(a, b), "answer": str(s)})
    for i, (a, b) in enumerate(held_out):
        rows["eval_prompts"].append({"id": f"e{i}", "prompt": prompt(a, b), "answer": str(a + b)})
    for name, items in rows.items():
        with open(OUT / f"{name}.jsonl", "w") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")


if __name__ == "__main__":
    main()
