"""Surrogates phi(t) of the mis-ranking indicator 1(t <= 0), t = s_i - s_j (loss spec, table).

Two forms are provided: ``surrogate_value`` is differentiable by autograd (used by the O(N)
paths), and ``surrogate_value_and_slope`` returns phi and dphi/dt together for the fused
all-pairs path, which computes its gradient in the forward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def surrogate_value(t: Tensor, surrogate: str, margin: float) -> Tensor:
    """phi(t), differentiable by autograd."""
    if surrogate == "logistic":
        return F.softplus(-t)  # log(1 + exp(-t)) without overflow
    if surrogate == "hinge":
        return F.relu(margin - t)  # subgradient 0 at the kink t == margin
    if surrogate == "squared":
        return (margin - t).square()
    if surrogate == "exponential":
        return torch.exp(-t)
    raise ValueError(f"unknown surrogate {surrogate!r}")


def surrogate_value_and_slope(t: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """(phi(t), dphi/dt) for a tile of pair margins, each from one transcendental pass."""
    if surrogate == "logistic":
        # dphi/dt = -sigmoid(-t) = -exp(-softplus(t)) = -exp(-(t + softplus(-t))): one more exp,
        # accurate in both tails because softplus is.
        value = F.softplus(-t)
        return value, -torch.exp(-(t + value))
    if surrogate == "hinge":
        gap = margin - t
        active = gap > 0
        return torch.where(active, gap, torch.zeros_like(gap)), -active.to(t.dtype)
    if surrogate == "squared":
        gap = margin - t
        return gap.square(), -2 * gap
    if surrogate == "exponential":
        value = torch.exp(-t)
        return value, -value
    raise ValueError(f"unknown surrogate {surrogate!r}")
