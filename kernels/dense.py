"""Small batches in one pair kernel: every pair compared in registers, no layout.

At the batch sizes recommenders train with (a thousand to a few thousand items), the sorted
``PairLayout`` of ``pairwise`` and ``hardest`` costs more than the pairs: a dozen sorts, binary
searches and casts before the first pair kernel, each a launch (and, in eager mode, the host's
dispatch of each). For binary problems (``AUCLoss``, ``PDAOMLoss``, a ``bce+`` objective's
ranking term, ``LoALoss``'s label columns) and for ``LaALoss`` of a few binary labels (at most
``MAX_LEVELS`` values of the aggregated label: two labels make three) with N <= ``MAX_ITEMS``,
these kernels read the scores, the labels (or the aggregated label's rank) and the group ids as
the caller passed them and test every (i, j) for a valid pair in registers: same group, opposite
classes (different levels). O(B N^2) comparisons, O(B N) memory, two launches. With
contiguous groups (``contiguous_groups=True``: a group is a run of equal ids) a block of rows
compares only the tiles of its rows' runs, O(B sum_u n_u^2), and batches of up to
``MAX_RUN_ITEMS`` items take these kernels:

1. ``_dense_rows_kernel``, grid (row blocks, problems): a program owns BLOCK_M items of one
   problem and streams every BLOCK_N-wide tile of the batch through [BLOCK_M, BLOCK_N] register
   accumulators, reduced once after the loop. It writes each item's gradient (in the caller's
   order) and the block's sums of the items' loss terms, of 1 / group size over the items of
   groups with a valid pair (each such group adds up to 1, and no item has to know whether it
   comes first) and of the valid pairs.

   * all pairs: a positive item i adds f(s_j - s_i) over its group's negatives j (the loss spec's
     phi(s_i - s_j) in reverse-margin form, ``_common.reverse_margin_terms``) and its gradient
     -f'(s_j - s_i); a negative item j the gradient +f'(s_j - s_i) over its group's positives.
     Each divides by its group's Z_u = positives * negatives, counted in the same loop (one
     int32 accumulator: negatives + 2^16 positives).
   * LaA's levels: the same, the row being the upper item of some pairs and the lower of others,
     each pair weighted by its cost (the levels' difference, or 1); the row counts its group's
     items per level (16 bits a level in one int64) and Z_u = sum_{a > b} n_a n_b c_ab.
   * hardest (no temperature): the group's lowest positive and highest negative score (a first
     loop), then how many items attain each (a second loop): a tied extreme gets 1/ties of the
     gradient, as in ``hardest``. The term phi(min - max), in float64, is shared by the group's
     items (1 / group size each).

2. ``reduce.combine``, the layout kernels' last step: sums the blocks' sums in a fixed order
   (float64), divides by the groups with a valid pair for ``reduction="mean"``, mixes the
   problems, and writes the loss, the statistics and the gradient. No atomics but the optional
   status bit of a non-finite loss: bit-identical results run to run.

Without groups every item is in one group. The items outside a ``mask=`` (read by both
kernels' loads) take part in no pair and get a zero gradient, whatever they hold: no layout, sort
or fill is needed for a fixed-size batch's filler rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
from ..ops.fused import accumulation_dtype
from ._common import (
    cdiv, fast_math, int32_addressable, launch_target, reverse_margin_terms, score_scale, shared_pull, surrogate_id,
    tl_dtype, validate_device, value_scale,
)
from ._launch import launcher
from .check import report_binary_check
from .pairwise import FINALIZE_BLOCK
from .reduce import combine
from .scan import group_edges, running_extreme

__all__ = ["MAX_ITEMS", "MAX_LEVELS", "dense_loss_and_grad"]

#: Largest batch the dense kernels take. Their loop spends more per pair than the layout kernels'
#: (38 instructions and 6 special-function ops per pair for the logistic, 52 with groups, against
#: 17-19 and 5: benchmarks/kernel_sass.py) and visits all N^2 pairs, not only a group's, but needs
#: no layout: a call is 9-19 aten ops instead of 14-30 (benchmarks/host_path.py) and two kernel
#: launches. 2,048 items are 2.1M pairs, about 10 us of an H100 at a third of the layout kernel's
#: measured 7.7e11 pairs/s (../shared/gpu-baseline). On an H100 an AUC call at N = 1,024 took
#: 1.01 ms on these kernels and 1.28 ms on the layout's (benchmarks/bench_gpu.py --quick at
#: da5adbf, its ``mlloss-layout`` row), both bound by the host. Above 2,048 items the recipe's
#: pairwise terms (users kept whole, on the layout kernels) cost an H100 0.5-1 ms more host time a
#: step at 8,192 than at 1,024 (benchmarks/results/recipe-cuda-eb07a70.md): bench_gpu.py's section
#: 10 times both kinds of kernel at 2,048-16,384 items, eager and in CUDA graphs, for this threshold.
MAX_ITEMS = 2048
#: Largest batch of contiguous groups (``contiguous_groups=True``) the dense kernels take. A block
#: of rows then visits only the tiles of its rows' runs (the recipe's batches of 1,024 and 2,048
#: impressions, users of ~50: 20% and 11% of the tiles), so the work grows with the sum of the
#: squared group sizes, not N^2, and a call keeps the dense kernels' 2 launches and 9-13 aten ops
#: where the layout kernels take 5-6 launches and 14-19 ops. At its worst, one group of all N
#: items, every pair is visited at ~50 instructions: about 0.45 ms of an H100 at 16,384 items
#: (estimated from kernel_sass.py's counts), against the layout kernels' 0.08 ms of kernels
#: behind ~1 ms of eager host path. Not yet timed on a GPU: bench_gpu.py section 4's "in runs" rows.
MAX_RUN_ITEMS = 16384
#: Most levels of LaA's aggregated label the dense kernels take (two binary labels make three):
#: a row counts its group's items per level in one int64, 16 bits a level.
MAX_LEVELS = 4
assert MAX_LEVELS <= 4, "_level_costs selects among at most four levels"
# A binary row counts its group's negatives and positives in one int32 (positives << 16): the
# counts, and 2^16 times the positives, must fit.
assert max(MAX_ITEMS, MAX_RUN_ITEMS) < 2**15, "the dense kernels' packed counts need at most 32,767 items"
TILES = {"cuda": (32, 32, 4), "interpreter": (64, 64, 1)}  # BLOCK_M, BLOCK_N, num_warps: no spills


@triton.jit
def _run_bounds(groups_ptr, rows, row_start, row_end, N, BLOCK_N: tl.constexpr):
    """(first position, one past the last) of the run of equal ids that holds each of ``rows``,
    the consecutive positions [row_start, row_end): contiguous groups (RUNS), whose pairs lie
    inside these bounds. The runs that cross the block's edges are followed tile by tile (of
    BLOCK_N positions) to their ends: a step or two for users of tens of items."""
    last_start = -1  # the last run start before the block (position 0 starts the first run)
    start = row_start
    while (last_start < 0) & (start > 0):
        start = tl.maximum(start - BLOCK_N, 0)
        positions = start + tl.arange(0, BLOCK_N)
        starts, _ = group_edges(groups_ptr, positions, positions < row_start, row_start)
        last_start = tl.max(tl.where(starts, positions, -1))
    first_end = N + 1  # one past the first run end after the block (position N - 1 ends the last run)
    start = row_end
    while (first_end > N) & (start < N):
        positions = start + tl.arange(0, BLOCK_N)
        _, ends = group_edges(groups_ptr, positions, positions < N, N)
        first_end = tl.min(tl.where(ends, positions + 1, N + 1))
        start += BLOCK_N
    starts, ends = group_edges(groups_ptr, rows, rows < N, N)
    run_start = tl.maximum(running_extreme(tl.where(starts, rows, -1), MAX=True, REVERSE=False), last_start)
    run_end = tl.minimum(running_extreme(tl.where(ends, rows + 1, N + 1), MAX=False, REVERSE=True), first_end)
    return run_start, run_end


@triton.jit
def _tile(scores_ptr, labels_ptr, label_stride, groups_ptr, keep_ptr, start, N, g_m, rows, run_end,
          GROUPED: tl.constexpr, RUNS: tl.constexpr, MASKED: tl.constexpr, SCORE_SCALE: tl.constexpr,
          ACC: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile of items [start, start + BLOCK_N): scores, levels (0/1 labels of a binary
    problem), and the [BLOCK_M, BLOCK_N] flags of the (row, item) pairs in one group (items of
    the mask, if MASKED). RUNS: the rows' groups are the positions [g_m, run_end), no id read."""
    offs_n = start + tl.arange(0, BLOCK_N)
    in_range = offs_n < N
    s_n = tl.load(scores_ptr + offs_n, mask=in_range, other=0.0).to(ACC) * SCORE_SCALE
    r_n = tl.load(labels_ptr + offs_n * label_stride, mask=in_range, other=0).to(tl.int32)
    if MASKED:
        in_range &= tl.load(keep_ptr + offs_n, mask=in_range, other=0) != 0
    # Every row as if it took part (a per-column flag the compiler keeps out of the pair loop);
    # the rows outside the batch or the mask are dropped after it (``has_pair``).
    same = in_range[None, :] & (rows[:, None] >= 0)
    if RUNS:
        same = same & (offs_n[None, :] >= g_m[:, None]) & (offs_n[None, :] < run_end[:, None])
    elif GROUPED:
        g_n = tl.load(groups_ptr + offs_n, mask=in_range, other=0)
        same = same & (g_m[:, None] == g_n[None, :])
    return s_n, r_n, same


