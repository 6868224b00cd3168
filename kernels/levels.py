"""Levels on the Triton tier: LaA's label patterns ranked in one launch, and the layout of a few
levels in two (a counting sort inside each group instead of sorts and binary searches).

**Pattern ranks.**

``LaALoss`` over K binary columns (2 <= K <= ``mlloss.ops.dispatch.MAX_PATTERN_COLUMNS``) ranks
each item's label pattern, sum_k 2^k y_k, through a table of the patterns' level ranks built once
per label weights on the host (``dispatch._pattern_tables``). In PyTorch that is five ops (a cast
to float64, a matrix-vector product with the powers of two, a cast back, a bit mask and a gather),
all of them CUDA launches, one through cuBLAS: on an H100 they took about 150 us of host time per
call under torch.profiler (``benchmarks/results/nvidia-h100-80gb-hbm3-profile-a98808d.txt``:
matmul, index and the casts of the LaA call). This kernel reads the columns as the caller passed them (any dtype, any strides: a slice
of a data set's label matrix) and writes the (1, N) int32 ranks the kernels take.

An entry other than 0 counts as a 1: the data check refuses such labels when it is on (made in the
same launch: a non-finite score, or a column entry other than 0/1, among the mask's items, OR-ed
into the call's status word as ``kernels.check.check_batch`` would in a launch of its own); with it
off (``validate_args=False``) non-binary labels give no defined loss, but every pattern stays
inside the table.

**Counting layout.** A problem of L levels (binary labels: 2; LaA of two binary columns: 3)
sorted by (group, level) is a stable counting sort inside each group: an item's position is its
group's start, plus the group's items of lower levels, plus those of its own level before it.
``counting_layout`` builds the ``PairLayout`` that ``mlloss.ops.layout.pair_layout`` builds with
sorts and binary searches (the same order, cell and group spans, bit for bit) in two launches:
the level counts of every block of positions, then each block's positions from the counts of
the blocks before it and in-block prefix sums per level. Without groups the items are counted in
index order, and no sort runs at all. With groups, one stable sort of the group ids puts each
group in a run of positions (in index order inside it, as pair_layout's stable sort of (group,
level) keys leaves them); a group's
items of level l are then the items of level l before its end minus those before its start, and
prefixes grow along the positions, so the positions kernel finds both by a max-scan and a
reverse min-scan over the block's group starts and ends, and, for the groups that cross the
block's edges, from the counts of the blocks between (a user's group spans one or two blocks).
Each block needs the counts of all blocks before it: past ``SCAN_BLOCKS`` blocks a third launch
sums them once (``_block_scan_kernel``: the blocks' prefix sums, and the group edges carried
across blocks), so that no program of the positions kernel adds up O(blocks) counts.
On CUDA a sort is several launches (CUB's radix passes, their scratch): without groups the sort
and the int32 cast took about 200 us of host time a call under torch.profiler on the H100
(``nvidia-h100-80gb-hbm3-profile-a98808d.txt``: the AUC call at N = 16,384), the binary searches
about 100 more; with groups pair_layout takes two sorts and five binary searches over N items.
For at most ``COUNTING_LEVELS`` levels; a rank outside [0, L) (labels the data check refuses)
counts as the nearest level, so that every position is written. Binary label columns come as
the caller passed them (transposed, a view of any dtype and strides: no int32 copy), and the
counts kernel then makes the data check too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
from ..ops.layout import PairLayout
from ._common import cdiv, int32_addressable, validate_device
from ._launch import launcher
from .check import report_binary_check, report_check
from .scan import group_edges, running_extreme

__all__ = ["COUNTING_LEVELS", "counting_layout", "pattern_ranks"]

BLOCK = 1024
GROUPED_BLOCK = 512  # the positions of a block with groups: its prefixes at the group edges take registers too
#: Most levels ``counting_layout`` takes (each item block counts them in registers).
COUNTING_LEVELS = 8
COUNT_BLOCK = 256  # blocks' counts summed per step of the positions kernel (or of the scan)
#: Blocks of positions past which a third launch scans the blocks' counts and group edges once
#: (``_block_scan_kernel``), instead of every program of the positions kernel summing those of
#: all blocks before it: O(blocks) work instead of O(blocks^2). On an H100 the positions kernel
#: took 97 us at 2^20 items with groups (2,048 blocks; ``nvidia-h100-80gb-hbm3-profile-a20b70f.txt``)
#: and a few us at 16,384 (32 blocks), where a launch costs more host time than it saves.
SCAN_BLOCKS = COUNT_BLOCK
SCAN_CHUNK = 1024  # blocks a step of the scan (2 steps at 2^20 items with groups)


@triton.jit(  # sizes and the caller's alignment not specialized: see _common.py
    do_not_specialize=("N", "stride_item", "stride_label"),
    do_not_specialize_on_alignment=("labels_ptr", "scores_ptr", "keep_ptr"),
)
def _pattern_rank_kernel(
    labels_ptr, stride_item, stride_label, table_ptr, out_ptr, scores_ptr, keep_ptr, status_ptr, N,
    K: tl.constexpr, BLOCK: tl.constexpr, CHECK: tl.constexpr, MASKED: tl.constexpr, BAD_SCORE: tl.constexpr,
    BAD_LABEL: tl.constexpr,
):
    """Grid (item blocks,): out[i] = table[sum_k 2^k (labels[i, k] != 0)]; with CHECK, the data
    check of the block's items (those of ``keep`` if MASKED) under the binary rule of each column,
    OR-ed into ``status``."""
    items = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = items < N
    row = labels_ptr + items.to(tl.int64) * stride_item
    pattern = tl.zeros([BLOCK], dtype=tl.int32)
    bad_label = tl.zeros([BLOCK], dtype=tl.int1)
    for k in tl.static_range(K):
        label = tl.load(row + k * stride_label, mask=mask, other=0)
        pattern |= (label != 0).to(tl.int32) << k
        if CHECK:
            bad_label |= (label != 0) & (label != 1)
    tl.store(out_ptr + items, tl.load(table_ptr + pattern, mask=mask, other=0), mask=mask)
    if CHECK:
        if MASKED:
            mask &= tl.load(keep_ptr + items, mask=mask, other=0) != 0
        report_check(status_ptr, tl.load(scores_ptr + items, mask=mask, other=0.0), bad_label, mask, BAD_SCORE, BAD_LABEL)


def pattern_ranks(
    labels: torch.Tensor, rank_table: torch.Tensor,
    check: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """(1, N) int32: the rank in ``rank_table`` ((2^K,) int32, on the labels' device) of each row's
    pattern of the (N, K) binary ``labels``. ``check``: (scores (N,), status (1,) int32, mask (N,)
    bool or None): the batch's data check (``check.check_batch``'s, each column 0/1) in the same
    launch, its bits OR-ed into ``status``."""
    scores, status, mask = check if check is not None else (None, None, None)
    validate_device(labels, rank_table, scores, status, mask)
    n, k = labels.shape
    if rank_table.numel() != 2**k:
        raise ValueError(f"a table of {2**k} pattern ranks is needed for {k} label columns; got {rank_table.numel()}")
    out = torch.empty((1, n), dtype=torch.int32, device=labels.device)
    if n:
        unused = out  # a pointer the kernel does not read without CHECK (or MASKED)
        launcher(_pattern_rank_kernel)[(cdiv(n, BLOCK),)](
            labels, labels.stride(0), labels.stride(1), rank_table, out,
            unused if scores is None else scores, unused if mask is None else mask, unused if status is None else status, n,
            K=k, BLOCK=BLOCK, CHECK=check is not None, MASKED=mask is not None, BAD_SCORE=STATUS_BAD_SCORE,
            BAD_LABEL=STATUS_BAD_LABEL,
        )
    return out


# --------------------------------------------------------------------------- #
# Counting layout: a stable sort by level, inside each group                   #
# --------------------------------------------------------------------------- #
@triton.jit
def _block_levels(rank_row, stride_item, order_ptr, block, N, LEVELS: tl.constexpr, WIDTH: tl.constexpr,
                  BLOCK: tl.constexpr, ORDERED: tl.constexpr):
    """(positions, in range, items, the ranks as stored, one-hot [BLOCK, WIDTH] int32 of each
    item's level) of one block of positions: the item at position p is p, or order[p] (ORDERED).
    Ranks are read as int32 and clamped into [0, LEVELS)."""
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    if ORDERED:
        items = tl.load(order_ptr + positions, mask=mask, other=0).to(tl.int32)
    else:
        items = positions
    stored = tl.load(rank_row + items.to(tl.int64) * stride_item, mask=mask, other=0)
    rank = tl.minimum(tl.maximum(stored.to(tl.int32), 0), LEVELS - 1)
    one_hot = ((rank[:, None] == tl.arange(0, WIDTH)[None, :]) & mask[:, None]).to(tl.int32)
    return positions, mask, items, stored, one_hot


@triton.jit
def _levels_in(rank_row, stride_item, order_ptr, block, lo, hi, N, LEVELS: tl.constexpr, WIDTH: tl.constexpr,
               BLOCK: tl.constexpr, ORDERED: tl.constexpr):
    """[WIDTH] the items of each level at the positions [lo, hi) of one block."""
    positions, mask, _, _, one_hot = _block_levels(rank_row, stride_item, order_ptr, block, N, LEVELS, WIDTH, BLOCK,
                                                   ORDERED)
    inside = (positions >= lo) & (positions < hi)
    return tl.sum(tl.where(inside[:, None], one_hot, 0), axis=0)


@triton.jit
def _levels_between(rank_row, stride_item, order_ptr, counts_row, lo, hi, N, LEVELS: tl.constexpr,
                    WIDTH: tl.constexpr, BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr, ORDERED: tl.constexpr,
                    SCANNED: tl.constexpr):
    """[WIDTH] the items of each level at the positions [lo, hi): the blocks inside from their
    counts (SCANNED: from two of their prefix sums), the part-blocks at the ends read."""
    levels = tl.arange(0, WIDTH)
    inner_start = (lo + BLOCK - 1) // BLOCK  # the whole blocks inside are [inner_start, inner_end)
    inner_end = hi // BLOCK
    found = tl.zeros([WIDTH], dtype=tl.int32)
    if lo < tl.minimum(hi, inner_start * BLOCK):
        found += _levels_in(rank_row, stride_item, order_ptr, lo // BLOCK, lo, tl.minimum(hi, inner_start * BLOCK),
                            N, LEVELS, WIDTH, BLOCK, ORDERED)
    if SCANNED:  # counts_row holds the blocks' exclusive prefix sums
        if inner_start < inner_end:
            found += (tl.load(counts_row + inner_end * WIDTH + levels)
                      - tl.load(counts_row + inner_start * WIDTH + levels))
    else:
        for start in range(inner_start, inner_end, COUNT_BLOCK):
            blocks = start + tl.arange(0, COUNT_BLOCK)
            found += tl.sum(tl.load(counts_row + blocks[:, None] * WIDTH + levels[None, :],
                                    mask=(blocks < inner_end)[:, None], other=0), axis=0)
    tail = tl.maximum(inner_start, inner_end) * BLOCK
    if tail < hi:
        found += _levels_in(rank_row, stride_item, order_ptr, inner_end, tail, hi, N, LEVELS, WIDTH, BLOCK, ORDERED)
    return found


@triton.jit(  # batch sizes and the caller's labels not specialized: see _common.py
    do_not_specialize=("N", "num_blocks", "stride_problem"),
    do_not_specialize_on_alignment=("rank_ptr", "scores_ptr"),
)
def _level_counts_kernel(rank_ptr, stride_problem, stride_item, order_ptr, groups_ptr, counts_ptr, edges_ptr,
                         scores_ptr, status_ptr, N, num_blocks,
                         LEVELS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, ORDERED: tl.constexpr,
                         GROUPED: tl.constexpr, CHECK: tl.constexpr, BAD_SCORE: tl.constexpr,
                         BAD_LABEL: tl.constexpr, SCORE_COLUMNS: tl.constexpr):
    """Grid (blocks of positions, B): counts[b, block, l], the items of level l in this block
    (counts has a row more per problem, for ``_block_scan_kernel``'s totals).
    GROUPED: also edges[block] = (the block's last group start, its first group end + 1; -1 and
    N + 1 without). CHECK (0/1 labels as the ranks): also the data check of ``kernels.check`` on
    the block, into ``status``, of the problem's own row of (B, N) scores with SCORE_COLUMNS."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    positions, mask, items, stored, one_hot = _block_levels(rank_ptr + problem * stride_problem, stride_item,
                                                            order_ptr, block, N, LEVELS, WIDTH, BLOCK, ORDERED)
    tl.store(counts_ptr + (problem * (num_blocks + 1) + block) * WIDTH + tl.arange(0, WIDTH), tl.sum(one_hot, axis=0))
    if GROUPED:
        if problem == 0:
            first, last = group_edges(groups_ptr, positions, mask, N)
            tl.store(edges_ptr + 2 * block, tl.max(tl.where(first, positions, -1)))
            tl.store(edges_ptr + 2 * block + 1, tl.min(tl.where(last, positions + 1, N + 1)))
    if CHECK:
        if SCORE_COLUMNS:
            scores_ptr += problem * N
        report_binary_check(status_ptr, tl.load(scores_ptr + items, mask=mask, other=0.0), stored, mask, BAD_SCORE,
                            BAD_LABEL)


@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _block_scan_kernel(counts_ptr, edges_ptr, carried_ptr, N, num_blocks, WIDTH: tl.constexpr,
                       CHUNK: tl.constexpr, GROUPED: tl.constexpr):
    """Grid (B,): in place, counts[b, block, l] becomes the items of level l in the blocks before
    ``block``, and counts[b, num_blocks, l] their total; GROUPED (problem 0): carried[block] =
    (the last group start in the blocks before it, -1 if none; the first group end in those after
    it, N + 1 if none), from ``_level_counts_kernel``'s edges. ``CHUNK`` blocks a step."""
    problem = tl.program_id(0).to(tl.int64)
    levels = tl.arange(0, WIDTH)
    counts_row = counts_ptr + problem * (num_blocks + 1) * WIDTH
    offsets = tl.arange(0, CHUNK)
    edges = GROUPED and problem == 0
    running = tl.zeros([WIDTH], dtype=tl.int32)
    last_start = -1
    for start in range(0, num_blocks, CHUNK):  # forward: exclusive sums and max-scan
        blocks = start + offsets
        inside = blocks < num_blocks
        at = counts_row + blocks[:, None] * WIDTH + levels[None, :]
        counts = tl.load(at, mask=inside[:, None], other=0)
        tl.store(at, running[None, :] + tl.cumsum(counts, axis=0) - counts, mask=inside[:, None])
        running += tl.sum(counts, axis=0)
        if edges:
            # each block's predecessor inside this chunk (the one before the chunk is in last_start)
            earlier = tl.load(edges_ptr + 2 * (blocks - 1), mask=(blocks > start) & inside, other=-1)
            last_starts = running_extreme(earlier, MAX=True, REVERSE=False)
            tl.store(carried_ptr + 2 * blocks, tl.maximum(last_starts, last_start), mask=inside)
            last_start = tl.maximum(last_start, tl.max(tl.load(edges_ptr + 2 * blocks, mask=inside, other=-1)))
    tl.store(counts_row + num_blocks * WIDTH + levels, running)
    if edges:
        first_end = N + 1
        for step in range(0, num_blocks, CHUNK):  # backward, chunk by chunk: exclusive min-scan
            start = (num_blocks - 1 - step) // CHUNK * CHUNK
            end = tl.minimum(start + CHUNK, num_blocks)
            blocks = start + offsets
            later = tl.load(edges_ptr + 2 * (blocks + 1) + 1, mask=blocks + 1 < end, other=N + 1)
            tl.store(carried_ptr + 2 * blocks + 1,
                     tl.minimum(running_extreme(later, MAX=False, REVERSE=True), first_end), mask=blocks < end)
            first_end = tl.minimum(first_end, tl.min(tl.load(edges_ptr + 2 * blocks + 1, mask=blocks < end,
                                                             other=N + 1)))


@triton.jit(  # batch sizes and the caller's labels not specialized: see _common.py
    do_not_specialize=("N", "num_blocks", "stride_problem"),
    do_not_specialize_on_alignment=("rank_ptr",),
)
def _level_positions_kernel(
    rank_ptr, stride_problem, stride_item, order_ptr, groups_ptr, counts_ptr, edges_ptr, carried_ptr, out_order_ptr,
    cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, N, num_blocks,
    LEVELS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr,
    ORDERED: tl.constexpr, GROUPED: tl.constexpr, SCANNED: tl.constexpr,
):
    """Grid (blocks of positions, B): the item at each position goes to its sorted position (its
    group's start, plus the group's items of lower levels, plus those of its level before it), with
    its cell's span. ``prefix[p, l]``, the items of level l before position p, is the counts of the
    blocks before this one plus an in-block prefix sum; a group's items of level l are its
    prefix at the group's end minus that at its start. SCANNED: ``counts`` holds the blocks'
    prefix sums and ``carried`` the group edges before and after each block (``_block_scan_kernel``)."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    levels = tl.arange(0, WIDTH)
    rank_row = rank_ptr + problem * stride_problem
    counts_row = counts_ptr + problem * (num_blocks + 1) * WIDTH
    block_start = block * BLOCK
    block_end = tl.minimum(block_start + BLOCK, N)
    if SCANNED:  # _block_scan_kernel's prefix sums, and its group edges carried across blocks
        before = tl.load(counts_row + block * WIDTH + levels)
        total = tl.load(counts_row + num_blocks * WIDTH + levels)
        last_start = -1
        first_end = N + 1
        if GROUPED:
            last_start = tl.load(carried_ptr + 2 * block)
            first_end = tl.load(carried_ptr + 2 * block + 1)
    else:
        before = tl.zeros([WIDTH], dtype=tl.int32)
        total = tl.zeros([WIDTH], dtype=tl.int32)
        last_start = -1  # the last group start before this block
        first_end = N + 1  # the first group end (one past a group's last position) after it
        for start in range(0, num_blocks, COUNT_BLOCK):  # every block's counts, in the same order
            blocks = start + tl.arange(0, COUNT_BLOCK)
            counts = tl.load(counts_row + blocks[:, None] * WIDTH + levels[None, :],
                             mask=(blocks < num_blocks)[:, None], other=0)
            before += tl.sum(tl.where((blocks < block)[:, None], counts, 0), axis=0)
            if GROUPED:
                last_start = tl.maximum(last_start, tl.max(tl.load(edges_ptr + 2 * blocks, mask=blocks < block,
                                                                   other=-1)))
                first_end = tl.minimum(first_end, tl.min(tl.load(edges_ptr + 2 * blocks + 1,
                                                                 mask=(blocks > block) & (blocks < num_blocks),
                                                                 other=N + 1)))
            else:
                total += tl.sum(counts, axis=0)
    positions, mask, items, _, one_hot = _block_levels(rank_row, stride_item, order_ptr, block, N, LEVELS, WIDTH,
                                                       BLOCK, ORDERED)
    in_block = tl.cumsum(one_hot, axis=0) - one_hot  # [BLOCK, WIDTH] this block's items of each level before p
    if GROUPED:
        prefix = before[None, :] + in_block  # and all blocks'

        first, last = group_edges(groups_ptr, positions, mask, N)
        # the groups that hold the block's first and last positions, which may start before it and
        # end after it (else the carried ranges below are empty)
        carry_start = tl.where(tl.sum((first & (positions == block_start)).to(tl.int32)) > 0, block_start, last_start)
        carry_end = tl.where(tl.sum((last & (positions == block_end - 1)).to(tl.int32)) > 0, block_end, first_end)
        before_carry = before - _levels_between(rank_row, stride_item, order_ptr, counts_row, carry_start,
                                                block_start, N, LEVELS, WIDTH, BLOCK, COUNT_BLOCK, ORDERED,
                                                SCANNED)
        after_carry = before + tl.sum(one_hot, axis=0) + _levels_between(
            rank_row, stride_item, order_ptr, counts_row, block_end, carry_end, N, LEVELS, WIDTH, BLOCK, COUNT_BLOCK,
            ORDERED, SCANNED)
        # the prefix at each position's group start and end: prefixes grow along the positions, so
        # a group's is the largest at a group start up to p, the smallest at a group end from p
        group_start = tl.maximum(running_extreme(tl.where(first, positions, -1), MAX=True, REVERSE=False), carry_start)
        group_end = tl.minimum(running_extreme(tl.where(last, positions + 1, N + 1), MAX=False, REVERSE=True),
                               carry_end)
        at_start = tl.maximum(running_extreme(tl.where(first[:, None], prefix, -1), MAX=True, REVERSE=False),
                              before_carry[None, :])
        at_end = tl.minimum(running_extreme(tl.where(last[:, None], prefix + one_hot, N + 1), MAX=False, REVERSE=True),
                            after_carry[None, :])
        size = at_end - at_start  # [BLOCK, WIDTH] items of each level in the item's group
        cell_start = group_start + tl.sum(one_hot * (tl.cumsum(size, axis=1) - size), axis=1)
        cell_end = cell_start + tl.sum(one_hot * size, axis=1)
        position = cell_start + tl.sum(one_hot * (prefix - at_start), axis=1)
        if problem == 0:
            tl.store(group_start_ptr + positions, group_start, mask=mask)
            tl.store(group_end_ptr + positions, group_end, mask=mask)
    else:  # one group: the same sums, over the totals
        level_start = tl.cumsum(total, axis=0) - total
        cell_start = tl.sum(one_hot * level_start[None, :], axis=1)
        cell_end = cell_start + tl.sum(one_hot * total[None, :], axis=1)
        position = tl.sum(one_hot * (in_block + (level_start + before)[None, :]), axis=1)
    row = problem * N + position
    tl.store(out_order_ptr + row, items, mask=mask)
    tl.store(cell_start_ptr + row, cell_start, mask=mask)
    tl.store(cell_end_ptr + row, cell_end, mask=mask)


def counting_layout(levels, groups: torch.Tensor | None = None, *,
                    check: tuple[torch.Tensor, torch.Tensor] | None = None, score_columns: bool = False,
                    contiguous_groups: bool = False):
    """The ``PairLayout`` of ``levels`` (a ``mlloss.ops.layout.Levels`` of at most
    ``COUNTING_LEVELS`` ranks, any integer or float dtype and strides: binary label columns
    transposed, a view) and the optional (N,) integer ``groups``, by a counting sort inside each
    group: equal to ``pair_layout(levels, groups)`` bit for bit.
    ``contiguous_groups``: a group is a run of consecutive equal ids, which stays where it is (no
    sort of the ids: the layout of ``pair_layout`` given the runs' ordinals, ``run_ordinals``).
    ``check`` (scores, status) with 0/1 labels as the ranks: the data check of
    ``kernels.check.check_batch`` in the same launch, its bits OR-ed into status; with
    ``score_columns`` the scores are (B, N), each problem checking its own row."""
    rank = int32_addressable(levels.rank)
    validate_device(rank, *(check or ()), *((groups,) if groups is not None else ()))
    if levels.num_ranks > COUNTING_LEVELS:
        raise ValueError(f"counting_layout takes at most {COUNTING_LEVELS} levels; got {levels.num_ranks}")
    num_problems, n = rank.shape
    device = rank.device
    # The items in group order (the groups' runs ascending, in index order inside them), as
    # pair_layout's stable sort of (group, level) keys leaves them. (At N = 2^20 each int64
    # temporary is 8 MB: dropped as soon as used.)
    order = sorted_groups = None
    if groups is not None and contiguous_groups:  # in runs already: the group edges are where the id changes
        sorted_groups = groups
    elif groups is not None:
        sorted_groups, order = torch.sort(groups, stable=True)
    block = BLOCK if groups is None else GROUPED_BLOCK
    num_blocks = max(cdiv(n, block), 1)
    width = 1 << (levels.num_ranks - 1).bit_length()  # the levels' power of two (triton.next_power_of_2 is slow)
    counts = torch.empty((num_problems, num_blocks + 1, width), dtype=torch.int32, device=device)
    out_order, cell_start, cell_end = (torch.empty((num_problems, n), dtype=torch.int32, device=device)
                                       for _ in range(3))
    group_start = group_end = edges = None
    if groups is not None:
        group_start, group_end = (torch.empty(n, dtype=torch.int32, device=device) for _ in range(2))
        edges = torch.empty((num_blocks, 2), dtype=torch.int32, device=device)
    if n:
        grid = (num_blocks, num_problems)
        scores, status = check if check is not None else (counts, counts)
        spare = counts  # a pointer for the arguments a specialization does not read
        launcher(_level_counts_kernel)[grid](
            rank, rank.stride(0), rank.stride(1), _or(order, spare), _or(sorted_groups, spare), counts,
            _or(edges, spare), scores, status, n, num_blocks, LEVELS=levels.num_ranks, WIDTH=width, BLOCK=block,
            ORDERED=order is not None, GROUPED=groups is not None, CHECK=check is not None,
            BAD_SCORE=STATUS_BAD_SCORE, BAD_LABEL=STATUS_BAD_LABEL, SCORE_COLUMNS=score_columns,
        )
        # [BLOCK, WIDTH] one-hot counts in registers (sm_90, ptxas of Triton 3.9): without groups
        # 8 levels spill at 4 warps; with groups, the prefixes at the group edges too: blocks of
        # 512 positions take 64 / 104 / 86 registers a thread for 2 / 3 / 5 levels at 8 / 8 / 16
        # warps (benchmarks/results/cuda-specializations.json); blocks of 1,024 took 93 / 189 /
        # 128 for 2 / 4 / 8 levels, with 12 bytes of spills at 8 levels
        warps = (8 if width <= 4 else 16) if groups is not None else 4 if width <= 4 else 8
        scanned = num_blocks > SCAN_BLOCKS
        carried = None
        if scanned:
            if groups is not None:
                carried = torch.empty((num_blocks, 2), dtype=torch.int32, device=device)
            launcher(_block_scan_kernel)[(num_problems,)](
                # one program of 8 warps; [CHUNK, WIDTH] counts in registers: 8 levels in chunks of
                # 1,024 blocks took 244-255 registers a thread (Triton 3.9, 3.6) and spilled at 16 warps
                counts, _or(edges, spare), _or(carried, spare), n, num_blocks, WIDTH=width,
                CHUNK=SCAN_CHUNK if width <= 4 else SCAN_CHUNK // 2, GROUPED=groups is not None, num_warps=8,
            )
        launcher(_level_positions_kernel)[grid](
            rank, rank.stride(0), rank.stride(1), _or(order, spare), _or(sorted_groups, spare), counts,
            _or(edges, spare), _or(carried, spare), out_order, cell_start, cell_end, _or(group_start, spare),
            _or(group_end, spare), n, num_blocks, LEVELS=levels.num_ranks, WIDTH=width, BLOCK=block,
            COUNT_BLOCK=COUNT_BLOCK, ORDERED=order is not None, GROUPED=groups is not None, SCANNED=scanned,
            num_warps=warps,
        )
    return PairLayout(out_order, cell_start, cell_end, group_start, group_end)


def _or(tensor: torch.Tensor | None, spare: torch.Tensor) -> torch.Tensor:
    return spare if tensor is None else tensor
