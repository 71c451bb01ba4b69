"""Corrections for stale samples (docs/method.md §3.6): what a GRPO step does with tokens drawn by an older
policy than the one it trains. Each rule is a small pure function of detached token log-ratios; `correct`
combines them into what `grpo_loss` reads (the ratio it clips, token weights, the tokens that count).

Three policies meet in a stale step (notation of AReaL, Fu et al. 2025, arXiv 2505.24298):
- pi_behav: the policy that sampled the tokens (the sampler, some versions old), whose log-probs are recorded
  with each sample;
- pi_prox: the policy at the start of this step, before its update (the proximal policy). One optimizer step
  is taken per batch, so its log-probs are the policy's own, detached: `pi_theta / pi_prox` is 1 in value and
  its gradient is the policy gradient;
- pi_theta: the policy being differentiated.

The rules (`objective.correction`), without humanline:
- none:      the PPO clip of `pi_theta / pi_ref`, pi_ref being the run's reference: the sampler itself (standard
             GRPO against the behaviour policy).
- drop:      as none, but samples older than `objective.max_staleness` versions count no token (TRL's async
             GRPO, prime-rl). Every sample of a step has the same staleness, so the trainer skips such a step whole
             (no optimizer or LR-schedule step; counted among the skipped steps).
- tis:       truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
             off-policy RL training"; verl / OpenRLHF / slime): every token's loss times
             `w = min(pi_prox / pi_behav, C)`, detached, C = `objective.tis_cap`; the PPO ratio is taken
             against pi_prox (pi_old of those frameworks, recomputed by the trainer), whatever the reference.
- decoupled: decoupled PPO (AReaL): the clipped `pi_theta / pi_prox` times the behaviour weight
             `pi_prox / pi_behav`, truncated at `objective.behaviour_cap` when set (null: not truncated). With
             one update per batch it is tis with a looser (or no) cap: the two differ only in the truncation.
             AReaL's default instead masks the tokens whose weight exceeds 5 (docs/method.md §3.6).
- m2po:      the second-moment mask of M2PO (Zheng et al. 2025, arXiv 2510.01161; AReaL's `m2_threshold`):
             the tokens of the largest `(log pi_prox / pi_behav)^2` are masked until the mean over the tokens
             left is at most tau = `objective.m2_threshold`; the rest train on the *unclipped* ratio
             `pi_theta / pi_behav`.
- vespo:     VESPO (arXiv 2602.10693; TRL's `loss_type="vespo"`): each sequence's policy gradient weighed by
             `phi(w) = exp(lambda + k log w - lambda w)` of its detached sequence ratio `w = exp(sum_t log
             pi_prox / pi_behav)` (no length normalisation; token log-ratios clamped to +-20 and log w to
             [log 1e-8, 20] as TRL does), `(k, lambda)` = (`vespo_k_pos`, `vespo_lambda_pos`) where the advantage
             is >= 0, else the `_neg` pair; no clip (phi(1) = 1, and phi falls away from w = 1 on both sides).
- icepop:    IcePop's token mask (verl's "lower_upper" rollout correction): tokens whose `pi_prox / pi_behav`
             lies outside `objective.icepop_band` ([0.5, 2]) count for nothing; the rest train as tis does
             (ratio and clip against pi_prox), unweighted.
- geo_mask:  the geometric sequence mask (SkyRL): a sequence whose geometric-mean token ratio `exp(mean_t log
             pi_prox / pi_behav)` lies outside `objective.geo_band` ([0.99, 1.01]) counts for nothing; the rest
             as icepop.
With humanline on, the loss's ratio is humanline's (against its reference, synced every k steps, clipped to its
band), and the rules compose with it against that reference (docs/method.md §3.6): tis and decoupled multiply
humanline's loss by `sg(min(pi_ref / pi_behav, C))`, vespo by `phi` of the sequence ratio `pi_ref / pi_behav`,
m2po, icepop and geo_mask mask its tokens by `pi_ref / pi_behav` (its clip stays), drop masks whole steps, none is
humanline alone.
So `behaviour_log_ratio` is `log pi_ref - log pi_behav` with humanline and `log pi_prox - log pi_behav` without
(`training.objective_table.loss_input`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

CORRECTIONS = ("none", "drop", "tis", "decoupled", "m2po", "vespo", "icepop", "geo_mask")
WEIGHTED = ("tis", "decoupled")  # rules that weigh tokens by pi_prox / pi_behav (with humanline pi_ref / pi_behav)
MASKED = ("icepop", "geo_mask")  # rules that keep or drop tokens by that ratio, the loss otherwise tis's
NEEDS_BEHAVIOUR = ("tis", "decoupled", "m2po", "vespo", "icepop", "geo_mask")  # rules that read the behaviour
LOG_W_MIN, LOG_RATIO_MAX = -18.420680743952367, 20.0  # VESPO's clamps, as TRL's: log 1e-8 and 20


@dataclass
class Corrected:
    """What the loss reads: `log_ratio` (B, T) for its ratio (with gradient), detached token `weights` (None: 1),
    the tokens that count (`keep`; None: all scored tokens), whether the PPO clip applies, and metrics."""

    log_ratio: torch.Tensor
    weights: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    clip: bool = True
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def behaviour_weights(behaviour_log_ratio: torch.Tensor, cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """`(w, capped)`: `w = exp(behaviour_log_ratio)` (log pi_prox - log pi_behav; with humanline log pi_ref -
    log pi_behav), truncated at `cap` (None: not), and where it was.

    Example: log-ratios [0, ln 3, -ln 2] with cap 2 give w = [1, 2, 0.5], capped = [F, T, F]."""
    w = torch.exp(behaviour_log_ratio.detach().double())
    if cap is None:
        return w, torch.zeros_like(w, dtype=torch.bool)
    return w.clamp(max=cap), w > cap


def staleness_mask(staleness: torch.Tensor, max_staleness: int, mask: torch.Tensor) -> torch.Tensor:
    """The scored tokens of samples at most `max_staleness` versions old. `staleness`: (B,) each sample's
    staleness, the versions between its sampler and the step that trains on it.

    Example: staleness [0, 3, 5] with bound 4 keeps the tokens of the first two rows only."""
    return mask.bool() & (staleness.to(mask.device) <= max_staleness)[:, None]


def m2po_mask(behaviour_log_ratio: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """M2PO's second-moment mask (arXiv 2510.01161; the rule of AReaL's `_apply_m2po_masking`): the scored
    tokens are sorted by `m = behaviour_log_ratio^2` (log pi_prox / pi_behav; with humanline log pi_ref /
    pi_behav), largest first, and the fewest largest are masked
    such that the mean `m` of the tokens left is at most `tau`; at least one token is kept.

    Vectorised and without a host read: the mean of every suffix of the sorted values, the number of leading
    suffixes above `tau`, and each token's rank against it. Ties are broken by position (a stable sort).

    Example: m = [0.09, 0.01, 0.04, 1.0] (log-ratios 0.3, 0.1, 0.2, 1.0), tau 0.04: sorted 1.0, 0.09, 0.04,
    0.01 have suffix means 0.285, 0.0467, 0.025, 0.01; the first at most 0.04 starts at rank 2, so the two
    largest (1.0 and 0.09) are masked and the mean of the rest is 0.025.
    """
    flat_mask = mask.bool().reshape(-1)
    m = behaviour_log_ratio.detach().double().square().reshape(-1).masked_fill(~flat_mask, -1.0)
    values, order = m.sort(descending=True, stable=True)  # tokens out of the mask sort last (as -1)
    values = values.clamp(min=0.0)
    n, positions = flat_mask.sum(), torch.arange(m.numel(), device=m.device)
    suffix_mean = values.flip(0).cumsum(0).flip(0) / (n - positions).clamp(min=1)
    below = (suffix_mean <= tau) & (positions < n)
    masked = torch.minimum((~below).long().cumprod(0).sum(), n - 1)  # how many of the largest go
    ranks = torch.empty_like(order).scatter_(0, order, positions)
    return (flat_mask & (ranks >= masked)).view_as(mask)


def vespo_weights(behaviour_log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, *,
                  k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
                  lambda_neg: float = 2.0) -> torch.Tensor:
    """VESPO's sequence weights `phi(w) = exp(lambda + k log w - lambda w)` (B,), detached, with `w = exp(sum_t
    behaviour_log_ratio)` over the scored tokens (each token's log-ratio clamped to +-20, log w to [log 1e-8, 20])
    and `(k, lambda)` by the sign of each row's advantage (>= 0: the `pos` pair). phi(1) = 1; phi peaks at
    w = k / lambda.

    Example (the defaults): a row of advantage > 0 with token log-ratios [0.1, -0.3] has log w = -0.2, w = 0.8187,
    phi = exp(3 + 2 (-0.2) - 3 x 0.8187) = exp(0.1438) = 1.1547; with advantage < 0, phi = exp(2 - 0.6 - 1.6375) =
    0.7886."""
    log_ratio = behaviour_log_ratio.detach().double().clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    log_w = (log_ratio * mask).sum(-1).clamp(LOG_W_MIN, LOG_RATIO_MAX)
    positive = advantages.to(log_w.device) >= 0
    k = torch.where(positive, k_pos, k_neg).double()
    lam = torch.where(positive, lambda_pos, lambda_neg).double().clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def icepop_mask(behaviour_log_ratio: torch.Tensor, mask: torch.Tensor, band: tuple[float, float]) -> torch.Tensor:
    """The scored tokens whose ratio `exp(behaviour_log_ratio)` lies in `band` = [low, high] (bounds kept).

    Example: log-ratios [0, ln 3, -ln 4, ln 1.5] with band [0.5, 2] keep the first and the last."""
    ratio = torch.exp(behaviour_log_ratio.detach().double())
    return mask.bool() & (ratio >= band[0]) & (ratio <= band[1])


def geometric_mask(behaviour_log_ratio: torch.Tensor, mask: torch.Tensor, band: tuple[float, float]) -> torch.Tensor:
    """The scored tokens of the sequences whose geometric-mean token ratio `exp(mean_t behaviour_log_ratio)` over
    their scored tokens lies in `band` (bounds kept); a sequence outside it loses every token.

    Example: rows of log-ratios [0.004, 0.004] and [0.02, 0.0] with band [0.99, 1.01]: means 0.004 (ratio 1.004,
    kept) and 0.01 (ratio 1.01005, dropped)."""
    mask = mask.bool()
    n = mask.sum(-1).clamp(min=1)
    ratio = torch.exp((behaviour_log_ratio.detach().double() * mask).sum(-1) / n)
    return mask & ((ratio >= band[0]) & (ratio <= band[1]))[:, None]


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`(sum w)^2 / (n sum w^2)` over the `n` scored tokens (a masked token weighs 0): 1 when every weight is
    equal, 1/n when one token carries all. Example: w = [1, 1, 0, 2] gives 16 / (4 * 6) = 2/3."""
    w = weights.detach().double().masked_fill(~mask.bool(), 0.0)
    n = mask.sum().clamp(min=1)
    return (w.sum().square() / (n * w.square().sum()).clamp(min=1e-300)).float()


def correct(name: str, log_ratio: torch.Tensor, mask: torch.Tensor, *, humanline: bool,
            behaviour_log_ratio: torch.Tensor | None = None, staleness: torch.Tensor | None = None,
            max_staleness: int | None = None, cap: float | None = None, tau: float | None = None,
            advantages: torch.Tensor | None = None, vespo: dict | None = None,
            band: tuple[float, float] | None = None) -> Corrected:
    """Apply rule `name` (module doc) to one micro-batch.

    Args:
        log_ratio: (B, T) what the loss reads without a correction: `log pi_theta - log pi_ref` (with gradient),
            humanline-transformed when it is on.
        mask: (B, T) scored tokens.
        humanline: the ratio is humanline's: the rules keep it. Otherwise tis and decoupled take the ratio
            against pi_prox (`log_ratio - log_ratio.detach()`: 1 in value, the policy's gradient), and m2po
            against the sampler (that plus `behaviour_log_ratio`), whatever the run's reference.
        behaviour_log_ratio: (B, T) detached, `log pi_ref - log pi_behav` with humanline, `log pi_prox -
            log pi_behav` without; for tis, decoupled, m2po.
        staleness: (B,) each sample's staleness (versions between its sampler and this step), for drop.
        max_staleness, cap, tau: drop's bound, the truncation (tis: C; decoupled: optional), m2po's tau.
        advantages, vespo: (B,) the rows' advantages and `vespo_weights`' k and lambda keywords, for vespo.
        band: icepop's token band or geo_mask's sequence band on the ratio.
    Metrics (0-dim, on the device): `correction/masked` (share of the scored tokens that count for nothing),
    `correction/capped` (share whose weight was truncated), `correction/ess` (`effective_sample_size` of the
    token weights, a masked token weighing 0).
    """
    mask = mask.bool()
    if behaviour_log_ratio is not None:  # padding may hold anything: no inf weight may meet a zero gradient
        behaviour_log_ratio = behaviour_log_ratio.detach().masked_fill(~mask, 0.0)
    n = mask.sum().clamp(min=1)
    out = Corrected(log_ratio)
    capped = torch.zeros_like(mask)
    own_gradient = log_ratio - log_ratio.detach()  # 0 in value: the ratio pi_theta / pi_prox
    if name == "drop":
        out.keep = staleness_mask(staleness, max_staleness, mask)
    elif name in WEIGHTED:
        out.weights, capped = behaviour_weights(behaviour_log_ratio, cap)
        # a float32 weight past its largest value would be inf, and inf x 0 (a masked token) nan
        out.weights = out.weights.clamp(max=torch.finfo(log_ratio.dtype).max).to(log_ratio.dtype)
        if not humanline:
            out.log_ratio = own_gradient
    elif name == "m2po":
        out.keep = m2po_mask(behaviour_log_ratio, mask, tau)
        if not humanline:  # M2PO's own loss: the unclipped ratio to the sampler
            out.log_ratio, out.clip = own_gradient + behaviour_log_ratio.to(log_ratio.dtype), False
    elif name == "vespo":
        phi = vespo_weights(behaviour_log_ratio, mask, advantages, **(vespo or {}))
        out.weights = phi[:, None].expand_as(log_ratio).to(log_ratio.dtype)
        if not humanline:  # VESPO's own loss: phi x A x grad log pi_theta, no clip
            out.log_ratio, out.clip = own_gradient, False
    elif name in MASKED:
        out.keep = (icepop_mask if name == "icepop" else geometric_mask)(behaviour_log_ratio, mask, band)
        if not humanline:
            out.log_ratio = own_gradient
    elif name != "none":
        raise ValueError(f"correct: unknown correction {name!r} (expected one of {', '.join(CORRECTIONS)})")
    keep = mask if out.keep is None else out.keep
    weights = keep.to(log_ratio.dtype) if out.weights is None else out.weights.masked_fill(~keep, 0.0)
    out.metrics = {"correction/masked": (mask & ~keep).sum().float() / n,
                   "correction/capped": (capped & keep).sum().float() / n,
                   "correction/ess": effective_sample_size(weights, mask)}
    return out
