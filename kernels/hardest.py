"""Max-violation pairs (DAOM, PDAOM: Sun et al. Eq. 5-6) as segmented kernels: of binary problems,
and of LaA's aggregated levels.

Input: a ``mlloss.ops.layout.PairLayout``: every problem sorted by (group, label), the items of
a (group, label) cell in index order. A group's negatives then occupy ``[group_start, c)`` and
its positives ``[c, group_end)``. Per group with both labels (loss spec, "Max-violation
variants"):

    loss_u = phi(min_{y=1} s - max_{y=0} s)

or, with a temperature tau, the min and max replaced by log-mean-exp,
softmin = -tau log(mean exp(-s / tau)), softmax = tau log(mean exp(s / tau)).

Each cell's extreme comes from a segmented scan over the positions (``scan``: in blocks,
``_cell_scan_kernel``, then across blocks, as ``reduce.group_sums`` does for sums): of
v = s in a positive cell (its min) and v = -s in a negative one (minus its max; with several
levels every cell is both, in two rows), keeping with the min the items attaining it, or with a
temperature the sums of exp((min - v) / tau) and of exp((min - v) / tau) - 1 over the cell,
rescaled as parts merge (every term in (0, 1] and (-1, 0], the cell's own items only, in a fixed
order; the second keeps the digits of log(mean) when tau is far above the cell's spread:
``scan.log_mean``). No sort of the scores: on an H100 the
sort and the gathers around it took about a third of PDAOM's device time at N = 2^20
(``benchmarks/results/nvidia-h100-80gb-hbm3-profile-a20b70f.txt``), and most of its host time.
The gradient goes to the items attaining the min and max, split equally among ties, or with a
temperature to every item by its softmin (softmax) weight.

``_hardest_kernel`` (grid (position blocks, B)) writes the gradient in the caller's item order
and per-block sums [loss, groups with both labels, level pairs], the same outputs as the
all-pairs finalize step, so ``reduce.combine`` reduces them (mean or sum over groups, mixing
over problems). ``_hardest_levels_kernel`` does the same for one problem of several levels
(LaA's aggregated label, of binary columns or of one ordinal column; hard or soft): every level
pair of a group, min of the upper cell against max of the lower,
sum_{a > b} c_ab phi(min_a - max_b) / sum_{a > b} c_ab (see its docstring).
Everything is float64: the work is O(N) and the exponential surrogate of raw scores overflows
float32 soon. The temperature too: its parameters are annotated ``tl.float64``, since Triton's
launcher types a plain Python float as fp32 on CUDA (tau = 0.3 would lose ~1e-8 relative there;
the interpreter keeps the Python float). No atomics; deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.fused import accumulation_dtype
from ._common import (
    cdiv, group_spans, launch_target, next_cell, rank_at, reverse_margin_terms, shared_pull, surrogate_id,
    validate_device,
)
from . import scan
from ._launch import launcher
from .pairwise import FINALIZE_BLOCK
from .reduce import combine
from .scan import CARRY_ROWS

__all__ = ["hardest_loss_and_grad"]

# Positions per program of the several-level kernel: its walk keeps a dozen float64 values per
# position live, so on CUDA one position per thread (1,024 per program spilled 2 KB per thread).
LEVELS_BLOCK = {"cuda": 128, "interpreter": 1024}


@triton.jit
def _score_at(scores_ptr, order_row, position, mask):
    return tl.load(scores_ptr + tl.load(order_row + position, mask=mask, other=0), mask=mask, other=0.0).to(tl.float64)


@triton.jit
def _spans(cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, row, positions, mask, N,
           HAS_GROUPS: tl.constexpr):
    """(cell start, cell end, group start, group end) of the positions; one group without groups."""
    cell_start = tl.load(cell_start_ptr + row + positions, mask=mask, other=0)
    cell_end = tl.load(cell_end_ptr + row + positions, mask=mask, other=0)
    group_start, group_end = group_spans(group_start_ptr, group_end_ptr, positions, mask, N, HAS_GROUPS)
    return cell_start, cell_end, group_start, group_end


# --------------------------------------------------------------------------- #
# Each cell's extreme: a segmented scan over the positions, then across blocks #
# --------------------------------------------------------------------------- #
# A cell's items hold values v (a score, or its negation: the max of s is -(the min of -s)); the
# scan keeps (min of v, what goes with it): the items attaining it (hard), or the sum of
# exp((min - v) / tau) over the cell (soft), rescaled to the smaller min as two parts merge.
@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _cell_scan_kernel(
    scores_ptr, order_ptr, cell_start_ptr, group_start_ptr, extremes_ptr, carries_ptr, N, num_blocks,
    inverse_temperature: tl.float64, HAS_GROUPS: tl.constexpr, BOTH: tl.constexpr, SOFT: tl.constexpr,
    BLOCK: tl.constexpr, SCORE_COLUMNS: tl.constexpr,
):
    """Grid (position blocks, R). Level one of the cells' scans (``scan.scan_block``): each
    position's (min, acc, deficit) of its cell's values v up to it, to extremes[r, 0..2, p] (the
    deficit, the sum of exp((min - v) / tau) - 1, SOFT only: 3 rows a problem, else 2).
    Binary problems (not BOTH, r the problem): v = s for a positive, -s for a negative (a
    positive's cell starts after its group's start); one problem of several levels (BOTH): v = s
    (row 0, the cells' min) and v = -s (row 1, their max). SCORE_COLUMNS (binary problems): each
    problem reads its own scores, row r of (B, N) ``scores``."""
    block = tl.program_id(0)
    r = tl.program_id(1).to(tl.int64)
    row = 0 if BOTH else r * N
    if SCORE_COLUMNS:
        scores_ptr += row
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    cell_start = tl.load(cell_start_ptr + row + positions, mask=mask, other=0)
    score = _score_at(scores_ptr, order_ptr + row, positions, mask)
    if BOTH:
        value = tl.where(r == 0, score, -score)
    else:
        if HAS_GROUPS:
            group_start = tl.load(group_start_ptr + positions, mask=mask, other=0)
        else:
            group_start = tl.zeros_like(cell_start)
        value = tl.where(cell_start > group_start, score, -score)
    # each item a part of its own (acc 1: one item attains its min, its term is exp(0); deficit
    # exp(0) - 1 = 0); the lanes past N empty parts
    value = tl.where(mask, value, float("inf"))
    acc = tl.where(mask, 1.0, 0.0).to(tl.float64)
    scan.scan_block(extremes_ptr + r * _extreme_rows(SOFT) * N, carries_ptr + r * CARRY_ROWS * num_blocks, block,
                    num_blocks, N, positions, mask, mask & (cell_start == positions), value, acc, tl.zeros_like(acc),
                    inverse_temperature, "softmin" if SOFT else "min", BLOCK)


@triton.jit
def _extreme_rows(SOFT: tl.constexpr):
    """Rows of ``extremes`` per scan: (min, acc), and a softmin's deficit."""
    if SOFT:
        return 3
    else:
        return 2


@triton.jit
def _cell_extreme(extremes_row, carries_row, start, end, N, num_blocks, mask, inverse_temperature,
                  SOFT: tl.constexpr, BLOCK: tl.constexpr):
    """(min of v over the cell [start, end), acc: the items attaining it, or the sum of
    exp((min - v) / tau), deficit: the sum of exp((min - v) / tau) - 1, SOFT) from
    ``_cell_scan_kernel``'s scan (``scan.segment_total``)."""
    return scan.segment_total(extremes_row, carries_row, start, end, N, num_blocks, mask, inverse_temperature,
                              "softmin" if SOFT else "min", BLOCK)


@triton.jit
def _soft_min(low, acc, deficit, size, temperature, SOFT: tl.constexpr):
    """A cell's min of v (hard), or its log-mean-exp min - tau log(mean exp((min - v) / tau)) (SOFT;
    ``scan.log_mean``)."""
    if SOFT:
        return low - temperature * scan.log_mean(acc, deficit, size)
    else:
        return low


@triton.jit
def _share(own, low, acc, inverse_temperature, has_pair, SOFT: tl.constexpr):
    """An item's share of the gradient of its cell's min of v (``own`` its v): its softmin
    weight (SOFT), or 1 / ties if it attains the min."""
    if SOFT:
        return tl.where(has_pair, scan.exp_below(low, own, inverse_temperature) / acc, 0.0)
    else:
        return tl.where(own == low, 1.0 / tl.maximum(acc, 1.0), 0.0)


@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _hardest_kernel(
    scores_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    extremes_ptr, carries_ptr, grad_ptr, block_sums_ptr, N, num_blocks, temperature: tl.float64,
    inverse_temperature: tl.float64, MARGIN: tl.constexpr, SURROGATE: tl.constexpr, HAS_GROUPS: tl.constexpr,
    SOFT: tl.constexpr, BLOCK: tl.constexpr, SCORE_COLUMNS: tl.constexpr,
):
    """Grid (position blocks, B); see the module docstring. ``extremes``, ``carries``: the cells'
    scans (``_cell_scan_kernel``, ``scan.carry_across_blocks``): a positive cell's min of s, a
    negative cell's min of -s. No rank is read: a group's positives are the cell after its first.
    SCORE_COLUMNS: each problem reads its own scores, row ``problem`` of (B, N) ``scores``."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    row = problem * N
    if SCORE_COLUMNS:
        scores_ptr += row
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    cell_start, cell_end, group_start, group_end = _spans(
        cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, row, positions, mask, N, HAS_GROUPS
    )
    positive = cell_start > group_start  # (in a group of one level, no pair: either way)
    boundary = tl.where(positive, cell_start, cell_end)  # the group's negatives [start, c), positives [c, end)
    has_pair = mask & (group_start < boundary) & (boundary < group_end)
    extremes = extremes_ptr + problem * _extreme_rows(SOFT) * N
    carries = carries_ptr + problem * CARRY_ROWS * num_blocks
    lowest_positive, positives_acc, positives_deficit = _cell_extreme(
        extremes, carries, boundary, group_end, N, num_blocks, has_pair, inverse_temperature, SOFT, BLOCK)
    lowest_negated, negatives_acc, negatives_deficit = _cell_extreme(
        extremes, carries, group_start, boundary, N, num_blocks, has_pair, inverse_temperature, SOFT, BLOCK)
    # min of the positives minus max of the negatives (their log-mean-exp with a temperature)
    margin = (_soft_min(lowest_positive, positives_acc, positives_deficit, group_end - boundary, temperature, SOFT)
              + _soft_min(lowest_negated, negatives_acc, negatives_deficit, boundary - group_start, temperature, SOFT))
    # phi(t) and -phi'(t) of the reverse margin x = -t (kernels._common).
    value, pull = reverse_margin_terms(tl.where(has_pair, -margin, 0.0), MARGIN, SURROGATE, True, False)

    score = _score_at(scores_ptr, order_ptr + row, positions, mask)
    own = tl.where(positive, score, -score)  # v, as the scan saw it
    share = _share(own, tl.where(positive, lowest_positive, lowest_negated),
                   tl.where(positive, positives_acc, negatives_acc), inverse_temperature, has_pair, SOFT)
    # d phi(min - max) / d min = -pull, / d max = +pull
    grad = tl.where(has_pair, shared_pull(tl.where(positive, -pull, pull), share), 0.0)
    item = tl.load(order_ptr + row + positions, mask=mask, other=0)
    tl.store(grad_ptr + row + item, grad.to(grad_ptr.dtype.element_ty), mask=mask)

    counted = has_pair & (positions == group_start)  # each group once, at its first position
    sums = block_sums_ptr + problem * 3 * num_blocks + block
    tl.store(sums, tl.sum(tl.where(counted, value, 0.0)))
    tl.store(sums + num_blocks, tl.sum(counted.to(tl.float64)))
    tl.store(sums + 2 * num_blocks, tl.sum(counted.to(tl.float64)))


@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _hardest_levels_kernel(
    scores_ptr, rank_ptr, values_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    extremes_ptr, carries_ptr, grad_ptr, block_sums_ptr, N, num_blocks, scan_blocks, temperature: tl.float64,
    inverse_temperature: tl.float64, MARGIN: tl.constexpr, SURROGATE: tl.constexpr, HAS_GROUPS: tl.constexpr, COST_LINEAR: tl.constexpr,
    SOFT: tl.constexpr, BLOCK: tl.constexpr, SCAN_BLOCK: tl.constexpr,
):
    """Grid (position blocks,): one problem of several levels (LaA's aggregated label: ranks into
    the ascending ``values``, of its label patterns or of an ordinal column), max-violation pairs.
    Per group u and present levels a > b:
    loss_u = sum c_ab phi(min_a - max_b) / Z_u, Z_u = sum c_ab (c_ab = v_a - v_b, or 1).

    Each position walks its group's cells in level order (a cell's min and max from the cells'
    scans, rows 0 and 1: ``_cell_scan_kernel`` in blocks of SCAN_BLOCK positions, scan_blocks of
    them), one step per level present in the group, until
    every position of the block has left its group: O(n_u L_u) steps for a group of n_u items at
    L_u levels, whatever the label's range. On its way it meets every level pair its own cell is
    in: as the upper cell a (its min's gradient, and the pair's loss term, kept by the cell's
    first position) and as the lower cell (its max's gradient). Z_u comes from the same
    walk in closed form: P(P - 1) / 2 for P present levels, or sum_k v_k (2 k - (P - 1)) over them
    in ascending order. Gradient to the tied extremes in equal shares; block sums as
    ``_hardest_kernel``'s, with the group's present level pairs as its valid pairs.

    SOFT: min and max are a cell's log-mean-exp at ``temperature``, and every item of a cell
    shares its gradient by its softmin (softmax) weight."""
    block = tl.program_id(0)
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    item = tl.load(order_ptr + positions, mask=mask, other=0)
    level = tl.load(rank_ptr + item, mask=mask, other=0)
    cell_start, cell_end, group_start, group_end = _spans(
        cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, 0, positions, mask, N, HAS_GROUPS
    )
    lowest_row, highest_row = extremes_ptr, extremes_ptr + _extreme_rows(SOFT) * N  # min of s, min of -s
    lowest_carries, highest_carries = carries_ptr, carries_ptr + CARRY_ROWS * scan_blocks
    hard_min, own_min_acc, own_min_deficit = _cell_extreme(lowest_row, lowest_carries, cell_start, cell_end, N,
                                                           scan_blocks, mask, inverse_temperature, SOFT, SCAN_BLOCK)
    hard_max_negated, own_max_acc, own_max_deficit = _cell_extreme(
        highest_row, highest_carries, cell_start, cell_end, N, scan_blocks, mask, inverse_temperature, SOFT, SCAN_BLOCK)
    own_min = _soft_min(hard_min, own_min_acc, own_min_deficit, cell_end - cell_start, temperature, SOFT)
    own_max = -_soft_min(hard_max_negated, own_max_acc, own_max_deficit, cell_end - cell_start, temperature, SOFT)
    # Z_u from values measured from the group's lowest level: a sum of terms with both signs,
    # which values far from 0 (1e8 + 0.01 k) would cancel (the costs are differences either way)
    lowest = tl.load(values_ptr + rank_at(order_ptr, rank_ptr, group_start, mask))
    own_value = tl.load(values_ptr + level, mask=mask, other=0.0) - lowest

    min_pull = tl.zeros([BLOCK], dtype=tl.float64)  # sum over lower cells b of c_ab phi'; as upper
    max_pull = tl.zeros([BLOCK], dtype=tl.float64)  # sum over upper cells of c phi'; as lower
    terms = tl.zeros([BLOCK], dtype=tl.float64)  # sum over lower cells b of c_ab phi(min_a - max_b)
    present = tl.zeros([BLOCK], dtype=tl.int32)
    value_sum = tl.zeros([BLOCK], dtype=tl.float64)
    weighted_sum = tl.zeros([BLOCK], dtype=tl.float64)  # sum_k k v_k over present levels
    start = group_start
    here, end, other_level = next_cell(order_ptr, rank_ptr, cell_end_ptr, start, group_end, mask)
    while tl.max(here.to(tl.int32), axis=0) > 0:  # until the block's walks have all left their groups
        other_value = tl.load(values_ptr + other_level, mask=here, other=0.0) - lowest
        if COST_LINEAR:
            cost = tl.abs(own_value - other_value)
        else:
            cost = tl.full([BLOCK], 1.0, dtype=tl.float64)
        below = here & (other_level < level)
        above = here & (other_level > level)
        # reverse margins x = s_lower - s_upper of the pair (own cell, this cell)
        lower_negated, lower_acc, lower_deficit = _cell_extreme(highest_row, highest_carries, start, end, N,
                                                                scan_blocks, below, inverse_temperature, SOFT, SCAN_BLOCK)
        upper_min, upper_acc, upper_deficit = _cell_extreme(lowest_row, lowest_carries, start, end, N, scan_blocks,
                                                            above, inverse_temperature, SOFT, SCAN_BLOCK)
        lower_max = -_soft_min(lower_negated, lower_acc, lower_deficit, end - start, temperature, SOFT)
        upper_min = _soft_min(upper_min, upper_acc, upper_deficit, end - start, temperature, SOFT)
        x = tl.where(below, lower_max - own_min, tl.where(above, own_max - upper_min, 0.0))
        value, pull = reverse_margin_terms(x, MARGIN, SURROGATE, True, False)
        min_pull += tl.where(below, cost * pull, 0.0)
        max_pull += tl.where(above, cost * pull, 0.0)
        terms += tl.where(below, cost * value, 0.0)
        weighted_sum += tl.where(here, present.to(tl.float64) * other_value, 0.0)
        value_sum += tl.where(here, other_value, 0.0)
        present += here.to(tl.int32)
        start = tl.where(here, end, start)
        here, end, other_level = next_cell(order_ptr, rank_ptr, cell_end_ptr, start, group_end, mask)
    count = present.to(tl.float64)
    if COST_LINEAR:
        normaliser = 2.0 * weighted_sum - (count - 1.0) * value_sum
    else:
        normaliser = count * (count - 1.0) * 0.5
    has_pair = mask & (present > 1)
    inverse = tl.where(has_pair, 1.0 / tl.where(has_pair, normaliser, 1.0), 0.0)

    score = _score_at(scores_ptr, order_ptr, positions, mask)
    min_share = _share(score, hard_min, own_min_acc, inverse_temperature, has_pair, SOFT)
    max_share = _share(-score, hard_max_negated, own_max_acc, inverse_temperature, has_pair, SOFT)
    # d phi(min_a - max_b) / d min_a = -pull, / d max_b = +pull
    grad = (shared_pull(max_pull, max_share) - shared_pull(min_pull, min_share)) * inverse
    tl.store(grad_ptr + item, grad.to(grad_ptr.dtype.element_ty), mask=mask)

    first_of_cell = has_pair & (positions == cell_start)
    first_of_group = has_pair & (positions == group_start)
    sums = block_sums_ptr + block
    tl.store(sums, tl.sum(tl.where(first_of_cell, terms * inverse, 0.0)))
    tl.store(sums + num_blocks, tl.sum(first_of_group.to(tl.float64)))
    tl.store(sums + 2 * num_blocks, tl.sum(tl.where(first_of_group, count * (count - 1.0) * 0.5, 0.0)))


def hardest_loss_and_grad(
    scores: torch.Tensor,
    levels,
    layout,
    *,
    mixing: torch.Tensor | None,
    surrogate: str,
    margin: float,
    temperature: float | None,
    reduction: str,
    status: torch.Tensor | None,
    cost: str = "uniform",
    score_columns: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every problem's max-violation loss over a ``PairLayout``, mixed.

    Same contract as ``pairwise.pair_loss_and_grad``:
    binary problems (``levels.rank`` the 0/1 labels) or one problem of several levels
    (``levels.values``: LaA's aggregated label, with pair cost ``cost``), hard or soft;
    ``score_columns`` (binary problems): (B, N) scores, a row per problem, and an (N, B) gradient.
    """
    validate_device(scores, levels.rank, layout.order)
    num_problems, n = layout.order.shape
    several = levels.values is not None
    if several and (num_problems != 1 or score_columns):
        raise ValueError(f"the several-level kernel takes one problem; got {num_problems} problems"
                         + (" on score columns" if score_columns else ""))
    block = FINALIZE_BLOCK[launch_target(scores.device)]
    num_blocks = cdiv(n, block)
    has_groups = layout.group_start is not None
    spans = (
        layout.cell_start, layout.cell_end,
        layout.group_start if has_groups else layout.cell_start,
        layout.group_end if has_groups else layout.cell_end,
    )
    soft = temperature is not None
    tau = float(temperature) if soft else 1.0  # a float64 kernel argument, not read without a temperature
    # 1 / tau passed as a float64 argument too: computed in a kernel from the interpreter's Python
    # float it went through a float32 constant (2e-9 relative at tau = 0.3)
    inverse_tau = 1.0 / tau
    loss_dtype = accumulation_dtype(scores)
    # One problem: its gradient goes straight to the output, which combine scales in place; score
    # columns' go to their columns of another output; problems over shared scores sum in float64.
    grad = torch.empty((num_problems, n), dtype=loss_dtype if num_problems == 1 or score_columns else torch.float64,
                       device=scores.device)
    # Each cell's min of s and max of s (rows of v = s and v = -s), or their soft sums: a binary
    # problem's positive cells need only the min and its negative cells only the max (one row).
    rows = 2 if several else num_problems
    extremes = torch.empty((rows, 3 if soft else 2, n), dtype=torch.float64, device=scores.device)
    carries = scan.new_carries(rows, num_blocks, scores.device)
    launcher(_cell_scan_kernel)[(num_blocks, rows)](
        scores, layout.order, layout.cell_start, spans[2], extremes, carries, n, num_blocks, inverse_tau,
        HAS_GROUPS=has_groups, BOTH=several, SOFT=soft, BLOCK=block, SCORE_COLUMNS=score_columns, num_warps=8,
    )
    scan.carry_across_blocks(carries, "softmin" if soft else "min", inverse_tau)
    if several:
        walk_block = LEVELS_BLOCK[launch_target(scores.device)]
        walk_blocks = cdiv(n, walk_block)
        block_sums = torch.empty((1, 3, walk_blocks), dtype=torch.float64, device=scores.device)
        launcher(_hardest_levels_kernel)[(walk_blocks,)](
            scores, levels.rank, levels.values, layout.order, *spans, extremes, carries, grad, block_sums, n,
            walk_blocks, num_blocks, tau, inverse_tau, MARGIN=float(margin), SURROGATE=surrogate_id(surrogate),
            HAS_GROUPS=has_groups, COST_LINEAR=cost == "linear", SOFT=soft, BLOCK=walk_block, SCAN_BLOCK=block,
            num_warps=4,
        )
    else:
        block_sums = torch.empty((num_problems, 3, num_blocks), dtype=torch.float64, device=scores.device)
        launcher(_hardest_kernel)[(num_blocks, num_problems)](
            scores, layout.order, *spans, extremes, carries, grad, block_sums, n, num_blocks, tau, inverse_tau,
            MARGIN=float(margin), SURROGATE=surrogate_id(surrogate), HAS_GROUPS=has_groups, SOFT=soft, BLOCK=block,
            SCORE_COLUMNS=score_columns,
            # float64 extremes of two cells per position (sm_90, Triton 3.9): hard 212 registers a
            # thread at 4 warps, 112 at 8; soft (three sums a cell: ``scan.log_mean``) 255 and 712
            # bytes of spills at 4, 242 at 8
            num_warps=8,
        )
    return combine(
        grad, 0, n, block_sums, mixing, mean=reduction == "mean", loss_dtype=loss_dtype, status=status, block=block,
        grad=grad[0] if num_problems == 1 and not score_columns else None, separate=score_columns,
    )
