"""Exact all-pairs sums in blocks: the PyTorch tier's path for surrogates without a closed form.

Part of the PyTorch tier (``torch_tier`` calls it on the stacked problems' tables; its siblings
``closed_form`` and ``hardest`` serve the closed forms and the max-violation pairs). The
surrogate terms come from the one table of ``mlloss.surrogates``.

``all_pairs_loss_and_grad`` computes each group's loss  coef_u * sum_{i, j in u, level_i > level_j}
c_ij * phi(s_i - s_j)  and the gradient of their sum in one pass over the dense tables
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
* the valid pairs of groups of at most ``MAX_LISTED_GROUP`` items (users with tens of
  impressions) and at most ``LISTED_PAIRS_PER_RECTANGLE`` pairs a rectangle are listed one
  after another, each item's as one run (its partners of a lower level follow its own cell in
  its group), and computed with a few tensor operations for all
  such groups at once (``_small_groups``): 20,000 users cost no Python loop over users, and no
  pair outside a group or of equal levels is computed.

Every reduction is a plain tensor sum in a fixed order (``segment_reduce`` over runs, or on the
CPU an indexed add, which adds in index order: no atomics) and every gradient entry is written by
one assignment or by sequential slice updates, so results are bitwise reproducible at a fixed
number of CPU threads
(``torch.get_num_threads()``: torch's CPU sums and vectorised functions split their work by
thread, so another count can move a loss by an ulp; the gradients observed did not move).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..surrogates import surrogate_value_and_pull_, tile_sum_and_pull
from .layout import LevelCosts, OrdinalLayout

TILE_ELEMENTS = 1 << 22  # pairs per block: 16 MB per float32 temporary
# On the CPU, a rectangle between two level runs is cut into tiles of about CPU_TILE_SIDE^2 pairs
# (4 MB per float32 buffer): its six passes over a tile (difference, value, sum, pull, row and
# column sums) then run from the cache. Tiles of TILE_ELEMENTS pairs (16 MB buffers) took 1.3x as
# long on one CPU thread (65 against 50 ms for AUC at N = 8,192; benchmarks/bench_cpu_path.py).
# Square tiles also bound the float32 additions into a gradient entry by n / 1,024 on both sides
# (full-width rows of 2^22 / n made n^2 / 2^22 of them into each lower item's entry). On a GPU,
# where each tile costs launches and not cache, the tiles stay TILE_ELEMENTS wide.
CPU_TILE_SIDE = 1 << 10
# On the CPU, the listed pairs of small groups are computed this many at a time (1 MB per int32 or
# float32 temporary, of which a chunk makes about ten): chunks of 2^17-2^20 pairs took about the
# same time (AUC in groups of 20-200 items at N = 65,536 and 262,144); fresh 16 MB temporaries of
# TILE_ELEMENTS made their page faults a quarter of a grouped call's CPU time when these groups
# were padded blocks (benchmarks/bench_cpu_path.py).
CPU_PAIR_LIST_CHUNK = 1 << 18
# Larger groups are cut into rectangles between level runs (or masked tiles): a listed pair costs
# a few gathers more than a rectangle's, which a small group's few operations outweigh. At 256
# items per group the two took the same time (AUC and LaA of 3 levels, 64 groups, CPU), at 512
# listing took 2.7x as long.
MAX_LISTED_GROUP = 256
# Devices whose indexed add (``index_add_`` of a 1-D tensor) adds the entries one after another in
# index order: deterministic, so the listed pairs' lower sums take one (the CPU's, checked by
# tests/test_cpu_path_equivalence.py against a sequential reference). A GPU's adds are atomic.
# On the CPU it took 0.7x the time of gathering the pairs lower-major for a second segment sum
# (AUC and LaA in groups of ~50 at 65,536 items, one thread).
ORDERED_INDEX_ADD = ("cpu",)
# A group of at most MAX_LISTED_GROUP items is listed unless its valid pairs exceed this many per
# rectangle (per pair of its levels), where the rectangles' few tensor operations then cost less
# than listing its pairs. AUC on one CPU thread, groups of ~200 items at prior 0.5 (10,000 pairs a
# rectangle): listed 256 ms, rectangles 144 ms for 262,144 items; at prior 0.1 (3,600) 121 against
# 114; groups of ~120 at prior 0.5 (3,600, 65,536 items) 51 against 45; groups of ~100 at prior
# 0.1 (900): 78 against 213. Between the two: 6K, which took that first case from 254-267 to
# 157-162 ms and LaA of two labels in groups of ~250 (6,500) from 101-104 to 90-93 ms.
LISTED_PAIRS_PER_RECTANGLE = 6 * 1024
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
    *,
    left_out: bool = False,
) -> tuple[Tensor, Tensor]:
    """(each group's loss (G,), dloss/dscores) for sorted scores; computed in the scores' dtype.
    A group whose coefficient is 0 is not computed (its loss is 0); ``left_out``: some groups with
    valid pairs have one (another rank's share of the groups), else only those without a pair do."""
    sizes, offsets = layout.group_sizes, layout.group_offsets
    active = group_coefficients > 0
    grad = torch.zeros_like(scores)

    linear_cost = costs.linear

    def item_level_values() -> Tensor:
        return layout.centred_level_values.to(scores.dtype)

    level_pairs = layout.level_pairs  # a group's rectangles
    listed = (sizes <= MAX_LISTED_GROUP) & (layout.group_pairs <= LISTED_PAIRS_PER_RECTANGLE * level_pairs)
    large = active & ~listed
    any_large = bool(large.any())
    small = active & listed if any_large or left_out else None  # None: every group with a pair
    if small is None or bool(small.any()):
        group_losses = _small_groups(
            scores, item_level_values() if linear_cost else None, layout, small,
            group_coefficients.to(scores.dtype), surrogate, margin, grad,
        )
    else:
        group_losses = scores.new_zeros(layout.num_groups)

    if any_large:  # their losses, one per group, replace the listed path's 0s
        large_losses: list[tuple[int, Tensor]] = []
        tiled = large & (level_pairs * RECTANGLE_PAIRS > sizes * sizes)
        if bool((large & ~tiled).any()):
            large_losses.extend(_level_rectangles(
                scores, layout, large & ~tiled, costs, group_coefficients, surrogate, margin, grad
            ))
        if bool(tiled.any()):
            level_values = item_level_values()
            for group in torch.nonzero(tiled).flatten().tolist():
                start, end = int(offsets[group]), int(offsets[group] + sizes[group])
                # Which pairs are valid comes from the level indices: two levels that the scores' dtype
                # cannot tell apart (weights [57150, 5e-5] in float32) are still two levels, counted in Z_u.
                large_losses.append((group, _level_tiles(
                    scores, level_values, layout.level, start, end, group_coefficients[group].to(scores.dtype),
                    linear_cost, surrogate, margin, grad,
                )))
        large_groups, losses = zip(*large_losses)
        group_losses.index_copy_(0, torch.tensor(large_groups, device=scores.device), torch.stack(losses))
    return group_losses, grad


def _pair_list_chunk(device: torch.device) -> int:
    """Listed pairs per chunk of small groups (see ``CPU_PAIR_LIST_CHUNK``)."""
    return CPU_PAIR_LIST_CHUNK if device.type == "cpu" else TILE_ELEMENTS


def _small_groups(
    scores: Tensor,
    item_level_values: Tensor | None,
    layout: OrdinalLayout,
    selected: Tensor | None,
    coefficients: Tensor,
    surrogate: str,
    margin: float,
    grad: Tensor,
) -> Tensor:
    """The valid pairs of the ``selected`` groups ((G,) bool; None: every group), listed one after
    another. Inside a group the levels descend, so the lower partners of an item are the positions
    from its cell's end to its group's end, and its upper partners those from its group's start to
    its cell's start: each item's pairs are a run of the list (upper-major), whose sums are
    ``segment_reduce`` sums over runs. Each lower item's sum over its upper partners is an indexed
    add in list order on the CPU (``ORDERED_INDEX_ADD``), elsewhere a sum over runs of the same
    pairs gathered lower-major (a GPU's indexed adds are atomic, in any order). No padding, and
    the same few tensor operations for any number of groups, in chunks of about
    ``_pair_list_chunk`` pairs that never cut a group. The groups' coefficients multiply the sums;
    ``item_level_values`` (the linear cost, else None) weigh each pair by its levels' difference.
    Returns each group's loss (G,), 0 for the groups not selected."""
    device = scores.device
    ordered_adds = device.type in ORDERED_INDEX_ADD
    partners = layout.partners
    group_start, cell_end, group_end = partners.group_start, partners.cell_end, partners.group_end
    below = partners.below  # each item's lower partners
    above = None if ordered_adds else partners.above  # and its upper ones, for the lower-major list
    if selected is not None:
        taken = selected.index_select(0, layout.group)
        below = torch.where(taken, below, 0)
        above = None if above is None else torch.where(taken, above, 0)
    item_coefficients = coefficients.index_select(0, layout.group)
    # chunks of whole groups of about ``chunk`` pairs: cut at the first group end past each multiple
    pairs_before = torch.cumsum(below, 0)
    chunk, total = _pair_list_chunk(device), int(pairs_before[-1])
    bounds = [0, scores.numel()]
    if total > chunk:
        cuts = torch.searchsorted(pairs_before, torch.arange(chunk, total, chunk, device=device))
        bounds = sorted({0, scores.numel(), *group_end[cuts].tolist()})
    # each item's pairs as the upper item, weighed by its group's coefficient
    item_losses: Tensor | None = None if len(bounds) == 2 else scores.new_zeros(scores.numel())
    for start, end in zip(bounds[:-1], bounds[1:]):  # chunk-local int32 positions from here on
        lower_counts = below[start:end]
        num_pairs = total if len(bounds) == 2 else int(lower_counts.sum())  # one chunk: every pair
        if num_pairs == 0:
            continue
        lower_first = (cell_end[start:end] - start if start else cell_end[start:end]).to(torch.int32)
        uppers, lowers, first_pair = _runs(lower_counts.to(torch.int32), lower_first, num_pairs)  # upper-major
        chunk_scores = scores[start:end]
        value, pull = surrogate_value_and_pull_(
            chunk_scores.index_select(0, lowers) - chunk_scores.index_select(0, uppers), surrogate, margin)
        if item_level_values is not None:
            chunk_values = item_level_values[start:end]
            weight = chunk_values.index_select(0, uppers) - chunk_values.index_select(0, lowers)
            pull = pull * weight if pull is value else pull.mul_(weight)
            value = value * weight
        chunk_coefficients = item_coefficients[start:end]
        chunk_losses = torch.segment_reduce(value, "sum", lengths=lower_counts) * chunk_coefficients
        if item_losses is None:  # one chunk: every item
            item_losses = chunk_losses
        else:
            item_losses[start:end] = chunk_losses
        upper_sums = torch.segment_reduce(pull, "sum", lengths=lower_counts)
        if ordered_adds:
            lower_sums = torch.zeros_like(upper_sums).index_add_(0, lowers, pull)
        else:
            # the same pairs listed lower-major: pair (i, j) of the upper-major list sits at
            # first_pair_i + (j - lower_first_i)
            assert above is not None  # listed when the adds are not ordered
            upper_counts = above[start:end]
            upper_first = (group_start[start:end] - start).to(torch.int32)
            lowers, uppers, _ = _runs(upper_counts.to(torch.int32), upper_first, num_pairs)
            position = (first_pair - lower_first).index_select(0, uppers) + lowers
            lower_sums = torch.segment_reduce(pull.index_select(0, position), "sum", lengths=upper_counts)
        grad[start:end] = (lower_sums - upper_sums) * chunk_coefficients
    if item_losses is None:  # no pair
        return scores.new_zeros(layout.num_groups)
    return torch.segment_reduce(item_losses, "sum", lengths=layout.group_sizes)


def _runs(counts: Tensor, first_partner: Tensor, num_entries: int) -> tuple[Tensor, Tensor, Tensor]:
    """A list of runs, one per item k (int32 positions): ``counts[k]`` entries pairing item k with
    the items ``first_partner[k]``, ``first_partner[k] + 1``, ... As (each entry's item, its
    partner, the position of each item's first entry)."""
    owners, first_entry = _run_of_each(counts, num_entries)
    entries = torch.arange(num_entries, dtype=torch.int32, device=counts.device)
    return owners, entries + (first_partner - first_entry).index_select(0, owners), first_entry


def _run_of_each(lengths: Tensor, total: int) -> tuple[Tensor, Tensor]:
    """(the run of each of ``total`` positions (int32), each run's first position (int32)) for
    consecutive runs of ``lengths`` (empty ones allowed): how many runs start at or before a
    position, less one, since an empty run starts where the next one does. ``repeat_interleave``
    gives the same, but spreads even a few thousand positions over every CPU thread, whose idle
    spinning then doubled a small batch's CPU time (the test suite's two workers share two cores)."""
    first = torch.cumsum(lengths, 0, dtype=torch.int32) - lengths.to(torch.int32)
    starts = torch.zeros(total + 1, dtype=torch.int32, device=lengths.device)
    starts.index_add_(0, first, torch.ones_like(first))
    return torch.cumsum(starts[:total], 0, dtype=torch.int32) - 1, first


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
) -> Tensor:
    """The loss of one group (positions ``start:end``, levels descending) from square tiles of
    the triangle i < j, where every valid pair has its upper item first; the tiles are masked to
    the pairs of distinct levels. For groups with a level per few items, which make too many
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
                item_level_values[None, lower], item_levels[upper, None] > item_levels[None, lower], coefficient,
                linear_cost, surrogate, margin,
            )
            partial_sums.append(weighted_value.sum())
            grad[upper] -= weighted_pull.sum(1)
            grad[lower] += weighted_pull.sum(0)
    return torch.stack(partial_sums).sum()


def _weighted_pairs(
    upper_scores: Tensor,
    lower_scores: Tensor,
    upper_values: Tensor,
    lower_values: Tensor,
    valid: Tensor,
    coefficient: Tensor,
    linear_cost: bool,
    surrogate: str,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(w phi, w pull) of a block of candidate pairs (upper item i, lower item j, broadcast), with
    w = c_ij * coefficient for the valid pairs (``valid``: level_i > level_j) and 0 for the others,
    whose surrogate is evaluated at 0 instead of their scores: an exponential that overflows there
    would make 0 * inf = NaN.

    Every step after the first of each block-sized temporary writes into it (the same arithmetic
    as out of place, so the same bits): a block of 2^22 pairs made nine fresh 16 MB temporaries,
    and the page faults of their fresh memory took about 40% of a grouped call's CPU time
    (benchmarks/bench_cpu_path.py)."""
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
) -> list[tuple[int, Tensor]]:
    """(group, its loss) of the selected groups, rectangle by rectangle: (run of level a) x (run
    of level b), a above b in the same group; each rectangle has one weight c_ab * coef_u and no
    invalid pair."""
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
    partial_sums: dict[int, list[Tensor]] = {}
    # Cells of one group are consecutive, levels descending: every later cell of the group is lower.
    for index, (group, upper_level, upper_start, upper_end) in enumerate(cells):
        for lower_group, lower_level, lower_start, lower_end in cells[index + 1 :]:
            if lower_group != group:
                break
            cost = values[upper_level] - values[lower_level] if costs.linear else 1.0
            weight = cost * coefficients[group]
            partial_sums.setdefault(group, []).extend(
                _rectangle(scores, upper_start, upper_end, lower_start, lower_end, weight, surrogate, margin, grad)
            )
    return [(group, torch.stack(sums).sum()) for group, sums in partial_sums.items()]


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
    made glibc keep gigabytes of freed memory in long runs.
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
