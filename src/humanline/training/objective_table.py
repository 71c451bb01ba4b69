"""The objective table: everything the training loop needs to know about an objective, in one entry each.

An `ObjectiveSpec` says which record format the objective trains on (records of other formats are converted
through `humanline.data.convert.CONVERSIONS`, docs/method.md §5), how records are tokenised into units and
units collated into micro-batches, how a scored group sampled online becomes units (the same selection rules
as the offline conversions), and how a `LossInput` becomes the loss (the pure objectives of
`humanline.objectives`, with the humanline transform applied upstream by `loss_input`). The allowed values of
`objective.name` are the keys of `SPECS`. Adding an objective is one entry here plus its pure loss
(docs/adding-an-objective.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from humanline.data import collate, convert, tokenization
from humanline.data.records import Unit
from humanline.errors import UserError
from humanline.model.forward import completion_mask
from humanline.objectives import (
    LossOutput,
    dpo_loss,
    group_advantages,
    grpo_loss,
    ipo_loss,
    kto_kl_ref,
    kto_loss,
    nll_anchor,
)
from humanline.objectives.anchor import with_anchor
from humanline.objectives.corrections import NEEDS_BEHAVIOUR, correct
from humanline.settings.config import DataConfig, ObjectiveConfig


@dataclass(frozen=True)
class LossInput:
    """What every batch loss reads: a collated micro-batch's token log-ratios, transformed and raw."""

    batch: dict  # the collated micro-batch (ids, masks and the objective's labels: desirable, rewards, ...)
    log_ratio: torch.Tensor  # (N, T) policy - reference token log-ratio, humanline-transformed (main part)
    raw_log_ratio: torch.Tensor  # (N, T) the same before the transform (GRPO's ratio clip reads it)
    mask: torch.Tensor  # (N, T) completion mask of the main part
    kl_log_ratio: torch.Tensor | None = None  # (M, T') the mismatched pairs' transformed log-ratio (kl_part)
    kl_mask: torch.Tensor | None = None
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None  # sums across processes (None: one)
    # sampled regimes with a correction that reads them (objectives.corrections): (N, T) the log-ratio of the
    # policy the loss's ratio is taken against to the sampler, detached. Humanline's ratio is against its synced
    # reference, so its behaviour weight is pi_ref / pi_behav (docs/method.md §3.6); without humanline a correction
    # takes the ratio against the pre-update policy pi_prox, so pi_prox / pi_behav
    behaviour_log_ratio: torch.Tensor | None = None
    humanline: bool = False  # the log-ratio is humanline's (against its synced reference)
    staleness: int = 0  # versions between the batch's sampler and this step (sampled regimes; 0 online)
    policy_logps: torch.Tensor | None = None  # (N, T) the policy's own token log-probs (main part), with gradient


def loss_input(spec: ObjectiveSpec, batch: dict, policy_logps: Callable[[str], torch.Tensor], ref: dict, *,
               transform: Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor] | None = None,
               reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None, humanline: bool = False,
               staleness: int = 0) -> LossInput:
    """The `LossInput` of one micro-batch, for training (`loop.Trainer`) and evaluation (`held_out`) alike.

    `policy_logps(part)`: the policy's `(N, T)` token log-probs of a part ("main", "kl"), with gradient where
    the caller wants one; the mismatched part of a `kl_part` objective is taken without gradient. `ref`: the
    reference's log-probs per part. `transform(raw, mask, part)` (None: identity) is applied to the main part,
    then the kl part (the Trainer's: `Humanline.apply`). `ref["behaviour"]`, where the Trainer sets it: the
    behaviour (sampler) policy's log-probs of the main part, the reference's own tensor when they are one.
    `humanline`: the transform is humanline's (its behaviour weight is then taken against the reference).
    """
    mask = completion_mask(batch)
    policy = policy_logps("main")
    raw = policy - ref["main"]
    log_ratio = transform(raw, mask, "main") if transform is not None else raw
    kl_log_ratio = kl_mask = None
    if spec.kl_part:  # KTO: the mismatched pairs' log-ratio, without gradient
        kl_mask = completion_mask(batch, "kl")
        with torch.no_grad():
            kl_raw = policy_logps("kl") - ref["kl"]
        kl_log_ratio = transform(kl_raw, kl_mask, "kl") if transform is not None else kl_raw
    behaviour, behaviour_log_ratio = ref.get("behaviour"), None
    if behaviour is not None:
        if humanline:  # log pi_ref - log pi_behav (docs/method.md §3.6)
            behaviour_log_ratio = ref["main"] - behaviour
        elif behaviour is ref["main"]:  # the reference is the sampler: log pi_prox - log pi_behav is raw itself
            behaviour_log_ratio = raw.detach()
        else:  # log pi_prox - log pi_behav, pi_prox being the policy before this step's update
            behaviour_log_ratio = raw.detach() + ref["main"] - behaviour
    return LossInput(batch, log_ratio, raw, mask, kl_log_ratio, kl_mask, reduce_sum, behaviour_log_ratio,
                     humanline, staleness, policy)


