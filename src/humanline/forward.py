"""Forward passes of a collated batch: per-token log-probs of its completion tokens.

A collated batch (see `humanline.data.tokenize`) has a main part (`input_ids`, `attention_mask`,
`completion_mask`) and, for KTO, a mismatched "kl" part (`kl_input_ids`, ...). Both go through `token_logps`,
the one place that shifts labels.
"""

from __future__ import annotations

import torch

from humanline.core.logps import token_logps

PARTS = {"main": "", "kl": "kl_"}


def parts_of(batch: dict) -> list[str]:
    """The sequence parts present in `batch`: always "main", plus "kl" for KTO."""
    return [part for part, prefix in PARTS.items() if f"{prefix}input_ids" in batch]


def completion_mask(batch: dict, part: str = "main") -> torch.Tensor:
    """`(N, L - 1)` bool mask of the completion tokens whose log-probs `part_logps` returns."""
    return batch[f"{PARTS[part]}completion_mask"][:, 1:].bool()


def part_logps(model, batch: dict, part: str = "main") -> torch.Tensor:
    """`(N, L - 1)` log-probs of `part`'s completion tokens under `model` (0 elsewhere).

    Only logits from the first completion position on are computed (`logits_to_keep`): prompt positions
    need no vocabulary projection, which saves time and memory on long prompts.
    """
    prefix = PARTS[part]
    input_ids = batch[f"{prefix}input_ids"]
    mask = batch[f"{prefix}completion_mask"].bool()
    length = input_ids.shape[1]
    if not mask.any():
        return torch.zeros(input_ids.shape[0], length - 1, device=input_ids.device)
    first = int(mask.float().argmax(dim=1)[mask.any(dim=1)].min())  # earliest completion token
    keep = length - max(first - 1, 0)  # logits at position first-1 predict token `first`
    out = model(input_ids=input_ids, attention_mask=batch[f"{prefix}attention_mask"], logits_to_keep=keep,
                use_cache=False)
    logits = out.logits
    start = length - logits.shape[1]
    logps, _ = token_logps(logits, input_ids[:, start:], mask[:, start:])
    if start > 0:  # left-pad back to (N, L - 1) so every caller sees one layout
        logps = torch.nn.functional.pad(logps, (start, 0))
    return logps


@torch.no_grad()
def batch_logps_no_grad(model, batch: dict) -> dict[str, torch.Tensor]:
    """Log-probs of every part of `batch`, without gradient (reference and lookahead passes)."""
    return {part: part_logps(model, batch, part).detach() for part in parts_of(batch)}
