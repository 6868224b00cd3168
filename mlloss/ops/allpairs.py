"""Exact all-pairs sums in blocks: the PyTorch path for surrogates without a closed form.

Computes  loss = sum_u coef_u * sum_{i, j in u, level_i > level_j} c_ij * phi(s_i - s_j)
and its gradient in one forward pass, never holding more than ``TILE_ELEMENTS`` pairs at once
(memory O(N + tile)); backward only scales the stored gradient by ``grad_output`` (the fused-loss
pattern of Liger-Kernel). Work follows the valid pairs rather than N^2:

* groups of at most ``MAX_BUCKETED_GROUP`` items are padded to the next power of two and
  processed as a batch of dense (m x m) blocks per size bucket, so a batch of 20,000 users costs
  a handful of tensor operations, not a Python loop over users;
* larger groups (and the whole batch when there are no groups) are cut into square tiles over
  their (level-descending) sorted order; tiles with no valid pair are skipped and tiles where every
  pair is valid skip the mask.

Every reduction is a plain tensor sum in a fixed order and every gradient entry is written by
exactly one assignment or sequential slice update, so results are bitwise reproducible.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..surrogates import surrogate_value_and_slope
from .layout import OrdinalLayout

TILE_ELEMENTS = 1 << 22  # pairs per block: about 16 MB per float32 temporary
MAX_BUCKETED_GROUP = 1 << 11  # 2048 x 2048 = one tile


def all_pairs_loss(
    scores_sorted: Tensor,
    layout: OrdinalLayout,
    cost_matrix: Tensor,
    group_coefficients: Tensor,
    surrogate: str,
    margin: float,
) -> Tensor:
    """Differentiable all-pairs loss of scores already sorted by ``layout.order``."""
    return _AllPairs.apply(scores_sorted, layout, cost_matrix, group_coefficients, surrogate, margin)


class _AllPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, layout, cost_matrix, group_coefficients, surrogate, margin):
        loss, grad = all_pairs_loss_and_grad(
            scores.detach(), layout, cost_matrix, group_coefficients, surrogate, margin
        )
        ctx.save_for_backward(grad)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable  # the stored gradient is not a graph: no double backward
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None, None, None


def all_pairs_loss_and_grad(
    scores: Tensor,
    layout: OrdinalLayout,
    cost_matrix: Tensor,
    group_coefficients: Tensor,
    surrogate: str,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(loss, dloss/dscores) for sorted scores; computed in the scores' dtype."""
    dtype = scores.dtype
    sizes = layout.group_sizes
    offsets = torch.cumsum(sizes, 0) - sizes
    coefficients = group_coefficients.to(dtype)
    costs = cost_matrix.to(dtype)
    grad = torch.zeros_like(scores)
    partial_sums: list[Tensor] = []

    active = group_coefficients > 0
    bucketed = active & (sizes <= MAX_BUCKETED_GROUP)
    tiled = active & (sizes > MAX_BUCKETED_GROUP)

    bucket_sides = _next_power_of_two(sizes.clamp(min=2))
    for side in torch.unique(bucket_sides[bucketed]).tolist():
        group_ids = torch.nonzero(bucketed & (bucket_sides == side)).flatten()
        chunk = max(1, TILE_ELEMENTS // (side * side))
        for start in range(0, group_ids.numel(), chunk):
            ids = group_ids[start : start + chunk]
            partial_sums.append(
                _padded_groups(
                    scores, layout.level, offsets[ids], sizes[ids], side, coefficients[ids],
                    costs, surrogate, margin, grad,
                )
            )

    tiled_ids = torch.nonzero(tiled).flatten().tolist()
    for group_id in tiled_ids:
        begin, size = int(offsets[group_id]), int(sizes[group_id])
        partial_sums.extend(
            _tiled_group(
                scores[begin : begin + size],
                layout.level[begin : begin + size],
                coefficients[group_id],
                costs,
                surrogate,
                margin,
                grad[begin : begin + size],
            )
        )

    loss = torch.stack(partial_sums).sum() if partial_sums else scores.new_zeros(())
    return loss, grad


def _next_power_of_two(values: Tensor) -> Tensor:
    return torch.pow(2, torch.ceil(torch.log2(values.to(torch.float64)))).to(torch.int64)


def _padded_groups(
    scores: Tensor,
    level: Tensor,
    offsets: Tensor,
    sizes: Tensor,
    side: int,
    coefficients: Tensor,
    costs: Tensor,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> Tensor:
    """Pairs inside each of a batch of groups, padded to ``side`` items: (G, side, side) blocks."""
    slots = torch.arange(side, device=scores.device)
    real = slots[None, :] < sizes[:, None]
    index = torch.where(real, offsets[:, None] + slots[None, :], 0)
    block_scores = scores[index]
    block_levels = level[index]
    # costs[a, b] is zero unless a > b, so it masks the invalid pairs; padding is masked here.
    both_real = real[:, :, None] & real[:, None, :]
    weight = torch.where(both_real, costs[block_levels[:, :, None], block_levels[:, None, :]], 0)
    weight = weight * coefficients[:, None, None]
    value, slope = surrogate_value_and_slope(
        block_scores[:, :, None] - block_scores[:, None, :], surrogate, margin
    )
    weighted_slope = weight * slope
    item_grad = weighted_slope.sum(2) - weighted_slope.sum(1)
    grad[index[real]] = item_grad[real]
    return (weight * value).sum()


def _tiled_group(
    scores: Tensor,
    level: Tensor,
    coefficient: Tensor,
    costs: Tensor,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> list[Tensor]:
    """Pairs inside one large group whose items are sorted by level, descending.

    Rows are upper items, columns lower items. Because levels descend, a tile can hold a valid
    pair only if its first row's level exceeds its last column's, and every pair in it is valid if
    its last row's level exceeds its first column's.
    """
    size = scores.numel()
    side = int(TILE_ELEMENTS**0.5)
    starts = list(range(0, size, side))
    ends = [min(start + side, size) for start in starts]
    first_level = level[starts].tolist()
    last_level = level[[end - 1 for end in ends]].tolist()
    uniform_cost = bool((costs[costs > 0] == 1).all())
    partial_sums = []
    for row, (row_start, row_end) in enumerate(zip(starts, ends)):
        row_scores = scores[row_start:row_end]
        row_grad = torch.zeros_like(row_scores)
        for col, (col_start, col_end) in enumerate(zip(starts, ends)):
            if first_level[row] <= last_level[col]:
                continue  # no row level above any column level
            all_valid = last_level[row] > first_level[col]
            value, slope = surrogate_value_and_slope(
                row_scores[:, None] - scores[None, col_start:col_end], surrogate, margin
            )
            if all_valid and uniform_cost:
                partial_sums.append(value.sum() * coefficient)
                row_grad += slope.sum(1) * coefficient
                grad[col_start:col_end] -= slope.sum(0) * coefficient
                continue
            # costs[a, b] is zero unless a > b: it weighs and masks the pairs at once.
            weight = costs[level[row_start:row_end, None], level[None, col_start:col_end]] * coefficient
            partial_sums.append((weight * value).sum())
            weighted_slope = weight * slope
            row_grad += weighted_slope.sum(1)
            grad[col_start:col_end] -= weighted_slope.sum(0)
        grad[row_start:row_end] += row_grad
    return partial_sums
