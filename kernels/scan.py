"""Segmented scans over positions: each segment's (a group's, a cell's) own total, without a
prefix over the batch and without atomics.

Two kernels use them: ``reduce.group_sums`` (each group's sum of an ordinal column's shares of
Z_u) and ``hardest`` (each cell's min of v, with the items attaining it or, with a temperature,
its sum of exp((min - v) / tau)). A *part* of a segment is three float64 values (x, y, z),
merged by the constexpr ``MONOID``:

* ``"sum"``: x the sum, y and z unused (0);
* ``"min"``: x the min, y the number of items attaining it, z unused;
* ``"softmin"``: x the min, y the sum of exp((min - v) / tau) over the part, rescaled to the
  smaller min as two parts merge (every term in (0, 1]), and z the sum of exp((min - v) / tau) - 1
  (``expm1_below``, every term in (-1, 0]). With tau far above the part's spread every term of y
  is 1 to within its rounding, and y / n keeps none of the digits of log(mean), which z keeps
  (``log_mean``): at tau = 1e12 times the spread y alone was off by 1e-4 of the spread, and past
  1e16 the soft min came out the hard min, where tau -> inf gives the mean.

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

The carries of R rows and B blocks are (R, 7, B) float64 (``new_carries``): rows 0-1 the
blocks' open parts (x, y), 2 whether a segment starts in the block, 3-4 the part carried into the
block (of the segment open at its first position, from the blocks before it), 5 and 6 a softmin's
z of the open and the carried part. A sum has no y: rows 1 and 4 are neither written nor read;
only a softmin writes and reads rows 5 and 6.

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

__all__ = [
    "CARRY_CHUNK", "CARRY_ROWS", "carry_across_blocks", "log_mean", "new_carries", "running_extreme", "scan_block",
    "segment_total",
]

# Blocks whose open parts one step of the carry kernel scans.
CARRY_CHUNK = 1024
# Rows of a scan's carries per problem (``new_carries``).
CARRY_ROWS: tl.constexpr = tl.constexpr(7)


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
def expm1_below(low, x, inverse_temperature):
    """exp((low - x) / tau) - 1 for x >= low, to the last digits where it is tiny (no expm1 in
    Triton's core): exp(t) - 1 where that keeps them (e = exp(t) below 1/2), else Kahan's
    (e - 1) t / log(e), and t itself where e rounds to 1. 0 where x is low; a NaN x gives NaN."""
    t = tl.where(x == low, 0.0, low - x) * inverse_temperature
    e = tl.exp(t)
    kahan = (e - 1.0) * t / tl.log(tl.where(e == 1.0, 0.5, e))  # (the divisor only where it is taken)
    return tl.where(e == 1.0, t, tl.where(e < 0.5, e - 1.0, kahan))


@triton.jit
def log_mean(y, z, size):
    """log(mean of a softmin part's terms) from its sums y and z over ``size`` items: log(y / n)
    while the mean is below 1/2, else log1p(z / n) (Kahan's log(u) a / (u - 1), u = 1 + a), which
    keeps the digits that y / n rounds away when every term is near 1."""
    n = size.to(tl.float64)
    # _common._log1p_small's formula, written out: called, it cost the soft _hardest_kernel 255
    # registers and 12 bytes of spills on sm_90 (Triton 3.9) instead of 242 and none
    a = z / n
    u = 1.0 + a
    log1p = tl.where(u == 1.0, a, tl.log(u) * a / tl.where(u == 1.0, 1.0, u - 1.0))
    return tl.where(y < 0.5 * n, tl.log(y / n), log1p)


@triton.jit
def _rescaled(x, y, low, inverse_temperature):
    """A softmin part's sum y of exp((x - v) / tau), rescaled to the merged min ``low``: 0 for an
    empty part (y = 0, x = +inf)."""
    return tl.where(y != 0, y * exp_below(low, x, inverse_temperature), 0.0)


@triton.jit
def _rescaled_deficit(x, y, z, low, inverse_temperature):
    """A softmin part's sum z of exp((x - v) / tau) - 1, rescaled to the merged min ``low``: each
    term 1 + d becomes r (1 + d), so the sum z + (r - 1) y (two terms of one sign); 0 when empty."""
    return tl.where(y != 0, z + y * expm1_below(low, x, inverse_temperature), 0.0)


@triton.jit
def merge(x_a, y_a, z_a, x_b, y_b, z_b, inverse_temperature, MONOID: tl.constexpr):
    """Two parts of a segment merged (see the module docstring)."""
    if MONOID == "sum":
        return x_a + x_b, y_a + y_b, z_a + z_b
    else:
        low = tl.minimum(x_a, x_b, propagate_nan=tl.PropagateNan.ALL)  # a NaN score's cell: NaN, no item attains it
        if MONOID == "softmin":  # a part of sum 0 adds 0; a part at the min keeps its sum (inf - inf is NaN)
            y = _rescaled(x_a, y_a, low, inverse_temperature) + _rescaled(x_b, y_b, low, inverse_temperature)
            z = (_rescaled_deficit(x_a, y_a, z_a, low, inverse_temperature)
                 + _rescaled_deficit(x_b, y_b, z_b, low, inverse_temperature))
        else:
            y = tl.where(x_a == low, y_a, 0.0) + tl.where(x_b == low, y_b, 0.0)
            z = z_a + z_b  # unused
        return low, y, z


# The scans' operators, restarting where a segment starts (start_b): tl.associative_scan takes a
# function of the lanes' values only, so one per monoid.
@triton.jit
def _restarting_sum(start_a, x_a, start_b, x_b):
    return start_a | start_b, tl.where(start_b != 0, x_b, x_a + x_b)


@triton.jit
def _restarting_min(start_a, x_a, y_a, start_b, x_b, y_b):
    x, y, _ = merge(x_a, y_a, y_a, x_b, y_b, y_b, 1.0, "min")
    restart = start_b != 0
    return start_a | start_b, tl.where(restart, x_b, x), tl.where(restart, y_b, y)


@triton.jit
def _restarting_softmin(start_a, x_a, y_a, z_a, scale_a, start_b, x_b, y_b, z_b, scale_b):
    """``scale`` is 1 / tau in every lane (the operator takes no other argument)."""
    x, y, z = merge(x_a, y_a, z_a, x_b, y_b, z_b, scale_b, "softmin")
    restart = start_b != 0
    return (start_a | start_b, tl.where(restart, x_b, x), tl.where(restart, y_b, y), tl.where(restart, z_b, z),
            scale_b)


@triton.jit
def scan_associative(restart, x, y, z, inverse_temperature, MONOID: tl.constexpr):
    """(started, x, y, z): the segmented inclusive scan of the parts (x, y, z) along axis 0,
    restarting where ``restart``; ``started`` whether a segment starts at or before each lane.
    A sum scans x only and a min (x, y): the others come back as they went in."""
    if MONOID == "sum":
        started, x = tl.associative_scan((restart.to(tl.int32), x), 0, _restarting_sum)
    elif MONOID == "min":
        started, x, y = tl.associative_scan((restart.to(tl.int32), x, y), 0, _restarting_min)
    else:
        scale = tl.zeros_like(x) + inverse_temperature
        started, x, y, z, _ = tl.associative_scan((restart.to(tl.int32), x, y, z, scale), 0, _restarting_softmin)
    return started, x, y, z


@triton.jit
def scan_by_doubling(restart, x, y, z, inverse_temperature, MONOID: tl.constexpr):
    """The same scan by doubling steps (Hillis and Steele): log2(lanes) merges of whole vectors.
    The interpreter's stand-in for ``scan_associative`` (a test suite's worth of max-violation
    calls took minutes with ``tl.associative_scan`` there)."""
    lanes = tl.arange(0, x.shape[0])
    started = restart.to(tl.int32)
    step = 1
    while step < x.shape[0]:
        source = tl.maximum(lanes - step, 0)
        reaches = lanes >= step
        if MONOID == "softmin":
            z_before = tl.gather(z, source, 0)
        else:
            z_before = z  # z unused: not gathered
        merged_x, merged_y, merged_z = merge(tl.gather(x, source, 0), tl.gather(y, source, 0), z_before, x, y, z,
                                             inverse_temperature, MONOID)
        open_part = reaches & (started == 0)  # no segment start yet between this lane's part and it
        started = tl.where(reaches, started | tl.gather(started, source, 0), started)
        x = tl.where(open_part, merged_x, x)
        y = tl.where(open_part, merged_y, y)
        if MONOID == "softmin":
            z = tl.where(open_part, merged_z, z)
        step *= 2
    return started, x, y, z


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
def scan_block(out_row, carries_row, block, num_blocks, N, positions, mask, restart, x, y, z, inverse_temperature,
               MONOID: tl.constexpr, BLOCK: tl.constexpr):
    """Level one, for a block of positions (``block``; lanes past N must hold empty parts): scans
    the parts (x, y, z) restarting where ``restart``, writes each position's x to ``out_row``, its
    y to ``out_row + N`` (not for a sum) and its z to ``out_row + 2 N`` (a softmin), and the
    block's carries to ``carries_row`` (R, CARRY_ROWS, B)'s row of this problem."""
    started, x, y, z = _scan(restart, x, y, z, inverse_temperature, MONOID)
    last = tl.arange(0, BLOCK) == BLOCK - 1
    carries = carries_row + block
    tl.store(out_row + positions, x, mask=mask)
    tl.store(carries, tl.sum(tl.where(last, x, 0.0)))
    if MONOID != "sum":
        tl.store(out_row + N + positions, y, mask=mask)
        tl.store(carries + num_blocks, tl.sum(tl.where(last, y, 0.0)))
    if MONOID == "softmin":
        tl.store(out_row + 2 * N + positions, z, mask=mask)
        tl.store(carries + 5 * num_blocks, tl.sum(tl.where(last, z, 0.0)))
    tl.store(carries + 2 * num_blocks, tl.max(started, axis=0).to(tl.float64))


@triton.jit(do_not_specialize=("num_blocks",))  # batch sizes: see _common.py
def _carry_kernel(carries_ptr, num_blocks, inverse_temperature: tl.float64, MONOID: tl.constexpr,
                  CHUNK: tl.constexpr):
    """Grid (R,). Level two: carries[r, 3..4, k] (and 6 for a softmin's z), the part before block
    k of the segment open at block k's first position (the restarting scan of the blocks' open
    parts up to block k - 1), in chunks of CHUNK blocks."""
    row = carries_ptr + tl.program_id(0).to(tl.int64) * CARRY_ROWS * num_blocks
    lanes = tl.arange(0, CHUNK)
    first = lanes == 0
    carry_x = tl.sum(tl.where(first, _empty_x(MONOID), 0.0).to(tl.float64))  # float64 scalars between chunks
    carry_y = tl.sum(tl.zeros([CHUNK], dtype=tl.float64))
    carry_z = tl.sum(tl.zeros([CHUNK], dtype=tl.float64))
    for begin in range(0, num_blocks, CHUNK):
        blocks = begin + lanes
        before = (blocks > 0) & (blocks <= num_blocks)
        open_x = tl.load(row + blocks - 1, mask=before, other=_empty_x(MONOID))
        if MONOID == "sum":
            open_y = tl.zeros_like(open_x)
        else:
            open_y = tl.load(row + num_blocks + blocks - 1, mask=before, other=0.0)
        if MONOID == "softmin":
            open_z = tl.load(row + 5 * num_blocks + blocks - 1, mask=before, other=0.0)
        else:
            open_z = tl.zeros_like(open_x)
        starts = tl.load(row + 2 * num_blocks + blocks - 1, mask=before, other=0.0) != 0
        started, x, y, z = _scan(starts, open_x, open_y, open_z, inverse_temperature, MONOID)
        merged_x, merged_y, merged_z = merge(carry_x, carry_y, carry_z, x, y, z, inverse_temperature, MONOID)
        x = tl.where(started != 0, x, merged_x)
        y = tl.where(started != 0, y, merged_y)
        z = tl.where(started != 0, z, merged_z)
        inside = blocks < num_blocks
        tl.store(row + 3 * num_blocks + blocks, x, mask=inside)
        if MONOID != "sum":
            tl.store(row + 4 * num_blocks + blocks, y, mask=inside)
        if MONOID == "softmin":
            tl.store(row + 6 * num_blocks + blocks, z, mask=inside)
        carry_x = tl.sum(tl.where(lanes == CHUNK - 1, x, 0.0))
        carry_y = tl.sum(tl.where(lanes == CHUNK - 1, y, 0.0))
        carry_z = tl.sum(tl.where(lanes == CHUNK - 1, z, 0.0))


@triton.jit
def segment_total(scanned_row, carries_row, start, end, N, num_blocks, mask, inverse_temperature,
                  MONOID: tl.constexpr, BLOCK: tl.constexpr):
    """(x, y, z) of the segment [start, end) (y 0 for a sum, z 0 but for a softmin):
    ``scan_block``'s part at its last position, merged with the part carried into that block when
    the segment began in an earlier one. Masked lanes give (0, 1, 0) (a min's y divides)."""
    last = end - 1
    x = tl.load(scanned_row + last, mask=mask, other=0.0)
    if MONOID == "sum":
        y = tl.zeros_like(x)
    else:
        y = tl.load(scanned_row + N + last, mask=mask, other=1.0)
    if MONOID == "softmin":
        z = tl.load(scanned_row + 2 * N + last, mask=mask, other=0.0)
    else:
        z = tl.zeros_like(x)
    began_before = mask & (start // BLOCK != last // BLOCK)
    carry_x = tl.load(carries_row + 3 * num_blocks + last // BLOCK, mask=began_before, other=_empty_x(MONOID))
    if MONOID == "sum":
        carry_y = tl.zeros_like(carry_x)
    else:
        carry_y = tl.load(carries_row + 4 * num_blocks + last // BLOCK, mask=began_before, other=0.0)
    if MONOID == "softmin":
        carry_z = tl.load(carries_row + 6 * num_blocks + last // BLOCK, mask=began_before, other=0.0)
    else:
        carry_z = tl.zeros_like(carry_x)
    return merge(carry_x, carry_y, carry_z, x, y, z, inverse_temperature, MONOID)


def new_carries(rows: int, num_blocks: int, device: torch.device) -> torch.Tensor:
    """The carries of ``rows`` scans over ``num_blocks`` blocks: (rows, CARRY_ROWS, num_blocks)
    float64."""
    return torch.empty((rows, CARRY_ROWS.value, num_blocks), dtype=torch.float64, device=device)


def carry_across_blocks(carries: torch.Tensor, monoid: str, inverse_temperature: float = 1.0) -> None:
    """Level two of every row's scan, in place (after the level-one kernel filled rows 0-2)."""
    rows, _, num_blocks = carries.shape
    # a softmin's three float64 sums through the scan of a chunk (sm_90, Triton 3.9): 255 registers
    # a thread and 248 bytes of spills at 4 warps
    launcher(_carry_kernel)[(rows,)](carries, num_blocks, inverse_temperature, MONOID=monoid, CHUNK=CARRY_CHUNK,
                                     num_warps=8 if monoid == "softmin" else 4)
