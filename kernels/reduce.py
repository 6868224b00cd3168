"""Kernels 2 and 3 of the all-pairs losses: finalize and combine (see ``pairwise``'s docstring).

``finalize`` sums each position's chunks of kernel 1 in a fixed order, normalises them by the
group's Z_u (``normaliser_source``: in closed form, by a walk over the group's cells, or from
each group's own sum of kernel 1's per-position shares, ``group_sums``) and writes the gradient
in the caller's item order with per-block sums; ``combine`` sums the block sums (every program in the same order, so
all agree without a host round trip), reduces over groups and mixes over problems. ``hardest``
writes the same block sums and reuses ``combine``. No float atomics; the only atomic sets the
overflow bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validation import STATUS_OVERFLOW
from ..ops.layout import MAX_WALK_LEVELS
from ._common import cdiv, group_spans, next_cell, rank_at, tl_dtype
from . import scan
from ._launch import launcher
from .scan import CARRY_ROWS

__all__ = ["combine", "finalize", "normaliser_source"]

_OVERFLOW: tl.constexpr = tl.constexpr(STATUS_OVERFLOW)
#: Block sums that ``combine``'s kernel adds per step of its loop over a problem's blocks: one
#: step up to 256 blocks (262,144 items in finalize's blocks of 1,024), more above.
SUM_BLOCK = 256


# --------------------------------------------------------------------------- #
# 2. Finalize: chunks summed, normalised per group, written in the caller's order #
# --------------------------------------------------------------------------- #
@triton.jit
def _group_normaliser(
    order_row, rank_row, values_row, cell_end_row, group_sums_row, carries_row, positions, mask,
    cell_start, group_start, group_end, num_levels, N, num_blocks, NORMALISER: tl.constexpr,
    COST_LINEAR: tl.constexpr, BLOCK: tl.constexpr,
):
    """Z_u of each position's group, float64, by ``NORMALISER`` (see ``normaliser_source``):

    * ``"binary"``: the negatives [group_start, c) times the positives [c, group_end); c is the
      item's cell start if a cell lies before it, else its cell end (a negative, or alone);
    * ``"walk"``: the group's cells in level order, at most ``num_levels`` steps: each cell of n
      items at value v adds n * (number below) (uniform cost), or n * (v * number below - sum of
      the values below) (linear cost);
    * ``"shares"``: the shares of Z_u that kernel 1 wrote, summed over each group by
      ``group_sums`` (``scan.segment_total``)."""
    if NORMALISER == "binary":
        cell_end = tl.load(cell_end_row + positions, mask=mask, other=0)
        boundary = tl.where(cell_start > group_start, cell_start, cell_end)
        normaliser = (boundary - group_start).to(tl.float64) * (group_end - boundary).to(tl.float64)
    elif NORMALISER == "walk":
        normaliser = tl.zeros(positions.shape, dtype=tl.float64)
        count_below = tl.zeros(positions.shape, dtype=tl.float64)
        value_below = tl.zeros(positions.shape, dtype=tl.float64)
        start = group_start
        if COST_LINEAR:  # the values measured from the group's lowest level (``pairwise.position_values``)
            lowest = tl.load(values_row + rank_at(order_row, rank_row, group_start, mask))
        for _ in range(num_levels):  # a loop, not unrolled
            here, end, level = next_cell(order_row, rank_row, cell_end_row, start, group_end, mask)
            count = tl.where(here, end - start, 0).to(tl.float64)
            if COST_LINEAR:
                value = tl.load(values_row + level, mask=here, other=0.0) - lowest
                normaliser += count * (value * count_below - value_below)
                value_below += count * value
            else:
                normaliser += count * count_below
            count_below += count
            start = tl.where(here, end, start)
    else:
        normaliser, _, _ = scan.segment_total(group_sums_row, carries_row, group_start, group_end, N, num_blocks, mask,
                                              1.0, "sum", BLOCK)
    return normaliser


@triton.jit(  # batch sizes not specialized: see _common.py
    do_not_specialize=("grad_stride", "N", "num_ranks", "num_chunks", "num_blocks"),
)
def _finalize_kernel(
    partials_ptr, order_ptr, rank_ptr, values_ptr, cell_start_ptr, cell_end_ptr, group_start_ptr, group_end_ptr,
    group_sums_ptr, carries_ptr, grad_ptr, grad_stride, block_sums_ptr, N, num_ranks, num_chunks, num_blocks,
    HAS_GROUPS: tl.constexpr, NORMALISER: tl.constexpr, COST_LINEAR: tl.constexpr, ACC: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Grid (position blocks, B). Sums each position's chunks, divides by its group's Z_u
    (``_group_normaliser``), writes the gradient in the caller's item order, not yet divided by
    the number of groups, to ``grad + b * grad_stride``, and block_sums (B, 3, num_blocks):
    [sum of row loss / Z_u, groups with a valid pair (counted at their first position), valid
    pairs (each counted at its upper item)]."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    row = problem * N
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    part = partials_ptr + problem * 3 * num_chunks * N + positions
    row_loss = tl.zeros([BLOCK], dtype=ACC)
    row_grad = tl.zeros([BLOCK], dtype=ACC)
    for chunk in range(num_chunks):
        row_loss += tl.load(part + chunk * N, mask=mask, other=0.0)
        row_grad += tl.load(part + (num_chunks + chunk) * N, mask=mask, other=0.0)
        row_grad += tl.load(part + (2 * num_chunks + chunk) * N, mask=mask, other=0.0)
    group_start, group_end = group_spans(group_start_ptr, group_end_ptr, positions, mask, N, HAS_GROUPS)
    cell_start = tl.load(cell_start_ptr + row + positions, mask=mask, other=0)
    cost = _group_normaliser(
        order_ptr + row, rank_ptr + row, values_ptr + problem * num_ranks, cell_end_ptr + row,
        group_sums_ptr + row, carries_ptr + problem * CARRY_ROWS * num_blocks, positions, mask, cell_start,
        group_start, group_end, num_ranks, N, num_blocks, NORMALISER, COST_LINEAR, BLOCK,
    )
    has_pairs = cost > 0
    coefficient = tl.where(has_pairs, 1.0 / tl.where(has_pairs, cost, 1.0), 0.0)
    item = tl.load(order_ptr + row + positions, mask=mask, other=0)
    tl.store(grad_ptr + problem * grad_stride + item, row_grad * coefficient.to(ACC), mask=mask)
    sums = block_sums_ptr + problem * 3 * num_blocks + block
    tl.store(sums, tl.sum(row_loss.to(tl.float64) * coefficient))
    tl.store(sums + num_blocks, tl.sum((has_pairs & (positions == group_start) & mask).to(tl.float64)))
    tl.store(sums + 2 * num_blocks, tl.sum((cell_start - group_start).to(tl.float64)))


def normaliser_source(levels) -> str:
    """How the finalize step finds Z_u for ``levels`` (a ``mlloss.ops.layout.Levels``):
    ``"binary"`` (0/1 labels: in closed form from the item's spans), ``"walk"`` (at most
    ``MAX_WALK_LEVELS`` levels, LaA of a few binary labels: a walk over the group's cells) or
    ``"shares"`` (an ordinal column: kernel 1 writes each position's share of Z_u, (B, N)
    float64, and ``group_sums`` adds them up over each group)."""
    if levels.values is None:
        return "binary"
    return "walk" if levels.num_ranks <= MAX_WALK_LEVELS else "shares"


def finalize(
    partials: torch.Tensor, shares: torch.Tensor | None, levels, layout, grad: torch.Tensor, *,
    cost_linear: bool, block: int,
) -> torch.Tensor:
    """Launch kernel 2: writes every problem's gradient to ``grad`` ((B, N), or (N,) for one
    problem) and returns the block sums (B, 3, blocks). ``shares``: kernel 1's shares of Z_u
    when ``normaliser_source(levels)`` is ``"shares"``, else None."""
    num_problems, _, num_chunks, n = partials.shape
    num_blocks = cdiv(n, block)
    source = normaliser_source(levels)
    has_groups = layout.group_start is not None
    # The groups' sums of the shares (in place), and the carries between blocks
    carries = group_sums(shares, layout.group_start, block) if source == "shares" else partials
    block_sums = torch.empty((num_problems, 3, num_blocks), dtype=torch.float64, device=partials.device)
    # A binary problem's normaliser reads no rank (its ranks may be the caller's labels, any dtype).
    launcher(_finalize_kernel)[(num_blocks, num_problems)](
        partials, layout.order, layout.order if source == "binary" else levels.rank,
        partials if levels.values is None else levels.values,
        layout.cell_start, layout.cell_end,
        layout.group_start if has_groups else layout.cell_start,
        layout.group_end if has_groups else layout.cell_start,
        partials if shares is None else shares, carries, grad, n, block_sums, n, levels.num_ranks, num_chunks,
        num_blocks, HAS_GROUPS=has_groups, NORMALISER=source, COST_LINEAR=cost_linear, ACC=tl_dtype(partials.dtype),
        BLOCK=block,
    )
    return block_sums


# --------------------------------------------------------------------------- #
# Each group's own sum of per-position values (a segmented scan: ``scan``)     #
# --------------------------------------------------------------------------- #
@triton.jit(do_not_specialize=("N", "num_blocks"))  # batch sizes: see _common.py
def _group_scan_kernel(values_ptr, group_start_ptr, carries_ptr, N, num_blocks,
                       HAS_GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (position blocks, B). Level one of ``group_sums``' scan (``scan.scan_block``): each
    position's value replaced, in place, by its group's sum from the group's first position (or
    the block's) to it."""
    block = tl.program_id(0)
    problem = tl.program_id(1).to(tl.int64)
    positions = block * BLOCK + tl.arange(0, BLOCK)
    mask = positions < N
    row = values_ptr + problem * N
    value = tl.load(row + positions, mask=mask, other=0.0)
    if HAS_GROUPS:
        starts = mask & (tl.load(group_start_ptr + positions, mask=mask, other=0) == positions)
    else:
        starts = positions == 0
    scan.scan_block(row, carries_ptr + problem * CARRY_ROWS * num_blocks, block, num_blocks, N, positions, mask, starts,
                    value, tl.zeros_like(value), tl.zeros_like(value), 1.0, "sum", BLOCK)