# ------------------------------------------------------------------ batch losses: (LossInput, ObjectiveConfig)


def dpo_batch_loss(x: LossInput, cfg: ObjectiveConfig) -> LossOutput:
    """Rows [0:B] are chosen, [B:2B] rejected (one concatenated forward, `collate_dpo`); with `objective.nll_weight`
    the chosen answers' NLL anchor."""
    half = x.log_ratio.shape[0] // 2
    out = dpo_loss(x.log_ratio[:half], x.log_ratio[half:], x.mask[:half], x.mask[half:], beta=cfg.beta)
    return _anchored(out, x, cfg, slice(0, half))


def ipo_batch_loss(x: LossInput, cfg: ObjectiveConfig) -> LossOutput:
    """As DPO: rows [0:B] chosen, [B:2B] rejected; tau is `objective.tau` (null: `objective.beta`, as IPO
    recipes written before that field)."""
    half = x.log_ratio.shape[0] // 2
    tau = cfg.beta if cfg.tau is None else cfg.tau
    out = ipo_loss(x.log_ratio[:half], x.log_ratio[half:], x.mask[:half], x.mask[half:], tau=tau)
    return _anchored(out, x, cfg, slice(0, half))


def kto_batch_loss(x: LossInput, cfg: ObjectiveConfig) -> LossOutput:
    """KTO with the reference point from the mismatched pairs, summed across processes; with
    `objective.nll_weight` the desirable examples' NLL anchor."""
    z0 = kto_kl_ref(x.kl_log_ratio, x.kl_mask, reduce_sum=x.reduce_sum)
    host = x.batch.get("host", {}).get("desirable")  # which classes the batch holds, known since collation
    host = None if host is None else host.numpy()
    present = None if host is None else (bool(host.any()), not bool(host.all()))
    out = kto_loss(x.log_ratio, x.mask, x.batch["desirable"], z0, beta=cfg.beta, present=present,
                   desirable_weight=cfg.desirable_weight, undesirable_weight=cfg.undesirable_weight)
    return _anchored(out, x, cfg, x.batch["desirable"].to(x.mask.device))


def _anchored(out: LossOutput, x: LossInput, cfg: ObjectiveConfig, preferred) -> LossOutput:
    """`out` plus `objective.nll_weight` times the NLL anchor of the `preferred` rows (a slice, or an (N,) bool
    tensor) (docs/method.md §4)."""
    if not cfg.nll_weight:
        return out
    rows = torch.zeros(x.mask.shape[0], dtype=torch.bool, device=x.mask.device)
    rows[preferred] = True
    return with_anchor(out, nll_anchor(x.policy_logps, x.mask & rows[:, None]), cfg.nll_weight)


def grpo_batch_loss(x: LossInput, cfg: ObjectiveConfig) -> LossOutput:
    """Group statistics per micro-batch: a group is never split across micro-batches or processes, so the
    per-micro-batch advantages equal the global ones."""
    advantages = group_advantages(x.batch["rewards"], x.batch["group_ids"], eps=cfg.advantage_eps,
                                  n_groups=x.batch.get("n_groups"))  # ids 0 .. n_groups - 1 (collate_grpo)
    corrected, extra = stale_correction(x, cfg, advantages), {}
    if corrected is not None:  # objective.correction: what becomes of tokens drawn by an older policy
        extra = dict(weights=corrected.weights, keep=corrected.keep, clip=corrected.clip)
    out = grpo_loss(x.log_ratio if corrected is None else corrected.log_ratio, x.mask,
                    advantages.to(x.log_ratio.device), raw_log_ratio=x.raw_log_ratio, beta=cfg.grpo_beta,
                    eps_low=cfg.eps_low, eps_high=cfg.eps_high, reduction=cfg.reduction, **extra)
    out.metrics["reward"] = x.batch["rewards"].float().mean()
    if corrected is not None:
        out.metrics.update(corrected.metrics)
    return out


def stale_correction(x: LossInput, cfg: ObjectiveConfig, advantages: torch.Tensor):
    """`objectives.corrections.correct` of `objective.correction` on this micro-batch (None: none). The
    input's `staleness` (versions between its sampler and this step) is every sample's; `advantages` (N,) the
    rows' (vespo's k and lambda go by their sign)."""
    if cfg.correction == "none":
        return None
    if cfg.correction in NEEDS_BEHAVIOUR and x.behaviour_log_ratio is None:
        raise ValueError(f"objective.correction={cfg.correction} needs the behaviour policy's log-probs "
                         f"(sampled regimes only)")
    staleness = torch.full(x.log_ratio.shape[:1], x.staleness, device=x.log_ratio.device)  # (N,) per sample
    cap = cfg.tis_cap if cfg.correction == "tis" else cfg.behaviour_cap
    vespo = dict(k_pos=cfg.vespo_k_pos, lambda_pos=cfg.vespo_lambda_pos, k_neg=cfg.vespo_k_neg,
                 lambda_neg=cfg.vespo_lambda_neg)
    band = tuple(cfg.icepop_band if cfg.correction == "icepop" else cfg.geo_band)
    return correct(cfg.correction, x.log_ratio, x.mask, humanline=x.humanline,
                   behaviour_log_ratio=x.behaviour_log_ratio, staleness=staleness, max_staleness=cfg.max_staleness,
                   cap=cap, tau=cfg.m2_threshold, advantages=advantages, vespo=vespo, band=band)


