"""An independent, deliberately naive re-derivation of docs/method.md §2-4, for the tests only.

Written from the text of `docs/method.md` (and the docstring contracts of the public API for the metrics,
which docs/method.md does not define), not from the package's code. Everything runs in float64 with explicit Python
loops over sequences and tokens: slow, but each line maps onto one clause of docs/method.md, so a disagreement with
the vectorised package code points at one of them. Masked-out positions are never *read*, so whatever they
hold (inf, nan) cannot matter here.

Functions return float64 tensors built from 0-dim torch scalars, so autograd works through them and gives
reference gradients.
"""

from __future__ import annotations

import math

import torch


def _f64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64)


def _v(x: torch.Tensor) -> float:
    """A Python float of a 0-dim tensor, for branching (never part of the graph)."""
    return float(x.detach())


def _neg_logsigmoid(x: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(x) = log(1 + e^-x), written in the branch that cannot overflow."""
    if _v(x) >= 0:
        return torch.log1p(torch.exp(-x))
    return -x + torch.log1p(torch.exp(x))


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def _masked_token_list(values: torch.Tensor, mask: torch.Tensor, b: int) -> list[torch.Tensor]:
    return [values[b, t] for t in range(values.shape[1]) if bool(mask[b, t])]


def _seq_sum(values: torch.Tensor, mask: torch.Tensor, b: int) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for v in _masked_token_list(values, mask, b):
        total = total + v
    return total


# ---------------------------------------------------------------------------------------------------------
# Section 3: token log-probs and the transforms
# ---------------------------------------------------------------------------------------------------------


def token_logps(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`out[b, t] = log softmax(logits[b, t])[labels[b, t + 1]]` where `mask[b, t + 1]`, else 0; `(B, L-1)`."""
    logits = _f64(logits)
    n_seq, length, _ = logits.shape
    rows = []
    for b in range(n_seq):
        row = []
        for t in range(length - 1):
            if bool(mask[b, t + 1]):
                lse = torch.logsumexp(logits[b, t], dim=0)
                row.append(logits[b, t, int(labels[b, t + 1])] - lse)
            else:
                row.append(torch.zeros((), dtype=torch.float64))
        rows.append(torch.stack(row) if row else torch.zeros(0, dtype=torch.float64))
    return torch.stack(rows)


def clip_log_ratio(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """docs/method.md §3.1: clamp to [low, high]; tokens strictly outside become constants (no gradient)."""
    lr = _f64(log_ratio)
    rows = []
    for b in range(lr.shape[0]):
        row = []
        for t in range(lr.shape[1]):
            x = lr[b, t]
            if _v(x) < low:
                row.append(torch.tensor(float(low), dtype=torch.float64))
            elif _v(x) > high:
                row.append(torch.tensor(float(high), dtype=torch.float64))
            else:
                row.append(x)
        rows.append(torch.stack(row))
    return torch.stack(rows)


def inside_band_fraction(log_ratio: torch.Tensor, mask: torch.Tensor, low: float, high: float) -> float:
    """Share of masked tokens with low < lr < high (strict); nan without masked tokens."""
    inside = count = 0
    for b in range(log_ratio.shape[0]):
        for t in range(log_ratio.shape[1]):
            if bool(mask[b, t]):
                count += 1
                inside += int(low < _v(log_ratio[b, t]) < high)
    return inside / count if count else float("nan")


def _max_ratios(log_ratio: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """M_P = max r and M_R = max 1/r over the masked tokens (docs/method.md §3.3), in ratio space."""
    ratios = [
        math.exp(_v(log_ratio[b, t]))
        for b in range(log_ratio.shape[0])
        for t in range(log_ratio.shape[1])
        if bool(mask[b, t])
    ]
    return max(ratios), max(1.0 / r for r in ratios)


def keep_probability(log_ratio: torch.Tensor, mask: torch.Tensor, gamma_p: float, gamma_r: float) -> torch.Tensor:
    """P(token kept) under docs/method.md §3.3. Beta(g, 1) has CDF x^g on [0, 1], so
    P(r >= M_P B_P) = P(B_P <= r / M_P) = (r / M_P)^g_P (r / M_P <= 1), likewise for 1/r; the draws are
    independent, so the probabilities multiply. 0 for masked-out tokens."""
    m_p, m_r = _max_ratios(log_ratio, mask)
    out = torch.zeros(log_ratio.shape, dtype=torch.float64)
    for b in range(log_ratio.shape[0]):
        for t in range(log_ratio.shape[1]):
            if bool(mask[b, t]):
                r = math.exp(_v(log_ratio[b, t]))
                out[b, t] = min(1.0, r / m_p) ** gamma_p * min(1.0, 1.0 / (r * m_r)) ** gamma_r
    return out


def deterministic_keep(log_ratio: torch.Tensor, mask: torch.Tensor, gamma_p: float, gamma_r: float) -> torch.Tensor:
    """Theorem 4.3's limit: B replaced by its mean gamma / (gamma + 1). Kept unless r < M_P * mean(B_P) or
    1/r < M_R * mean(B_R). Bool `(B, T)`, false on masked-out tokens."""
    m_p, m_r = _max_ratios(log_ratio, mask)
    b_p = gamma_p / (gamma_p + 1.0)
    b_r = gamma_r / (gamma_r + 1.0)
    out = torch.zeros(log_ratio.shape, dtype=torch.bool)
    for b in range(log_ratio.shape[0]):
        for t in range(log_ratio.shape[1]):
            if bool(mask[b, t]):
                r = math.exp(_v(log_ratio[b, t]))
                out[b, t] = not (r < m_p * b_p or 1.0 / r < m_r * b_r)
    return out


# ---------------------------------------------------------------------------------------------------------
# Section 4: objectives
# ---------------------------------------------------------------------------------------------------------


def dpo(chosen_lr, rejected_lr, chosen_mask, rejected_mask, beta: float) -> tuple[torch.Tensor, dict[str, float]]:
    """r_w = beta sum_t lr(y_w), r_l = beta sum_t lr(y_l), loss = mean_b -log sigmoid(r_w - r_l)."""
    cw, cl = _f64(chosen_lr), _f64(rejected_lr)
    n = cw.shape[0]
    losses, rw, rl = [], [], []
    for b in range(n):
        r_w = beta * _seq_sum(cw, chosen_mask, b)
        r_l = beta * _seq_sum(cl, rejected_mask, b)
        rw.append(_v(r_w))
        rl.append(_v(r_l))
        losses.append(_neg_logsigmoid(r_w - r_l))
    loss = sum(losses[1:], losses[0]) / n
    margins = [w - l for w, l in zip(rw, rl)]
    metrics = {
        "rewards/chosen": sum(rw) / n,
        "rewards/rejected": sum(rl) / n,
        "rewards/margin": sum(margins) / n,
        "rewards/accuracy": sum(m > 0 for m in margins) / n,
    }
    return loss, metrics


def kto_kl_ref(kl_lr: torch.Tensor, kl_mask: torch.Tensor) -> float:
    """z0 = max(0, mean over non-empty mismatched sequences of sum_t lr); 0 if none is non-empty."""
    sums = []
    for b in range(kl_lr.shape[0]):
        tokens = _masked_token_list(_f64(kl_lr), kl_mask, b)
        if tokens:
            sums.append(sum(_v(x) for x in tokens))
    if not sums:
        return 0.0
    return max(0.0, sum(sums) / len(sums))


def kto(lr, mask, desirable, z0: float, beta: float, w_d: float = 1.0, w_u: float = 1.0):
    """r = sum_t lr (no beta). Desirable: w_D (1 - sigmoid(beta (r - z0))); undesirable:
    w_U (1 - sigmoid(beta (z0 - r))); loss = mean over the micro-batch."""
    x = _f64(lr)
    n = x.shape[0]
    losses, rewards = [], []
    for b in range(n):
        r = _seq_sum(x, mask, b)
        rewards.append(_v(r))
        if bool(desirable[b]):
            losses.append(w_d * (1.0 - _sigmoid(beta * (r - z0))))
        else:
            losses.append(w_u * (1.0 - _sigmoid(beta * (z0 - r))))
    loss = sum(losses[1:], losses[0]) / n
    des = [beta * r for r, d in zip(rewards, desirable) if bool(d)]
    und = [beta * r for r, d in zip(rewards, desirable) if not bool(d)]
    metrics = {
        "kl_ref": z0,
        "rewards/accuracy": sum((r > z0) == bool(d) for r, d in zip(rewards, desirable)) / n,
    }
    if des:
        metrics["rewards/desirable"] = sum(des) / len(des)
    if und:
        metrics["rewards/undesirable"] = sum(und) / len(und)
    return loss, metrics


def group_advantages(rewards, group_ids, eps: float = 0.01) -> list[float]:
    """A_i = (s_i - mean_g s) / (std_g s + eps), population std (divide by the group size)."""
    s = [_v(v) for v in rewards]
    g = [int(v) for v in group_ids]
    groups: dict[int, list[float]] = {}
    for gi, si in zip(g, s):
        groups.setdefault(gi, []).append(si)
    out = []
    for gi, si in zip(g, s):
        members = groups[gi]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))
        out.append((si - mean) / (std + eps))
    return out


def grpo(lr, mask, advantages, raw_lr=None, beta=0.0, eps_low=0.2, eps_high=0.2, reduction="token"):
    """Per token: ratio = exp(lr); surr = min(A ratio, A clamp(ratio, 1 - eps_low, 1 + eps_high));
    kl = exp(ref - pol) - (ref - pol) - 1 with ref - pol = -raw; loss_t = -surr + beta kl.
    "token": mean over all masked tokens; "sequence": mean over non-empty sequences of per-sequence means."""
    x = _f64(lr)
    raw = x if raw_lr is None else _f64(raw_lr)
    per_seq: list[list[torch.Tensor]] = []
    kls, ratios, clipped = [], [], 0
    for b in range(x.shape[0]):
        a = _v(advantages[b])
        row = []
        for t in range(x.shape[1]):
            if not bool(mask[b, t]):
                continue
            ratio = torch.exp(x[b, t])
            lo, hi = 1.0 - eps_low, 1.0 + eps_high
            clamped = ratio if lo <= _v(ratio) <= hi else torch.tensor(min(max(_v(ratio), lo), hi), dtype=torch.float64)
            unclipped_term, clipped_term = a * ratio, a * clamped
            if _v(clipped_term) < _v(unclipped_term):
                surr = clipped_term
                clipped += 1
            else:
                surr = unclipped_term
            d = -raw[b, t]  # ref - pol
            kl = torch.exp(d) - d - 1.0
            row.append(-surr + beta * kl)
            kls.append(_v(kl))
            ratios.append(_v(ratio))
        per_seq.append(row)
    n_tok = sum(len(r) for r in per_seq)
    zero = torch.zeros((), dtype=torch.float64)
    if reduction == "token":
        total = zero
        for row in per_seq:
            for v in row:
                total = total + v
        loss = total / max(n_tok, 1)
    else:
        means = [sum(row[1:], row[0]) / len(row) for row in per_seq if row]
        loss = sum(means[1:], means[0]) / len(means) if means else zero
    metrics = {
        "kl": sum(kls) / max(n_tok, 1),
        "ratio": sum(ratios) / max(n_tok, 1),
        "clip_fraction": clipped / max(n_tok, 1),
        "advantage_mean": sum(_v(a) for a in advantages) / len(advantages),
    }
    return loss, metrics


# ---------------------------------------------------------------------------------------------------------
# Section 2: prospect theory
# ---------------------------------------------------------------------------------------------------------


def value(z: float, alpha: float, lam: float, z0: float) -> float:
    """v(z) = (z - z0)^alpha for z >= z0, -lam (z0 - z)^alpha otherwise."""
    return (z - z0) ** alpha if z >= z0 else -lam * (z0 - z) ** alpha


def capacity(a: float, gamma: float) -> float:
    """Omega+(a) = a^g / (a^g + (1 - a)^g)^(1/g)."""
    return a**gamma / (a**gamma + (1.0 - a) ** gamma) ** (1.0 / gamma)


def decision_weights(outcomes: list[float], gamma: float) -> list[float]:
    """Cumulative prospect theory on N equally likely outcomes: the tie class of x gets
    Omega(P(X >= x)) - Omega(P(X > x)), shared equally among its members."""
    n = len(outcomes)
    out = []
    for x in outcomes:
        at_least = sum(1 for y in outcomes if y >= x) / n
        above = sum(1 for y in outcomes if y > x) / n
        ties = sum(1 for y in outcomes if y == x)
        out.append((capacity(at_least, gamma) - capacity(above, gamma)) / ties)
    return out
