"""A graded reward for the tiny online recipes: even a random tiny model gets varied scores, so groups are
not degenerate and every objective has signal. Loaded by path: `reward: rewards.py:digits` (beside the recipes)."""


def digits(prompts, completions, answer=None, **_):
    """1.0 for the exact answer, otherwise the share of the completion's characters that are digits (x 0.5)."""
    scores = []
    for i, text in enumerate(completions):
        text = text.strip()
        if answer is not None and answer[i] is not None and text == str(answer[i]):
            scores.append(1.0)
        else:
            scores.append(0.5 * sum(ch.isdigit() for ch in text) / max(len(text), 1))
    return scores