@triton.jit
def _level_costs(values_ptr, r_m, row_ok, LEVELS: tl.constexpr, ACC: tl.constexpr):
    """|v_l - v_m| for the levels l < LEVELS (3 or 4; the fourth 0 for 3), each the float64
    difference rounded once: ``ACC`` values of the levels, subtracted, would round away the small
    costs of levels far from 0 (label weights [1e4, 1e-4]: 1e4 and 1e4 + 1e-4 are one float32)."""
    v_m = tl.load(values_ptr + r_m, mask=row_ok, other=0.0)
    cost_0 = tl.abs(tl.load(values_ptr) - v_m).to(ACC)
    cost_1 = tl.abs(tl.load(values_ptr + 1) - v_m).to(ACC)
    cost_2 = tl.abs(tl.load(values_ptr + 2) - v_m).to(ACC)
    if LEVELS > 3:
        cost_3 = tl.abs(tl.load(values_ptr + 3) - v_m).to(ACC)
    else:
        cost_3 = tl.zeros_like(cost_2)
    return cost_0, cost_1, cost_2, cost_3


@triton.jit(  # sizes and alignments not specialized: see _common.py
    do_not_specialize=("N", "num_blocks", "label_stride_problem"),
    do_not_specialize_on_alignment=("labels_ptr", "groups_ptr", "keep_ptr"),
)
def _dense_rows_kernel(
    scores_ptr, labels_ptr, label_stride_problem, label_stride, groups_ptr, keep_ptr, values_ptr, grad_ptr,
    block_sums_ptr, status_ptr, N, num_blocks,
    GROUPED: tl.constexpr, RUNS: tl.constexpr, MASKED: tl.constexpr, HARDEST: tl.constexpr, LEVELS: tl.constexpr,
    LINEAR: tl.constexpr,
    SURROGATE: tl.constexpr, MARGIN: tl.constexpr, FAST: tl.constexpr,
    SCORE_SCALE: tl.constexpr, VALUE_SCALE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHECK: tl.constexpr, BAD_SCORE: tl.constexpr,
    BAD_LABEL: tl.constexpr, SCORE_COLUMNS: tl.constexpr,
):
    """Grid (row blocks, problems). Rows [pid * BLOCK_M, +BLOCK_M) of one problem (a binary label
    column, LEVELS = 2; or LaA's aggregated label as ranks into the level values ``values_ptr``,
    2 < LEVELS <= MAX_LEVELS, pair cost the values' difference if LINEAR, else 1): each item's
    gradient (before the mean over groups), and the block's sums of the items' loss terms, of 1 /
    group size over the items of groups with a valid pair (a group's items add up to 1) and of the
    valid pairs counted at their upper items, as ``reduce.combine`` reads them. CHECK: the data
    check of ``kernels.check`` (binary labels) on the block's rows, OR-ed into ``status``.
    SCORE_COLUMNS: each problem reads its own scores, row ``problem`` of (B, N) ``scores``.
    RUNS (with GROUPED, contiguous groups): a group is a run of consecutive equal ids, whose
    bounds (``_run_bounds``) replace the ids, and the loops visit only the tiles of the rows' runs
    (a block of rows of a few users meets a few tiles, not N / BLOCK_N)."""
    block = tl.program_id(0)
    problem = tl.program_id(1)  # a label column: its 0/1 labels, gradient and block sums
    labels_ptr += problem * label_stride_problem
    if SCORE_COLUMNS:
        scores_ptr += problem.to(tl.int64) * N
    grad_ptr += problem * N
    block_sums_ptr += problem * 3 * num_blocks
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    in_batch = rows < N
    row_ok = in_batch  # the rows that take part: in the batch, and in the mask if MASKED
    if MASKED:
        row_ok &= tl.load(keep_ptr + rows, mask=in_batch, other=0) != 0
    s_m = tl.load(scores_ptr + rows, mask=row_ok, other=0.0).to(ACC) * SCORE_SCALE
    label_m = tl.load(labels_ptr + rows * label_stride, mask=row_ok, other=0)
    r_m = label_m.to(tl.int32)
    if CHECK:  # NaN and inf stay so after the positive score scale
        report_binary_check(status_ptr, s_m, label_m, row_ok, BAD_SCORE, BAD_LABEL)
    up_m = r_m == 1
    first_tile, end_tiles = 0, N  # the items [first_tile, end_tiles) the loops visit, in tiles of BLOCK_N
    run_end = rows
    if RUNS:  # g_m: the first position of the row's run; the rows' runs are all its pairs
        g_m, run_end = _run_bounds(groups_ptr, rows, block * BLOCK_M, tl.minimum(block * BLOCK_M + BLOCK_M, N), N,
                                   BLOCK_N)
        first_tile = tl.min(tl.where(in_batch, g_m, N)) // BLOCK_N * BLOCK_N
        end_tiles = tl.max(tl.where(in_batch, run_end, 0))
    elif GROUPED:
        g_m = tl.load(groups_ptr + rows, mask=row_ok, other=0)
    else:
        g_m = rows
    if LEVELS == 2:
        members = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)  # negatives + 2^16 positives
    else:  # the items of each level in the row's group, 16 bits a level (N <= MAX_ITEMS < 2^16)
        packed = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int64)
        if LINEAR:  # the row's pair cost to each level, |v_l - v_m| in float64 rounded once
            cost_0, cost_1, cost_2, cost_3 = _level_costs(values_ptr, r_m, row_ok, LEVELS, ACC)
    if HARDEST:
        lowest = tl.full([BLOCK_M, BLOCK_N], float("inf"), dtype=ACC)
        highest = tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=ACC)
    else:
        acc_value = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
        acc_pull = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    for start in range(first_tile, end_tiles, BLOCK_N):
        s_n, r_n, same = _tile(scores_ptr, labels_ptr, label_stride, groups_ptr, keep_ptr, start, N, g_m, rows,
                               run_end, GROUPED, RUNS, MASKED, SCORE_SCALE, ACC, BLOCK_N)
        up_n = r_n == 1
        if LEVELS == 2:
            members += tl.where(same, tl.where(up_n, 65536, 1)[None, :], 0)
        else:
            packed += same.to(tl.int64) << (r_n.to(tl.int64) * 16)[None, :]
        if HARDEST:
            # a NaN score stays (CUDA's min and max return the other operand)
            lowest = tl.where(same & up_n[None, :], tl.minimum(lowest, s_n[None, :], propagate_nan=tl.PropagateNan.ALL),
                              lowest)
            highest = tl.where(same & ~up_n[None, :],
                               tl.maximum(highest, s_n[None, :], propagate_nan=tl.PropagateNan.ALL), highest)
        elif LEVELS == 2:
            # Reverse margin x = s_lower - s_upper of the pair the two items form, if any.
            keep = same & (up_m[:, None] != up_n[None, :])
            x = tl.where(up_m[:, None], s_n[None, :] - s_m[:, None], s_m[:, None] - s_n[None, :])
            value, pull = reverse_margin_terms(x, MARGIN, SURROGATE, True, FAST)
            acc_value = tl.where(keep & up_m[:, None], acc_value + value, acc_value)
            acc_pull = tl.where(keep, acc_pull + pull, acc_pull)
        else:  # the row is the pair's upper item or its lower one, pair by pair
            upper = r_m[:, None] > r_n[None, :]
            keep = same & (r_m[:, None] != r_n[None, :])
            x = tl.where(upper, s_n[None, :] - s_m[:, None], s_m[:, None] - s_n[None, :])
            value, pull = reverse_margin_terms(x, MARGIN, SURROGATE, True, FAST)
            if LINEAR:
                cost = tl.where((r_n < 2)[None, :], tl.where((r_n == 0)[None, :], cost_0[:, None], cost_1[:, None]),
                                cost_2[:, None])
                if LEVELS > 3:
                    cost = tl.where((r_n == 3)[None, :], cost_3[:, None], cost)
                value *= cost
                pull *= cost
            acc_value = tl.where(keep & upper, acc_value + value, acc_value)
            acc_pull = tl.where(keep, acc_pull + tl.where(upper, -pull, pull), acc_pull)
    if LEVELS == 2:
        counts = tl.sum(members, axis=1)
        num_positive = counts >> 16
        num_negative = counts & 0xFFFF
        group_size = num_positive + num_negative
        has_pair = row_ok & (num_positive > 0) & (num_negative > 0)
    else:
        counts = tl.sum(packed, axis=1)
        group_size = tl.zeros([BLOCK_M], dtype=tl.int64)
        lower = tl.zeros([BLOCK_M], dtype=tl.float64)  # the row's valid pairs as their upper item
        pair_count = tl.zeros([BLOCK_M], dtype=tl.float64)  # Z_u: the group's pair costs, summed
        for a in tl.static_range(LEVELS):
            n_a = (counts >> (16 * a)) & 0xFFFF
            group_size += n_a
            lower += tl.where(r_m > a, n_a, 0).to(tl.float64)
            for b in tl.static_range(LEVELS):
                if b < a:
                    n_b = ((counts >> (16 * b)) & 0xFFFF).to(tl.float64)
                    if LINEAR:
                        pair_count += n_a.to(tl.float64) * n_b * (tl.load(values_ptr + a) - tl.load(values_ptr + b))
                    else:
                        pair_count += n_a.to(tl.float64) * n_b
        has_pair = row_ok & (pair_count > 0)
    # 1 / group size at every item of a group with a valid pair: the group's items add up to 1.
    share_of_group = tl.where(has_pair, 1.0 / tl.maximum(group_size, 1).to(tl.float64), 0.0)
    if HARDEST:
        # tl.min and tl.max skip NaN (and a reduce of NaN-keeping ops runs a Python call per
        # element in the interpreter): a row whose pairs meet a NaN score gets NaN extremes.
        unordered = tl.max(((lowest != lowest) | (highest != highest)).to(tl.int32), axis=1) > 0
        low = tl.where(unordered, float("nan"), tl.min(lowest, axis=1))
        high = tl.where(unordered, float("nan"), tl.max(highest, axis=1))
        low_ties = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
        high_ties = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.int32)
        for start in range(first_tile, end_tiles, BLOCK_N):
            s_n, r_n, same = _tile(scores_ptr, labels_ptr, label_stride, groups_ptr, keep_ptr, start, N, g_m, rows,
                                   run_end, GROUPED, RUNS, MASKED, SCORE_SCALE, ACC, BLOCK_N)
            up_n = r_n == 1
            low_ties += (same & up_n[None, :] & (s_n[None, :] == low[:, None])).to(tl.int32)
            high_ties += (same & ~up_n[None, :] & (s_n[None, :] == high[:, None])).to(tl.int32)
        x = tl.where(has_pair, high.to(tl.float64) - low.to(tl.float64), 0.0)
        value, pull = reverse_margin_terms(x, MARGIN, SURROGATE, True, False)
        attains = tl.where(up_m, s_m == low, s_m == high)
        ties = tl.maximum(tl.where(up_m, tl.sum(low_ties, axis=1), tl.sum(high_ties, axis=1)), 1).to(tl.float64)
        share = tl.where(attains, 1.0 / ties, 0.0)
        term = value * share_of_group
        grad = tl.where(has_pair, shared_pull(tl.where(up_m, -pull, pull), share), 0.0)
        pairs = share_of_group  # one level pair per group
    elif LEVELS == 2:
        pair_count = (num_positive * num_negative).to(tl.float64)  # Z_u, exact in float64
        inverse = tl.where(has_pair, 1.0 / tl.where(has_pair, pair_count, 1.0), 0.0)
        # A dropped row's sums may hold anything (an overflowing exponential): selected away.
        term = tl.where(has_pair & up_m, tl.sum(acc_value, axis=1).to(tl.float64) * VALUE_SCALE * inverse, 0.0)
        pull_sum = tl.sum(acc_pull, axis=1).to(tl.float64)
        grad = tl.where(has_pair, tl.where(up_m, -pull_sum, pull_sum) * inverse, 0.0)
        pairs = tl.where(has_pair & up_m, num_negative.to(tl.float64), 0.0)
    else:
        inverse = tl.where(has_pair, 1.0 / tl.where(has_pair, pair_count, 1.0), 0.0)
        term = tl.where(has_pair, tl.sum(acc_value, axis=1).to(tl.float64) * VALUE_SCALE * inverse, 0.0)
        grad = tl.where(has_pair, tl.sum(acc_pull, axis=1).to(tl.float64) * inverse, 0.0)
        pairs = tl.where(has_pair, lower, 0.0)
    tl.store(grad_ptr + rows, grad.to(grad_ptr.dtype.element_ty), mask=in_batch)  # 0 outside the mask
    tl.store(block_sums_ptr + block, tl.sum(tl.where(row_ok, term, 0.0)))
    tl.store(block_sums_ptr + num_blocks + block, tl.sum(tl.where(row_ok, share_of_group, 0.0)))
    tl.store(block_sums_ptr + 2 * num_blocks + block, tl.sum(tl.where(row_ok, pairs, 0.0)))


