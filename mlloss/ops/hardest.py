"""Max-violation pairs (DAOM / PDAOM, Sun et al. Eq. 5-6) and their soft version, O(N).

Per group u and every pair of levels a > b present in u, the hardest pair is
(min score at level a) against (max score at level b); the group's loss is
sum_{a > b} c_ab * phi(min_a - max_b) / sum_{a > b} c_ab (loss spec, "Max-violation variants").
With ``temperature`` tau the min and max become log-mean-exp:
softmin = -tau * log(mean exp(-s / tau)), softmax = tau * log(mean exp(s / tau)).

The hard version's gradient goes to the argmin / argmax items; tied extremes share it equally
(see ``layout.segment_extreme``), which is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..surrogates import surrogate_value
from .layout import OrdinalLayout, dense_cells, segment_extreme, segment_logsumexp


def hardest_pair_loss(
    scores: Tensor,
    layout: OrdinalLayout,
    cost_matrix: Tensor,
    surrogate: str,
    margin: float,
    reduction: str,
    temperature: float | None,
) -> tuple[Tensor, Tensor]:
    """(loss, number of groups with a valid level pair) for scores sorted by the layout."""
    lowest, highest = _cell_extremes(scores, layout.cell_lengths, temperature)
    cell_min = dense_cells(layout, lowest, 0.0)
    cell_max = dense_cells(layout, highest, 0.0)
    present = layout.counts > 0
    pair_cost = torch.where(present[:, :, None] & present[:, None, :], cost_matrix, 0.0)
    # Margins of absent level pairs are set to 0 before phi so that no inf (and no NaN gradient
    # through torch.where) can come from them.
    margins = torch.where(pair_cost > 0, cell_min[:, :, None] - cell_max[:, None, :], 0.0)
    per_pair = torch.where(pair_cost > 0, surrogate_value(margins, surrogate, margin), 0.0)
    normaliser = pair_cost.sum((1, 2))
    has_pairs = normaliser > 0
    per_group = (pair_cost * per_pair).sum((1, 2)) / torch.where(has_pairs, normaliser, 1.0)
    num_groups = has_pairs.sum()
    loss = per_group.sum()
    if reduction == "mean":
        loss = loss / num_groups.clamp(min=1)
    return loss, num_groups


def _cell_extremes(scores: Tensor, lengths: Tensor, temperature: float | None) -> tuple[Tensor, Tensor]:
    """(min, max) of the scores in each cell, or their log-mean-exp versions."""
    if temperature is None:
        return segment_extreme(scores, lengths, "min"), segment_extreme(scores, lengths, "max")
    log_count = torch.log(lengths.to(scores.dtype))
    softmin = -temperature * (segment_logsumexp(-scores / temperature, lengths) - log_count)
    softmax = temperature * (segment_logsumexp(scores / temperature, lengths) - log_count)
    return softmin, softmax

