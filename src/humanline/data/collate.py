"""Collate encoded units into right-padded tensors for one forward pass.

Every batch holds `input_ids` and `attention_mask` (long) and `completion_mask` (bool), all `(N, L)` with
`L` the longest prompt + completion in the batch. `completion_mask` is true exactly on completion tokens, in
input positions (never on prompt or padding), which is what `humanline.core.token_logps` expects.

A step's units become micro-batches in one place, `micro_batches` (cut by a `BatchLayout`, collated, moved to the
device): the offline schedule, the sample buffer and the asynchronous sampler process all call it, so the sampler's
log-probs of micro-batch `i` are those of the trainer's micro-batch `i` (docs/method.md §5: async = sync, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from humanline.data.records import Unit

Collate = Callable[[list[Unit], int], dict]  # (units, pad_id) -> micro-batch: the objective table's `collate`


@dataclass(frozen=True)
class BatchLayout:
    """How one optimizer step's units are shared out: `micro_batch_size` units per micro-batch, `grad_accum`
    micro-batches per process, `num_processes` processes, of which this is `process_index`."""

    micro_batch_size: int
    grad_accum: int
    num_processes: int = 1
    process_index: int = 0

    @property
    def per_step(self) -> int:
        """Units per optimizer step across all processes."""
        return self.micro_batch_size * self.grad_accum * self.num_processes

    def local_micro_batches(self, units: list[Unit]) -> list[list[Unit]]:
        """This process's share of one step's units, cut into at most `grad_accum` micro-batches, none empty.

        Units are dealt in contiguous blocks so that process p's data is the same whatever the number of
        processes that a 1-process run with the same global batch would split it into.
        """
        per_process = -(-len(units) // self.num_processes)
        mine = units[self.process_index * per_process : (self.process_index + 1) * per_process]
        size = max(1, -(-len(mine) // self.grad_accum))
        return [mine[i : i + size] for i in range(0, len(mine), size)]


def micro_batches(units: list[Unit], layout: BatchLayout, collate: Collate, pad_id: int,
                  device: torch.device | str) -> list[dict]:
    """One step's `units` as this process's micro-batches: cut by `layout`, collated, on `device` (`to_device`)."""
    return [to_device(collate(chunk, pad_id), device) for chunk in layout.local_micro_batches(units)]


def pad_sequences(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows `prompt[i] + completion[i]`, right-padded with `pad_id`.

    Returns `input_ids` (N, L) long, `attention_mask` (N, L) long (1 on real tokens) and `completion_mask`
    (N, L) bool (true on completion tokens). Example: prompt [5, 6], completion [7], L = 4 ->
    input_ids [5, 6, 7, pad], attention_mask [1, 1, 1, 0], completion_mask [F, F, T, F].
    """
    if not prompts or len(prompts) != len(completions):
        raise ValueError(f"pad_sequences: need as many prompts as completions (> 0), got "
                         f"{len(prompts)} and {len(completions)}")
    length = max(max(len(p) + len(c) for p, c in zip(prompts, completions)), 1)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), length), dtype=torch.long)
    completion_mask = torch.zeros((len(prompts), length), dtype=torch.bool)
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        n_prompt, n_total = len(prompt), len(prompt) + len(completion)
        input_ids[row, :n_total] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
        attention_mask[row, :n_total] = 1
        completion_mask[row, n_prompt:n_total] = True
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}


def collate_dpo(units: list[dict], pad_id: int) -> dict:
    """DPO micro-batch of B pairs as one concatenated forward: rows [0:B] chosen, [B:2B] rejected.

    Returns `input_ids`, `attention_mask`, `completion_mask` (2B, L) and `ids` (B unit ids).
    """
    prompts = [u["prompt"] for u in units]
    batch = pad_sequences(prompts + prompts, [u["chosen"] for u in units] + [u["rejected"] for u in units], pad_id)
    batch["ids"] = [u["id"] for u in units]
    return batch


