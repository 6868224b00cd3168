"""Float64 brute-force references for every loss: explicit loops over groups, every pair formed.

Written from docs/loss-spec.md alone and sharing no code with mlloss, so that agreement between the
two is evidence, not tautology. Slow on purpose: use with N up to a few hundred.
"""

from __future__ import annotations

import torch
from torch import Tensor


def phi(t: Tensor, surrogate: str, margin: float = 1.0) -> Tensor:
    if surrogate == "logistic":
        return torch.log1p(torch.exp(-t)) if t.abs().max() < 30 else torch.nn.functional.softplus(-t)
    if surrogate == "hinge":
        return torch.relu(margin - t)
    if surrogate == "squared":
        return (margin - t) ** 2
    if surrogate == "exponential":
        return torch.exp(-t)
    raise ValueError(surrogate)


def _group_ids(groups: Tensor | None, n: int) -> list[Tensor]:
    if groups is None:
        return [torch.arange(n)]
    return [torch.nonzero(groups == u).flatten() for u in torch.unique(groups)]


def _reduce(per_group: list[Tensor], reduction: str, like: Tensor) -> Tensor:
    if not per_group:
        return like.sum() * 0
    stacked = torch.stack(per_group)
    return stacked.mean() if reduction == "mean" else stacked.sum()


def pair_loss(scores, levels, groups=None, *, cost="uniform", surrogate="logistic", margin=1.0,
              reduction="mean") -> Tensor:
    """sum_P c_ij phi(s_i - s_j) / sum_P c_ij per group, P = {level_i > level_j}, then reduced."""
    per_group = []
    for idx in _group_ids(groups, scores.shape[0]):
        s, v = scores[idx], levels[idx].to(torch.float64)
        upper = v[:, None] > v[None, :]
        c = (v[:, None] - v[None, :]) if cost == "linear" else torch.ones_like(v[:, None] - v[None, :])
        c = torch.where(upper, c, torch.zeros_like(c))
        if c.sum() == 0:
            continue
        t = s[:, None] - s[None, :]
        per_group.append((c * torch.where(upper, phi(t, surrogate, margin), torch.zeros_like(t))).sum() / c.sum())
    return _reduce(per_group, reduction, scores)


def hardest_loss(scores, levels, groups=None, *, cost="uniform", surrogate="logistic", margin=1.0,
                 reduction="mean", temperature=None) -> Tensor:
    """Per group: sum_{l > l'} c(l, l') phi(min_l s - max_l' s) / sum c(l, l')."""
    per_group = []
    for idx in _group_ids(groups, scores.shape[0]):
        s, v = scores[idx], levels[idx].to(torch.float64)
        present = torch.unique(v)
        num, den = scores.sum() * 0, 0.0
        for a in present:
            for b in present:
                if a <= b:
                    continue
                hi, lo = s[v == a], s[v == b]
                if temperature is None:
                    low_hi, high_lo = hi.min(), lo.max()
                else:
                    tau = temperature
                    low_hi = -tau * torch.log(torch.mean(torch.exp(-hi / tau)))
                    high_lo = tau * torch.log(torch.mean(torch.exp(lo / tau)))
                c = float(a - b) if cost == "linear" else 1.0
                num = num + c * phi(low_hi - high_lo, surrogate, margin)
                den += c
        if den > 0:
            per_group.append(num / den)
    return _reduce(per_group, reduction, scores)


def loa_loss(scores, labels, groups=None, weights=None, **options) -> Tensor:
    labels = labels.reshape(labels.shape[0], -1)
    weights = torch.ones(labels.shape[1], dtype=torch.float64) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    fn = hardest_loss if options.pop("pairs", "all") == "hardest" else pair_loss
    return sum(float(weights[k]) * fn(scores, labels[:, k], groups, **options) for k in range(labels.shape[1]))


def laa_loss(scores, labels, groups=None, weights=None, cost="linear", **options) -> Tensor:
    labels = labels.reshape(labels.shape[0], -1).to(torch.float64)
    weights = torch.ones(labels.shape[1], dtype=torch.float64) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    fn = hardest_loss if options.pop("pairs", "all") == "hardest" else pair_loss
    return fn(scores, labels @ weights, groups, cost=cost, **options)
