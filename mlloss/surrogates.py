"""Surrogates phi(t) of the mis-ranking indicator 1(t <= 0), t = s_i - s_j (loss spec, table).

Two forms are provided: ``surrogate_value`` is differentiable by autograd (used by the O(N)
paths), and ``surrogate_value_and_pull`` returns phi and -dphi/dt together for the fused
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


def surrogate_value_and_pull(reverse_margin: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """(phi(t), -dphi/dt) for a tile of reversed margins r = -t = s_j - s_i, in two passes.

    The fused all-pairs path works with r because both outputs are then single vectorised calls
    (``softplus(r)`` and ``sigmoid(r)`` for the logistic surrogate); -dphi/dt is the "pull" that
    raises the upper item's score and lowers the lower item's.
    """
    if surrogate == "logistic":
        return torch.nn.functional.softplus(reverse_margin), torch.sigmoid(reverse_margin)
    if surrogate == "exponential":
        value = torch.exp(reverse_margin)
        return value, value
    gap = margin + reverse_margin  # m - t
    if surrogate == "hinge":
        return torch.relu(gap), (gap > 0).to(gap.dtype)  # subgradient 0 at the kink
    if surrogate == "squared":
        return gap.square(), 2 * gap
    raise ValueError(f"unknown surrogate {surrogate!r}")
