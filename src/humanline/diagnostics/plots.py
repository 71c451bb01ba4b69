"""Figures of the diagnostics (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from humanline.core.prospect import capacity


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_logp_histogram(sides: dict[str, np.ndarray], record_summary: dict, path: Path, title: str) -> Path:
    """Histogram of completion average token log-probs, one colour per side, record quartiles as lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    finite = {side: v[np.isfinite(v)] for side, v in sides.items()}
    pooled = np.concatenate([v for v in finite.values()]) if finite else np.array([])
    bins = np.histogram_bin_edges(pooled, bins=min(50, max(5, int(np.sqrt(max(1, pooled.size)))))) \
        if pooled.size else 10
    for side, values in finite.items():
        ax.hist(values, bins=bins, alpha=0.55, label=f"{side} ({values.size})")
    for key, style in (("q25", ":"), ("q50", "--"), ("q75", ":")):
        if key in record_summary:
            ax.axvline(record_summary[key], color="black", linestyle=style, linewidth=1,
                       label=f"record {key} = {record_summary[key]:.3f}")
    ax.set_xlabel("average token log-prob under the model (nats)")
    ax.set_ylabel("completions")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_perception(comparisons: list, z_by_source: dict[str, np.ndarray], weights: np.ndarray, gamma: float,
                    path: Path, title: str) -> Path:
    """Left: implied capacity curve of each Q beside the human curve Omega(a; gamma) (the paper's Figure 2).
    Right: the outcome distributions, with omega (the policy sample reweighted by the decision weights)."""
    import torch

    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.5))
    a = np.linspace(0.0, 1.0, 201)
    human = capacity(torch.as_tensor(a), gamma=gamma).numpy()
    left.plot(a, human, color="black", linewidth=2, label=f"human Omega(a; {gamma:g})")
    left.plot(a, a, color="gray", linewidth=0.8, linestyle=":")
    for comp in comparisons:
        left.step(comp.curve_x, comp.curve_y, where="post", linewidth=1.4,
                  label=f"{comp.name}: KL {comp.kl:.3f}, gamma* {comp.implied_gamma:.2f}")
    left.set_xlabel("objective P_policy(Z >= t)")
    left.set_ylabel("P_Q(Z >= t)")
    left.set_xlim(0, 1)
    left.set_ylim(0, 1)
    # Below the axes: inside, it would hide the curves (they can pass through any corner).
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    left.set_title("implied capacity of each sampling distribution", fontsize=10)

    pooled = np.concatenate(list(z_by_source.values()))
    edges = np.histogram_bin_edges(pooled, bins=40) if np.ptp(pooled) > 0 else 10
    policy = z_by_source.get("on-policy")
    if policy is not None:
        right.hist(policy, bins=edges, weights=weights, histtype="step", color="black", linewidth=2,
                   label="omega (perceived)")
    for name, z in z_by_source.items():
        right.hist(z, bins=edges, weights=np.full(len(z), 1.0 / max(1, len(z))), histtype="step", label=name)
    right.set_xlabel("outcome z = log pi_P(y|x) - log pi_R(y|x)")
    right.set_ylabel("probability")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    right.set_title("outcome distributions", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
