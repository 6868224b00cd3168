"""Fused, deterministic Triton kernels for the all-pairs losses of every family.

The input is ``mlloss.ops.layout.PairLayout``: B problems (one per label for LoA, one for AUC
and LaA) over N items, each sorted by (group, level ascending), so that the valid partners of
the item at sorted position p are two position ranges: its lower partners
``[group_start, cell_start)`` and its upper partners ``[cell_end, group_end)``. For every
problem b the kernels compute

    loss_b = reduce_u  sum_{i, j in u, level_i > level_j} c_ij phi(s_i - s_j) / Z_u

with c_ij = 1 (uniform) or level_i - level_j (linear), Z_u = sum over the valid pairs of u of
c_ij, and ``reduce`` the mean over the groups with a valid pair (or the sum), then
``loss = sum_b mixing_b loss_b`` and its gradient with respect to the scores, in three
launches (the gradient is computed in the forward pass; backward only scales it, as in
Liger-Kernel's fused losses), after a small one for the linear cost (``position_values``: each
position's level value, measured from its group's lowest level, in the accumulation dtype):

1. ``_pair_partials_kernel``, grid (row blocks x chunks, 2 passes, B). A program owns BLOCK_M
   consecutive positions as *upper* items (pass 0: the loss and the upper side of the
   gradient) or as *lower* items (pass 1: the lower side), and streams BLOCK_N-wide tiles of
   its partner range through registers. Per-pair terms go into [BLOCK_M, BLOCK_N] register
   accumulators that are reduced once after the loops: no cross-thread reduction inside a loop.
   Tiles where every row's partner range covers the whole tile run a loop with no masks;
   the others run a second, masked loop. The fast logistic (CUDA, float32) factors each pair's
   2^x into a row term and a column term (``_common.factored_logistic_terms``) in row blocks whose
   scores lie within ~44 of each other (nearly all): one exp per row and per column of a tile
   instead of one per pair; other blocks run the same loops with the per-pair terms. The
   partner range of a row block is split into ``num_chunks`` chunks (more programs when N is
   small, so that the GPU fills up); each (block, chunk, pass) writes its own slice of a partial
   buffer.
2. ``_finalize_kernel`` (in ``reduce``), grid (position blocks, B): sums the chunks of each
   position in a fixed order, divides by its group's Z_u (in closed form for binary problems,
   from a walk over the group's cells for a few levels, from each group's own sum of the
   per-position shares that kernel 1 writes for an ordinal column: ``reduce.group_sums``, two
   small launches of a segmented scan), writes the gradient to the caller's item
   order, and per-block sums of the loss, the groups with a valid pair and the valid pairs.
3. ``_combine_kernel`` (in ``reduce``), grid (position blocks,): every program sums the block sums in the same
   fixed order, so all agree on the totals without a host round trip, and writes
   ``grad = sum_b mixing_b / G_b * grad_b`` (G_b the groups with pairs, for the mean) and,
   from program 0, the loss and the per-problem statistics.

No float atomics: every output element is written by one program, and every sum runs in a
fixed order, so results are bit-identical run to run. Integer atomics set the status bits of
``_check_batch_kernel`` (in ``check``) (non-finite scores, bad labels) and of the combine step (a non-finite
loss); their result does not depend on the order.

Precision: scores of any float dtype are upcast; fp16/bf16/fp32 accumulate in float32 (with
the approximate special functions on CUDA) and float64 in float64; per-position sums of the
finalize step and the normalisers are float64. Pair costs are differences of level values that
each group measures from its own lowest level, so a group far from the others' levels keeps
its costs to its own scale (one user's watch times of 0.01 s beside others' of 1e4 s).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE, STATUS_OVERFLOW
from ._common import (
    SURROGATES, cdiv, factored_logistic_terms, factored_rows, factored_span, launch_target, rank_at,
    reverse_margin_terms, tl_dtype,
)
from ._launch import launcher
from .check import check_batch
from .reduce import combine, finalize, normaliser_source

__all__ = [
    "STATUS_BAD_LABEL",
    "STATUS_BAD_SCORE",
    "STATUS_OVERFLOW",
    "check_batch",
    "combine",
    "finalize",
    "pair_partials",
]


# --------------------------------------------------------------------------- #
# 1. Pair partials                                                            #
# --------------------------------------------------------------------------- #
@triton.jit
def _accumulate(
    row, s_n, w, keep, margin, centre, acc_value, acc_pull,
    UPPER_ROWS: tl.constexpr, SURROGATE: tl.constexpr, FAST: tl.constexpr, FACTORED: tl.constexpr,
    WEIGHTED: tl.constexpr, MASKED: tl.constexpr,
):
    """Add one tile's terms to the register accumulators. Rows are the upper items
    (UPPER_ROWS: value and pull) or the lower items (pull only); ``row`` is their scores, or
    with FACTORED their factors a_m of ``factored_logistic_terms`` (``centre`` its centre).
    ``w`` is the pair cost (WEIGHTED) and ``keep`` the validity mask (MASKED)."""
    if FACTORED:
        value, pull = factored_logistic_terms(row, s_n, centre, UPPER_ROWS)
    else:
        if UPPER_ROWS:
            x = s_n[None, :] - row[:, None]
        else:
            x = row[:, None] - s_n[None, :]
        value, pull = reverse_margin_terms(x, margin, SURROGATE, UPPER_ROWS, FAST)
    if MASKED:
        # Selecting the accumulator (not the term) lets ptxas predicate the add: invalid pairs,
        # whose terms may be inf (exponential), cost no select of their own.
        if WEIGHTED:
            if UPPER_ROWS:
                acc_value = tl.where(keep, acc_value + w * value, acc_value)
            acc_pull = tl.where(keep, acc_pull + w * pull, acc_pull)
        else:
            if UPPER_ROWS:
                acc_value = tl.where(keep, acc_value + value, acc_value)
            acc_pull = tl.where(keep, acc_pull + pull, acc_pull)
    else:
        if WEIGHTED:
            if UPPER_ROWS:
                acc_value += w * value
            acc_pull += w * pull
        else:
            if UPPER_ROWS:
                acc_value += value
            acc_pull += pull
    return acc_value, acc_pull


@triton.jit
def _partner_tile(
    scores_ptr, values_row, order_row, start, v_m, bound,
    UPPER_ROWS: tl.constexpr, COST_LINEAR: tl.constexpr, MASKED: tl.constexpr,
    SCORE_SCALE: tl.constexpr, ACC: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Positions, scores and pair costs of the partner tile starting at ``start``."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        in_range = offs_n < bound
        item_n = tl.load(order_row + offs_n, mask=in_range, other=0)
    else:
        item_n = tl.load(order_row + offs_n)
    s_n = tl.load(scores_ptr + item_n).to(ACC) * SCORE_SCALE
    if COST_LINEAR:
        if MASKED:
            v_n = tl.load(values_row + offs_n, mask=in_range, other=0.0)
        else:
            v_n = tl.load(values_row + offs_n)
        if UPPER_ROWS:
            w = v_m[:, None] - v_n[None, :]
        else:
            w = v_n[None, :] - v_m[:, None]
    else:
        w = 1.0
    return offs_n, s_n, w


@triton.jit
def _scan_partners(
    scores_ptr, values_row, order_row, row, centre, v_m, lo_m, hi_m, block_lo, block_hi,
    k0, k1, fs, fe, margin,
    UPPER_ROWS: tl.constexpr, COST_LINEAR: tl.constexpr, SURROGATE: tl.constexpr, FAST: tl.constexpr,
    FACTORED: tl.constexpr, SCORE_SCALE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The rows' sums of value and pull over this chunk's partner tiles [k0, k1): the unmasked
    ones [fs, fe) in one loop, the others in a masked one (``_accumulate``'s arguments)."""
    acc_value = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    acc_pull = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
    for k in range(fs, fe):
        offs_n, s_n, w = _partner_tile(
            scores_ptr, values_row, order_row, block_lo + k * BLOCK_N, v_m, block_hi,
            UPPER_ROWS, COST_LINEAR, False, SCORE_SCALE, ACC, BLOCK_N,
        )
        acc_value, acc_pull = _accumulate(
            row, s_n, w, True, margin, centre, acc_value, acc_pull,
            UPPER_ROWS, SURROGATE, FAST, FACTORED, COST_LINEAR, False,
        )
    head = fs - k0
    for i in range(head + (k1 - fe)):
        k = tl.where(i < head, k0 + i, fe + (i - head))
        offs_n, s_n, w = _partner_tile(
            scores_ptr, values_row, order_row, block_lo + k * BLOCK_N, v_m, block_hi,
            UPPER_ROWS, COST_LINEAR, True, SCORE_SCALE, ACC, BLOCK_N,
        )
        # offs_n - lo_m < hi_m - lo_m as unsigned: one subtraction and one compare per pair.
        keep = (offs_n[None, :] - lo_m[:, None]).to(tl.uint32, bitcast=True) < (hi_m - lo_m).to(
            tl.uint32, bitcast=True
        )[:, None]
        acc_value, acc_pull = _accumulate(
            row, s_n, w, keep, margin, centre, acc_value, acc_pull,
            UPPER_ROWS, SURROGATE, FAST, FACTORED, COST_LINEAR, True,
        )
    return tl.sum(acc_value, axis=1), tl.sum(acc_pull, axis=1)


