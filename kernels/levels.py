"""Levels on the Triton tier: LaA's label patterns ranked in one launch, and the layout of a few
levels without groups in two (a counting sort instead of a sort and two binary searches).

**Pattern ranks.**

``LaALoss`` over K binary columns (2 <= K <= ``mlloss.ops.dispatch.MAX_PATTERN_COLUMNS``) ranks
each item's label pattern, sum_k 2^k y_k, through a table of the patterns' level ranks built once
per label weights on the host (``dispatch._pattern_tables``). In PyTorch that is five ops (a cast
to float64, a matrix-vector product with the powers of two, a cast back, a bit mask and a gather),
all of them CUDA launches, one through cuBLAS: on an H100 they took about 150 us of host time per
call under torch.profiler (``benchmarks/results/nvidia-h100-80gb-hbm3-profile-a98808d.txt``:
matmul, index and the casts of the LaA call). This kernel reads the columns as the caller passed them (any dtype, any strides: a slice
of a data set's label matrix) and writes the (1, N) int32 ranks the kernels take.

An entry other than 0 counts as a 1: the data check refuses such labels when it is on; with it
off (``validate_args=False``) non-binary labels give no defined loss, but every pattern stays
inside the table.

**Counting layout.** Without groups, a problem of L levels (binary labels: 2; LaA of two binary
columns: 3) sorted by level is a stable counting sort: an item's position is the number of items
of lower levels, plus those of its own level before it. ``counting_layout`` builds the
``PairLayout`` that ``mlloss.ops.layout.pair_layout`` builds with a sort and two binary searches
(the same order, cell starts and ends, bit for bit) in two launches: the level counts of every
block of items, then each block's positions from the counts of the blocks before it and an
in-block prefix sum per level. On CUDA the sort alone is several launches (CUB's radix passes,
their scratch) and took about 200 us of host time a call under torch.profiler on the H100
(``nvidia-h100-80gb-hbm3-profile-a98808d.txt``: the AUC call at N = 16,384), the binary searches
and the int32 cast of the order about 100 more. For at most ``COUNTING_LEVELS`` levels; a rank
outside [0, L) (labels the data check refuses) counts as the nearest level, so that every
position is written. Binary label columns come as the caller passed them (transposed, a view of
any dtype and strides: no int32 copy), and the counts kernel then makes the data check too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
from ..ops.layout import PairLayout
from ._common import cdiv, int32_addressable, validate_device
from .check import report_binary_check

__all__ = ["COUNTING_LEVELS", "counting_layout", "pattern_ranks"]

BLOCK = 1024
#: Most levels ``counting_layout`` takes (each item block counts them in registers).
COUNTING_LEVELS = 8
COUNT_BLOCK = 256  # blocks' counts summed per step of the positions kernel


@triton.jit(  # sizes and the caller's alignment not specialized: see _common.py
    do_not_specialize=("N", "stride_item", "stride_label"),
    do_not_specialize_on_alignment=("labels_ptr",),
)
def _pattern_rank_kernel(
    labels_ptr, stride_item, stride_label, table_ptr, out_ptr, N, K: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (item blocks,): out[i] = table[sum_k 2^k (labels[i, k] != 0)]."""
    items = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = items < N
    row = labels_ptr + items.to(tl.int64) * stride_item
    pattern = tl.zeros([BLOCK], dtype=tl.int32)
    for k in tl.static_range(K):
        label = tl.load(row + k * stride_label, mask=mask, other=0)
        pattern |= (label != 0).to(tl.int32) << k
    tl.store(out_ptr + items, tl.load(table_ptr + pattern, mask=mask, other=0), mask=mask)


def pattern_ranks(labels: torch.Tensor, rank_table: torch.Tensor) -> torch.Tensor:
    """(1, N) int32: the rank in ``rank_table`` ((2^K,) int32, on the labels' device) of each row's
    pattern of the (N, K) binary ``labels``."""
    validate_device(labels, rank_table)
    n, k = labels.shape
    if rank_table.numel() != 2**k:
        raise ValueError(f"a table of {2**k} pattern ranks is needed for {k} label columns; got {rank_table.numel()}")
    out = torch.empty((1, n), dtype=torch.int32, device=labels.device)
    if n:
        _pattern_rank_kernel[(cdiv(n, BLOCK),)](
            labels, labels.stride(0), labels.stride(1), rank_table, out, n, K=k, BLOCK=BLOCK,
        )
    return out


