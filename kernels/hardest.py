"""Max-violation pairs (DAOM, PDAOM: Sun et al. Eq. 5-6) as segmented kernels: of binary problems,
and of LaA's aggregated levels.

Input: a ``mlloss.ops.layout.PairLayout`` built with ``tie_scores``: every problem sorted by
(group, label), and the items of each (group, label) cell by score, ascending. A group's
negatives then occupy ``[group_start, c)`` and its positives ``[c, group_end)``, so its hardest
pair is the two positions around the boundary c: the largest negative at c - 1 and the smallest
positive at c. Per group with both labels (loss spec, "Max-violation variants"):

    loss_u = phi(min_{y=1} s - max_{y=0} s)

or, with a temperature tau, the min and max replaced by log-mean-exp,
softmin = -tau log(mean exp(-s / tau)), softmax = tau log(mean exp(s / tau)), whose cell sums
come from a float64 prefix sum of exp(-(s - min) / tau) (positives) and exp((s - max) / tau)
(negatives; with several levels a cell is both, and both rows are summed): every term is in
(0, 1] and a cell holds its extreme's term 1, so a cell's sum is >= 1, and its prefix difference
is off by the roundings of the cell's own additions to running totals of at most N: n N 2^-53
at most for a cell of n items (a term below 2^-53 of the running total is lost), 1.1e-8 relative
at N = 1M for a cell of a hundred. The gradient goes to the items attaining the min and
max, split equally among ties (a binary search in the sorted cell counts them), or with a
temperature to every item by its softmax weight.

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
from ._common import cdiv, launch_target, next_cell, rank_at, reverse_margin_terms, surrogate_id, validate_device
from ._launch import launcher
from .pairwise import FINALIZE_BLOCK
from .reduce import combine

__all__ = ["hardest_loss_and_grad"]

# Binary searches run a fixed number of halvings (enough for any N < 2^31).
_SEARCH_STEPS: tl.constexpr = tl.constexpr(31)
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
    if HAS_GROUPS:
        group_start = tl.load(group_start_ptr + positions, mask=mask, other=0)
        group_end = tl.load(group_end_ptr + positions, mask=mask, other=0)
    else:
        group_start = tl.zeros_like(cell_start)
        group_end = tl.zeros_like(cell_start) + N
    return cell_start, cell_end, group_start, group_end


@triton.jit
def _group_bounds(rank_row, order_row, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
                  row, positions, mask, N, HAS_GROUPS: tl.constexpr):
    """(positive: the item is a positive, group start, the label boundary c, group end)."""
    positive = rank_at(order_row, rank_row, positions, mask) > 0
    cell_start, cell_end, group_start, group_end = _spans(
        cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, row, positions, mask, N, HAS_GROUPS
    )
    boundary = tl.where(positive, cell_start, cell_end)
    return positive, group_start, boundary, group_end


@triton.jit(do_not_specialize=("N",))  # batch sizes: see _common.py
def _soft_terms_kernel(
    scores_ptr, rank_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    terms_ptr, N, inverse_temperature: tl.float64,
    HAS_GROUPS: tl.constexpr, BOTH: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (position blocks, B): each position's upper term exp(-(s_p - min) / tau) and lower term
    exp((s_p - max) / tau) (min, max: its cell's, at the cell's ends). Binary problems
    (not BOTH): terms[b, p], a positive's upper term or a negative's lower term; one problem of
    several levels (BOTH), whose cells are upper and lower cells at once: terms[0, p] the upper
    term and terms[1, p] the lower term."""
    problem = tl.program_id(1).to(tl.int64)
    row = problem * N
    positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    order_row = order_ptr + row
    cell_start, cell_end, _, _ = _spans(
        cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, row, positions, mask, N, HAS_GROUPS
    )
    score = _score_at(scores_ptr, order_row, positions, mask)
    lowest = _score_at(scores_ptr, order_row, cell_start, mask)
    highest = _score_at(scores_ptr, order_row, cell_end - 1, mask)
    upper = tl.exp((lowest - score) * inverse_temperature)
    lower = tl.exp((score - highest) * inverse_temperature)
    if BOTH:
        tl.store(terms_ptr + positions, upper, mask=mask)
        tl.store(terms_ptr + N + positions, lower, mask=mask)
    else:
        positive = rank_at(order_row, rank_ptr + row, positions, mask) > 0
        tl.store(terms_ptr + row + positions, tl.where(positive, upper, lower), mask=mask)


