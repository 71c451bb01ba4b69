"""Prospect-theory functions (docs/method.md §2): value, capacity, and decision weights.

Used for diagnostics and documentation, never inside a training loss.
"""

from __future__ import annotations

import torch


def value_function(
    z: torch.Tensor, *, alpha: float = 0.88, lam: float = 2.25, z0: float = 0.0
) -> torch.Tensor:
    """Kahneman-Tversky value `v(z) = (z - z0)^alpha` for `z >= z0`, `-lam * (z0 - z)^alpha` otherwise.

    `alpha < 1` is risk aversion, `lam > 1` loss aversion (defaults: Tversky & Kahneman 1992 estimates).
    """
    gain = (z - z0).clamp(min=0.0)
    loss = (z0 - z).clamp(min=0.0)
    return torch.where(z >= z0, gain**alpha, -lam * loss**alpha)


def capacity(a: torch.Tensor, *, gamma: float = 0.61) -> torch.Tensor:
    """Capacity (probability weighting) `Omega+(a) = a^g / (a^g + (1 - a)^g)^(1/g)` for `a in [0, 1]`.

    Inverse-S for `gamma in (0, 1)`: over-weights small probabilities (extreme outcomes) and under-weights
    large ones; `Omega(0) = 0`, `Omega(1) = 1`, and `gamma = 1` is the identity. Near 0 it behaves like
    `a^gamma`, the CDF of Beta(gamma, 1) (the link to humanline sampling). Default 0.61: Tversky & Kahneman's
    estimate for gains.
    """
    if not gamma > 0:
        raise ValueError(f"capacity: gamma must be > 0, got {gamma}")
    a = a.clamp(0.0, 1.0)
    num = a**gamma
    return num / (num + (1.0 - a) ** gamma) ** (1.0 / gamma)


def decision_weights(outcomes: torch.Tensor, *, gamma: float = 0.61) -> torch.Tensor:
    """Rank-dependent (cumulative prospect theory) decision weights for `N` equally likely sampled outcomes.

    Outcomes are ranked best first; the i-th best gets `Omega(i / N) - Omega((i - 1) / N)`, the capacity
    applied to decumulative probabilities. Ties share their block's weight equally. The weights are
    non-negative and sum to `Omega(1) - Omega(0) = 1`, so they define the perceived distribution `omega` over
    the sample; `gamma = 1` gives back the uniform (objective) distribution.

    Args: outcomes `(N,)`. Returns `(N,)` weights in the original order.
    """
    x = outcomes.detach().double().flatten()
    n = x.numel()
    if n == 0:
        return x
    order = torch.argsort(x, descending=True, stable=True)
    ranks = torch.arange(n + 1, dtype=torch.float64, device=x.device) / n
    block = capacity(ranks[1:], gamma=gamma) - capacity(ranks[:-1], gamma=gamma)
    weights_sorted = block.clone()
    sorted_x = x[order]
    # Share weight within ties so equal outcomes get equal weight.
    _, inverse, counts = torch.unique_consecutive(sorted_x, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.numel(), dtype=torch.float64, device=x.device).index_add_(0, inverse, weights_sorted)
    weights_sorted = (sums / counts)[inverse]
    weights = torch.empty_like(weights_sorted)
    weights[order] = weights_sorted
    return weights
