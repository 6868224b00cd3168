"""Exact all-pairs sums in blocks: the PyTorch tier's path for surrogates without a closed form.

Part of the PyTorch tier (``torch_tier`` calls it per problem; its siblings ``closed_form`` and
``hardest`` serve the closed forms and the max-violation pairs). The surrogate terms come from
the one table of ``mlloss.surrogates``.

``all_pairs_loss_and_grad`` computes  loss = sum_u coef_u * sum_{i, j in u, level_i > level_j}
c_ij * phi(s_i - s_j)  and its gradient in one pass over one problem's dense tables
(``layout.dense_tables``), never holding more than ``TILE_ELEMENTS`` pairs at once (memory
O(N + tile)) and recording no autograd graph: the custom op returns the gradient, and its
backward (``fused``) only scales it by the incoming one (the fused-loss pattern of Liger-Kernel).
The work follows the valid pairs, not N^2:

* in a large group (and in the whole batch when there are no groups) the items sorted by level
  form one run per level; every valid pair lies in a *rectangle* (run of level a) x (run of a
  lower level b), all of whose pairs are valid with the same cost c_ab. Rectangles are cut into
  tiles and computed without masks: exactly the valid pairs, each once;
* a large group with many levels for its size (a real-valued label, a level per item), which
  would make a rectangle per pair of levels, is cut into square tiles of the triangle of its
  level-sorted items instead, masked to the pairs of distinct levels (``RECTANGLE_PAIRS``);
* groups of at most ``MAX_BUCKETED_GROUP`` items (users with tens of impressions) are padded to
  the next power of two and processed as batches of dense (m x m) blocks per size bucket, so that
  20,000 users cost a handful of tensor operations, not a Python loop over users.

Every reduction is a plain tensor sum in a fixed order and every gradient entry is written by
one assignment or by sequential slice updates, so results are bitwise reproducible at a fixed
number of CPU threads (``torch.get_num_threads()``: torch's CPU sums and vectorised functions split
their work by thread, so another count can move a loss by an ulp; the gradients observed did not move).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..surrogates import surrogate_value_and_pull_, tile_sum_and_pull
from .layout import LevelCosts, OrdinalLayout, next_power_of_two

TILE_ELEMENTS = 1 << 22  # pairs per block: 16 MB per float32 temporary
# On the CPU, a rectangle between two level runs is cut into tiles of about CPU_TILE_SIDE^2 pairs
# (4 MB per float32 buffer): its six passes over a tile (difference, value, sum, pull, row and
# column sums) then run from the cache. Tiles of TILE_ELEMENTS pairs (16 MB buffers) took 1.3x as
# long on one CPU thread (65 against 50 ms for AUC at N = 8,192; benchmarks/bench_cpu_path.py).
# Square tiles also bound the float32 additions into a gradient entry by n / 1,024 on both sides
# (full-width rows of 2^22 / n made n^2 / 2^22 of them into each lower item's entry). On a GPU,
# where each tile costs launches and not cache, the tiles stay TILE_ELEMENTS wide.
CPU_TILE_SIDE = 1 << 10
# On the CPU, the groups of one size bucket are processed this many padded pairs at a time (4 MB
# per float32 temporary): chunks of TILE_ELEMENTS pairs made their temporaries in fresh memory,
# whose page faults took a quarter of a grouped call's CPU time (N = 65,536 in groups of about 20
# items, benchmarks/bench_cpu_path.py); at this size the allocator reuses them. Chunks of 2^18
# pairs took 10-20% longer at N = 8,192 (more operations for the same work).
CPU_BUCKET_CHUNK_ELEMENTS = 1 << 20
MAX_BUCKETED_GROUP = 256  # larger groups are cut into rectangles between level runs
# A large group is cut into masked tiles instead of rectangles when its level pairs times this
# exceed n^2: a rectangle's few tensor operations cost about as much as 2^11-2^12 pairs of a masked
# tile, whose pairs cost several times a rectangle's (benchmarks/bench_level_tiles.py: the two
# cross at level pairs of about 1.7 n^2 / 2^12 for 1,024 items and 0.6 n^2 / 2^12 for 4,096). A
# real-valued label, a level per item, made a rectangle per level pair: 29 s for 1,100 items on
# the CPU, 0.04 s in tiles.
RECTANGLE_PAIRS = 1 << 12


def all_pairs_loss_and_grad(
    scores: Tensor,
    layout: OrdinalLayout,
    costs: LevelCosts,
    group_coefficients: Tensor,
    surrogate: str,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(loss, dloss/dscores) for sorted scores; computed in the scores' dtype."""
    sizes = layout.group_sizes
    offsets = torch.cumsum(sizes, 0) - sizes
    active = group_coefficients > 0
    grad = torch.zeros_like(scores)
    partial_sums: list[Tensor] = []

    bucketed = active & (sizes <= MAX_BUCKETED_GROUP)
    bucket_sides = next_power_of_two(sizes.clamp(min=2))
    # Each item's level value measured from its group's middle item's (in float64, then the scores'
    # dtype): a pair's cost, a difference of two levels of one group, keeps its precision however far
    # the group's levels lie from the others' (0.010 s of watch time beside 1e4 s was 7% off in float32).
    item_values = layout.level_values[layout.level]
    item_level_values = (item_values - item_values[offsets + sizes // 2][layout.group]).to(scores.dtype)
    # Which pairs are valid comes from the level indices: two levels that the scores' dtype cannot
    # tell apart (weights [57150, 5e-5] in float32) are still two levels, counted in Z_u.
    item_levels = layout.level
    linear_cost = costs.linear
    for side in torch.unique(bucket_sides[bucketed]).tolist():
        group_ids = torch.nonzero(bucketed & (bucket_sides == side)).flatten()
        chunk = max(1, _bucket_chunk_elements(scores.device) // (side * side))
        for start in range(0, group_ids.numel(), chunk):
            ids = group_ids[start : start + chunk]
            partial_sums.append(
                _padded_groups(
                    scores, item_level_values, item_levels, offsets[ids], sizes[ids], side,
                    group_coefficients[ids].to(scores.dtype), linear_cost, surrogate, margin, grad,
                )
            )

    large = active & (sizes > MAX_BUCKETED_GROUP)
    if bool(large.any()):
        cells = torch.bincount(layout.cell_group, minlength=layout.num_groups)
        tiled = large & (cells * (cells - 1) // 2 * RECTANGLE_PAIRS > sizes * sizes)
        if bool((large & ~tiled).any()):
            partial_sums.extend(_level_rectangles(
                scores, layout, large & ~tiled, costs, group_coefficients, surrogate, margin, grad
            ))
        for group in torch.nonzero(tiled).flatten().tolist():
            start, end = int(offsets[group]), int(offsets[group] + sizes[group])
            partial_sums.extend(_level_tiles(
                scores, item_level_values, item_levels, start, end, group_coefficients[group].to(scores.dtype),
                linear_cost, surrogate, margin, grad,
            ))

    loss = torch.stack(partial_sums).sum() if partial_sums else scores.new_zeros(())
    return loss, grad


def _bucket_chunk_elements(device: torch.device) -> int:
    """Padded pairs per chunk of a size bucket's groups (see ``CPU_BUCKET_CHUNK_ELEMENTS``)."""
    return CPU_BUCKET_CHUNK_ELEMENTS if device.type == "cpu" else TILE_ELEMENTS


def _padded_groups(
    scores: Tensor,
    item_level_values: Tensor,
    item_levels: Tensor,
    offsets: Tensor,
    sizes: Tensor,
    side: int,
    coefficients: Tensor,
    linear_cost: bool,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> Tensor:
    """Pairs inside each of a batch of groups, padded to ``side`` items: (G, side, side) blocks,
    upper item i on dim 1, lower item j on dim 2."""
    slots = torch.arange(side, device=scores.device)
    real = slots[None, :] < sizes[:, None]
    index = torch.where(real, offsets[:, None] + slots[None, :], 0)
    block_scores = scores[index]
    values, levels = item_level_values[index], item_levels[index]
    weighted_value, weighted_pull = _weighted_pairs(
        block_scores[:, :, None], block_scores[:, None, :], values[:, :, None], values[:, None, :],
        levels[:, :, None] > levels[:, None, :], real[:, :, None] & real[:, None, :], coefficients[:, None, None],
        linear_cost, surrogate, margin,
    )
    item_grad = weighted_pull.sum(1) - weighted_pull.sum(2)  # lower side minus upper side
    grad[index[real]] = item_grad[real]
    return weighted_value.sum()


def _level_tiles(
    scores: Tensor,
    item_level_values: Tensor,
    item_levels: Tensor,
    start: int,
    end: int,
    coefficient: Tensor,
    linear_cost: bool,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> list[Tensor]:
    """Pairs of one group (positions ``start:end``, levels descending) in square tiles of the
    triangle i < j, where every valid pair has its upper item first; the tiles are masked to the
    pairs of distinct levels. For groups with a level per few items, which make too many
    rectangles. A tile holds a quarter of ``TILE_ELEMENTS`` pairs: its masked arithmetic keeps
    several temporaries of its size alive (about 32 MB in float32)."""
    side = math.isqrt(TILE_ELEMENTS // 4)
    partial_sums = []
    for row_start in range(start, end, side):
        upper = slice(row_start, min(row_start + side, end))
        for col_start in range(row_start, end, side):
            lower = slice(col_start, min(col_start + side, end))
            weighted_value, weighted_pull = _weighted_pairs(
                scores[upper, None], scores[None, lower], item_level_values[upper, None],
                item_level_values[None, lower], item_levels[upper, None] > item_levels[None, lower], None,
                coefficient, linear_cost, surrogate, margin,
            )
            partial_sums.append(weighted_value.sum())
            grad[upper] -= weighted_pull.sum(1)
            grad[lower] += weighted_pull.sum(0)
    return partial_sums


def _weighted_pairs(
    upper_scores: Tensor,
    lower_scores: Tensor,
    upper_values: Tensor,
    lower_values: Tensor,
    above: Tensor,
    real: Tensor | None,
    coefficient: Tensor,
    linear_cost: bool,
    surrogate: str,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(w phi, w pull) of a block of candidate pairs (upper item i, lower item j, broadcast), with
    w = c_ij * coefficient for the valid pairs (``above``: level_i > level_j, both ``real``) and 0
    for the others, whose surrogate is evaluated at 0 instead of their scores: an exponential that
    overflows there would make 0 * inf = NaN.

    ``above`` (a temporary of the block's shape) is overwritten. Every step after the first of each
    block-sized temporary writes into it (the same arithmetic as out of place, so the same bits):
    a block of 2^22 pairs made nine fresh 16 MB temporaries, and the page faults of their fresh
    memory took about 40% of a grouped call's CPU time (benchmarks/bench_cpu_path.py)."""
    valid = above if real is None else above.logical_and_(real)
    invalid = valid.logical_not()
    if linear_cost:
        weight = (upper_values - lower_values).masked_fill_(invalid, 0).mul_(coefficient)
    else:
        weight = valid.to(coefficient.dtype).mul_(coefficient)
    value, pull = surrogate_value_and_pull_((lower_scores - upper_scores).masked_fill_(invalid, 0), surrogate, margin)
    weighted_pull = pull * weight if pull is value else pull.mul_(weight)  # the exponential's pull is its value
    return value.mul_(weight), weighted_pull


def _level_rectangles(
    scores: Tensor,
    layout: OrdinalLayout,
    groups: Tensor,
    costs: LevelCosts,
    group_coefficients: Tensor,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> list[Tensor]:
    """Pairs of the selected groups, rectangle by rectangle: (run of level a) x (run of level b),
    a above b in the same group; each rectangle has one weight c_ab * coef_u and no invalid pair."""
    cell_ends = torch.cumsum(layout.cell_lengths, 0)
    selected = groups[layout.cell_group]
    cells = list(
        zip(
            layout.cell_group[selected].tolist(),
            layout.cell_level[selected].tolist(),
            (cell_ends - layout.cell_lengths)[selected].tolist(),
            cell_ends[selected].tolist(),
        )
    )
    values = costs.level_values.tolist()
    coefficients = group_coefficients.tolist()
    partial_sums = []
    # Cells of one group are consecutive, levels descending: every later cell of the group is lower.
    for index, (group, upper_level, upper_start, upper_end) in enumerate(cells):
        for lower_group, lower_level, lower_start, lower_end in cells[index + 1 :]:
            if lower_group != group:
                break
            cost = values[upper_level] - values[lower_level] if costs.linear else 1.0
            weight = cost * coefficients[group]
            partial_sums.extend(
                _rectangle(scores, upper_start, upper_end, lower_start, lower_end, weight, surrogate, margin, grad)
            )
    return partial_sums


def _rectangle(
    scores: Tensor,
    upper_start: int,
    upper_end: int,
    lower_start: int,
    lower_end: int,
    weight: float,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> list[Tensor]:
    """weight * sum over the rectangle of phi(s_i - s_j), in tiles of at most TILE_ELEMENTS pairs
    of full rows, or on the CPU of about CPU_TILE_SIDE^2 pairs (square where both runs are that
    long; a short run is taken whole and the other cut to keep the tile's size).

    Two tile buffers are allocated once and reused: allocating fresh 16 MB temporaries per tile
    made glibc keep gigabytes of freed memory in long runs (benchmarks/README.md).
    """
    if scores.device.type == "cpu":
        tile = CPU_TILE_SIDE * CPU_TILE_SIDE
        num_cols = min(lower_end - lower_start, max(CPU_TILE_SIDE, tile // (upper_end - upper_start)))
    else:
        tile = TILE_ELEMENTS
        num_cols = min(lower_end - lower_start, tile)
    num_rows = max(1, tile // num_cols)
    size = min(num_rows, upper_end - upper_start) * num_cols
    reverse_buffer, work_buffer = scores.new_empty(size), scores.new_empty(size)
    partial_sums = []
    for row_start in range(upper_start, upper_end, num_rows):
        row_end = min(row_start + num_rows, upper_end)
        rows = scores[row_start:row_end]
        for col_start in range(lower_start, lower_end, num_cols):
            col_end = min(col_start + num_cols, lower_end)
            shape = (row_end - row_start, col_end - col_start)
            reverse = reverse_buffer[: shape[0] * shape[1]].view(shape)
            torch.sub(scores[None, col_start:col_end], rows[:, None], out=reverse)
            value_sum, pull = tile_sum_and_pull(reverse, work_buffer[: reverse.numel()].view(shape), surrogate, margin)
            partial_sums.append(value_sum * weight)
            grad[row_start:row_end] -= pull.sum(1) * weight
            grad[col_start:col_end] += pull.sum(0) * weight
    return partial_sums