@triton.jit
def _range_sum(prefix_row, start, end, mask):
    """sum of the terms at positions [start, end) from their inclusive prefix sums (end > start)."""
    before = tl.load(prefix_row + start - 1, mask=mask & (start > 0), other=0.0)
    return tl.load(prefix_row + end - 1, mask=mask, other=1.0) - before


@triton.jit
def _soft_extreme(prefix_row, extreme, start, end, signed_temperature, mask):
    """(log-mean-exp extreme of the cell [start, end), its term sum): extreme + t log(sum / size)
    with t = -tau for the softmin (upper terms) and +tau for the softmax (lower terms)."""
    total = _range_sum(prefix_row, start, end, mask)
    size = tl.where(mask, end - start, 1).to(tl.float64)
    return extreme + signed_temperature * tl.log(total / size), total


@triton.jit
def _tie_count(scores_ptr, order_row, lo, hi, value, FROM_START: tl.constexpr, mask):
    """Items of the ascending range [lo, hi) equal to its first value (FROM_START: count up to
    the first larger one) or to its last value (count from the first one not smaller)."""
    left = lo
    right = hi
    for _ in range(_SEARCH_STEPS):
        active = left < right
        middle = (left + right) // 2
        probe = _score_at(scores_ptr, order_row, middle, mask & active)
        if FROM_START:
            go_right = active & (probe <= value)
        else:
            go_right = active & (probe < value)
        right = tl.where(active & ~go_right, middle, right)
        left = tl.where(go_right, middle + 1, left)
    if FROM_START:
        return left - lo
    else:
        return hi - left