def collate_kto(units: list[dict], pad_id: int) -> dict:
    """KTO micro-batch of B examples plus the mismatched pairs for the KL reference point (docs/method.md §4).

    Returns `input_ids`, `attention_mask`, `completion_mask` (B, L); `desirable` (B,) bool; `kl_input_ids`,
    `kl_attention_mask`, `kl_completion_mask` (B, L') pairing prompt i with the completion of unit
    (i + 1) mod B (a cyclic shift within the micro-batch; for B == 1 the KL mask is all false, so that
    example contributes no KL estimate); and `ids`.
    """
    prompts = [u["prompt"] for u in units]
    completions = [u["completion"] for u in units]
    batch = pad_sequences(prompts, completions, pad_id)
    batch["desirable"] = torch.tensor([bool(u["desirable"]) for u in units], dtype=torch.bool)
    shifted = completions[1:] + completions[:1]
    kl = pad_sequences(prompts, shifted, pad_id)
    if len(units) == 1:
        kl["completion_mask"].zero_()
    batch.update({f"kl_{name}": value for name, value in kl.items()})
    batch["ids"] = [u["id"] for u in units]
    return batch


def collate_grpo(units: list[dict], pad_id: int) -> dict:
    """GRPO micro-batch of whole groups, flattened to N = total completions rows.

    Returns `input_ids`, `attention_mask`, `completion_mask` (N, L); `rewards` (N,) float32; `group_ids` (N,)
    long, the index of each row's group within the micro-batch (0, 0, ..., 1, 1, ...); `n_groups` (int, so the
    advantages need not count them on the device); `ids` (one per group); and, for sampled groups (each with
    `logps`, the log-probabilities the sampler drew its tokens with), `behaviour_logps` (N, L) float32 on the
    completion tokens.
    """
    prompts, completions, rewards, group_ids = [], [], [], []
    for index, unit in enumerate(units):
        if len(unit["completions"]) != len(unit["rewards"]):
            raise ValueError(f"collate_grpo: unit {unit['id']!r} has {len(unit['completions'])} completions "
                             f"but {len(unit['rewards'])} rewards")
        for completion, reward in zip(unit["completions"], unit["rewards"]):
            prompts.append(unit["prompt"])
            completions.append(completion)
            rewards.append(float(reward))
            group_ids.append(index)
    batch = pad_sequences(prompts, completions, pad_id)
    batch["rewards"] = torch.tensor(rewards, dtype=torch.float32)
    batch["group_ids"] = torch.tensor(group_ids, dtype=torch.long)
    batch["n_groups"] = len(units)
    batch["ids"] = [u["id"] for u in units]
    if units and all("logps" in u for u in units):  # sampled groups: what the sampler recorded
        batch["behaviour_logps"] = at_completions([lp for u in units for lp in u["logps"]], batch["completion_mask"])
    return batch


def at_completions(logps: list[list[float]], completion_mask: torch.Tensor) -> torch.Tensor:
    """(N, L) float32: row i's values on its completion tokens (in input positions, as `completion_mask`), 0
    elsewhere. Example: mask [F, F, T, T, F] and values [-0.5, -1.0] give [0, 0, -0.5, -1.0, 0]. Built with numpy:
    collation is host bookkeeping, and a boolean index on a tensor counts as a host sync (`diagnostics.syncs`)."""
    mask = completion_mask.numpy()
    out = np.zeros(mask.shape, dtype=np.float32)
    for row, values in enumerate(logps):
        out[row, mask[row]] = values
    return torch.from_numpy(out)


def to_device(batch: dict, device: torch.device | str) -> dict:
    """`batch` with its tensors on `device`, and the host's own copies under `batch["host"]`.

    The forward layouts, the prefix decision and the token counters read the host copies (`humanline.model.forward`),
    so a training step never reads the device to learn what collation already knew. On an accelerator the
    tensors travel from pinned memory without blocking the host; on the CPU they are the same objects.
    """
    device = torch.device(device)
    host = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    if device.type == "cpu":
        moved = {k: v.to(device) for k, v in host.items()}
    else:
        moved = {k: v.pin_memory().to(device, non_blocking=True) for k, v in host.items()}
    return {**batch, **moved, "host": host}
