"""The humanline transforms of token log-ratios (paper section 4; docs/method.md §3.1 and §3.3).

Each takes the token-level log-ratio `log_ratio = policy_logps - ref_logps` of shape `(B, T)` and returns a
tensor of the same shape that replaces it *upstream* of the objective. Nothing here knows about objectives.

Name mapping (paper -> here; HALOs passes the bounds as `++humanline=true ++log_epsilon_P=.. ++log_epsilon_R=..`):
    log eps_P -> `low`     (HALOs `log_epsilon_P`, default -1.0; the math recipes and "strong default" -1.5)
    log eps_R -> `high`    (HALOs `log_epsilon_R`, default  1.5)
    gamma_P   -> `gamma_p` (Beta(gamma_P, 1) of humanline sampling; authors' last setting 0.5)
    gamma_R   -> `gamma_r` (Beta(gamma_R, 1); authors' last setting 0.01)
"""

from __future__ import annotations

import math

import torch


def validate_band(low: float, high: float) -> None:
    """Check `low < 0 < high` (log eps_P < 0 < log eps_R); raise ValueError naming the bound otherwise."""
    if not (isinstance(low, (int, float)) and isinstance(high, (int, float))):
        raise ValueError(f"humanline band bounds must be numbers, got low={low!r}, high={high!r}")
    if not low < 0.0:
        raise ValueError(f"humanline band: low (log eps_P) must be < 0, got {low}")
    if not high > 0.0:
        raise ValueError(f"humanline band: high (log eps_R) must be > 0, got {high}")


def clip_log_ratio(log_ratio: torch.Tensor, *, low: float, high: float) -> torch.Tensor:
    """Humanline clipping (docs/method.md §3.1): `clamp(log_ratio, low, high)`.

    Args:
        log_ratio: `(B, T)` token log-ratios `log pi_theta(y_t) - log pi_ref(y_t)`.
        low, high: `log eps_P < 0 < log eps_R`; clipping happens in log space for precision.

    Tokens strictly outside `[low, high]` get exactly zero gradient (plain clamp, no straight-through):
    that is the rejection of Theorem 4.3 in its deterministic limit. Tokens on the boundary keep theirs.
    """
    validate_band(low, high)
    return log_ratio.clamp(min=low, max=high)


def inside_band_fraction(
    log_ratio: torch.Tensor, mask: torch.Tensor, *, low: float, high: float
) -> torch.Tensor:
    """Fraction of masked tokens with `low < log_ratio < high` strictly (HALOs logs it as "unclamped").

    Returns a 0-dim float tensor, detached; nan when the mask is empty.
    """
    mask = mask.bool()
    lr = log_ratio.detach()
    inside = (lr > low) & (lr < high) & mask
    count = mask.sum()
    if count == 0:
        return torch.tensor(float("nan"), device=log_ratio.device)
    return inside.sum().float() / count.float()


def rejection_keep_mask(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma_p: float,
    gamma_r: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Which tokens survive humanline sampling (docs/method.md §3.3; the paper's Theorem 4.3): `(B, T)` bool.

    With `r_t = exp(log_ratio_t)`, `M_P = max r`, `M_R = max 1/r` over the masked tokens, and per-token draws
    `B_P ~ Beta(gamma_p, 1)`, `B_R ~ Beta(gamma_r, 1)`, token t is rejected if `r_t < M_P * B_P` or
    `1/r_t < M_R * B_R`. So it is kept with probability `(r_t / M_P)^gamma_p * (1 / (r_t M_R))^gamma_r`.
    Beta(g, 1) has CDF `x^g`, so it is drawn as `U^(1/g)`; everything is compared in log space.
    Masked-out tokens are reported as not kept. Draws use `generator` (same device as `log_ratio`).
    """
    if not (gamma_p > 0 and gamma_r > 0):
        raise ValueError(f"humanline sampling: gamma_p and gamma_r must be > 0, got {gamma_p}, {gamma_r}")
    mask = mask.bool()
    lr = log_ratio.detach().float()
    if lr.numel() == 0:
        return mask.clone()
    # An empty mask needs no early return (a host read): the maxima are -inf, nothing is rejected, and
    # `mask & ~reject` is all false.
    lr_masked = lr.masked_fill(~mask, 0.0)
    log_m_p = lr_masked.masked_fill(~mask, -math.inf).max()  # log max r
    log_m_r = (-lr_masked).masked_fill(~mask, -math.inf).max()  # log max 1/r
    u_p = torch.rand(lr.shape, generator=generator, device=lr.device, dtype=lr.dtype)
    u_r = torch.rand(lr.shape, generator=generator, device=lr.device, dtype=lr.dtype)
    # log B = log(U) / gamma; U = 0 has probability ~0 but would give -inf, which keeps the token: fine.
    log_b_p = torch.log(u_p) / gamma_p
    log_b_r = torch.log(u_r) / gamma_r
    reject = (lr_masked < log_m_p + log_b_p) | (-lr_masked < log_m_r + log_b_r)
    return mask & ~reject


def reject_log_ratio(
    log_ratio: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma_p: float,
    gamma_r: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Humanline sampling (docs/method.md §3.3): rejected tokens keep their value but are detached (no gradient).

    Args:
        log_ratio: `(B, T)` token log-ratios; mask: `(B, T)` bool, true on trained tokens.
        gamma_p, gamma_r: Beta shape parameters (paper gamma_P, gamma_R); `gamma_p < gamma_r` favours exploitation.
        generator: a `torch.Generator` for reproducible draws.

    Replacing each Beta draw by its mean `gamma / (gamma + 1)` turns this into the deterministic keep band of
    Theorem 4.3, i.e. `clip_log_ratio` with `low = log M_P + log(gamma_p / (gamma_p + 1))` (see
    `deterministic_band`).
    """
    keep = rejection_keep_mask(log_ratio, mask, gamma_p=gamma_p, gamma_r=gamma_r, generator=generator)
    return torch.where(keep, log_ratio, log_ratio.detach())


def deterministic_band(
    log_ratio: torch.Tensor, mask: torch.Tensor, *, gamma_p: float, gamma_r: float
) -> tuple[float, float]:
    """The keep band `[low, high]` obtained when the Beta draws of `reject_log_ratio` are replaced by their
    means (Theorem 4.3): keep iff `r >= M_P * g_p/(g_p+1)` and `1/r >= M_R * g_r/(g_r+1)`, i.e.
    `low = log M_P + log(g_p/(g_p+1))` and `high = -(log M_R + log(g_r/(g_r+1)))`."""
    lr = log_ratio.detach().float()[mask.bool()]
    if lr.numel() == 0:
        raise ValueError("deterministic_band: the mask selects no token")
    low = float(lr.max()) + math.log(gamma_p / (gamma_p + 1.0))
    high = float(lr.min()) - math.log(gamma_r / (gamma_r + 1.0))
    return low, high
