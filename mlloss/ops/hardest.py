"""Max-violation pairs (DAOM / PDAOM, Sun et al. Eq. 5-6) and their soft version, O(N).

Per group u and every pair of levels a > b present in u, the hardest pair is
(min score at level a) against (max score at level b); the group's loss is
sum_{a > b} c_ab * phi(min_a - max_b) / sum_{a > b} c_ab (loss spec, "Max-violation variants").
With ``temperature`` tau the min and max become log-mean-exp:
softmin = -tau * log(mean exp(-s / tau)), softmax = tau * log(mean exp(s / tau)).
The work is O(N) plus each group's level pairs (sum_u L_u^2: a real-valued LaA label has a level
per item), which are held ``BLOCK_ELEMENTS`` at a time, never as one (L_u, L_u) table. With two
levels in the batch (every binary problem: AUC, PDAOM, each label of LoA) a group has at most one
level pair, its two cells, which are paired directly (``_one_pair_per_group``: about 100 tensor
operations a PDAOM call fewer than the tables').

``hardest_pair_loss_and_grad`` works on the dense tables (``layout.dense_tables``, every problem
stacked) and returns each group's loss with the gradient of their sum, computed in the same pass from plain tensor arithmetic (no
autograd graph; the custom op's backward only scales it, see ``fused``). The hard version's
gradient goes to the argmin / argmax items, tied extremes sharing it equally (deterministic:
each item is written once per extreme), and its per-item work stays in the scores' dtype; the
soft version's to every item of the cell, by its softmax weight.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..surrogates import surrogate_value_and_pull
from .layout import LevelCosts, OrdinalLayout, cell_buckets

# Level pairs per block of groups, or per tile of one wide group (float64 temporaries of 32 MB).
BLOCK_ELEMENTS = 1 << 22


@torch.no_grad()
def hardest_pair_loss_and_grad(
    scores: Tensor,
    layout: OrdinalLayout,
    costs: LevelCosts,
    surrogate: str,
    margin: float,
    temperature: float | None,
) -> tuple[Tensor, Tensor]:
    """(each group's loss (G,) float64, d (their sum) / d scores in ``scores``' dtype), no
    autograd; a group's loss is sum_{a > b} c_ab phi(min_a - max_b) / Z_u (the reduction over
    groups is the caller's).

    With w_uab = c_ab / Z_u and t_uab = min_ua - max_ub:
    d loss / d min_ua = sum_b w_uab phi'(t_uab), d loss / d max_ub = -sum_a w_uab phi'(t_uab),
    then d min_ua / d s_i and d max_ub / d s_i: an equal share among the tied extremes (hard), or
    the softmax weight of s_i within its cell (soft). The hard extremes are exact in any float
    dtype, so ``scores`` may be float32 there (the caller's own: no float64 copy of every item);
    the soft ones take float64 scores. Everything per cell is float64.
    """
    lowest, highest = _cell_extremes(scores, layout, temperature)
    pairs_per_group = _one_pair_per_group if layout.num_levels <= 2 else _level_pairs_per_group
    group_losses, min_grad, max_grad = pairs_per_group(layout, lowest, highest, costs, surrogate, margin)
    grad = torch.zeros_like(scores)
    lowest.spread(min_grad, grad)
    highest.spread(max_grad, grad)
    return group_losses, grad


def _one_pair_per_group(layout: OrdinalLayout, lowest: CellExtreme, highest: CellExtreme, costs: LevelCosts,
                        surrogate: str, margin: float):
    """(each group's loss c_ab phi(t) / Z_u, d loss / d cell min, d loss / d cell max) when no
    group has more than two levels (every binary problem): its pair is its upper cell and the
    next (levels descend in a group), and its loss is phi(t), the pair's cost being all of Z_u."""
    cell_group = layout.cell_group
    upper = torch.nonzero(cell_group[1:] == cell_group[:-1]).flatten()
    lower = upper + 1
    value, pull = surrogate_value_and_pull(  # of x = -t = max_b - min_a
        highest.value.index_select(0, lower) - lowest.value.index_select(0, upper), surrogate, margin)
    group_losses = value.new_zeros(layout.num_groups).index_copy_(0, cell_group.index_select(0, upper), value)
    min_grad = torch.zeros_like(lowest.value).index_copy_(0, upper, -pull)  # d loss / d t = -pull
    max_grad = torch.zeros_like(highest.value).index_copy_(0, lower, pull)
    return group_losses, min_grad, max_grad


def _level_pairs_per_group(layout: OrdinalLayout, lowest: CellExtreme, highest: CellExtreme, costs: LevelCosts,
                           surrogate: str, margin: float):
    """``_one_pair_per_group`` for groups of any number of levels."""
    lengths = layout.cell_lengths
    min_grad, max_grad = torch.zeros_like(lowest.value), torch.zeros_like(highest.value)  # d loss / d cell min, max
    group_losses = lowest.value.new_zeros(layout.num_groups)
    # Each group's level pairs on its own cells: (groups, width, width) blocks, not (G, L, L) tables
    # over every level of the batch (a real-valued label has a level per item: 10 GB at 2,048 items
    # in 40 groups); a group too wide for one block is cut into tiles of level pairs.
    for groups, cells in cell_buckets(layout, BLOCK_ELEMENTS, lambda width: width * width):
        present = cells.table(torch.ones_like(lengths, dtype=torch.bool))
        level = cells.table(layout.cell_level)
        cell_min, cell_max = cells.table(lowest.value), cells.table(highest.value)
        if cells.width * cells.width <= BLOCK_ELEMENTS:
            block = _whole_block(present, level, cell_min, cell_max, costs, surrogate, margin)
        else:
            block = _tiled_block(present, level, cell_min, cell_max, costs, surrogate, margin)
        block_loss, block_min_grad, block_max_grad = block
        group_losses[groups] = block_loss
        at = (cells.rows, cells.slot)
        min_grad[cells.cells] = block_min_grad[at]
        max_grad[cells.cells] = block_max_grad[at]
    return group_losses, min_grad, max_grad


def _whole_block(present, level, cell_min, cell_max, costs, surrogate, margin):
    """(loss, d loss / d cell min, d loss / d cell max) of the groups of one block, from their
    (groups, width, width) table of level pairs."""
    pair_cost = _pair_costs(present, level, present, level, costs)
    normaliser = pair_cost.sum((1, 2))
    divisor = torch.where(normaliser > 0, normaliser, 1.0)
    loss_sum, pulls = _pair_terms(pair_cost, cell_min, cell_max, surrogate, margin)
    margin_grad = pulls / divisor[:, None, None]  # d loss / d t_uab
    return loss_sum / divisor, margin_grad.sum(2), -margin_grad.sum(1)


def _tiled_block(present, level, cell_min, cell_max, costs, surrogate, margin):
    """``_whole_block`` for one group whose (width, width) table of level pairs exceeds
    ``BLOCK_ELEMENTS`` (a real-valued label, a level per item: 12 GB at 16,384 items, N x N at
    any N): tiles of at most ``BLOCK_ELEMENTS`` level pairs, their sums divided by the normaliser
    at the end. Slots hold ascending levels, so a tile whose upper slots all lie below its lower
    ones has no valid pair and is skipped."""
    side = math.isqrt(BLOCK_ELEMENTS)
    width = present.shape[1]
    normaliser: Tensor | int = 0  # tensors of the tiles' dtypes after the first tile
    loss_sum: Tensor | int = 0
    min_grad, max_grad = torch.zeros_like(cell_min), torch.zeros_like(cell_max)
    for upper in range(0, width, side):
        for lower in range(0, upper + side, side):
            a, b = slice(upper, upper + side), slice(lower, lower + side)
            pair_cost = _pair_costs(present[:, a], level[:, a], present[:, b], level[:, b], costs)
            tile_sum, pulls = _pair_terms(pair_cost, cell_min[:, a], cell_max[:, b], surrogate, margin)
            normaliser = normaliser + pair_cost.sum((1, 2))
            loss_sum = loss_sum + tile_sum
            min_grad[:, a] += pulls.sum(2)
            max_grad[:, b] -= pulls.sum(1)
    assert isinstance(normaliser, Tensor)  # a group has a tile
    divisor = torch.where(normaliser > 0, normaliser, 1.0)
    return loss_sum / divisor, min_grad / divisor[:, None], max_grad / divisor[:, None]


def _pair_costs(upper_present, upper_level, lower_present, lower_level, costs: LevelCosts) -> Tensor:
    """(groups, upper slots, lower slots) c_ab of the level pairs present in a group, else 0."""
    return torch.where(upper_present[:, :, None] & lower_present[:, None, :],
                       costs.between(upper_level[:, :, None], lower_level[:, None, :]), 0.0)


def _pair_terms(pair_cost, upper_min, lower_max, surrogate, margin) -> tuple[Tensor, Tensor]:
    """(sum of c_ab phi(min_a - max_b) per group, -c_ab pull per level pair: Z_u d loss / d t_uab)
    of a table of level pairs (``_pair_costs``)."""
    valid = pair_cost > 0
    # Margins of absent level pairs are set to 0 so that no inf (and no NaN from inf * 0) arises.
    margins = torch.where(valid, upper_min[:, :, None] - lower_max[:, None, :], 0.0)
    value, pull = surrogate_value_and_pull(-margins, surrogate, margin)
    loss_sum = (pair_cost * torch.where(valid, value, 0.0)).sum((1, 2))
    return loss_sum, pair_cost * torch.where(valid, -pull, 0.0)


class CellExtreme(NamedTuple):
    """Each cell's extreme (float64, (C,)) and the items its gradient reaches: the sorted
    positions ``items`` (every item when None), the cell of each (``cells``) and ``weights``,
    d extreme / d s_i."""

    value: Tensor
    items: Tensor | None
    cells: Tensor
    weights: Tensor

    def spread(self, cell_grad: Tensor, grad: Tensor) -> None:
        """Add d loss / d s_i = (d loss / d extreme) (d extreme / d s_i) to ``grad`` (N,)."""
        at_item = cell_grad.index_select(0, self.cells)
        shares = (at_item * self.weights).to(grad.dtype)
        if self.items is None:
            # every item's slope (soft extremes): a cell in no valid pair (d loss / d extreme = 0)
            # passes 0 on, also to a NaN score (unchecked, validate_args=False) whose slope is NaN,
            # as the Triton tier and the hard extremes do
            grad += torch.where(at_item == 0, 0.0, shares)
        else:  # each item once (an item of a one-valued cell is both extremes: the second adds)
            grad.index_add_(0, self.items, shares)


def _cell_extremes(scores: Tensor, layout: OrdinalLayout, temperature: float | None) -> tuple[CellExtreme, CellExtreme]:
    """Per cell (min, max), or their log-mean-exp versions, with the items their gradients reach."""
    if temperature is None:
        return _hard_extreme(scores, layout, "min"), _hard_extreme(scores, layout, "max")
    # In score units, from each cell's own extreme (as the Triton tier does): a cell of equal
    # scores has mean exp 1 and its soft extremes are its score exactly, not off by the roundings
    # of dividing by tau and adding log n back (which moved a pair at a hinge's kink).
    return _cell_log_mean_exp(scores, layout, -temperature), _cell_log_mean_exp(scores, layout, temperature)


def _hard_extreme(values: Tensor, layout: OrdinalLayout, extreme: str) -> CellExtreme:
    """The min or max per cell, its gradient split equally among the items attaining it: only
    those items are listed (about one a cell), so no per-item weights or float64 copies are made."""
    value = torch.segment_reduce(values, extreme, lengths=layout.cell_lengths)
    items = torch.nonzero(values == layout.per_item(value)).flatten()
    cells = layout.cell.index_select(0, items)
    ties = torch.bincount(cells, minlength=value.numel())
    return CellExtreme(value.to(torch.float64), items, cells, 1.0 / ties.index_select(0, cells).to(torch.float64))


def _cell_log_mean_exp(scores: Tensor, layout: OrdinalLayout, signed_temperature: float) -> CellExtreme:
    """t log mean exp(s / t) per cell at t = ``signed_temperature`` (the soft max for t > 0, the
    soft min for t < 0), its slope exp(s_i / t) / sum exp over the cell at every item, from the
    cell's extreme e: e + t log(mean exp((s - e) / t)), every term in (0, 1]. Float64 scores."""
    lengths = layout.cell_lengths
    extreme = torch.segment_reduce(scores, "max" if signed_temperature > 0 else "min", lengths=lengths)
    at_item = layout.per_item(extreme)
    # An infinite extreme (scores unchecked: validate_args=False) takes the whole slope, where
    # inf - inf made every slope of its cell NaN (a NaN score stays NaN).
    exponents = torch.where(scores == at_item, 0.0, scores - at_item) / signed_temperature
    exps = torch.exp(exponents)
    total = torch.segment_reduce(exps, "sum", lengths=lengths)
    # With t far above the cell's spread every term is 1 to within its rounding and total / n
    # keeps none of log(mean)'s digits: from a mean of 1/2 up, log1p of the mean of the terms
    # minus 1 (as the Triton tier's ``scan.log_mean``; at t = 1e16 the soft extremes were the hard ones).
    size = lengths.to(scores.dtype)
    deficit = torch.segment_reduce(torch.expm1(exponents), "sum", lengths=lengths)
    log_mean = torch.where(total < 0.5 * size, torch.log(total / size), torch.log1p(deficit / size))
    value = extreme + signed_temperature * log_mean
    return CellExtreme(value, None, layout.cell, exps / layout.per_item(total))