@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _hardest_kernel(
    scores_ptr, rank_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    prefix_ptr, grad_ptr, block_sums_ptr, N, num_blocks, temperature: tl.float64,
    MARGIN: tl.constexpr, SURROGATE: tl.constexpr, HAS_GROUPS: tl.constexpr, SOFT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (position blocks, B); see the module docstring. ``prefix`` (B, N) float64: the
    inclusive prefix sums of ``_soft_terms_kernel``'s terms (SOFT only)."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    row = problem * N
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    order_row = order_ptr + row
    positive, group_start, boundary, group_end = _group_bounds(
        rank_ptr + row, order_row, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
        row, positions, mask, N, HAS_GROUPS,
    )
    has_pair = mask & (group_start < boundary) & (boundary < group_end)
    lowest_positive = _score_at(scores_ptr, order_row, boundary, has_pair)
    highest_negative = _score_at(scores_ptr, order_row, boundary - 1, has_pair)
    if SOFT:
        prefix = prefix_ptr + row
        soft_min, positives_sum = _soft_extreme(prefix, lowest_positive, boundary, group_end, -temperature, has_pair)
        soft_max, negatives_sum = _soft_extreme(prefix, highest_negative, group_start, boundary, temperature, has_pair)
        margin = soft_min - soft_max
    else:
        margin = lowest_positive - highest_negative
    # phi(t) and -phi'(t) of the reverse margin x = -t (kernels._common).
    value, pull = reverse_margin_terms(tl.where(has_pair, -margin, 0.0), MARGIN, SURROGATE, True, False)

    score = _score_at(scores_ptr, order_row, positions, mask)
    if SOFT:
        share = _range_sum(prefix, positions, positions + 1, mask) / tl.where(positive, positives_sum, negatives_sum)
    else:
        # A tied extreme gets 1 / ties of the gradient: min at the start of the positives' run,
        # max at the end of the negatives'.
        lowest_ties = _tie_count(scores_ptr, order_row, boundary, group_end, lowest_positive, True, has_pair & positive)
        highest_ties = _tie_count(scores_ptr, order_row, group_start, boundary, highest_negative, False, has_pair & ~positive)
        attains = tl.where(positive, score == lowest_positive, score == highest_negative)
        ties = tl.maximum(tl.where(positive, lowest_ties, highest_ties), 1).to(tl.float64)
        share = tl.where(attains, 1.0 / ties, 0.0)
    # d phi(min - max) / d min = -pull, / d max = +pull
    grad = tl.where(has_pair, tl.where(positive, -pull, pull) * share, 0.0)
    item = tl.load(order_row + positions, mask=mask, other=0)
    tl.store(grad_ptr + row + item, grad.to(grad_ptr.dtype.element_ty), mask=mask)

    counted = has_pair & (positions == group_start)  # each group once, at its first position
    sums = block_sums_ptr + problem * 3 * num_blocks + block
    tl.store(sums, tl.sum(tl.where(counted, value, 0.0)))
    tl.store(sums + num_blocks, tl.sum(counted.to(tl.float64)))
    tl.store(sums + 2 * num_blocks, tl.sum(counted.to(tl.float64)))


@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _hardest_levels_kernel(
    scores_ptr, rank_ptr, values_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    prefix_ptr, grad_ptr, block_sums_ptr, N, num_blocks, temperature: tl.float64,
    MARGIN: tl.constexpr, SURROGATE: tl.constexpr, HAS_GROUPS: tl.constexpr, COST_LINEAR: tl.constexpr,
    SOFT: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (position blocks,): one problem of several levels (LaA's aggregated label: ranks into
    the ascending ``values``, of its label patterns or of an ordinal column), max-violation pairs.
    Per group u and present levels a > b:
    loss_u = sum c_ab phi(min_a - max_b) / Z_u, Z_u = sum c_ab (c_ab = v_a - v_b, or 1).

    Each position walks its group's cells in level order (a cell's min and max sit at its ends,
    the layout being score-ordered within cells), one step per level present in the group, until
    every position of the block has left its group: O(n_u L_u) steps for a group of n_u items at
    L_u levels, whatever the label's range. On its way it meets every level pair its own cell is
    in: as the upper cell a (its min's gradient, and the pair's loss term, kept by the cell's
    first position) and as the lower cell (its max's gradient). Z_u comes from the same
    walk in closed form: P(P - 1) / 2 for P present levels, or sum_k v_k (2 k - (P - 1)) over them
    in ascending order. Gradient to the tied extremes in equal shares; block sums as
    ``_hardest_kernel``'s, with the group's present level pairs as its valid pairs.

    SOFT: min and max are a cell's log-mean-exp at ``temperature``, from ``prefix`` (2, N), the
    inclusive prefix sums of ``_soft_terms_kernel``'s upper and lower terms (row 0, row 1), and
    every item of a cell shares its gradient by its softmin (softmax) weight."""
    block = tl.program_id(0)
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    item = tl.load(order_ptr + positions, mask=mask, other=0)
    level = tl.load(rank_ptr + item, mask=mask, other=0)
    cell_start, cell_end, group_start, group_end = _spans(
        cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr, 0, positions, mask, N, HAS_GROUPS
    )
    own_min = _score_at(scores_ptr, order_ptr, cell_start, mask)
    own_max = _score_at(scores_ptr, order_ptr, cell_end - 1, mask)
    if SOFT:
        own_min, own_upper_sum = _soft_extreme(prefix_ptr, own_min, cell_start, cell_end, -temperature, mask)
        own_max, own_lower_sum = _soft_extreme(prefix_ptr + N, own_max, cell_start, cell_end, temperature, mask)
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
        lower_max = _score_at(scores_ptr, order_ptr, end - 1, below)
        upper_min = _score_at(scores_ptr, order_ptr, start, above)
        if SOFT:
            lower_max, _ = _soft_extreme(prefix_ptr + N, lower_max, start, end, temperature, below)
            upper_min, _ = _soft_extreme(prefix_ptr, upper_min, start, end, -temperature, above)
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

    if SOFT:
        min_share = _range_sum(prefix_ptr, positions, positions + 1, mask) / own_upper_sum
        max_share = _range_sum(prefix_ptr + N, positions, positions + 1, mask) / own_lower_sum
    else:
        score = _score_at(scores_ptr, order_ptr, positions, mask)
        min_ties = _tie_count(scores_ptr, order_ptr, cell_start, cell_end, own_min, True, has_pair)
        max_ties = _tie_count(scores_ptr, order_ptr, cell_start, cell_end, own_max, False, has_pair)
        min_share = tl.where(score == own_min, 1.0 / tl.maximum(min_ties, 1).to(tl.float64), 0.0)
        max_share = tl.where(score == own_max, 1.0 / tl.maximum(max_ties, 1).to(tl.float64), 0.0)
    # d phi(min_a - max_b) / d min_a = -pull, / d max_b = +pull
    grad = (max_pull * max_share - min_pull * min_share) * inverse
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every problem's max-violation loss over a score-ordered ``PairLayout``, mixed.

    Same contract as ``pairwise.pair_loss_and_grad``, the layout built with ``tie_scores=scores``:
    binary problems (``levels.rank`` the 0/1 labels) or one problem of several levels
    (``levels.values``: LaA's aggregated label, with pair cost ``cost``), hard or soft.
    """
    validate_device(scores, levels.rank, layout.order)
    num_problems, n = layout.order.shape
    several = levels.values is not None
    if several and num_problems != 1:
        raise ValueError(f"the several-level kernel takes one problem; got {num_problems} problems")
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
    loss_dtype = accumulation_dtype(scores)
    # One problem: its gradient goes straight to the output, which combine scales in place.
    grad = torch.empty(n, dtype=loss_dtype, device=scores.device) if num_problems == 1 else torch.empty(
        (num_problems, n), dtype=torch.float64, device=scores.device
    )
    prefix = grad  # not read without a temperature
    if soft:  # the cells' exp terms, then their prefix sums (one row per problem, or upper and lower rows)
        terms = torch.empty((2 if several else num_problems, n), dtype=torch.float64, device=scores.device)
        launcher(_soft_terms_kernel)[(num_blocks, 1 if several else num_problems)](
            scores, levels.rank, layout.order, *spans, terms, n, 1.0 / tau,
            HAS_GROUPS=has_groups, BOTH=several, BLOCK=block,
        )
        prefix = torch.cumsum(terms, dim=1)
    if several:
        walk_block = LEVELS_BLOCK[launch_target(scores.device)]
        walk_blocks = cdiv(n, walk_block)
        block_sums = torch.empty((1, 3, walk_blocks), dtype=torch.float64, device=scores.device)
        launcher(_hardest_levels_kernel)[(walk_blocks,)](
            scores, levels.rank, levels.values, layout.order, *spans, prefix, grad, block_sums, n, walk_blocks, tau,
            MARGIN=float(margin), SURROGATE=surrogate_id(surrogate),
            HAS_GROUPS=has_groups, COST_LINEAR=cost == "linear", SOFT=soft,
            BLOCK=walk_block, num_warps=4,
        )
    else:
        block_sums = torch.empty((num_problems, 3, num_blocks), dtype=torch.float64, device=scores.device)
        launcher(_hardest_kernel)[(num_blocks, num_problems)](
            scores, levels.rank, layout.order, *spans, prefix, grad, block_sums, n, num_blocks, tau,
            MARGIN=float(margin), SURROGATE=surrogate_id(surrogate), HAS_GROUPS=has_groups, SOFT=soft, BLOCK=block,
        )
    return combine(
        grad, 0, n, block_sums, mixing, mean=reduction == "mean",
        loss_dtype=loss_dtype, status=status, block=block, grad=grad if num_problems == 1 else None,
    )