def dense_loss_and_grad(
    scores: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    *,
    mixing: torch.Tensor | None,
    surrogate: str,
    margin: float,
    hardest: bool,
    reduction: str,
    status: torch.Tensor | None,
    values: torch.Tensor | None = None,
    linear: bool = False,
    check: bool = False,
    score_columns: bool = False,
    contiguous_groups: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,)) of B
    binary problems over the same scores, mixed by ``mixing`` (B,) (None: ones; the tier contract
    of ``pairwise.pair_loss_and_grad``): ``labels`` (B, N) 0/1 of any dtype and strides (read as
    int32; the caller's (N, B) label columns transposed, a view: LoA's columns, one for AUC and
    PDAOM), ``groups`` (N,) integer ids or None, ``mask`` (N,) bool or None (the
    items outside it, whatever they hold, form no pair and get a zero gradient), N <= ``MAX_ITEMS``
    (``MAX_RUN_ITEMS`` with ``contiguous_groups``);
    all pairs, or the hardest pair per group (no temperature).

    ``values`` (1, L) float64, 2 < L <= ``MAX_LEVELS``: one problem whose ``labels`` (1, N) are
    ranks into these ascending level values (LaA's aggregated label, ``dispatch.problem_levels``),
    all pairs, pair cost the values' difference (``linear``) or 1. The loss and gradient come
    back in the scores' accumulation dtype.

    ``check`` (binary labels, with a ``status``): the rows kernel also makes the data check of
    ``kernels.check.check_batch`` (non-finite scores, labels other than 0/1, over the mask) and
    ORs its bits into ``status``: no launch of its own.

    ``score_columns``: ``scores`` (B, N), contiguous, problem b reading row b (a multi-task
    model's task columns, each with its own label column); the gradient comes back (N, B), each
    problem's own in its column, scaled by its mixing weight and its reduction
    (``reduce.combine``'s ``separate``).

    ``contiguous_groups``: a group is a run of consecutive equal ids (an id that comes back after
    another's run starts another group), as ``ops.layout.run_ordinals`` numbers them; each block
    of rows then visits only the tiles of its rows' runs."""
    validate_device(scores, labels, groups, mask, values)
    num_problems, n = labels.shape
    runs = groups is not None and contiguous_groups
    if n > (MAX_RUN_ITEMS if runs else MAX_ITEMS):
        raise ValueError(f"the dense kernels take at most {MAX_ITEMS} items ({MAX_RUN_ITEMS} in contiguous groups); "
                         f"got {n}")
    num_levels = 2 if values is None else values.shape[-1]
    if check and (values is not None or status is None):
        raise ValueError("the dense kernels check binary labels into a status word: check=True needs a status and "
                         "no values")
    if values is not None and not (2 < num_levels <= MAX_LEVELS and num_problems == 1 and not hardest):
        raise ValueError(f"the dense kernels take one problem of 3 to {MAX_LEVELS} levels, all pairs; got "
                         f"{num_problems} problems of {num_levels} levels, hardest={hardest}")
    loss_dtype = accumulation_dtype(scores)
    fast = fast_math(scores.device, loss_dtype) and not hardest
    kind = launch_target(scores.device)
    block_m, block_n, num_warps = TILES[kind]
    num_blocks = cdiv(n, block_m)
    labels = int32_addressable(labels)  # the kernel's label offsets are int32
    # One problem: its gradient goes straight to the output, which combine scales in place; score
    # columns' go to their columns of another output; problems over shared scores sum in float64.
    grad = torch.empty((num_problems, n), dtype=loss_dtype if num_problems == 1 or score_columns else torch.float64,
                       device=scores.device)
    block_sums = torch.empty((num_problems, 3, num_blocks), dtype=torch.float64, device=scores.device)
    if n:
        launcher(_dense_rows_kernel)[(num_blocks, num_problems)](
            scores, labels, labels.stride(0), labels.stride(1), groups if groups is not None else labels,
            mask if mask is not None else labels,
            values if values is not None else scores, grad, block_sums, status if check else block_sums, n, num_blocks,
            GROUPED=groups is not None, RUNS=runs, MASKED=mask is not None,
            HARDEST=hardest, LEVELS=num_levels,
            LINEAR=linear and values is not None, SURROGATE=surrogate_id(surrogate), MARGIN=float(margin), FAST=fast,
            SCORE_SCALE=score_scale(surrogate, fast), VALUE_SCALE=value_scale(surrogate, fast),
            ACC=tl_dtype(loss_dtype), BLOCK_M=block_m, BLOCK_N=block_n, CHECK=check, BAD_SCORE=STATUS_BAD_SCORE,
            BAD_LABEL=STATUS_BAD_LABEL, SCORE_COLUMNS=score_columns, num_warps=num_warps,
        )
    return combine(grad, 0, n, block_sums, mixing, mean=reduction == "mean", loss_dtype=loss_dtype,
                   status=status, block=FINALIZE_BLOCK[kind],
                   grad=grad[0] if num_problems == 1 and not score_columns else None, separate=score_columns)
