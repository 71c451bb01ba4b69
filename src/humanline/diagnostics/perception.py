"""`inspect perception`: how far is a sampling distribution from the human-perceived one? (docs/method.md §2)

Outcomes are sequence log-ratios `z = log pi_P(y|x) - log pi_R(y|x)`. The perceived distribution `omega` puts
the cumulative-prospect-theory decision weights (`humanline.core.prospect.decision_weights`) on the policy's
own samples: ranked best first, the i-th of N gets `Omega(i/N) - Omega((i-1)/N)`. A candidate sampling
distribution Q is an unweighted sample of outcomes (on-policy samples, an offline dataset, another model).

KL(omega || Q) is estimated with histograms on shared bins (docs/perception.md):
- bins: quantiles of the pooled outcomes of every source, so each bin holds about the same share of all
  outcomes; bins are right-closed, the outer ones open-ended; repeated edges (tied outcomes) are merged.
- masses: omega's mass in a bin is the sum of the decision weights of the policy samples in it, Q's the share
  of its samples in it; both are smoothed with `alpha` pseudo-counts per bin,
  `p_k = (n * mass_k + alpha) / (n + K * alpha)`, n the source's sample count, so an empty bin of Q does not
  make the divergence infinite.
- interval: percentile bootstrap, resampling policy outcomes and Q outcomes independently (jointly when Q is
  the on-policy sample itself), recomputing the decision weights, with the bins held fixed.
Binning can only lose information, so the binned KL is below the KL of the underlying distributions (data
processing inequality), and the Proposition 3.4 bound computed from it is optimistic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from humanline.core.prospect import capacity, decision_weights, value_function


def perceived_weights(z_policy: torch.Tensor, gamma: float) -> torch.Tensor:
    """`(N,)` float64 weights of omega on the policy's N outcomes: sum to 1, uniform when gamma = 1."""
    return decision_weights(z_policy, gamma=gamma)


def quantile_edges(pooled: torch.Tensor, bins: int) -> torch.Tensor:
    """Interior bin edges `(<= bins - 1,)`: the `k / bins` quantiles of `pooled`, repeated values merged."""
    if bins < 1:
        raise ValueError(f"quantile_edges: bins must be >= 1, got {bins}")
    if bins == 1 or pooled.numel() == 0:
        return torch.empty(0, dtype=torch.float64)
    levels = torch.arange(1, bins, dtype=torch.float64) / bins
    edges = torch.quantile(pooled.double().flatten(), levels)
    edges = torch.unique(edges)  # sorted; ties in the data give repeated quantiles
    return edges[edges < pooled.max()] if edges.numel() else edges  # an edge at the maximum leaves an empty bin


def default_bins(*sample_sizes: int, cap: int = 20) -> int:
    """About sqrt(n) bins for the smallest sample, between 2 and `cap`: every source gets a few samples per bin."""
    return int(min(cap, max(2, round(math.sqrt(max(1, min(sample_sizes)))))))


def bin_masses(z: torch.Tensor, weights: torch.Tensor | None, edges: torch.Tensor) -> torch.Tensor:
    """`(len(edges) + 1,)` total weight per right-closed bin (`weights=None` means uniform 1/n)."""
    z = z.double().flatten()
    w = torch.full_like(z, 1.0 / max(1, z.numel())) if weights is None else weights.double().flatten()
    index = torch.bucketize(z, edges.double(), right=False)  # edges[i-1] < z <= edges[i] -> bin i
    return torch.zeros(edges.numel() + 1, dtype=torch.float64).index_add_(0, index, w)


def smoothed(masses: torch.Tensor, n: int, alpha: float) -> torch.Tensor:
    """Additive smoothing of a distribution estimated from n samples: `(n * m_k + alpha) / (n + K * alpha)`."""
    return (n * masses + alpha) / (n + masses.numel() * alpha)


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> float:
    """`sum_k p_k log(p_k / q_k)` in nats (0 log 0 = 0; infinite when q_k = 0 < p_k)."""
    p, q = p.double(), q.double()
    support = p > 0
    if bool((q[support] <= 0).any()):
        return math.inf
    return float((p[support] * (p[support].log() - q[support].log())).sum().clamp(min=0.0))


