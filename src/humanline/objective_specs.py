"""The objective table: everything the training loop needs to know about an objective, in one entry each.

An `ObjectiveSpec` says which record format the objective trains on, how records of the other formats are
converted (docs/method.md §5), how records are tokenised into units and units collated into micro-batches,
how a scored group sampled online becomes units (the same selection rules as the offline conversions), and
how a collated micro-batch's token log-ratios become the loss (the pure objectives of `humanline.objectives`,
with the humanline transform applied upstream by the trainer). Adding an objective is one entry in `SPECS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from humanline.config import DataConfig, ObjectiveConfig
from humanline.data import collate, convert, tokenize
from humanline.errors import UserError
from humanline.objectives import LossOutput, dpo_loss, group_advantages, grpo_loss, kto_kl_ref, kto_loss

Unit = dict


@dataclass
class LossContext:
    batch: dict
    mask: torch.Tensor  # (N, T) completion mask of the main part
    cfg: ObjectiveConfig
    kl_log_ratio: torch.Tensor | None = None  # KTO: transformed log-ratio of the mismatched pairs
    kl_mask: torch.Tensor | None = None
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None  # sums across processes


def dpo_batch_loss(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """Rows [0:B] are chosen, [B:2B] rejected (one concatenated forward, `collate_dpo`)."""
    half = log_ratio.shape[0] // 2
    return dpo_loss(log_ratio[:half], log_ratio[half:], ctx.mask[:half], ctx.mask[half:], beta=ctx.cfg.beta)


def kto_batch_loss(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """KTO with the reference point from the mismatched pairs, summed across processes."""
    z0 = kto_kl_ref(ctx.kl_log_ratio, ctx.kl_mask, reduce_sum=ctx.reduce_sum)
    return kto_loss(log_ratio, ctx.mask, ctx.batch["desirable"], z0, beta=ctx.cfg.beta,
                    desirable_weight=ctx.cfg.desirable_weight, undesirable_weight=ctx.cfg.undesirable_weight)


def grpo_batch_loss(log_ratio: torch.Tensor, raw_log_ratio: torch.Tensor, ctx: LossContext) -> LossOutput:
    """Group statistics per micro-batch: a group is never split across micro-batches or processes, so the
    per-micro-batch advantages equal the global ones."""
    advantages = group_advantages(ctx.batch["rewards"], ctx.batch["group_ids"], eps=ctx.cfg.advantage_eps)
    out = grpo_loss(log_ratio, ctx.mask, advantages.to(log_ratio.device), raw_log_ratio=raw_log_ratio,
                    beta=ctx.cfg.grpo_beta, eps_low=ctx.cfg.eps_low, eps_high=ctx.cfg.eps_high,
                    reduction=ctx.cfg.reduction)
    out.metrics["reward"] = ctx.batch["rewards"].float().mean()
    return out


# ------------------------------------------------------------------ online: scored groups -> units


def _same(group: Unit) -> Callable[[int, int], bool]:
    return lambda i, j: group["completions"][i] == group["completions"][j]


def dpo_units(group: Unit, data: DataConfig) -> list[Unit]:
    """Pairs by `data.pair_mode` and `data.pair_threshold`, as `groups_to_pairs` makes them offline."""
    kept, _ = convert.pair_choices(group["rewards"], _same(group), threshold=data.pair_threshold, mode=data.pair_mode)
    c = group["completions"]
    return [{"id": group["id"], "prompt": group["prompt"], "chosen": c[w], "rejected": c[l]} for w, l in kept]


def kto_units(group: Unit, data: DataConfig) -> list[Unit]:
    """Labels by `data.unpaired_rule`, as `groups_to_unpaired` makes them offline."""
    labels = convert.unpaired_labels(group["rewards"], rule=data.unpaired_rule, threshold=data.unpaired_threshold)
    return [{"id": group["id"], "prompt": group["prompt"], "completion": group["completions"][i],
             "desirable": desirable} for i, desirable in labels]


def grpo_units(group: Unit, data: DataConfig) -> list[Unit]:
    """The group itself; a group whose rewards are all equal has zero advantages everywhere (no policy
    gradient), so online it is not worth a forward and is dropped."""
    rewards = group["rewards"]
    return [group] if len(rewards) >= 2 and max(rewards) != min(rewards) else []


# ------------------------------------------------------------------ offline: records of other formats


Converter = Callable[[list, DataConfig], tuple[list, str | None]]  # records, data config -> records, log note


def _groups_to_pairs(records: list, data: DataConfig) -> tuple[list, str]:
    pairs, dropped = convert.groups_to_pairs(records, threshold=data.pair_threshold, mode=data.pair_mode)
    unit = "groups" if data.pair_mode == "best_worst" else "candidate pairs"
    return pairs, f"groups -> pairs: {len(pairs)} pairs, {dropped} {unit} dropped (score gap <= {data.pair_threshold})"


def _groups_to_unpaired(records: list, data: DataConfig) -> tuple[list, None]:
    return convert.groups_to_unpaired(records, rule=data.unpaired_rule, threshold=data.unpaired_threshold), None


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    kind: str  # the record format it trains on: pairwise | unpaired | groups
    encode: Callable  # (records, tokenizer, max_prompt_length=, max_length=) -> tokenize.EncodeResult
    collate: Callable[[list[Unit], int], dict]  # (units, pad_id) -> micro-batch
    loss: Callable[[torch.Tensor, torch.Tensor, LossContext], LossOutput]  # (log_ratio, raw, ctx)
    units_from_group: Callable[[Unit, DataConfig], list[Unit]]  # online: one scored group -> units
    converters: dict[str, Converter]  # other record formats it can train on
    kl_part: bool = False  # batches carry a mismatched "kl" part (KTO's reference point)
    # The loss clips the token ratio itself (GRPO's PPO clip): an auto humanline band then holds its bounds
    own_ratio_clip: bool = False

    def convert(self, records: list, kind: str, data: DataConfig) -> tuple[list, str | None]:
        """`records` of format `kind` as this objective's format, and a note for the log (or None)."""
        if kind == self.kind:
            return records, None
        if kind not in self.converters:
            raise UserError(f"data.train: {kind} data cannot train objective '{self.name}' (expected {self.kind}"
                            f"{''.join(f' or {k}' for k in self.converters)})")
        return self.converters[kind](records, data)


SPECS: dict[str, ObjectiveSpec] = {
    "dpo": ObjectiveSpec("dpo", "pairwise", tokenize.encode_pairs, collate.collate_dpo, dpo_batch_loss, dpo_units,
                         {"groups": _groups_to_pairs}),
    "kto": ObjectiveSpec("kto", "unpaired", tokenize.encode_unpaired, collate.collate_kto, kto_batch_loss, kto_units,
                         {"groups": _groups_to_unpaired,
                          "pairwise": lambda records, data: (convert.pairs_to_unpaired(records), None)},
                         kl_part=True),
    "grpo": ObjectiveSpec("grpo", "groups", tokenize.encode_groups, collate.collate_grpo, grpo_batch_loss, grpo_units,
                          {"pairwise": lambda records, data: (convert.pairs_to_groups(records), None)},
                          own_ratio_clip=True),
}
