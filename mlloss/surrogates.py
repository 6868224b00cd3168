"""The surrogates phi(t) of the mis-ranking indicator 1(t <= 0), t = s_i - s_j: the one table of
their names and the PyTorch tier's formulas (loss spec, table). The Triton tier's twin is
``mlloss.kernels._common.reverse_margin_terms``, which branches on a surrogate's index in
``NAMES``; ``tests/reference.py`` holds the float64 brute-force formulas the tiers are tested
against. Adding a surrogate: a ``Surrogate`` row in ``TABLE`` here, a branch there, a formula in
the reference (docs/architecture.md).

Every path computes its gradient in the forward pass, so a surrogate is given with its slope, as
functions of the *reverse margin* x = -t = s_j - s_i: phi(t) and the "pull" -dphi/dt, which
raises the upper item and lowers the lower one. Surrogates with a margin m are functions of the
gap z = m + x = m - t; the others of z = x:

* logistic     phi = log(1 + exp(z)) = logaddexp(z, 0),  pull = sigmoid(z)
* hinge        phi = max(0, z),  z = m + x,               pull = 1 where z > 0 (0 at the kink)
* squared      phi = z^2,        z = m + x,               pull = 2 z
* exponential  phi = exp(z),                              pull = exp(z)

The logistic value is exact in float64 for every x (``logaddexp``, not ``softplus``, whose
threshold returns x itself past x = 20 and drops up to 2e-9 per pair).

Each formula takes an optional ``out`` buffer: the blocked all-pairs path (``ops.allpairs``)
writes a tile's values into one reused buffer, sums them, then writes the pulls over them
(``tile_sum_and_pull``), with the same arithmetic as ``surrogate_value_and_pull``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Optional

import torch
from torch import Tensor


class Surrogate(NamedTuple):
    """One surrogate: phi and -dphi/dt as functions of z (see the module docstring)."""

    name: str
    uses_margin: bool  # z = m + x (else z = x)
    value: Callable[[Tensor, Optional[Tensor]], Tensor]  # (z, out) -> phi
    pull: Callable[[Tensor, Tensor, Optional[Tensor]], Tensor]  # (z, phi, out) -> -dphi/dt; out may hold phi


def _logistic_value(z: Tensor, out: Tensor | None) -> Tensor:
    return torch.logaddexp(z, z.new_zeros(()), out=out)


def _exp(z: Tensor, out: Tensor | None) -> Tensor:
    return torch.exp(z, out=out)


# The order is the kernels' surrogate ids: append, do not reorder.
TABLE: tuple[Surrogate, ...] = (
    Surrogate("logistic", False, _logistic_value, lambda z, value, out: torch.sigmoid(z, out=out)),
    Surrogate("hinge", True, lambda z, out: torch.clamp(z, min=0, out=out), lambda z, value, out: torch.gt(z, 0, out=out)),
    Surrogate("squared", True, lambda z, out: torch.square(z, out=out), lambda z, value, out: torch.mul(z, 2, out=out)),
    Surrogate("exponential", False, _exp, lambda z, value, out: value),
)
NAMES: tuple[str, ...] = tuple(row.name for row in TABLE)
BY_NAME: dict[str, Surrogate] = {row.name: row for row in TABLE}
USES_MARGIN: tuple[str, ...] = tuple(row.name for row in TABLE if row.uses_margin)


def lookup(surrogate: str) -> Surrogate:
    try:
        return BY_NAME[surrogate]
    except KeyError:
        raise ValueError(f"surrogate must be one of {', '.join(map(repr, NAMES))}; got {surrogate!r}") from None


def surrogate_value_and_pull(reverse_margin: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """(phi(t), -dphi/dt) for reverse margins x = -t = s_j - s_i (see the module docstring)."""
    row = lookup(surrogate)
    z = margin + reverse_margin if row.uses_margin else reverse_margin
    value = row.value(z, None)
    pull = row.pull(z, value, None)
    return value, pull.to(z.dtype) if pull.dtype == torch.bool else pull


def surrogate_value_and_pull_(reverse_margin: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """``surrogate_value_and_pull`` with x overwritten by the pulls (no temporary beside the
    value's; the same arithmetic, so the same bits). The pull may be the value tensor itself (the
    exponential's): a caller that scales both in place checks ``pull is value``."""
    row = lookup(surrogate)
    z = reverse_margin.add_(margin) if row.uses_margin else reverse_margin
    value = row.value(z, None)
    return value, row.pull(z, value, z)


def tile_sum_and_pull(reverse_margin: Tensor, work: Tensor, surrogate: str, margin: float) -> tuple[Tensor, Tensor]:
    """(sum of phi over a tile, -dphi/dt per pair) from x = s_j - s_i, written into ``work`` (a
    buffer of x's shape and dtype, which holds the pulls afterwards); x may be overwritten. The
    same arithmetic as ``surrogate_value_and_pull``, without a temporary per tile."""
    row = lookup(surrogate)
    z = reverse_margin.add_(margin) if row.uses_margin else reverse_margin
    value = row.value(z, work)
    value_sum = value.sum()
    return value_sum, row.pull(z, value, work)