def group_sums(values: torch.Tensor, group_start: torch.Tensor | None, block: int) -> torch.Tensor:
    """Sum (B, N) float64 ``values`` over each group in blocks of ``block`` positions, in place,
    and return the scan's carries (B, CARRY_ROWS, blocks), as the finalize step reads them
    (``_group_normaliser``'s "shares" source, ``scan.segment_total``). Each group adds only its
    own values, in a fixed order (see ``scan``): deterministic, and as exact as the values."""
    num_problems, n = values.shape
    num_blocks = cdiv(n, block)
    carries = scan.new_carries(num_problems, num_blocks, values.device)
    has_groups = group_start is not None
    launcher(_group_scan_kernel)[(num_blocks, num_problems)](
        values, group_start if has_groups else values, carries, n, num_blocks, HAS_GROUPS=has_groups, BLOCK=block,
    )
    scan.carry_across_blocks(carries, "sum")
    return carries


# --------------------------------------------------------------------------- #
# 3. Combine: totals, the reduction over groups, the mixing over problems      #
# --------------------------------------------------------------------------- #
@triton.jit(  # batch sizes not specialized: see _common.py
    do_not_specialize=("grad_parts_offset", "grad_parts_stride", "N", "num_blocks"),
)
def _combine_kernel(
    grad_parts_ptr, grad_parts_offset, grad_parts_stride, block_sums_ptr, mixing_ptr, grad_ptr, loss_ptr, stats_ptr, status_ptr,
    N, num_problems, num_blocks,
    MEAN: tl.constexpr, HAS_MIXING: tl.constexpr, CHECK: tl.constexpr, ACC: tl.constexpr,
    BLOCK: tl.constexpr, SUM_BLOCK: tl.constexpr, SEPARATE: tl.constexpr,
):
    """Grid (position blocks,). ``grad_parts``: problem b's gradient (caller order) at
    ``grad_parts + grad_parts_offset + b * grad_parts_stride``. stats (3, B) float64: [loss_b], [valid pairs],
    [groups with pairs]. The gradient: the problems' scaled gradients summed into ``grad`` (N,),
    or with SEPARATE each written to its own column of ``grad`` (N, B) (score columns)."""
    block = tl.program_id(0)
    items = block * BLOCK + tl.arange(0, BLOCK)
    mask = items < N
    grad = tl.zeros([BLOCK], dtype=ACC)
    loss = tl.zeros([1], dtype=tl.float64).sum()  # a float64 scalar
    for problem in range(num_problems):
        # Every program sums the block sums in the same order: identical totals everywhere.
        sums = block_sums_ptr + problem * 3 * num_blocks
        value = tl.zeros([SUM_BLOCK], dtype=tl.float64)
        groups = tl.zeros([SUM_BLOCK], dtype=tl.float64)
        pairs = tl.zeros([SUM_BLOCK], dtype=tl.float64)
        for start in range(0, num_blocks, SUM_BLOCK):
            offs = start + tl.arange(0, SUM_BLOCK)
            in_range = offs < num_blocks
            value += tl.load(sums + offs, mask=in_range, other=0.0)
            groups += tl.load(sums + num_blocks + offs, mask=in_range, other=0.0)
            pairs += tl.load(sums + 2 * num_blocks + offs, mask=in_range, other=0.0)
        value_total = tl.sum(value)
        # Whole numbers; the dense kernels count a group as its items' 1 / size shares.
        groups_total = tl.floor(tl.sum(groups) + 0.5)
        if MEAN:
            denominator = tl.maximum(groups_total, 1.0)
        else:
            denominator = 1.0
        problem_loss = value_total / denominator
        if HAS_MIXING:
            weight = tl.load(mixing_ptr + problem).to(tl.float64)
        else:
            weight = 1.0
        # A problem of weight 0 (a label LoA leaves out) adds nothing, also when its own terms
        # overflow (0 * inf would make the loss and the gradient NaN).
        loss += tl.where(weight != 0, weight * problem_loss, 0.0)
        scale = (weight / denominator).to(ACC)
        problem_grad = grad_parts_ptr + grad_parts_offset + problem * grad_parts_stride
        scaled = tl.where(scale != 0, scale * tl.load(problem_grad + items, mask=mask, other=0.0), 0.0)
        if SEPARATE:  # column ``problem`` of (N, B): item-major, as the caller's task columns
            tl.store(grad_ptr + items.to(tl.int64) * num_problems + problem, scaled.to(grad_ptr.dtype.element_ty),
                     mask=mask)
        else:
            grad += scaled
        if block == 0:
            tl.store(stats_ptr + problem, problem_loss)
            tl.store(stats_ptr + num_problems + problem, tl.floor(tl.sum(pairs) + 0.5))
            tl.store(stats_ptr + 2 * num_problems + problem, groups_total)
    if not SEPARATE:
        tl.store(grad_ptr + items, grad.to(grad_ptr.dtype.element_ty), mask=mask)
    if block == 0:
        stored = loss.to(loss_ptr.dtype.element_ty)
        tl.store(loss_ptr, stored)
        if CHECK:  # the loss as the caller gets it: a float64 sum may be finite and its float32 cast not
            finite = (stored == stored) & (tl.abs(stored) < float("inf"))
            tl.atomic_or(status_ptr, tl.where(finite, 0, _OVERFLOW))