def histogram_kl(z_p: torch.Tensor, w_p: torch.Tensor | None, z_q: torch.Tensor, w_q: torch.Tensor | None,
                 edges: torch.Tensor, alpha: float = 0.5) -> float:
    """Binned KL(P || Q) of two weighted samples of outcomes on shared `edges` (see the module docstring)."""
    p = smoothed(bin_masses(z_p, w_p, edges), z_p.numel(), alpha)
    q = smoothed(bin_masses(z_q, w_q, edges), z_q.numel(), alpha)
    return kl_divergence(p, q)


def sample_kl_same_support(weights: torch.Tensor) -> float:
    """KL(omega || uniform) on the policy sample itself, no bins: `sum_i w_i log(N w_i)`.

    As N grows this tends to `integral_0^1 Omega'(a) log Omega'(a) da`, a constant of gamma alone (0.338
    nats at gamma = 0.61, 0.801 at gamma = 0.5): the price of using on-policy samples instead of the perceived
    distribution.
    """
    return kl_divergence(weights, torch.full_like(weights.double(), 1.0 / weights.numel()))


def bootstrap_kl(z_policy: torch.Tensor, z_q: torch.Tensor | None, *, gamma: float, edges: torch.Tensor,
                 alpha: float = 0.5, resamples: int = 200, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of `histogram_kl(omega, Q)`; `z_q=None` means Q is the on-policy sample."""
    if resamples < 1:
        return (math.nan, math.nan)
    generator = torch.Generator().manual_seed(seed)
    values = []
    for _ in range(resamples):
        idx = torch.randint(len(z_policy), (len(z_policy),), generator=generator)
        zp = z_policy[idx]
        zq = zp if z_q is None else z_q[torch.randint(len(z_q), (len(z_q),), generator=generator)]
        values.append(histogram_kl(zp, perceived_weights(zp, gamma), zq, None, edges, alpha))
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(np.array(values), [tail, 1.0 - tail])
    return float(lo), float(hi)


def implied_capacity(z_policy: torch.Tensor, z_q: torch.Tensor, w_q: torch.Tensor | None = None,
                     max_points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Q's decumulative probability against the policy's, at the policy's outcome thresholds (Figure 2).

    For thresholds t running down the distinct policy outcomes, x(t) = P_policy(Z >= t) (objective) and
    y(t) = P_Q(Z >= t). On-policy samples give the diagonal, the perceived distribution gives the human curve
    Omega(x; gamma). The curve starts at (0, 0) and ends at (1, 1): Q's mass above (below) every policy outcome
    shows as a vertical jump at x = 0 (x = 1). At most `max_points` thresholds (evenly spaced ranks) are kept.
    """
    zp = z_policy.double().flatten()
    zq = z_q.double().flatten()
    wq = torch.full_like(zq, 1.0 / max(1, zq.numel())) if w_q is None else w_q.double().flatten()
    thresholds = torch.unique(zp).flip(0)  # descending
    if thresholds.numel() > max_points:
        keep = torch.linspace(0, thresholds.numel() - 1, max_points).round().long()
        thresholds = thresholds[keep]
    x = (zp[None, :] >= thresholds[:, None]).double().mean(dim=1)
    y = ((zq[None, :] >= thresholds[:, None]).double() * wq[None, :]).sum(dim=1)
    x = torch.cat([torch.zeros(1, dtype=torch.float64), x, torch.ones(1, dtype=torch.float64)])
    y = torch.cat([torch.zeros(1, dtype=torch.float64), y.clamp(0.0, 1.0), torch.ones(1, dtype=torch.float64)])
    return x.numpy(), y.numpy()


def fit_gamma(x: np.ndarray, y: np.ndarray, grid: np.ndarray | None = None) -> float:
    """The gamma whose capacity `Omega(x; gamma)` is closest to the curve (x, y) in mean squared error.

    A one-number summary of an implied capacity curve: 1 is the diagonal (objective), < 1 inverse-S.
    """
    grid = np.round(np.arange(0.05, 3.0001, 0.01), 2) if grid is None else grid
    xs = torch.as_tensor(x, dtype=torch.float64)
    ys = torch.as_tensor(y, dtype=torch.float64)
    errors = [float(((capacity(xs, gamma=float(g)) - ys) ** 2).mean()) for g in grid]
    return float(grid[int(np.argmin(errors))])


def proposition_bound(kl: float, value_bound: float) -> float:
    """Proposition 3.4 (Pinsker): `|u(Z; omega) - u(Z; Q)| <= sqrt(2) * ||v||_inf * sqrt(KL(omega || Q))`."""
    return math.sqrt(2.0) * value_bound * math.sqrt(max(kl, 0.0))


@dataclass
class Comparison:
    """KL(omega || Q) for one candidate Q, with its interval, the utility bound and the implied capacity."""

    name: str
    n: int
    kl: float
    kl_low: float
    kl_high: float
    bound: float
    bound_high: float
    utility: float
    utility_gap: float
    implied_gamma: float
    curve_x: np.ndarray
    curve_y: np.ndarray

    def to_json(self) -> dict:
        """JSON-ready summary (the curve is subsampled to at most 101 points to keep the file small)."""
        step = max(1, len(self.curve_x) // 100)
        return {"name": self.name, "samples": self.n, "kl": self.kl, "kl_95": [self.kl_low, self.kl_high],
                "utility_bound": self.bound, "utility_bound_95_high": self.bound_high, "utility": self.utility,
                "utility_gap": self.utility_gap, "implied_gamma": self.implied_gamma,
                "curve": {"x": self.curve_x[::step].round(4).tolist(), "y": self.curve_y[::step].round(4).tolist()}}


def compare(z_policy: torch.Tensor, candidates: dict[str, torch.Tensor | None], *, gamma: float, bins: int,
            value_bound: float | None = None, alpha: float = 0.5, resamples: int = 200,
            seed: int = 0) -> tuple[list[Comparison], dict]:
    """Compare omega (perceived, from the policy's outcomes) with every candidate Q.

    `candidates` maps a name to Q's outcomes, or to None for the on-policy sample itself. `value_bound` is
    `||v||_inf` for Proposition 3.4; None takes the largest |v(z)| over the pooled outcomes, v the
    Kahneman-Tversky value function with its default parameters (docs/method.md §2). Returns the comparisons and the
    shared settings (edges, weights summary, value bound) for the report.
    """
    z_policy = z_policy.double().flatten()
    samples = {name: (z_policy if z is None else z.double().flatten()) for name, z in candidates.items()}
    pooled = torch.cat([z_policy] + [z for name, z in samples.items() if candidates[name] is not None])
    edges = quantile_edges(pooled, bins)
    weights = perceived_weights(z_policy, gamma)
    values = value_function(pooled)
    bound_v = float(values.abs().max()) if value_bound is None else float(value_bound)
    u_omega = float((weights * value_function(z_policy)).sum())
    out = []
    for index, (name, zq) in enumerate(samples.items()):
        kl = histogram_kl(z_policy, weights, zq, None, edges, alpha)
        lo, hi = bootstrap_kl(z_policy, None if candidates[name] is None else zq, gamma=gamma, edges=edges,
                              alpha=alpha, resamples=resamples, seed=seed + index)
        x, y = implied_capacity(z_policy, zq)
        u_q = float(value_function(zq).mean())
        out.append(Comparison(name, zq.numel(), kl, lo, hi, proposition_bound(kl, bound_v),
                              proposition_bound(hi, bound_v) if math.isfinite(hi) else math.nan,
                              u_q, abs(u_omega - u_q), fit_gamma(x, y), x, y))
    shared = {"gamma": gamma, "bins": edges.numel() + 1, "edges": edges.tolist(), "smoothing_alpha": alpha,
              "bootstrap_resamples": resamples, "value_bound": bound_v,
              "value_bound_source": "given" if value_bound is not None else "max |v(z)| over pooled outcomes",
              "utility_perceived": u_omega, "kl_on_policy_unbinned": sample_kl_same_support(weights),
              "policy_samples": z_policy.numel()}
    return out, shared