# --------------------------------------------------------------------------- #
# Counting layout: a stable sort by level of problems without groups           #
# --------------------------------------------------------------------------- #
@triton.jit
def _block_levels(rank_row, stride_item, block, N, LEVELS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """(items, in range, the ranks as stored, one-hot [BLOCK, WIDTH] int32 of each item's level)
    of one item block; ranks are read as int32 and clamped into [0, LEVELS)."""
    items = block * BLOCK + tl.arange(0, BLOCK)
    mask = items < N
    stored = tl.load(rank_row + items.to(tl.int64) * stride_item, mask=mask, other=0)
    rank = tl.minimum(tl.maximum(stored.to(tl.int32), 0), LEVELS - 1)
    one_hot = ((rank[:, None] == tl.arange(0, WIDTH)[None, :]) & mask[:, None]).to(tl.int32)
    return items, mask, stored, one_hot


@triton.jit(  # batch sizes and the caller's labels not specialized: see _common.py
    do_not_specialize=("N", "num_blocks", "stride_problem"),
    do_not_specialize_on_alignment=("rank_ptr", "scores_ptr"),
)
def _level_counts_kernel(rank_ptr, stride_problem, stride_item, counts_ptr, scores_ptr, status_ptr, N, num_blocks,
                         LEVELS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, CHECK: tl.constexpr,
                         BAD_SCORE: tl.constexpr, BAD_LABEL: tl.constexpr):
    """Grid (item blocks, B): counts[b, block, l], the items of level l in this block. CHECK (0/1
    labels as the ranks): also the data check of ``kernels.check`` on the block, into ``status``."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    items, mask, stored, one_hot = _block_levels(rank_ptr + problem * stride_problem, stride_item, block, N, LEVELS,
                                                 WIDTH, BLOCK)
    tl.store(counts_ptr + (problem * num_blocks + block) * WIDTH + tl.arange(0, WIDTH), tl.sum(one_hot, axis=0))
    if CHECK:
        report_binary_check(status_ptr, tl.load(scores_ptr + items, mask=mask, other=0.0), stored, mask, BAD_SCORE,
                            BAD_LABEL)


@triton.jit(  # batch sizes and the caller's labels not specialized: see _common.py
    do_not_specialize=("N", "num_blocks", "stride_problem"),
    do_not_specialize_on_alignment=("rank_ptr",),
)
def _level_positions_kernel(
    rank_ptr, stride_problem, stride_item, counts_ptr, order_ptr, cell_start_ptr, cell_end_ptr, N, num_blocks,
    LEVELS: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr,
):
    """Grid (item blocks, B): each item's sorted position (its level's start, plus the items of its
    level in earlier blocks and earlier in this one) gets the item's index and its cell's span."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    levels = tl.arange(0, WIDTH)
    total = tl.zeros([WIDTH], dtype=tl.int32)
    before = tl.zeros([WIDTH], dtype=tl.int32)
    counts_row = counts_ptr + problem * num_blocks * WIDTH
    for start in range(0, num_blocks, COUNT_BLOCK):  # every block's counts, in the same order
        blocks = start + tl.arange(0, COUNT_BLOCK)
        counts = tl.load(counts_row + blocks[:, None] * WIDTH + levels[None, :], mask=(blocks < num_blocks)[:, None],
                         other=0)
        total += tl.sum(counts, axis=0)
        before += tl.sum(tl.where((blocks < block)[:, None], counts, 0), axis=0)
    level_start = tl.cumsum(total, axis=0) - total
    items, mask, _, one_hot = _block_levels(rank_ptr + problem * stride_problem, stride_item, block, N, LEVELS,
                                            WIDTH, BLOCK)
    earlier = tl.cumsum(one_hot, axis=0) - one_hot  # this block's items of the level before each item
    position = tl.sum(one_hot * (earlier + (level_start + before)[None, :]), axis=1)
    cell_start = tl.sum(one_hot * level_start[None, :], axis=1)
    cell_end = cell_start + tl.sum(one_hot * total[None, :], axis=1)
    row = problem * N + position
    tl.store(order_ptr + row, items, mask=mask)
    tl.store(cell_start_ptr + row, cell_start, mask=mask)
    tl.store(cell_end_ptr + row, cell_end, mask=mask)


def counting_layout(levels, *, check: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The ``PairLayout`` of ``levels`` (a ``mlloss.ops.layout.Levels`` of at most
    ``COUNTING_LEVELS`` ranks, any integer or float dtype and strides: binary label columns
    transposed, a view) without groups, by a counting sort: equal to ``pair_layout(levels, None)``.
    ``check`` (scores, status) with 0/1 labels as the ranks: the data check of
    ``kernels.check.check_batch`` in the same launch, its bits OR-ed into status."""
    rank = int32_addressable(levels.rank)
    validate_device(rank, *(check or ()))
    if levels.num_ranks > COUNTING_LEVELS:
        raise ValueError(f"counting_layout takes at most {COUNTING_LEVELS} levels; got {levels.num_ranks}")
    num_problems, n = rank.shape
    num_blocks = max(cdiv(n, BLOCK), 1)
    width = 1 << (levels.num_ranks - 1).bit_length()  # the levels' power of two (triton.next_power_of_2 is slow)
    counts = torch.empty((num_problems, num_blocks, width), dtype=torch.int32, device=rank.device)
    order, cell_start, cell_end = (torch.empty((num_problems, n), dtype=torch.int32, device=rank.device)
                                   for _ in range(3))
    if n:
        grid = (num_blocks, num_problems)
        scores, status = check if check is not None else (counts, counts)
        _level_counts_kernel[grid](rank, rank.stride(0), rank.stride(1), counts, scores, status, n, num_blocks,
                                   LEVELS=levels.num_ranks, WIDTH=width, BLOCK=BLOCK, CHECK=check is not None,
                                   BAD_SCORE=STATUS_BAD_SCORE, BAD_LABEL=STATUS_BAD_LABEL)
        # [BLOCK, WIDTH] one-hot counts in registers: 8 levels spilled at 4 warps (255 registers, sm_90)
        _level_positions_kernel[grid](rank, rank.stride(0), rank.stride(1), counts, order, cell_start, cell_end, n,
                                      num_blocks, LEVELS=levels.num_ranks, WIDTH=width, BLOCK=BLOCK,
                                      COUNT_BLOCK=COUNT_BLOCK, num_warps=4 if width <= 4 else 8)
    return PairLayout(order, cell_start, cell_end, None, None)
