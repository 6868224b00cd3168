r"""Sorting and segmented pair counting, shared by the functional metrics (``functional``).

The items are sorted once by ``(group, key)`` (:func:`tie_blocks`, the group's and the key's ranks
packed in one integer): each group is a contiguous segment of positions and, inside it, each run of
equal keys a contiguous *tie block*. For
each item, the number of items of a given kind ranked strictly below it and tied with it in its group
is then read off a prefix sum. Pair counts are ``int64``; float sums run over sorted data in a fixed
order (no atomics), so every result is exact and deterministic.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import Tensor

from .._validation import callers_level
from ..ops.layout import run_bounds, sortable, value_ranks

Weighting = Literal["uniform", "size"]


class UndefinedMetricWarning(UserWarning):
    """Emitted when a metric has no valid pair (for example only one class) and ``NaN`` is returned."""


@dataclass(frozen=True)
class TieBlocks:
    """Items sorted by ``(group, key)``, with their tie blocks and group segments.

    A tie block is a maximal run of sorted items with the same group and the same key. All per-item tensors
    are indexed by sorted position; groups occupy contiguous segments of the sorted order.
    """

    order: Tensor  # (N,) permutation that sorts the items by (group, key)
    block_start: Tensor  # (N,) sorted position of the first item of the item's tie block
    block_stop: Tensor  # (N,) sorted position one past the last item of the item's tie block
    group_start: Tensor  # (N,) sorted position of the first item of the item's group
    group_size: Tensor  # (N,) number of items in the item's group
    counts: Tensor  # (G,) number of items per group, in segment order


def tie_blocks(keys: Tensor, groups: Optional[Tensor]) -> TieBlocks:
    """Sort by ``(groups, keys)`` (stable: a deterministic permutation) and delimit the tie blocks.

    ``groups=None`` is one group. With groups, an item's sort key is its group's rank (the number
    of items of smaller id) times N plus its key's rank (``value_ranks``): the items of a group
    are then the positions from its rank on, and its tie blocks the runs of equal sort keys
    (``run_bounds``: linear passes where binary searches took 4-5x as long).
    """
    n = keys.numel()
    if groups is None:
        sorted_keys, order = torch.sort(sortable(keys), stable=True)
        block_start, block_stop = run_bounds(sorted_keys)
        group_start = torch.zeros(n, dtype=torch.long, device=keys.device)
        group_size = torch.full((n,), n, dtype=torch.long, device=keys.device)
        counts = torch.tensor([n], device=keys.device)
        return TieBlocks(order, block_start, block_stop, group_start, group_size, counts)
    sorted_keys, order = torch.sort(value_ranks(groups) * n + value_ranks(keys), stable=True)
    block_start, block_stop = run_bounds(sorted_keys)
    group_start = torch.div(sorted_keys, n, rounding_mode="floor")  # the group's rank is its first position
    group_size = run_bounds(group_start)[1] - group_start
    counts = group_size[group_start == torch.arange(n, device=keys.device)]
    return TieBlocks(order, block_start, block_stop, group_start, group_size, counts)


def segment_sum(values: Tensor, counts: Tensor) -> Tensor:
    """Sum ``values`` (sorted by group, shape ``(N, ...)``) over the group segments of lengths ``counts``.

    Integers are summed exactly through an ``int64`` prefix sum; floats through :func:`torch.segment_reduce`,
    which reduces each segment in a fixed order on CPU and CUDA (no atomics, unlike ``index_add_``).
    """
    if counts.numel() == 0:
        return values.new_zeros((0, *values.shape[1:]))
    if values.is_floating_point():
        return torch.segment_reduce(values, "sum", lengths=counts, axis=0)
    prefix = torch.cat([values.new_zeros((1, *values.shape[1:])), torch.cumsum(values, dim=0)])
    stops = torch.cumsum(counts, dim=0)
    return prefix[stops] - prefix[stops - counts]


def twice_wins(blocks: TieBlocks, positive: Tensor, negative: Tensor) -> Tensor:
    r"""Per group and column, :math:`2 \sum_{i \in \text{pos}, j \in \text{neg}} h(s_i, s_j)` as ``int64 (G, K)``.

    With :math:`C` the prefix count of negatives in sorted order, an item at sorted position :math:`p` has
    :math:`C[\text{start}] - C[\text{group start}]` negatives strictly below it and
    :math:`C[\text{stop}] - C[\text{start}]` tied with it, so twice its credit is
    :math:`C[\text{start}] + C[\text{stop}] - 2\,C[\text{group start}]`.

    Args:
        blocks: the items sorted by ``(group, score)``.
        positive: ``(N, K)`` int64 0/1 indicators of the left member of a pair, in item order.
        negative: ``(N, K)`` int64 0/1 indicators of the right member of a pair, in item order.
    """
    positive, negative = positive[blocks.order], negative[blocks.order]
    prefix = torch.cat([negative.new_zeros((1, negative.shape[1])), torch.cumsum(negative, dim=0)])
    twice_below = prefix[blocks.block_start] + prefix[blocks.block_stop] - 2 * prefix[blocks.group_start]
    return segment_sum(positive * twice_below, blocks.counts)


def prefix_dominance(ranks: Tensor, stops: Tensor, bounds: Tensor) -> Tensor:
    r"""For every query :math:`i`, :math:`\#\{q < \text{stops}_i : \text{ranks}_q < \text{bounds}_i\}`, as ``int64``.

    ``ranks`` ``(N,)`` are the points' ranks (in ``[0, N]``) by position; ``stops`` in ``[0, N]`` and
    ``bounds`` in ``[0, N + 1]`` the queries. The prefix :math:`[0, \text{stop})` is the union of one
    aligned block of :math:`2^k` positions per set bit :math:`k` of ``stop``, the positions :math:`q`
    with :math:`q \gg k = (\text{stop} \gg k) - 1`. Per bit, one sort of the points by ``(block, rank)``
    answers every query by two binary searches: :math:`O((N + Q) \log^2 N)` in all, whatever the ranks.
    """
    n = ranks.numel()
    width = n + 2  # a key (block, rank) is block * width + rank, rank and bound in [0, n + 1]
    positions = torch.arange(n, device=ranks.device)
    counts = torch.zeros_like(stops)
    for bit in range(n.bit_length()):
        keys = torch.sort((positions >> bit) * width + ranks).values
        block = (stops >> bit) - 1
        below = torch.searchsorted(keys, block * width + bounds) - torch.searchsorted(keys, block * width)
        counts += torch.where((stops >> bit) & 1 == 1, below, 0)
    return counts


def pair_count(blocks: TieBlocks, positive: Tensor, negative: Tensor) -> Tensor:
    """Per group and column, the number of (positive, negative) pairs, as ``int64 (G, K)``."""
    return segment_sum(positive[blocks.order], blocks.counts) * segment_sum(negative[blocks.order], blocks.counts)


def centered_rank_sum(blocks: TieBlocks, values: Tensor) -> Tensor:
    r"""Per group, :math:`\sum_i v_i\,(2 r_i - n_g - 1)` with :math:`r_i` the 1-based mid-rank of the key.

    This equals :math:`\sum_{i, j:\, key_i > key_j} (v_i - v_j)` over the pairs of the group, because the
    item at mid-rank :math:`r_i` has :math:`r_i - (t_i + 1)/2` items strictly below it and
    :math:`n_g - r_i - (t_i - 1)/2` strictly above it (:math:`t_i` its tie block size).
    """
    twice_rank_centered = blocks.block_start + blocks.block_stop - 2 * blocks.group_start - blocks.group_size
    return segment_sum(values[blocks.order] * twice_rank_centered, blocks.counts)


def ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` in float64, ``NaN`` where the denominator (a pair count or cost) is zero."""
    nan = torch.full_like(numerator, float("nan"), dtype=torch.float64)
    return torch.where(denominator > 0, numerator.double() / denominator.double(), nan)


def group_mean(values: Tensor, counts: Tensor, weighting: Weighting) -> Tensor:
    """Mean of the per-group ``values`` over groups where they are defined, uniform or weighted by size."""
    defined = ~torch.isnan(values)
    weights = (torch.ones_like(values) if weighting == "uniform" else counts.double()) * defined
    total = weights.sum()
    return torch.where(total > 0, (weights * values.nan_to_num()).sum() / total, torch.nan)


def warn_if_undefined(value: Tensor, message: str) -> Tensor:
    if torch.isnan(value).any():
        warnings.warn(f"{message}; returning NaN.", UndefinedMetricWarning, stacklevel=callers_level())
    return value


