"""Segmented scans over positions: each segment's (a group's, a cell's) own total, without a
prefix over the batch and without atomics.

Two kernels use them: ``reduce.group_sums`` (each group's sum of an ordinal column's shares of
Z_u) and ``hardest`` (each cell's min of v, with the items attaining it or, with a temperature,
its sum of exp((min - v) / tau)). A *part* of a segment is two float64 values (x, y), merged by
the constexpr ``MONOID``:

* ``"sum"``: x the sum, y unused (0);
* ``"min"``: x the min, y the number of items attaining it;
* ``"softmin"``: x the min, y the sum of exp((min - v) / tau) over the part, rescaled to the
  smaller min as two parts merge (every term in (0, 1]).

The scan runs in two levels. ``scan_block`` (called by each user's kernel with its own values,
one program per block of positions) writes each position's part from its segment's start, or
from the block's first position if the segment began in an earlier block, and the block's
carries: its open part (from its last segment start, or its first position, to its end) and
whether a segment starts in it. ``carry_across_blocks`` then scans the blocks' open parts in
chunks of ``CARRY_CHUNK`` blocks, one program per row. ``segment_total`` reads a segment's
total from both. Each segment adds only its own values, in a fixed order: a prefix sum over
the batch would give a group's sum as a difference of running totals, which lost a small
group after a large one (Z_u = 1e-6 after 5e11 came out 0); deterministic, as exact as the
values.

The carries of R rows and B blocks are (R, 5, B) float64 (``new_carries``): rows 0-1 the
blocks' open parts, 2 whether a segment starts in the block, 3-4 the part carried into the
block (of the segment open at its first position, from the blocks before it). A sum has no y:
rows 1 and 4 are neither written nor read.

``running_extreme`` is the scan without segments, a block's running max or min along axis 0
(the counting layout's group edges and prefixes, ``levels``; the dense kernels' run bounds), and
``group_edges`` finds where each segment of group ids in runs starts and ends.

Each scan has two branches of the same meaning, chosen at import: ``tl.associative_scan`` on
CUDA, and doubling steps (log2(lanes) whole-vector steps) under the interpreter, which would run
``tl.associative_scan`` a Python call of the operator per lane.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET
from ._launch import launcher

__all__ = ["CARRY_CHUNK", "carry_across_blocks", "new_carries", "running_extreme", "scan_block", "segment_total"]

# Blocks whose open parts one step of the carry kernel scans.
CARRY_CHUNK = 1024


@triton.jit
def _empty_x(MONOID: tl.constexpr):
    """x of an empty part: 0 for a sum, +inf for a min (y is 0 either way)."""
    if MONOID == "sum":
        return 0.0
    else:
        return float("inf")


@triton.jit
def exp_below(low, x, inverse_temperature):
    """exp((low - x) / tau) for x >= low: 1 where x is low, also at an infinite low (a score at
    +inf, scores unchecked), where inf - inf would make it NaN; a NaN x stays NaN."""
    return tl.exp(tl.where(x == low, 0.0, low - x) * inverse_temperature)


@triton.jit
def _rescaled(x, y, low, inverse_temperature):
    """A softmin part's sum y of exp((x - v) / tau), rescaled to the merged min ``low``: 0 for an
    empty part (y = 0, x = +inf)."""
    return tl.where(y != 0, y * exp_below(low, x, inverse_temperature), 0.0)


@triton.jit
def merge(x_a, y_a, x_b, y_b, inverse_temperature, MONOID: tl.constexpr):
    """Two parts of a segment merged (see the module docstring)."""
    if MONOID == "sum":
        return x_a + x_b, y_a + y_b
    else:
        low = tl.minimum(x_a, x_b, propagate_nan=tl.PropagateNan.ALL)  # a NaN score's cell: NaN, no item attains it
        if MONOID == "softmin":  # a part of sum 0 adds 0; a part at the min keeps its sum (inf - inf is NaN)
            y = _rescaled(x_a, y_a, low, inverse_temperature) + _rescaled(x_b, y_b, low, inverse_temperature)
        else:
            y = tl.where(x_a == low, y_a, 0.0) + tl.where(x_b == low, y_b, 0.0)
        return low, y


# The scans' operators, restarting where a segment starts (start_b): tl.associative_scan takes a
# function of the lanes' values only, so one per monoid.
@triton.jit
def _restarting_sum(start_a, x_a, start_b, x_b):
    return start_a | start_b, tl.where(start_b != 0, x_b, x_a + x_b)


@triton.jit
def _restarting_min(start_a, x_a, y_a, start_b, x_b, y_b):
    x, y = merge(x_a, y_a, x_b, y_b, 1.0, "min")
    restart = start_b != 0
    return start_a | start_b, tl.where(restart, x_b, x), tl.where(restart, y_b, y)


@triton.jit
def _restarting_softmin(start_a, x_a, y_a, scale_a, start_b, x_b, y_b, scale_b):
    """``scale`` is 1 / tau in every lane (the operator takes no other argument)."""
    x, y = merge(x_a, y_a, x_b, y_b, scale_b, "softmin")
    restart = start_b != 0
    return start_a | start_b, tl.where(restart, x_b, x), tl.where(restart, y_b, y), scale_b


@triton.jit
def scan_associative(restart, x, y, inverse_temperature, MONOID: tl.constexpr):
    """(started, x, y): the segmented inclusive scan of the parts (x, y) along axis 0, restarting
    where ``restart``; ``started`` whether a segment starts at or before each lane."""
    if MONOID == "sum":
        started, x = tl.associative_scan((restart.to(tl.int32), x), 0, _restarting_sum)
    elif MONOID == "min":
        started, x, y = tl.associative_scan((restart.to(tl.int32), x, y), 0, _restarting_min)
    else:
        scale = tl.zeros_like(x) + inverse_temperature
        started, x, y, _ = tl.associative_scan((restart.to(tl.int32), x, y, scale), 0, _restarting_softmin)
    return started, x, y


@triton.jit
def scan_by_doubling(restart, x, y, inverse_temperature, MONOID: tl.constexpr):
    """The same scan by doubling steps (Hillis and Steele): log2(lanes) merges of whole vectors.
    The interpreter's stand-in for ``scan_associative`` (a test suite's worth of max-violation
    calls took minutes with ``tl.associative_scan`` there)."""
    lanes = tl.arange(0, x.shape[0])
    started = restart.to(tl.int32)
    step = 1
    while step < x.shape[0]:
        source = tl.maximum(lanes - step, 0)
        reaches = lanes >= step
        merged_x, merged_y = merge(tl.gather(x, source, 0), tl.gather(y, source, 0), x, y, inverse_temperature, MONOID)
        open_part = reaches & (started == 0)  # no segment start yet between this lane's part and it
        started = tl.where(reaches, started | tl.gather(started, source, 0), started)
        x = tl.where(open_part, merged_x, x)
        y = tl.where(open_part, merged_y, y)
        step *= 2
    return started, x, y


_scan = scan_by_doubling if INTERPRET else scan_associative


# Running extremes: a scan without segments (the counting layout's group edges and prefixes).
@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _minimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def running_extreme_associative(x, MAX: tl.constexpr, REVERSE: tl.constexpr):
    """Each lane's max (MAX) or min of x over the lanes along axis 0 up to it (from it to the
    last: REVERSE)."""
    if MAX:
        return tl.associative_scan(x, 0, _maximum, reverse=REVERSE)
    else:
        return tl.associative_scan(x, 0, _minimum, reverse=REVERSE)


@triton.jit
def running_extreme_by_doubling(x, MAX: tl.constexpr, REVERSE: tl.constexpr):
    """The same by doubling steps, the interpreter's stand-in (as ``scan_by_doubling``). A max
    or min takes a lane twice without harm, so a step reads the first (last) lane where it
    would read past the end."""
    lanes = tl.arange(0, x.shape[0])
    if len(x.shape) == 2:
        lanes = tl.broadcast_to(lanes[:, None], x.shape)
    step = 1
    while step < x.shape[0]:
        if REVERSE:
            other = tl.gather(x, tl.minimum(lanes + step, x.shape[0] - 1), 0)
        else:
            other = tl.gather(x, tl.maximum(lanes - step, 0), 0)
        if MAX:
            x = tl.maximum(x, other)
        else:
            x = tl.minimum(x, other)
        step *= 2
    return x


running_extreme = running_extreme_by_doubling if INTERPRET else running_extreme_associative


@triton.jit
def group_edges(groups_ptr, positions, mask, N):
    """(first of its group, last of its group) of each of ``positions`` (of ``mask``) among group
    ids whose groups are runs of positions: sorted ids (the counting layout), or contiguous groups
    as the caller passed them (the dense kernels' run bounds)."""
    group = tl.load(groups_ptr + positions, mask=mask, other=0)
    previous = tl.load(groups_ptr + positions - 1, mask=mask & (positions > 0), other=0)
    following = tl.load(groups_ptr + positions + 1, mask=positions + 1 < N, other=0)
    first = mask & ((positions == 0) | (group != previous))
    last = mask & ((positions == N - 1) | (group != following))
    return first, last


@triton.jit
def scan_block(out_row, carries_row, block, num_blocks, N, positions, mask, restart, x, y, inverse_temperature,
               MONOID: tl.constexpr, BLOCK: tl.constexpr):
    """Level one, for a block of positions (``block``; lanes past N must hold empty parts): scans
    the parts (x, y) restarting where ``restart``, writes each position's x to ``out_row`` and its
    y to ``out_row + N`` (not for a sum), and the block's carries to ``carries_row`` (R, 5, B)'s
    row of this problem."""
    started, x, y = _scan(restart, x, y, inverse_temperature, MONOID)
    last = tl.arange(0, BLOCK) == BLOCK - 1
    carries = carries_row + block
    tl.store(out_row + positions, x, mask=mask)
    tl.store(carries, tl.sum(tl.where(last, x, 0.0)))
    if MONOID != "sum":
        tl.store(out_row + N + positions, y, mask=mask)
        tl.store(carries + num_blocks, tl.sum(tl.where(last, y, 0.0)))
    tl.store(carries + 2 * num_blocks, tl.max(started, axis=0).to(tl.float64))


@triton.jit(do_not_specialize=("num_blocks",))  # batch sizes: see _common.py
def _carry_kernel(carries_ptr, num_blocks, inverse_temperature: tl.float64, MONOID: tl.constexpr,
                  CHUNK: tl.constexpr):
    """Grid (R,). Level two: carries[r, 3..4, k], the part before block k of the segment open at
    block k's first position (the restarting scan of the blocks' open parts up to block k - 1),
    in chunks of CHUNK blocks."""
    row = carries_ptr + tl.program_id(0).to(tl.int64) * 5 * num_blocks
    lanes = tl.arange(0, CHUNK)
    first = lanes == 0
    carry_x = tl.sum(tl.where(first, _empty_x(MONOID), 0.0).to(tl.float64))  # float64 scalars between chunks
    carry_y = tl.sum(tl.zeros([CHUNK], dtype=tl.float64))
    for begin in range(0, num_blocks, CHUNK):
        blocks = begin + lanes
        before = (blocks > 0) & (blocks <= num_blocks)
        open_x = tl.load(row + blocks - 1, mask=before, other=_empty_x(MONOID))
        if MONOID == "sum":
            open_y = tl.zeros_like(open_x)
        else:
            open_y = tl.load(row + num_blocks + blocks - 1, mask=before, other=0.0)
        starts = tl.load(row + 2 * num_blocks + blocks - 1, mask=before, other=0.0) != 0
        started, x, y = _scan(starts, open_x, open_y, inverse_temperature, MONOID)
        merged_x, merged_y = merge(carry_x, carry_y, x, y, inverse_temperature, MONOID)
        x = tl.where(started != 0, x, merged_x)
        y = tl.where(started != 0, y, merged_y)
        inside = blocks < num_blocks
        tl.store(row + 3 * num_blocks + blocks, x, mask=inside)
        if MONOID != "sum":
            tl.store(row + 4 * num_blocks + blocks, y, mask=inside)
        carry_x = tl.sum(tl.where(lanes == CHUNK - 1, x, 0.0))
        carry_y = tl.sum(tl.where(lanes == CHUNK - 1, y, 0.0))


@triton.jit
def segment_total(scanned_row, carries_row, start, end, N, num_blocks, mask, inverse_temperature,
                  MONOID: tl.constexpr, BLOCK: tl.constexpr):
    """(x, y) of the segment [start, end) (y 0 for a sum): ``scan_block``'s part at its last
    position, merged with the part carried into that block when the segment began in an earlier
    one. Masked lanes give (0, 1) (a min's y divides)."""
    last = end - 1
    x = tl.load(scanned_row + last, mask=mask, other=0.0)
    if MONOID == "sum":
        y = tl.zeros_like(x)
    else:
        y = tl.load(scanned_row + N + last, mask=mask, other=1.0)
    began_before = mask & (start // BLOCK != last // BLOCK)
    carry_x = tl.load(carries_row + 3 * num_blocks + last // BLOCK, mask=began_before, other=_empty_x(MONOID))
    if MONOID == "sum":
        carry_y = tl.zeros_like(carry_x)
    else:
        carry_y = tl.load(carries_row + 4 * num_blocks + last // BLOCK, mask=began_before, other=0.0)
    return merge(carry_x, carry_y, x, y, inverse_temperature, MONOID)


def new_carries(rows: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """The carries of ``rows`` scans over ``num_blocks`` blocks: (rows, 5, num_blocks) float64."""
    return torch.empty((rows, 5, num_blocks), dtype=torch.float64, device=device)


def carry_across_blocks(carries: torch.Tensor, monoid: str, inverse_temperature: float = 1.0) -> None:
    """Level two of every row's scan, in place (after the level-one kernel filled rows 0-2)."""
    rows, _, num_blocks = carries.shape
    launcher(_carry_kernel)[(rows,)](carries, num_blocks, inverse_temperature, MONOID=monoid, CHUNK=CARRY_CHUNK)