@triton.jit
def _pass(
    scores_ptr, values_row, order_row, lo_ptr, hi_ptr, grad_row, value_row,
    N, margin, row_block, chunk, num_chunks,
    UPPER_ROWS: tl.constexpr, LO_IS_ZERO: tl.constexpr, HI_IS_N: tl.constexpr,
    COST_LINEAR: tl.constexpr, SURROGATE: tl.constexpr, FAST: tl.constexpr, FACTOR: tl.constexpr,
    SCORE_SCALE: tl.constexpr, VALUE_SCALE: tl.constexpr,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Rows [row_block * BLOCK_M, +BLOCK_M) against their partner ranges [lo, hi), one chunk.
    Writes the rows' side of the gradient to ``grad_row`` and (UPPER_ROWS) their loss to
    ``value_row``. FACTOR (the fast logistic): the factored terms where the rows fit them."""
    first = row_block * BLOCK_M
    last = tl.minimum(first + BLOCK_M, N) - 1
    rows = first + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    item_m = tl.load(order_row + rows, mask=row_mask, other=0)
    s_m = tl.load(scores_ptr + item_m, mask=row_mask, other=0.0).to(ACC) * SCORE_SCALE
    if COST_LINEAR:
        v_m = tl.load(values_row + rows, mask=row_mask, other=0.0)
    else:
        v_m = 0.0
    # Partner ranges [lo_m, hi_m) per row; both ends are non-decreasing in the position, so the
    # block scans [lo(first), hi(last)) and every row covers [lo(last), hi(first)) whole.
    if LO_IS_ZERO:
        lo_m = tl.zeros([BLOCK_M], dtype=tl.int32)
        block_lo = 0
        full_lo = 0
    else:
        lo_m = tl.load(lo_ptr + rows, mask=row_mask, other=0)
        block_lo = tl.load(lo_ptr + first)
        full_lo = tl.load(lo_ptr + last)
    if HI_IS_N:
        hi_m = tl.where(row_mask, N, 0)
        block_hi = N
        full_hi = N
    else:
        hi_m = tl.load(hi_ptr + rows, mask=row_mask, other=0)
        block_hi = tl.load(hi_ptr + last)
        full_hi = tl.load(hi_ptr + first)

    # This chunk's tiles [k0, k1) of the block's range; the unmasked ones [fs, fe) inside it.
    num_tiles = tl.cdiv(tl.maximum(block_hi - block_lo, 0), BLOCK_N)
    per_chunk = tl.cdiv(num_tiles, num_chunks)
    k0 = tl.minimum(chunk * per_chunk, num_tiles)
    k1 = tl.minimum(k0 + per_chunk, num_tiles)
    first_full = tl.cdiv(tl.maximum(full_lo - block_lo, 0), BLOCK_N)
    end_full = tl.maximum(full_hi - block_lo, 0) // BLOCK_N
    fs = tl.minimum(tl.maximum(first_full, k0), k1)
    fe = tl.minimum(tl.maximum(end_full, fs), k1)

    # FACTOR: 2^x factors into row and column terms (``factored_logistic_terms``) for row blocks
    # whose scores fit; the others take the per-pair terms.
    if FACTOR:
        fits, centre = factored_span(s_m, row_mask)
    else:
        fits, centre = False, 0.0  # constants: only the per-pair loops are compiled
    if fits:
        a_m = factored_rows(s_m, centre, row_mask)
        row_value, row_pull = _scan_partners(
            scores_ptr, values_row, order_row, a_m, centre, v_m, lo_m, hi_m, block_lo, block_hi,
            k0, k1, fs, fe, margin, UPPER_ROWS, COST_LINEAR, SURROGATE, FAST, True, SCORE_SCALE, ACC,
            BLOCK_M, BLOCK_N,
        )
        if UPPER_ROWS:
            row_pull = row_pull * a_m  # the factored pulls are divided by a_m
    else:
        row_value, row_pull = _scan_partners(
            scores_ptr, values_row, order_row, s_m, 0.0, v_m, lo_m, hi_m, block_lo, block_hi,
            k0, k1, fs, fe, margin, UPPER_ROWS, COST_LINEAR, SURROGATE, FAST, False, SCORE_SCALE, ACC,
            BLOCK_M, BLOCK_N,
        )

    if UPPER_ROWS:
        tl.store(grad_row + rows, -row_pull, mask=row_mask)  # d/ds_upper = -pull
        tl.store(value_row + rows, row_value * VALUE_SCALE, mask=row_mask)
    else:
        tl.store(grad_row + rows, row_pull, mask=row_mask)  # d/ds_lower = +pull
    return v_m, lo_m, hi_m, rows, row_mask


@triton.jit(do_not_specialize=("N", "num_chunks"))  # batch sizes: see _common.py
def _pair_partials_kernel(
    scores_ptr, values_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr,
    group_end_ptr, partials_ptr, shares_ptr, N, num_chunks,
    MARGIN: tl.constexpr, HAS_GROUPS: tl.constexpr, COST_LINEAR: tl.constexpr, SURROGATE: tl.constexpr,
    FAST: tl.constexpr, FACTOR: tl.constexpr, SCORE_SCALE: tl.constexpr, VALUE_SCALE: tl.constexpr, ACC: tl.constexpr,
    WRITE_SHARES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCORE_COLUMNS: tl.constexpr,
):
    """Grid (row blocks * num_chunks, 2, B). ``partials`` (B, 3, num_chunks, N) gets, per chunk,
    the row loss of the upper pass, the upper side and the lower side of the gradient. With
    WRITE_SHARES (an ordinal column: ``reduce.normaliser_source`` is "shares"), chunk 0 of the
    upper pass writes each position's share of its group's Z_u to ``shares`` (B, N) float64
    (the finalize step finds the other problems' Z_u itself). ``values`` (B, N), read with
    COST_LINEAR: each position's level value from ``_position_values_kernel``. MARGIN is a
    constexpr so that the float64 path sees it unrounded (a float argument is typed fp32).
    SCORE_COLUMNS: each problem reads its own scores, row ``problem`` of (B, N) ``scores``."""
    row_block = tl.program_id(0) // num_chunks
    chunk = tl.program_id(0) % num_chunks
    problem = tl.program_id(2).to(tl.int64)
    row = problem * N
    if SCORE_COLUMNS:
        scores_ptr += row
    values_row = values_ptr + row
    order_row = order_ptr + row
    part = partials_ptr + (problem * 3 * num_chunks + chunk) * N
    if tl.program_id(1) == 0:
        # Upper rows: lower partners [group_start, cell_start).
        v_m, lo_m, hi_m, rows, row_mask = _pass(
            scores_ptr, values_row, order_row, group_start_ptr, cell_start_ptr + row,
            part + num_chunks * N, part, N, MARGIN, row_block, chunk, num_chunks,
            True, not HAS_GROUPS, False, COST_LINEAR, SURROGATE, FAST, FACTOR, SCORE_SCALE, VALUE_SCALE,
            ACC, BLOCK_M, BLOCK_N,
        )
        if WRITE_SHARES:
            if chunk == 0:
                # Z_u = sum over the group's positions of this share (lower partners for the
                # uniform cost; v * (lower - upper partners) for the linear one, see _cost_shares).
                lower = hi_m - lo_m
                if COST_LINEAR:
                    if HAS_GROUPS:
                        upper = tl.load(group_end_ptr + rows, mask=row_mask, other=0) - tl.load(
                            cell_end_ptr + row + rows, mask=row_mask, other=0
                        )
                    else:
                        upper = N - tl.load(cell_end_ptr + row + rows, mask=row_mask, other=N)
                    share = v_m.to(tl.float64) * (lower - upper).to(tl.float64)
                else:
                    share = lower.to(tl.float64)
                tl.store(shares_ptr + row + rows, share, mask=row_mask)
    else:
        # Lower rows: upper partners [cell_end, group_end).
        _pass(
            scores_ptr, values_row, order_row, cell_end_ptr + row, group_end_ptr,
            part + 2 * num_chunks * N, part, N, MARGIN, row_block, chunk, num_chunks,
            False, False, not HAS_GROUPS, COST_LINEAR, SURROGATE, FAST, FACTOR, SCORE_SCALE, VALUE_SCALE,
            ACC, BLOCK_M, BLOCK_N,
        )


def pair_partials(
    scores: torch.Tensor,
    levels,
    layout,
    *,
    cost_linear: bool,
    surrogate_id: int,
    margin: float,
    fast: bool,
    score_scale: float,
    value_scale: float,
    accumulation: torch.dtype,
    tiles: tuple[int, int, int],
    num_chunks: int,
    factor: bool = False,
    max_registers: int | None = None,
    score_columns: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch kernel 1 (after ``position_values`` for a linear cost); returns (partials
    (B, 3, num_chunks, N), the shares of Z_u (B, N) float64 where
    ``reduce.normaliser_source(levels)`` is "shares", else None). ``factor``: the fast logistic's
    factored terms (``factored``); ``max_registers``: the launch's register cap (``register_cap``),
    or None; ``score_columns``: (B, N) scores, a row per problem (``pair_loss_and_grad``)."""
    num_problems, n = layout.order.shape
    block_m, block_n, num_warps = tiles
    partials = torch.empty((num_problems, 3, num_chunks, n), dtype=accumulation, device=scores.device)
    write_shares = normaliser_source(levels) == "shares"
    shares = torch.empty((num_problems, n), dtype=torch.float64, device=scores.device) if write_shares else None
    values = position_values(levels, layout, accumulation) if cost_linear else scores
    has_groups = layout.group_start is not None
    cap = {"maxnreg": max_registers} if max_registers else {}
    launcher(_pair_partials_kernel)[(cdiv(n, block_m) * num_chunks, 2, num_problems)](
        scores, values, layout.order, layout.cell_start, layout.cell_end,
        layout.group_start if has_groups else layout.cell_start,
        layout.group_end if has_groups else layout.cell_end,
        partials, shares if write_shares else partials, n, num_chunks,
        MARGIN=margin, HAS_GROUPS=has_groups, COST_LINEAR=cost_linear, SURROGATE=surrogate_id, FAST=fast,
        FACTOR=factor,
        SCORE_SCALE=score_scale, VALUE_SCALE=value_scale, ACC=tl_dtype(accumulation), WRITE_SHARES=write_shares,
        BLOCK_M=block_m, BLOCK_N=block_n, SCORE_COLUMNS=score_columns, num_warps=num_warps,
        **cap,
    )
    return partials, shares


@triton.jit(do_not_specialize=("N", "num_ranks"))  # batch sizes: see _common.py
def _position_values_kernel(
    rank_ptr, values_ptr, order_ptr, group_start_ptr, out_ptr, N, num_ranks,
    HAS_GROUPS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (position blocks, B): out[b, p] = v(p) - v(first position of p's group), v the
    float64 level value of the item at sorted position p, rounded once to ``out``'s dtype."""
    positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    problem = tl.program_id(1).to(tl.int64)
    rank_row = rank_ptr + problem * N
    order_row = order_ptr + problem * N
    values_row = values_ptr + problem * num_ranks
    if HAS_GROUPS:
        first = tl.load(group_start_ptr + positions, mask=mask, other=0)
    else:
        first = tl.zeros([BLOCK], dtype=tl.int32)
    value = tl.load(values_row + rank_at(order_row, rank_row, positions, mask))
    lowest = tl.load(values_row + rank_at(order_row, rank_row, first, mask))
    tl.store(out_ptr + problem * N + positions, (value - lowest).to(out_ptr.dtype.element_ty), mask=mask)


def position_values(levels, layout, dtype: torch.dtype) -> torch.Tensor:
    """(B, N) ``dtype``: the level value of the item at each sorted position of each problem,
    measured from its group's lowest level, as kernel 1's pair costs read them.

    The costs are differences in the accumulation dtype. Measured from one level for the whole
    batch (or as they are), the values of a group far from it round away what its own pairs
    cost: one user's watch times 0.010-0.0125 s beside others' near 1e4 s, or label weights
    [1e4, 1e-4] whose 1e-4 pairs become 0. From the group's own lowest level, the float64
    difference is rounded once, to the group's own scale."""
    num_problems, n = layout.order.shape
    out = torch.empty((num_problems, n), dtype=dtype, device=layout.order.device)
    has_groups = layout.group_start is not None
    block = FINALIZE_BLOCK[launch_target(out.device)]
    launcher(_position_values_kernel)[(cdiv(n, block), num_problems)](
        levels.rank, levels.values, layout.order, layout.group_start if has_groups else layout.order, out,
        n, levels.num_ranks, HAS_GROUPS=has_groups, BLOCK=block,
    )
    return out


# --------------------------------------------------------------------------- #
# Host entry                                                                  #
# --------------------------------------------------------------------------- #
# (BLOCK_M, BLOCK_N, num_warps) of kernel 1 per device, and on CUDA with groups ("cuda groups").
# Fixed, not autotuned at run time, so that
# the summation order (and so every bit of the result) depends only on the device and N.
# Chosen on an H100 (bench_gpu.py sections 7 and 8: results/nvidia-h100-80gb-hbm3-tiles-8fc0c10.md,
# results/nvidia-h100-80gb-hbm3-graph-tiles-d3d908a.md):
# - without groups, 64 x 64 at 8 warps: 16 pairs a thread per tile and ~100-130 registers (64 x 64
#   x 4: 168-255), so more warps per SM hide the special-function latency. AUC / LaA at N = 2^20 in
#   139 / 416 ms (64 x 64 x 4: 154 / 497), at N = 16,384 in a CUDA graph 0.086 / 0.152 ms (0.121 /
#   0.182), the fastest there; 64 x 32 x 4 was faster at 2^20 (127 / 393 ms) but slower at 16,384
#   (0.14 / 0.162 ms; probably as AUC's pairs sit in the few row blocks of its positives, which
#   then have half the threads: not profiled);
# - with groups, 64 x 16 at 2 warps: a row block scans the partner positions of the groups its rows
#   fall in, about BLOCK_M + the group size rounded up to BLOCK_N tiles; narrow tiles scan fewer
#   pairs that are not a group's. Users of ~50 items at N = 2^20: 0.47 / 0.56 ms in a CUDA graph for
#   AUC / LaA (64 x 64 x 4: 1.08 / 1.24 ms), at 16,384 0.115 / 0.128 ms (0.139 / 0.153). (32 x 16 x 2
#   was 2-5% faster at 2^20, but ptxas unrolls some of its variants' loops, which kernel_sass.py's
#   per-pair counts do not follow.)
# Smaller tiles spend a few more loop instructions a pair on each tile's loads (kernel_sass.py: the
# launched variants, and the same kernel at the budget tiles, variants.BUDGET_TILES).
# A cap of 128 registers (ptxas's maxnreg) on 64 x 32 x 4 kept LaA at 442 ms instead of 393 at
# 2^20. Float64 accumulators take twice the registers: 64 x 64 spilled 5.9 KB per thread with
# groups, 32 x 32 none (188 registers; benchmarks/cuda_specializations.py). The interpreter pays
# about a millisecond per program-and-tile step whatever the tile size: big tiles are cheapest.
# The fast logistic's factored terms (``_common.factored_logistic_terms``: 3 special-function ops
# a pair over both passes instead of 5, for row blocks whose scores fit; kernel_sass.py). False: the
# per-pair terms everywhere, the kernel before them, which bench_gpu.py's "@per-pair" rows time
# beside the library's (benchmarks/cases.py ``kernel_settings``). On an H100 (eb07a70, section 9,
# CUDA graphs) AUC / LaA at 2^20 took 95.4 / 318 ms factored against 137 / 414 per pair (1.03e12 /
# 9.4e11 pairs/s), at 16,384 0.084 / 0.130 ms against 0.096 / 0.158, with groups the same within 3%.
FACTOR_LOGISTIC = True
TILES = {"cuda": (64, 64, 8), "cuda groups": (64, 16, 2), "cuda float64": (32, 32, 4), "interpreter": (128, 128, 4)}
# The register cap (ptxas .maxnreg) of the fast logistic's launches (FACTOR_LOGISTIC) with a key of
# TILES. 64 x 64 x 8 at 128 registers runs two programs (16 warps) per SM, the occupancy at which it
# was the fastest on an H100 (above). With both the factored and the per-pair loops in one kernel,
# ptxas gives the linear cost 162 registers otherwise (one program per SM); at 128 it spills
# nothing and spends ~0.4 more instructions a pair (kernel_sass.py). The other surrogates' kernels
# take 90-117 registers uncapped. bench_gpu.py's "@uncapped" rows time the cap's effect: on an H100
# (eb07a70) LaA at 2^20 took 618 ms uncapped against 318, AUC (uniform cost, 125 registers either
# way) 94.9 against 95.4.
MAX_REGISTERS = {"cuda": 128}
FINALIZE_BLOCK = {"cuda": 1024, "interpreter": 1024}
# Kernel 1 aims at this many programs per streaming multiprocessor (each pass of each problem
# counts), splitting partner ranges into chunks when N alone gives too few row blocks.
PROGRAMS_PER_SM = 8
MAX_CHUNKS = 32


def factored(fast: bool, surrogate_id: int) -> bool:
    """Whether kernel 1 takes the fast logistic's factored terms (its FACTOR constexpr)."""
    return fast and surrogate_id == SURROGATES["logistic"] and FACTOR_LOGISTIC


def register_cap(key: str, factor: bool) -> int | None:
    """The register cap of a kernel-1 launch with the tiles ``TILES[key]``: ``MAX_REGISTERS``' for
    the factored kernel, none for the others."""
    return MAX_REGISTERS.get(key) if factor else None


def launch_config(
    device: torch.device, num_items: int, num_problems: int, accumulation: torch.dtype = torch.float32,
    grouped: bool = False,
) -> tuple[tuple[int, int, int], int, int]:
    """((BLOCK_M, BLOCK_N, num_warps), chunks, finalize block) for a batch on ``device``."""
    target = launch_target(device)
    tiles = TILES[tile_key(target, accumulation, grouped)]
    if target == "cuda":
        row_blocks = cdiv(num_items, tiles[0]) * 2 * num_problems
        programs = PROGRAMS_PER_SM * _multiprocessors(device)
        chunks = min(MAX_CHUNKS, max(1, cdiv(programs, max(row_blocks, 1))))
    else:
        chunks = 1
    return tiles, chunks, FINALIZE_BLOCK[target]


def tile_key(target: str, accumulation: torch.dtype = torch.float32, grouped: bool = False) -> str:
    """The key of ``TILES`` for a launch target: CUDA has its own for float64 and for groups."""
    if target != "cuda":
        return target
    return "cuda float64" if accumulation == torch.float64 else "cuda groups" if grouped else "cuda"


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def pair_loss_and_grad(
    scores: torch.Tensor,
    levels,
    layout,
    *,
    mixing: torch.Tensor | None,
    cost: str,
    surrogate: str,
    margin: float,
    reduction: str,
    status: torch.Tensor | None,
    tiles: tuple[int, int, int] | None = None,
    chunks: int | None = None,
    fast: bool | None = None,
    score_columns: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every problem's all-pairs loss over a ``PairLayout``, mixed, and its gradient.

    Args:
        scores: (N,) float scores in the caller's item order.
        levels: the problems' ``mlloss.ops.layout.Levels`` (rank per item, value table).
        layout: their ``mlloss.ops.layout.PairLayout``.
        mixing: (B,) weights of the problems' losses, or None for all ones.
        cost: ``"uniform"`` or ``"linear"``; surrogate, margin: the pair loss.
        reduction: ``"mean"`` or ``"sum"`` over the groups with a valid pair.
        status: a one-element int32 tensor that gets STATUS_OVERFLOW if the loss is not
            finite, or None for no check.
        tiles, chunks: override :func:`launch_config` (tests).
        fast: override ``_common.fast_math`` for float32 (tests: the fast branch's algebra under
            the interpreter, which computes its special functions exactly).
        score_columns: ``scores`` (B, N), contiguous, a row of its own for each problem (binary
            problems: a multi-task model's task columns); the gradient comes back (N, B).

    Returns:
        (loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,)):
        the loss in float32 (float64 for float64 scores), the gradient in the accumulation dtype.
    """
    from ..ops.fused import accumulation_dtype
    from ._common import fast_math, score_scale, surrogate_id, validate_device, value_scale

    validate_device(scores, levels.rank, layout.order)
    accumulation = accumulation_dtype(scores)
    grouped = layout.group_start is not None
    default_tiles, default_chunks, finalize_block = launch_config(
        scores.device, layout.num_items, layout.num_problems, accumulation, grouped=grouped
    )
    fast = fast_math(scores.device, accumulation) if fast is None else fast and accumulation == torch.float32
    surrogate_index = surrogate_id(surrogate)
    factor = factored(fast, surrogate_index)
    partials, shares = pair_partials(
        scores, levels, layout,
        cost_linear=cost == "linear", surrogate_id=surrogate_index, margin=float(margin), fast=fast,
        score_scale=score_scale(surrogate, fast), value_scale=value_scale(surrogate, fast),
        accumulation=accumulation, tiles=tiles or default_tiles, num_chunks=chunks or default_chunks, factor=factor,
        max_registers=None if tiles else register_cap(tile_key(launch_target(scores.device), accumulation, grouped), factor),
        score_columns=score_columns,
    )
    num_problems, n = layout.order.shape
    # One problem: its gradient goes straight to the output, which combine scales in place.
    grad = torch.empty(n if num_problems == 1 else (num_problems, n), dtype=accumulation, device=scores.device)
    block_sums = finalize(partials, shares, levels, layout, grad, cost_linear=cost == "linear", block=finalize_block)
    return combine(
        grad, 0, n, block_sums, mixing, mean=reduction == "mean", loss_dtype=accumulation, status=status,
        block=finalize_block, grad=grad if num_problems == 1 and not score_columns else None, separate=score_columns,
    )
