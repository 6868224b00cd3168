"""Max-violation pairs of binary problems (DAOM, PDAOM: Sun et al. Eq. 5-6) as segmented kernels.

Input: a ``mlloss.ops.layout.PairLayout`` built with ``tie_scores``: every problem sorted by
(group, label), and the items of each (group, label) cell by score, ascending. A group's
negatives then occupy ``[group_start, c)`` and its positives ``[c, group_end)``, so its hardest
pair is the two positions around the boundary c: the largest negative at c - 1 and the smallest
positive at c. Per group with both labels (loss spec, "Max-violation variants"):

    loss_u = phi(min_{y=1} s - max_{y=0} s)

or, with a temperature tau, the min and max replaced by log-mean-exp,
softmin = -tau log(mean exp(-s / tau)), softmax = tau log(mean exp(s / tau)), whose cell sums
come from a float64 prefix sum of exp(-(s - min) / tau) (positives) and exp((s - max) / tau)
(negatives): every term is in (0, 1] and a cell holds its extreme's term 1, so the prefix
differences keep full relative precision. The gradient goes to the items attaining the min and
max, split equally among ties (a binary search in the sorted cell counts them), or with a
temperature to every item by its softmax weight.

``_hardest_kernel`` (grid (position blocks, B)) writes the gradient in the caller's item order
and per-block sums [loss, groups with both labels, level pairs], the same outputs as the
all-pairs finalize step, so ``reduce.combine`` reduces them (mean or sum over groups, mixing
over problems). Everything is float64: the work is O(N) and the exponential surrogate of raw
scores overflows float32 soon. No atomics; deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.fused import accumulation_dtype
from ._common import launch_target, reverse_margin_terms, surrogate_id, validate_device
from .pairwise import FINALIZE_BLOCK
from .reduce import combine

__all__ = ["hardest_loss_and_grad"]

# Binary searches run a fixed number of halvings (enough for any N < 2^31).
_SEARCH_STEPS: tl.constexpr = tl.constexpr(31)


@triton.jit
def _score_at(scores_ptr, order_row, position, mask):
    return tl.load(scores_ptr + tl.load(order_row + position, mask=mask, other=0), mask=mask, other=0.0).to(tl.float64)


@triton.jit
def _group_bounds(rank_row, order_row, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
                  row, positions, mask, N, HAS_GROUPS: tl.constexpr):
    """(positive: the item is a positive, group start, the label boundary c, group end)."""
    positive = tl.load(rank_row + tl.load(order_row + positions, mask=mask, other=0), mask=mask, other=0) > 0
    cell_start = tl.load(cell_start_ptr + row + positions, mask=mask, other=0)
    cell_end = tl.load(cell_end_ptr + row + positions, mask=mask, other=0)
    if HAS_GROUPS:
        group_start = tl.load(group_start_ptr + positions, mask=mask, other=0)
        group_end = tl.load(group_end_ptr + positions, mask=mask, other=0)
    else:
        group_start = tl.zeros_like(cell_start)
        group_end = tl.zeros_like(cell_start) + N
    boundary = tl.where(positive, cell_start, cell_end)
    return positive, group_start, boundary, group_end


@triton.jit
def _soft_terms_kernel(
    scores_ptr, rank_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    terms_ptr, N, inverse_temperature,
    HAS_GROUPS: tl.constexpr, BLOCK: tl.constexpr,
):
    """Grid (position blocks, B): terms[b, p] = exp(-(s_p - min) / tau) for a positive at p,
    exp((s_p - max) / tau) for a negative (min, max: its cell's, at the cell's ends)."""
    problem = tl.program_id(1).to(tl.int64)
    row = problem * N
    positions = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    order_row = order_ptr + row
    positive, group_start, boundary, group_end = _group_bounds(
        rank_ptr + row, order_row, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
        row, positions, mask, N, HAS_GROUPS,
    )
    score = _score_at(scores_ptr, order_row, positions, mask)
    extreme = _score_at(scores_ptr, order_row, tl.where(positive, boundary, boundary - 1), mask)
    exponent = tl.where(positive, extreme - score, score - extreme) * inverse_temperature
    tl.store(terms_ptr + row + positions, tl.exp(exponent), mask=mask)


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


@triton.jit
def _hardest_kernel(
    scores_ptr, rank_ptr, order_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    prefix_ptr, grad_ptr, block_sums_ptr, N, num_blocks, temperature,
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
        before_group = tl.load(prefix + group_start - 1, mask=has_pair & (group_start > 0), other=0.0)
        negatives_sum = tl.load(prefix + boundary - 1, mask=has_pair, other=1.0) - before_group
        positives_sum = tl.load(prefix + group_end - 1, mask=has_pair, other=1.0) - tl.load(
            prefix + boundary - 1, mask=has_pair, other=0.0
        )
        negatives = (boundary - group_start).to(tl.float64)
        positives = (group_end - boundary).to(tl.float64)
        soft_min = lowest_positive - temperature * tl.log(positives_sum / tl.where(has_pair, positives, 1.0))
        soft_max = highest_negative + temperature * tl.log(negatives_sum / tl.where(has_pair, negatives, 1.0))
        margin = soft_min - soft_max
    else:
        margin = lowest_positive - highest_negative
    # phi(t) and -phi'(t) of the reverse margin x = -t (kernels._common).
    value, pull = reverse_margin_terms(tl.where(has_pair, -margin, 0.0), MARGIN, SURROGATE, True, False)

    score = _score_at(scores_ptr, order_row, positions, mask)
    if SOFT:
        term = tl.load(prefix_ptr + row + positions, mask=mask, other=0.0) - tl.load(
            prefix_ptr + row + positions - 1, mask=mask & (positions > 0), other=0.0
        )
        share = term / tl.where(positive, positives_sum, negatives_sum)
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every binary problem's max-violation loss over a score-ordered ``PairLayout``, mixed.

    Same contract as ``pairwise.pair_loss_and_grad`` (``levels.rank`` must be the 0/1 labels and
    the layout built with ``tie_scores=scores``).
    """
    validate_device(scores, levels.rank, layout.order)
    num_problems, n = layout.order.shape
    block = FINALIZE_BLOCK[launch_target(scores.device)]
    num_blocks = triton.cdiv(n, block)
    has_groups = layout.group_start is not None
    spans = (
        layout.cell_start, layout.cell_end,
        layout.group_start if has_groups else layout.cell_start,
        layout.group_end if has_groups else layout.cell_end,
    )
    soft = temperature is not None
    loss_dtype = accumulation_dtype(scores)
    # One problem: its gradient goes straight to the output, which combine scales in place.
    grad = torch.empty(n, dtype=loss_dtype, device=scores.device) if num_problems == 1 else torch.empty(
        (num_problems, n), dtype=torch.float64, device=scores.device
    )
    prefix = grad  # not read without a temperature
    if soft:
        terms = torch.empty((num_problems, n), dtype=torch.float64, device=scores.device)
        _soft_terms_kernel[(num_blocks, num_problems)](
            scores, levels.rank, layout.order, *spans, terms, n, 1.0 / temperature,
            HAS_GROUPS=has_groups, BLOCK=block,
        )
        prefix = torch.cumsum(terms, dim=1)
    block_sums = torch.empty((num_problems, 3, num_blocks), dtype=torch.float64, device=scores.device)
    _hardest_kernel[(num_blocks, num_problems)](
        scores, levels.rank, layout.order, *spans, prefix, grad, block_sums, n, num_blocks,
        float(temperature or 1.0),
        MARGIN=float(margin), SURROGATE=surrogate_id(surrogate), HAS_GROUPS=has_groups, SOFT=soft, BLOCK=block,
    )
    return combine(
        grad, 0, n, block_sums, mixing, mean=reduction == "mean",
        loss_dtype=loss_dtype, status=status, block=block, grad=grad if num_problems == 1 else None,
    )