def combine(
    grad_parts: torch.Tensor,
    grad_parts_offset: int,
    grad_parts_stride: int,
    block_sums: torch.Tensor,
    mixing: torch.Tensor | None,
    *,
    mean: bool,
    loss_dtype: torch.dtype,
    status: torch.Tensor | None,
    block: int,
    grad: torch.Tensor | None = None,
    separate: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch kernel 3 on the problems' gradients in ``grad_parts`` (problem b's N values, in
    the caller's order, start at element ``grad_parts_offset + b * grad_parts_stride``); returns
    (loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,)), the
    loss and the gradient in ``loss_dtype``. ``grad`` may be ``grad_parts`` itself (one problem):
    every element is read and then written by the same program. ``separate`` (score columns, each
    problem on its own scores): grad (N, B), each problem's gradient in its column, scaled by its
    weight and reduction, not summed."""
    num_problems, n = block_sums.shape[0], grad_parts.shape[-1]
    loss = torch.empty((), dtype=loss_dtype, device=grad_parts.device)
    stats = torch.empty(3 * num_problems, dtype=torch.float64, device=grad_parts.device)
    if grad is None:
        grad = torch.empty((n, num_problems) if separate else n, dtype=loss_dtype, device=grad_parts.device)
    launcher(_combine_kernel)[(max(cdiv(n, block), 1),)](
        grad_parts, grad_parts_offset, grad_parts_stride, block_sums, mixing if mixing is not None else block_sums, grad, loss, stats,
        status if status is not None else stats, n, num_problems, block_sums.shape[2],
        MEAN=mean, HAS_MIXING=mixing is not None, CHECK=status is not None,
        ACC=tl_dtype(grad_parts.dtype), BLOCK=block, SUM_BLOCK=SUM_BLOCK, SEPARATE=separate,
    )
    return loss, stats, grad
