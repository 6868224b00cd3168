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
        lowest, highest = [], []  # each level's min and max (or soft min and soft max) over its own items
        for a in present:
            cell = s[v == a]
            if temperature is None:
                lowest.append(cell.min())
                highest.append(cell.max())
            else:
                tau = temperature
                lowest.append(-tau * torch.log(torch.mean(torch.exp(-cell / tau))))
                highest.append(tau * torch.log(torch.mean(torch.exp(cell / tau))))
        upper, lower = torch.nonzero(present[:, None] > present[None, :], as_tuple=True)  # every level pair
        margins = torch.stack(lowest)[upper] - torch.stack(highest)[lower]
        costs = (present[upper] - present[lower]).to(margins.dtype) if cost == "linear" else torch.ones_like(margins)
        # phi's logistic branch follows the largest |t| it is given: each pair as if alone
        near = margins.abs() < 30
        num = sum(costs[part] @ phi(margins[part], surrogate, margin) for part in (near, ~near) if part.any())
        if costs.sum() > 0:
            per_group.append(num / costs.sum())
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
