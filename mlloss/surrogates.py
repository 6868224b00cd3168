"""The surrogates phi(t) of the mis-ranking indicator 1(t <= 0), t = s_i - s_j, for the PyTorch
tier (loss spec, table). The Triton tier's twin is ``mlloss.kernels._common.reverse_margin_terms``.

Every path computes its gradient in the forward pass, so a surrogate is given with its slope:
``surrogate_value_and_pull`` takes the *reverse margin* x = -t = s_j - s_i and returns
(phi(t), -dphi/dt), the "pull" that raises the upper item and lowers the lower one:

* logistic     phi = log(1 + exp(x)) = logaddexp(0, x),  pull = sigmoid(x)
* hinge        phi = max(0, m + x),                     pull = 1 where m + x > 0 (0 at the kink)
* squared      phi = (m + x)^2,                         pull = 2 (m + x)
* exponential  phi = exp(x),                            pull = exp(x)

The logistic value is exact in float64 for every x (``logaddexp``, not ``softplus``, whose
threshold returns x itself past x = 20 and drops up to 2e-9 per pair).
"""

from __future__ import annotations

import torch
from torch import Tensor

NAMES = ("logistic", "hinge", "squared", "exponential")


def surrogate_value_and_pull(reverse_margin: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """(phi(t), -dphi/dt) for reverse margins x = -t = s_j - s_i (see the module docstring)."""
    if surrogate == "logistic":
        return torch.logaddexp(reverse_margin, reverse_margin.new_zeros(())), torch.sigmoid(reverse_margin)
    if surrogate == "exponential":
        value = torch.exp(reverse_margin)
        return value, value
    gap = margin + reverse_margin  # m - t
    if surrogate == "hinge":
        return torch.relu(gap), (gap > 0).to(gap.dtype)
    if surrogate == "squared":
        return gap.square(), 2 * gap
    raise ValueError(f"surrogate must be one of {', '.join(NAMES)}; got {surrogate!r}")
