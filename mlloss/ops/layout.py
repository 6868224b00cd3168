"""The ordinal pair layout every computation path shares.

A batch is described by scores, a level per item (the binary label for AUC, the aggregated label
ybar for LaA) and an optional group id. A pair (i, j) is valid when g_i == g_j and
level_i > level_j (loss spec, "Pair sets and weights"). This module sorts the items by
(group ascending, level descending), so that each group is a contiguous run and, inside it, each
level is a contiguous *cell*; it counts items per (group, level) and derives from the counts the
exact per-group normalisers Z_u = sum_{valid pairs in u} c_ij and the coefficients of the group
reduction. Nothing here is O(N^2): the sort is O(N log N), the rest O(N + G L^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

# Dense (group, level) tables hold G * L entries; beyond this the layout refuses rather than
# allocating gigabytes (a label with thousands of distinct values is not an ordinal label).
MAX_GROUP_LEVEL_CELLS = 1 << 27


@dataclass(frozen=True)
class OrdinalLayout:
    """Items sorted by (group ascending, level descending) and their (group, level) counts."""

    order: Tensor  # (N,) sorted position -> original item index
    group: Tensor  # (N,) group index (0..G-1) of each sorted item
    level: Tensor  # (N,) level index (0..L-1, higher ranks higher) of each sorted item
    level_values: Tensor  # (L,) float64, ascending
    counts: Tensor  # (G, L) int64 items per (group, level)
    cell_lengths: Tensor  # (C,) lengths of the runs of equal (group, level) in sorted order
    cell_group: Tensor  # (C,) group index of each cell
    cell_level: Tensor  # (C,) level index of each cell

    @property
    def num_groups(self) -> int:
        return self.counts.shape[0]

    @property
    def num_levels(self) -> int:
        return self.counts.shape[1]

    @property
    def group_sizes(self) -> Tensor:
        return self.counts.sum(1)


def ordinal_layout(levels: Tensor, groups: Tensor | None) -> OrdinalLayout:
    """Sort items by (group, level desc) and count them per (group, level).

    ``levels`` is a float64 vector (N,); ``groups`` an int64 vector (N,) or None (one group).
    One stable sort of a combined integer key does the work (stable: equal keys keep their input
    order, so every later sum runs in a reproducible order).
    """
    level, level_values = _level_index(levels)
    num_levels = level_values.numel()
    group_key = _group_key(groups, level)
    if groups is not None and group_key is None:  # id range too wide to pack: compact ids first
        group_key = torch.unique(groups, return_inverse=True)[1]
    if group_key is None:
        group_key = torch.zeros_like(level)
    # Descending level inside a group: the lower items of every valid pair follow the upper ones.
    sort_key = group_key * num_levels + (num_levels - 1 - level)
    if sort_key.numel() and int(sort_key.max()) < 2**31:
        sort_key = sort_key.to(torch.int32)  # sorts about 1.5x faster than int64 on the CPU
    sorted_key, order = torch.sort(sort_key, stable=True)
    sorted_key = sorted_key.to(torch.int64)
    cell_key, cell_lengths = torch.unique_consecutive(sorted_key, return_counts=True)
    cell_group_key = torch.div(cell_key, num_levels, rounding_mode="floor")
    cell_level = num_levels - 1 - (cell_key - cell_group_key * num_levels)
    _, cell_group = torch.unique_consecutive(cell_group_key, return_inverse=True)
    num_groups = int(cell_group[-1]) + 1 if cell_group.numel() else 1
    if num_groups * num_levels > MAX_GROUP_LEVEL_CELLS:
        raise ValueError(
            f"labels have {num_levels} distinct levels across {num_groups} groups; the dense "
            f"(group, level) table would need {num_groups * num_levels} cells (limit "
            f"{MAX_GROUP_LEVEL_CELLS}). Is the label really ordinal?"
        )
    counts = torch.zeros(num_groups, num_levels, dtype=torch.int64, device=levels.device)
    counts[cell_group, cell_level] = cell_lengths
    return OrdinalLayout(
        order=order,
        group=cell_group.repeat_interleave(cell_lengths),
        level=cell_level.repeat_interleave(cell_lengths),
        level_values=level_values,
        counts=counts,
        cell_lengths=cell_lengths,
        cell_group=cell_group,
        cell_level=cell_level,
    )


# Integer-valued levels spanning at most this many values are indexed directly (no sort); the
# absent values in the span cost an empty column of the (group, level) table.
MAX_DIRECT_LEVEL_SPAN = 64


def _level_index(levels: Tensor) -> tuple[Tensor, Tensor]:
    """(level index (N,) int64, ascending level values (L,) float64)."""
    if levels.numel() == 0:
        return levels.to(torch.int64), torch.zeros(1, dtype=torch.float64, device=levels.device)
    low, high = torch.aminmax(levels)
    low, high = float(low), float(high)
    if high - low < MAX_DIRECT_LEVEL_SPAN and bool((levels == torch.round(levels)).all()):
        values = torch.arange(low, high + 1, dtype=torch.float64, device=levels.device)
        return (levels - low).to(torch.int64), values
    values, index = torch.unique(levels, return_inverse=True)
    return index, values.to(torch.float64)


def _group_key(groups: Tensor | None, level: Tensor) -> Tensor | None:
    """Group ids shifted to start at 0 when (id range) x (levels) fits an int64 sort key."""
    if groups is None or groups.numel() == 0:
        return None
    low, high = (int(v) for v in torch.aminmax(groups))
    levels_bound = int(level.max()) + 1
    if (high - low + 1) * levels_bound >= 2**62:
        return None
    return groups - low


def pair_cost_matrix(level_values: Tensor, cost: str) -> Tensor:
    """C[a, b] = c(level a, level b) for a > b, else 0 (float64, (L, L)).

    ``cost="linear"``: c = v_a - v_b (Lukasik et al. Prop. 5.4); ``"uniform"``: c = 1 (Prop. 5.3).
    """
    upper = level_values[:, None] > level_values[None, :]
    if cost == "linear":
        return torch.where(upper, level_values[:, None] - level_values[None, :], 0.0)
    return upper.to(torch.float64)


def level_pair_sums(upper: Tensor, cost_matrix: Tensor, lower: Tensor) -> Tensor:
    """Per group u: sum_{a > b} C_ab * upper_ua * lower_ub over (G, L) tables (float64, (G,))."""
    return torch.einsum("ga,ab,gb->g", upper.to(torch.float64), cost_matrix, lower.to(torch.float64))


def group_pair_cost(counts: Tensor, cost_matrix: Tensor) -> Tensor:
    """Z_u = sum over valid pairs in group u of c_ij = sum_{a,b} n_ua C_ab n_ub (float64, (G,))."""
    return level_pair_sums(counts, cost_matrix, counts)


def reduction_coefficients(group_cost: Tensor, reduction: str) -> Tensor:
    """Per-group weight of a group's pair sum: 1/Z_u, divided by the number of groups with a
    valid pair for ``reduction="mean"``; 0 for groups without a valid pair (loss spec, Groups)."""
    has_pairs = group_cost > 0
    coefficients = torch.where(has_pairs, 1.0 / torch.where(has_pairs, group_cost, 1.0), 0.0)
    if reduction == "mean":
        coefficients = coefficients / has_pairs.sum().clamp(min=1)
    return coefficients


def segment_logsumexp(values: Tensor, lengths: Tensor) -> Tensor:
    """log(sum(exp(values))) over consecutive segments, shifted by each segment's max."""
    shift = torch.segment_reduce(values.detach(), "max", lengths=lengths)
    total = torch.segment_reduce(torch.exp(values - shift.repeat_interleave(lengths)), "sum", lengths=lengths)
    return torch.log(total) + shift


def segment_extreme(values: Tensor, lengths: Tensor, extreme: str) -> Tensor:
    """Min or max over consecutive segments; the gradient is split evenly among tied extremes.

    ``torch.segment_reduce``'s own min/max backward does not split ties when the incoming
    gradient differs between segments (torch 2.13), so the gradient is routed here instead: the
    extreme equals the mean of the items that attain it, a differentiable segment sum.
    """
    value = torch.segment_reduce(values.detach(), extreme, lengths=lengths)
    attains = (values.detach() == value.repeat_interleave(lengths)).to(values.dtype)
    ties = torch.segment_reduce(attains, "sum", lengths=lengths)
    share = attains / ties.repeat_interleave(lengths)
    return torch.segment_reduce(values * share, "sum", lengths=lengths)


def dense_cells(layout: OrdinalLayout, cell_values: Tensor, fill: float) -> Tensor:
    """Scatter per-cell values (C,) into a (G, L) table; absent cells hold ``fill``."""
    table = torch.full(
        (layout.num_groups, layout.num_levels), fill, dtype=cell_values.dtype, device=cell_values.device
    )
    return table.index_put((layout.cell_group, layout.cell_level), cell_values)