def past_staleness_bound(cfg: ObjectiveConfig, staleness: int) -> bool:
    """`objective.correction: drop` and a step whose samples are more than `max_staleness` versions old: every
    sample of a step has the same staleness, so the whole step is dropped (the trainer then takes no optimizer step)."""
    return cfg.correction == "drop" and staleness > cfg.max_staleness


# ------------------------------------------------------------------ online: scored groups -> units
# `data` is the run's `DataConfig` (pair_mode, pair_threshold, unpaired_rule, unpaired_threshold).


def _same(group: Unit) -> Callable[[int, int], bool]:
    return lambda i, j: group["completions"][i] == group["completions"][j]


def pair_units(group: Unit, data: DataConfig) -> list[Unit]:
    """Pairs by `data.pair_mode` and `data.pair_threshold`, as `groups_to_pairs` makes them offline."""
    kept, _ = convert.pair_choices(group["rewards"], _same(group), threshold=data.pair_threshold, mode=data.pair_mode)
    c = group["completions"]
    return [{"id": group["id"], "prompt": group["prompt"], "chosen": c[w], "rejected": c[l]} for w, l in kept]


def unpaired_units(group: Unit, data: DataConfig) -> list[Unit]:
    """Labels by `data.unpaired_rule`, as `groups_to_unpaired` makes them offline."""
    labels = convert.unpaired_labels(group["rewards"], rule=data.unpaired_rule, threshold=data.unpaired_threshold)
    return [{"id": group["id"], "prompt": group["prompt"], "completion": group["completions"][i],
             "desirable": desirable} for i, desirable in labels]


def group_units(group: Unit, data: DataConfig) -> list[Unit]:
    """The group itself; a group whose rewards are all equal has zero advantages everywhere (no policy
    gradient), so online it is not worth a forward and is dropped."""
    rewards = group["rewards"]
    return [group] if len(rewards) >= 2 and max(rewards) != min(rewards) else []


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class ObjectiveSpec:
    name: str
    kind: str  # the record format it trains on: pairwise | unpaired | groups (others via convert.CONVERSIONS)
    encode: Callable  # (records, tokenizer, max_prompt_length=, max_length=) -> tokenization.EncodeResult
    collate: Callable[[list[Unit], int], dict]  # (units, pad_id) -> micro-batch
    loss: Callable[[LossInput, Any], LossOutput]  # (input, the run's ObjectiveConfig) -> loss and metrics
    units_from_group: Callable[[Unit, Any], list[Unit]]  # online: (scored group, DataConfig) -> units
    kl_part: bool = False  # batches carry a mismatched "kl" part (KTO's reference point)
    # The loss clips the token ratio itself (GRPO's PPO clip): an auto humanline band then holds its bounds
    own_ratio_clip: bool = False
    # Online without humanline, train.reference=auto takes the sampling policy as the reference (GRPO's
    # old-policy ratio) instead of the frozen initial policy (standard online DPO/KTO)
    sampler_reference: bool = False

    def convert(self, records: list, kind: str, data: DataConfig) -> tuple[list, str | None]:
        """`records` of format `kind` as this objective's format, and a note for the log (or None)."""
        if kind == self.kind:
            return records, None
        if (kind, self.kind) not in convert.CONVERSIONS:
            raise UserError(f"data.train: {kind} data cannot train objective '{self.name}' (expected {self.kind}"
                            f"{''.join(f' or {k}' for k in convert.sources_of(self.kind))})")
        records, note = convert.convert_records(records, kind, self.kind, data)
        return records, f"{kind} -> {self.kind}: {len(records)} records" + (f" ({note})" if note else "")


PAIRWISE = dict(kind="pairwise", encode=tokenization.encode_pairs, collate=collate.collate_dpo,
                units_from_group=pair_units)

SPECS: dict[str, ObjectiveSpec] = {
    "dpo": ObjectiveSpec("dpo", loss=dpo_batch_loss, **PAIRWISE),
    "ipo": ObjectiveSpec("ipo", loss=ipo_batch_loss, **PAIRWISE),
    "kto": ObjectiveSpec("kto", "unpaired", tokenization.encode_unpaired, collate.collate_kto, kto_batch_loss,
                         unpaired_units, kl_part=True),
    "grpo": ObjectiveSpec("grpo", "groups", tokenization.encode_groups, collate.collate_grpo, grpo_batch_loss,
                          group_units, own_ratio_clip=True, sampler_reference=True),
}
