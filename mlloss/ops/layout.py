"""The pair layout every computation path shares, and the dense tables of the PyTorch tier.

A batch is B *problems* over the same N items (B = 1 for AUC and LaA, one per label for LoA):
scores, a level per item and problem (the binary label for AUC/LoA, the aggregated label ybar
for LaA) and an optional group id. A pair (i, j) is valid when g_i == g_j and
level_i > level_j (loss spec, "Pair sets and weights"). The file reads top-down:

* ``Levels`` holds every problem's levels as order-preserving integer ranks (built by
  ``dispatch.problem_levels``), and ``pair_layout`` turns them and the groups into a
  ``PairLayout``: the items of every problem sorted by (group ascending, level ascending), so
  that each group is a contiguous run of positions and, inside it, each level a contiguous
  *cell*. The valid partners of the item at position p are then two ranges of positions, read
  from four int32 spans (the cell spans per problem, the group spans shared): its lower partners
  ``[group_start, cell_start)`` and its upper partners ``[cell_end, group_end)``. The Triton
  kernels stream these ranges in tiles.
* ``dense_tables`` lays out the problems of the same ``Levels`` and groups for the PyTorch tier
  as an ``OrdinalLayout`` (one sort, reading sizes on the host), stacked into one problem whose
  groups are the (problem, group) pairs: the items by (problem, group ascending, level
  descending) and their cells, which the PyTorch tier's closed
  forms, max-violation pairs and blocked all-pairs path work on, with each item's partners as
  two runs of positions (``OrdinalLayout.partners``, which also give the normalisers,
  ``group_pair_costs``); ``CellTables`` lays each group's own cells in a row (the max-violation
  pairs and the squared closed form), and ``OrdinalLayout.counts`` the (group, level) table over
  every level of the batch (the hinge and exponential closed forms). The helpers after them: the
  level-pair costs and their sums (``LevelCosts``), the groups' coefficients 1/Z_u, per-cell
  log-sum-exp and the scatter of per-cell values.
* ``sortable``, ``run_bounds`` and ``value_ranks`` rank values by integer sorts and linear passes
  (the hinge closed form's merge, the metrics' tie blocks).

``pair_layout`` is sync-free and shape-static: a few sorts and binary searches on the device,
no ``unique``/``nonzero``/``.item()``, so a CUDA step does not wait for the host and
``torch.compile`` sees fixed shapes. (The Triton tier lays out problems of a few levels by a
counting sort inside each group in two launches instead, after one sort of the group ids if
there are groups, ``kernels.levels.counting_layout``: the same ``PairLayout``, bit for bit.) The tables of ``dense_tables`` are data-dependent in size
and read counts on the host; they serve the PyTorch tier only (the Triton tier's max-violation
pairs walk each group's cells instead: ``kernels.hardest``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

# A (group, level) table over every level of the batch holds G * L entries; beyond this
# ``OrdinalLayout.counts`` refuses rather than allocating gigabytes (the closed forms, its only
# users, give way to the blocked sum before: ``torch_tier.closed_form_cost``).
MAX_GROUP_LEVEL_CELLS = 1 << 27
# The all-pairs kernels' finalize step finds Z_u by a walk over each group's cells in level order,
# one loop step per level, for problems of at most this many levels (LaA of a few binary labels);
# more levels, or an ordinal column (a rank per item), take per-position shares of Z_u. (The
# max-violation kernel's walk stops when it leaves the group: its steps are the group's levels.)
MAX_WALK_LEVELS = 16


@dataclass(frozen=True)
class PairLayout:
    """B problems over N items, each sorted by (group ascending, level ascending).

    The lower partners of the item at position p of problem b are the positions
    ``[group_start[p], cell_start[b, p])``, its upper partners ``[cell_end[b, p], group_end[p])``.
    Group spans are shared by the problems (every problem's sort keeps the groups in the same
    runs); without groups they are None and the one group is ``[0, N)``.
    """

    order: Tensor  # (B, N) int32: sorted position -> item index
    cell_start: Tensor  # (B, N) int32: first position of the item's (group, level) cell
    cell_end: Tensor  # (B, N) int32: one past its last position
    group_start: Tensor | None  # (N,) int32
    group_end: Tensor | None  # (N,) int32

    @property
    def num_problems(self) -> int:
        return self.order.shape[0]

    @property
    def num_items(self) -> int:
        return self.order.shape[1]


@dataclass(frozen=True)
class Levels:
    """The level of every item in every problem, as an order-preserving integer *rank*."""

    rank: Tensor  # (B, N) int32 or int64: level_i > level_j iff rank_i > rank_j (on the Triton tier,
    # binary label columns may be the caller's own, any dtype and strides: dispatch's columns_as_passed)
    num_ranks: int  # every rank is < num_ranks
    values: Tensor | None  # (B, num_ranks) float64: values[b, rank] is the level's value; None for
    # 0/1 labels (rank = label), whose pairs all cost 1

    @property
    def num_problems(self) -> int:
        return self.rank.shape[0]


def pair_layout(levels: Levels, groups: Tensor | None) -> PairLayout:
    """Sort every problem by (group, level) and find the spans.

    With groups, an item's group rank is the first position of its group among the sorted ids,
    which is also where the group starts in every problem's order: one sort of the ids serves
    all problems. Inside a cell the items keep their index order (a stable sort). Sync-free:
    sorts, binary searches and elementwise arithmetic on the device, shapes fixed by (B, N).
    """
    num_items = levels.rank.shape[1]
    if groups is None:
        key = levels.rank
        group_start = group_end = None
    else:
        key, group_start, group_end = _group_key(levels, groups, num_items)
    # The temporaries are dropped as soon as they are used: at N = 2^20 every int64 vector is
    # 8 MB, and the sorts' outputs are the call's memory peak.
    sorted_key, order = torch.sort(key, dim=1, stable=True)
    del key
    order = order.to(torch.int32)  # half the int64 indices' memory for the rest of the call (N < 2^31)
    cell_start = torch.searchsorted(sorted_key, sorted_key, out_int32=True)
    cell_end = torch.searchsorted(sorted_key, sorted_key, right=True, out_int32=True)
    return PairLayout(order, cell_start, cell_end, group_start, group_end)


def run_ordinals(groups: Tensor) -> Tensor:
    """(N,) int32: the ordinal of each item's run of consecutive equal ids (from 0, or from 1 when
    the last id differs from the first), non-decreasing: the groups of ``contiguous_groups=True``,
    where an id that comes back after another's run starts another group, as ids that every path
    takes (a stable sort leaves them in place; 32-bit keys: half a radix sort's passes). Three
    elementwise ops, no sync."""
    return torch.cumsum(groups != groups.roll(1), 0, dtype=torch.int32)


_SORTABLE_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
                  torch.bfloat16: torch.int16}


def sortable(values: Tensor) -> Tensor:
    """Floats as integers of their width in the same order (integers pass through, bools as
    uint8): equal floats
    give equal integers (-0.0 as 0.0, every NaN as one NaN, after +inf as sorts put them), a
    larger float a larger integer. Torch sorts integers by radix on the CPU: 4-5x faster than
    the comparison sort of floats (1M float64 146 ms, their integers 38 ms, a stable sort on 2
    threads). On CUDA both are radix sorts."""
    if values.dtype == torch.bool:
        return values.to(torch.uint8)
    if not values.is_floating_point():
        return values
    canonical = torch.where(torch.isnan(values), float("nan"), values + 0.0)  # x + 0.0: -0.0 -> 0.0
    bits = canonical.view(_SORTABLE_BITS[values.dtype])
    magnitude = torch.iinfo(bits.dtype).max
    # a negative float's bits grow with its magnitude: flip them below the sign
    return bits ^ ((bits >> (bits.element_size() * 8 - 1)) & magnitude)


def run_bounds(ordered: Tensor) -> tuple[Tensor, Tensor]:
    """(N,) int64 each position's run of equal values in ``ordered`` (sorted): its first position
    and one past its last. One linear pass each way (a running max of the run starts, a running
    min of the run ends from the back), sync-free; the binary searches of every value that give
    the same took 4-5x as long at 2^20 values on the CPU (63 against 14 ms for both bounds)."""
    num = ordered.numel()
    positions = torch.arange(num, device=ordered.device)
    starts = torch.ones(num, dtype=torch.bool, device=ordered.device)
    starts[1:] = ordered[1:] != ordered[:-1]
    ends = torch.roll(starts, -1)  # a run ends where the next starts (the last position ends one)
    start = torch.cummax(torch.where(starts, positions, 0), 0).values
    stop = torch.cummin(torch.where(ends, positions + 1, num).flip(0), 0).values.flip(0)
    return start, stop


def value_ranks(values: Tensor) -> Tensor:
    """(N,) how many of ``values`` are smaller than each: each value's first position among them
    sorted, an order-preserving integer rank (equal values equal). The values are sorted as
    ``sortable`` integers, each run's first position found in that order (``run_bounds``) and put
    back in input order by the sort's permutation (each position written once: deterministic)."""
    ordered, order = torch.sort(sortable(values))
    first = run_bounds(ordered)[0]
    return torch.empty_like(first).scatter_(0, order, first)


def _group_key(levels: Levels, groups: Tensor, num_items: int) -> tuple[Tensor, Tensor, Tensor]:
    """(sort key group rank * ranks + level rank, group start, group end): the group rank is the
    first position of the item's group among the sorted ids: the sorted ids' own searches (the
    group starts in sorted order) put back in input order by the sort's permutation (binary
    searches, not ``run_bounds``' running max and min: fewer launches on the Triton tier).
    int32 keys when they fit."""
    sorted_groups, by_group = torch.sort(groups)
    group_start = torch.searchsorted(sorted_groups, sorted_groups, out_int32=True)
    group_end = torch.searchsorted(sorted_groups, sorted_groups, right=True, out_int32=True)
    del sorted_groups
    first = group_start if num_items * levels.num_ranks < 2**31 else group_start.to(torch.int64)
    group_rank = first.scatter(0, by_group, first)
    return torch.add(levels.rank, group_rank, alpha=levels.num_ranks), group_start, group_end


class Partners(NamedTuple):
    """Each sorted item's valid partners in an ``OrdinalLayout`` ((N,) int64 positions): levels
    descend inside a group, so its upper partners are the positions [group_start, cell_start) and
    its lower ones [cell_end, group_end)."""

    group_start: Tensor
    cell_start: Tensor
    cell_end: Tensor
    group_end: Tensor

    @property
    def below(self) -> Tensor:
        """(N,) how many lower partners each item has."""
        return self.group_end - self.cell_end

    @property
    def above(self) -> Tensor:
        """(N,) how many upper partners each item has."""
        return self.cell_start - self.group_start


@dataclass(frozen=True)
class OrdinalLayout:
    """One problem's items sorted by (group ascending, level descending), and its *cells*, the
    runs of one (group, level): the tables ``dense_tables`` builds for the PyTorch tier, where the
    one problem is the call's problems stacked (``num_problems`` of n items each; a group is a
    (problem, group) pair, and N = B n).

    The (G, L) table of counts over every level of the batch (``counts``) is built only when
    asked for (by the closed forms, when they pay): with a level per item (a real-valued label)
    and many groups it would be quadratic in the batch. The normalisers come from each item's
    partners (``partners``), the max-violation pairs work on each group's own cells (``CellTables``)."""

    order: Tensor  # (N,) sorted position -> original item index
    level_values: Tensor  # (L,) float64, ascending
    num_groups: int
    cell_lengths: Tensor  # (C,) lengths of the runs of equal (group, level) in sorted order
    cell_group: Tensor  # (C,) group index of each cell
    cell_level: Tensor  # (C,) level index of each cell
    cell: Tensor  # (N,) cell index (0..C-1) of each sorted item
    num_problems: int = 1  # stacked problems (``dense_tables``): problem b's items at positions [b n, (b + 1) n)

    @property
    def num_levels(self) -> int:
        return self.level_values.numel()

    @functools.cached_property
    def group(self) -> Tensor:
        """(N,) group index (0..G-1) of each sorted item (built when asked for: the max-violation
        pairs work on cells only)."""
        return self.per_item(self.cell_group)

    @functools.cached_property
    def level(self) -> Tensor:
        """(N,) level index (0..L-1, higher ranks higher) of each sorted item."""
        return self.per_item(self.cell_level)

    @functools.cached_property
    def group_sizes(self) -> Tensor:
        """(G,) int64 items per group."""
        sizes = torch.zeros(self.num_groups, dtype=torch.int64, device=self.cell_lengths.device)
        return sizes.index_add_(0, self.cell_group, self.cell_lengths)

    @functools.cached_property
    def group_pairs(self) -> Tensor:
        """(G,) int64 valid pairs per group: (n_u^2 - sum_a n_ua^2) / 2, the group's pairs less
        those inside a cell (exact)."""
        square_sums = torch.zeros_like(self.group_sizes).index_add_(0, self.cell_group, self.cell_lengths.square())
        return (self.group_sizes.square() - square_sums) // 2

    @functools.cached_property
    def group_offsets(self) -> Tensor:
        """(G,) int64 first position of each group."""
        return torch.cumsum(self.group_sizes, 0) - self.group_sizes

    @functools.cached_property
    def partners(self) -> Partners:
        """Each sorted item's partners, two runs of positions (``Partners``)."""
        cell_end = self.per_item(torch.cumsum(self.cell_lengths, 0))
        group_start = self.group_offsets.index_select(0, self.group)
        return Partners(group_start, cell_end - self.per_item(self.cell_lengths), cell_end,
                        group_start + self.group_sizes.index_select(0, self.group))

    @functools.cached_property
    def centred_level_values(self) -> Tensor:
        """(N,) float64 each sorted item's level value measured from its group's middle item's: a
        pair's cost, a difference of two levels of one group, keeps its precision however far the
        group's levels lie from the others' (0.010 s of watch time beside 1e4 s was 7% off in
        float32 when measured from the batch's)."""
        values = self.level_values[self.level]
        middle = self.group_offsets + self.group_sizes // 2
        return values - values[middle].index_select(0, self.group)

    def per_item(self, cell_values: Tensor) -> Tensor:
        """(N,) each sorted item's entry of per-cell values (C,)."""
        return cell_values.index_select(0, self.cell)

    @functools.cached_property
    def groups_per_problem(self) -> Tensor:
        """(B,) int64 groups of each stacked problem (their groups are consecutive)."""
        problem_items = self.order.numel() // self.num_problems
        return torch.bincount(torch.div(self.group_offsets, problem_items, rounding_mode="floor"),
                              minlength=self.num_problems)

    def per_problem(self, group_values: Tensor) -> Tensor:
        """(B,) the sums of per-group values (G,) over each stacked problem's groups."""
        if self.num_problems == 1:
            return group_values.sum(0, keepdim=True)
        return torch.segment_reduce(group_values, "sum", lengths=self.groups_per_problem)

    def problem_rows(self, item_values: Tensor) -> Tensor:
        """(B, n) per-item values (B n,) in stacked order (problem b's n items in row b)."""
        return item_values.view(self.num_problems, -1)

    @functools.cached_property
    def cells_per_group(self) -> Tensor:
        """(G,) int64 cells (distinct levels) per group."""
        return torch.bincount(self.cell_group, minlength=self.num_groups)

    @functools.cached_property
    def level_pairs(self) -> Tensor:
        """(G,) int64 pairs of distinct levels per group (the blocked sum's rectangles, the
        max-violation pairs)."""
        cells = self.cells_per_group
        return cells * (cells - 1) // 2

    @functools.cached_property
    def counts(self) -> Tensor:
        """(G, L) int64 items per (group, level), over every level of the batch."""
        cells = self.num_groups * self.num_levels
        if cells > MAX_GROUP_LEVEL_CELLS:
            raise ValueError(
                f"labels have {self.num_levels} distinct levels across {self.num_groups} groups; the dense "
                f"(group, level) table would need {cells} cells (limit {MAX_GROUP_LEVEL_CELLS})"
            )
        return dense_cells(self, self.cell_lengths, 0)


def dense_tables(levels: Levels, groups: Tensor | None) -> OrdinalLayout:
    """The sorted items and cells of every problem of ``levels``, for the PyTorch tier, which
    reads sizes on the host (``pair_layout`` is the sync-free layout of the Triton tier).

    The B problems over N items are laid out as one problem over B N items, *stacked*
    problem-major: item i of problem b is stacked item b N + i (its scores in that order:
    ``torch_tier.stacked_scores``), and each (problem, group) is a group of its own, so that
    every path computes all the problems in one pass (two task columns, or LoA's labels, cost one
    sort and one set of tensor operations, not one each). Problem b's items then hold the sorted
    positions [b N, (b + 1) N) and its groups are consecutive (``OrdinalLayout.per_problem``).
    The problems share one table of level values (binary label columns, or one problem).

    One stable sort of the key (problem, group, level descending), packed in int32 where it fits.
    The levels present are indexed by a count over the ranks (no sort); the group ids are
    shifted to start at 0 when their range times the problems and levels fits a key (else
    compacted by ``unique``). At 10^6 items in 20,000 groups this is one sort where
    ``pair_layout`` takes three and two binary searches: a grouped call a third of the time on
    the CPU. Inside a cell the items keep their index order.
    """
    num_problems, num_items = levels.rank.shape
    assert levels.values is None or levels.values.shape[0] == 1, "stacked problems share their levels' values"
    rank = levels.rank.reshape(-1)  # problem-major
    present = torch.bincount(rank, minlength=levels.num_ranks) > 0
    rank_values = torch.nonzero(present).flatten()
    level_values = rank_values.to(torch.float64) if levels.values is None else levels.values[0][rank_values]
    num_levels = rank_values.numel()
    # descending levels inside a group: the lower partners of an item follow it
    key = (num_levels - torch.cumsum(present, 0)).index_select(0, rank)  # index_select: 3x an indexing's speed
    span = 1  # group keys 0 .. span - 1 within a problem
    if groups is not None and num_items:
        low, high = (int(bound) for bound in torch.aminmax(groups))
        span = high - low + 1
        if span * num_problems * num_levels >= 2**62:
            groups, low, span = torch.unique(groups, return_inverse=True)[1], 0, num_items
        group_key = groups.to(torch.int64) - low
        if num_problems > 1:  # (problem, group) keys, problem-major
            group_key = (torch.arange(0, num_problems * span, span, device=rank.device)[:, None] + group_key).reshape(-1)
        key = group_key.mul_(num_levels).add_(key)
    elif num_problems > 1:  # each problem one group
        problem_key = torch.arange(0, num_problems * num_levels, num_levels, device=rank.device)
        key = (problem_key[:, None] + key.view(num_problems, num_items)).reshape(-1)
    if span * num_problems * num_levels < 2**31:
        key = key.to(torch.int32)  # sorts about 1.5x faster than int64 on the CPU
    sorted_key, order = torch.sort(key, stable=True)
    cell_key, cell, cell_lengths = torch.unique_consecutive(sorted_key.to(torch.int64), return_inverse=True,
                                                            return_counts=True)
    cell_group_key = torch.div(cell_key, num_levels, rounding_mode="floor")
    cell_level = num_levels - 1 - (cell_key - cell_group_key * num_levels)
    _, cell_group = torch.unique_consecutive(cell_group_key, return_inverse=True)
    return OrdinalLayout(
        order=order,
        level_values=level_values,
        num_groups=int(cell_group[-1]) + 1 if num_items else num_problems,
        cell_lengths=cell_lengths,
        cell_group=cell_group,
        cell_level=cell_level,
        cell=cell,
        num_problems=num_problems,
    )


@dataclass(frozen=True)
class CellTables:
    """Each group's own cells in a row of (G, K) tables, K the most cells of a group (in
    ``groups``, a subset of the groups, else all): row u holds its c_u cells in ascending level
    order, slots past c_u empty. ``values`` are the cells' level values measured from the group's
    middle cell: a group's costs are differences of its own levels, which stay exact however far
    they lie from the other groups' (0.01 and 0.02 beside levels near 1e14). ``LevelCosts`` over
    ``values`` sums over level pairs in O(G K), where (G, L) tables over every level of the batch
    would take O(G L)."""

    rows: Tensor  # (C',) the row of each cell taken
    slot: Tensor  # (C',) its column: its rank among its group's cells, ascending level
    cells: Tensor  # (C',) the cells taken, indices into the layout's cells
    values: Tensor  # (R, K) float64, measured from each group's middle cell; empty slots repeat the top value
    num_rows: int
    width: int

    @classmethod
    def of(cls, layout: OrdinalLayout, groups: Tensor | None = None) -> CellTables:
        """The tables of ``groups`` (sorted group indices; None: every group, row u for group u).
        (Every group has an item, hence a cell.)"""
        per_group = layout.cells_per_group
        first_cell = torch.cumsum(per_group, 0) - per_group
        if groups is None:
            cells = torch.arange(layout.cell_group.numel(), device=per_group.device)
            rows, num_rows = layout.cell_group, layout.num_groups
        else:
            cells = torch.nonzero(torch.isin(layout.cell_group, groups)).flatten()
            rows, num_rows = torch.searchsorted(groups, layout.cell_group[cells]), groups.numel()
        group = layout.cell_group[cells]
        slot = per_group[group] - 1 - (cells - first_cell[group])  # a group's cells run in descending level order
        width = int(per_group[group].max()) if cells.numel() else 1
        cell_values = layout.level_values[layout.cell_level]
        top = torch.zeros(num_rows, dtype=torch.float64, device=per_group.device).index_put_(
            (rows,), cell_values[first_cell[group]])
        values = top[:, None].repeat(1, width).index_put_((rows, slot), cell_values[cells])
        middle = torch.zeros_like(top).index_put_((rows,), cell_values[(first_cell + per_group // 2)[group]])
        return cls(rows, slot, cells, values - middle[:, None], num_rows, width)

    def table(self, cell_values: Tensor) -> Tensor:
        """(R, K) of per-cell values (C,) of the layout's cells; empty slots 0."""
        table = cell_values.new_zeros(self.num_rows, self.width)
        return table.index_put_((self.rows, self.slot), cell_values[self.cells])

    def item_slot(self, layout: OrdinalLayout) -> Tensor:
        """(N,) every item's column (all groups' tables)."""
        return layout.per_item(self.slot)


def cell_buckets(
    layout: OrdinalLayout, block_elements: int, group_elements: Callable[[int], int]
) -> Iterator[tuple[Tensor, CellTables]]:
    """The groups with a pair of levels (two cells or more) as (group indices, their
    ``CellTables``), in buckets of similar cell counts (power-of-two widths), so that the tables
    hold at most about twice the cells (one user with hundreds of distinct levels beside thousands
    of one-level users makes no (G, 300) table), and in blocks of at most ``block_elements``
    elements, a group of a bucket of ``width`` taking ``group_elements(width)``."""
    per_group = layout.cells_per_group
    widths = next_power_of_two(per_group.clamp(min=1))
    for width in torch.unique(widths[per_group > 1]).tolist():  # a group of one cell has no pair
        bucket = torch.nonzero((widths == width) & (per_group > 1)).flatten()
        chunk = max(1, block_elements // group_elements(width))
        for start in range(0, bucket.numel(), chunk):
            groups = bucket[start : start + chunk]
            yield groups, CellTables.of(layout, groups)


def group_pair_costs(layout: OrdinalLayout, linear: bool) -> tuple[Tensor, Tensor]:
    """Per group u, Z_u = the summed cost of its valid pairs and their number (float64, (G,)).

    The number is ``OrdinalLayout.group_pairs``. The linear cost's sum is sum_i c_i (lower
    partners - upper partners) over the group's items, c_i the item's level measured from the
    group's middle item's (``centred_level_values``):
    a pair (i, j) adds c_i - c_j = v_i - v_j. Every term is >= 0 (an item above the middle item has
    more partners below it than above), so nothing cancels; ``segment_reduce`` adds them in a fixed
    order (deterministic on CUDA too)."""
    pairs = layout.group_pairs.to(torch.float64)
    if not linear:
        return pairs, pairs
    partners = layout.partners
    terms = layout.centred_level_values * (partners.below - partners.above)
    return torch.segment_reduce(terms, "sum", lengths=layout.group_sizes), pairs


@dataclass(frozen=True)
class LevelCosts:
    """The pair costs of one problem's levels: c_ab = v_a - v_b (``linear``, Lukasik et al.
    Prop. 5.4) or 1 (uniform, Prop. 5.3) for levels a > b, else 0, over the ascending level
    values v (L,) float64 of the dense tables.

    The sums over level pairs the PyTorch tier needs (normalisers Z_u, each level's partners)
    are prefix sums along the levels: O(G L) for (G, L) tables, with no (L, L) cost table, which
    a real-valued label (a level per item) would make quadratic in the batch. ``matrix`` builds
    that table for the exponential closed form, which works on level pairs (the max-violation
    pairs take ``between`` on each group's own levels).
    """

    level_values: Tensor  # (L,) float64, ascending; or the (G, K) rows of ``CellTables``, for the sums only
    linear: bool

    @classmethod
    def of(cls, level_values: Tensor, cost: str) -> LevelCosts:
        return cls(level_values, cost == "linear")

    def matrix(self) -> Tensor:
        """C (L, L) float64, C[a, b] = c_ab."""
        values = self.level_values
        return self.between(torch.arange(values.numel(), device=values.device)[:, None],
                            torch.arange(values.numel(), device=values.device)[None, :])

    def between(self, upper: Tensor, lower: Tensor | int) -> Tensor:
        """c of the level indices ``upper`` and ``lower`` (broadcast): 0 unless upper is above."""
        gap = self.level_values[upper] - self.level_values[lower]
        return torch.where(gap > 0, gap if self.linear else torch.ones_like(gap), 0.0)

    def below(self, table: Tensor) -> Tensor:
        """(G, L): sum_b c_ab table[:, b] for each level a, over its lower partners b < a."""
        table = table.to(torch.float64)
        lower = _exclusive_cumsum(table)
        if not self.linear:
            return lower
        values = self._centred_values()
        return values * lower - _exclusive_cumsum(table * values)

    def above(self, table: Tensor) -> Tensor:
        """(G, L): sum_a c_ab table[:, a] for each level b, over its upper partners a > b."""
        table = table.to(torch.float64)
        upper = _exclusive_cumsum(table.flip(1)).flip(1)
        if not self.linear:
            return upper
        values = self._centred_values()
        return _exclusive_cumsum((table * values).flip(1)).flip(1) - values * upper

    def pair_sums(self, upper: Tensor, lower: Tensor) -> Tensor:
        """Per group u: sum_{a > b} c_ab * upper_ua * lower_ub over (G, L) tables (float64, (G,))."""
        return (upper.to(torch.float64) * self.below(lower)).sum(1)

    def group_cost(self, counts: Tensor) -> Tensor:
        """Z_u = sum over valid pairs in group u of c_ij = sum_{a > b} n_ua c_ab n_ub (float64, (G,))."""
        return self.pair_sums(counts, counts)

    def _centred_values(self) -> Tensor:
        # Differences are what the costs are made of: measured from the middle level, the prefix
        # sums of v * table stay small and v_a * (lower count) - (lower sum of v) cancels less
        # (the middle, not the lowest: a mask's fillers add one level, 0, far from labels near 1e8).
        # Values of (G, K) ``CellTables`` rows come measured from their group's middle cell already.
        if self.level_values.dim() > 1:
            return self.level_values
        middle = self.level_values.numel() // 2
        return self.level_values - self.level_values[middle]


def _exclusive_cumsum(table: Tensor) -> Tensor:
    """Sums of the entries before each one along dim 1 (the first is 0), each computed as its own
    prefix (not cumsum - entry, which would round)."""
    return torch.nn.functional.pad(torch.cumsum(table[:, :-1], 1), (1, 0))


def next_power_of_two(values: Tensor) -> Tensor:
    """The smallest power of two >= each of ``values`` (>= 1), int64: the widths of ``cell_buckets``' tables."""
    return torch.pow(2, torch.ceil(torch.log2(values.to(torch.float64)))).to(torch.int64)


def group_coefficients(group_cost: Tensor, layout: OrdinalLayout) -> tuple[Tensor, Tensor]:
    """(per-group weight of a group's pair sum, each problem's number of groups with a valid pair
    (B,) float64) for the normalisers Z_u (G,) of ``layout``'s groups: the weight is 1/Z_u, 0 for
    groups without a valid pair (loss spec, Groups). ``reduction="mean"`` divides each problem's
    loss by its number after the path (``torch_tier``), as the Triton tier's ``reduce.combine``."""
    has_pairs = group_cost > 0
    coefficients = torch.where(has_pairs, group_cost.reciprocal(), 0.0)  # the inf of 1/0 is not taken
    return coefficients, layout.per_problem(has_pairs.to(torch.float64))


def cell_logsumexp(values: Tensor, layout: OrdinalLayout) -> Tensor:
    """(C,) log(sum(exp(values))) over each cell of per-item values (N,), shifted by the cell's max."""
    lengths = layout.cell_lengths
    shift = torch.segment_reduce(values, "max", lengths=lengths)
    total = torch.segment_reduce(torch.exp(values - layout.per_item(shift)), "sum", lengths=lengths)
    return torch.log(total) + shift


def dense_cells(layout: OrdinalLayout, cell_values: Tensor, fill: float) -> Tensor:
    """Scatter per-cell values (C,) into a (G, L) table; absent cells hold ``fill``."""
    table = torch.full(
        (layout.num_groups, layout.num_levels), fill, dtype=cell_values.dtype, device=cell_values.device
    )
    return table.index_put((layout.cell_group, layout.cell_level), cell_values)
