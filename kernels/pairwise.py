"""Fused, deterministic Triton kernels for grouped pairwise ranking losses.

Two pair families are supported, both as a single launch that returns the loss
*and* its gradient with respect to the scores (the backward pass then only scales
the saved gradient, as in Liger-Kernel's fused losses):

* **ordinal pairs** (bipartite / multi-level AUC, LaA label aggregation):
  items sorted by (group ascending, level descending); pair (i, j) is valid iff
  same group and ``level[i] > level[j]``;
  ``loss = sum_valid coef[i] * c_ij * phi(s_i - s_j)`` with
  ``c_ij = 1`` (uniform) or ``level_value[level[i]] - level_value[level[j]]`` (linear).
* **label bits** (LoA loss aggregation over K binary labels): items sorted by group;
  ``w_ij = sum_k bit_k(i) * (1 - bit_k(j)) * coef[k, i]``;
  ``loss = sum_{same group, i != j} w_ij * phi(s_i - s_j)``.

``phi`` is one of logistic, hinge, squared, exponential (see
:func:`mlloss.kernels._common.surrogate_and_derivative`), and
``d loss / d s_i = sum_{pairs with i upper} w phi'(t) - sum_{pairs with i lower} w phi'(t)``.

Tiling (flash-attention style, never an N x N matrix): a program owns BLOCK_M
consecutive items and streams BLOCK_N-wide tiles of the other items of the same
groups through registers. Because the input is sorted by group, the partners of a
block lie in one contiguous range, read from ``group_start`` / ``group_end``:

* ordinal, own the upper items: partners in ``[first_row, group_end[last_row])``
  (a lower item always comes after its upper item);
* ordinal, own the lower items: partners in ``[group_start[first_row], last_row]``;
* label bits (either side): ``[group_start[first_row], group_end[last_row])``.

A tile whose ``BLOCK_M x BLOCK_N`` pair mask is empty (other group, no level below,
no differing label bit) is skipped after loading only the int32 metadata, so the
work grows with the number of same-group pairs, not with N^2.

Determinism (no float atomics anywhere): the launch grid is ``(num_blocks, 2)``.
Programs with ``program_id(1) == 0`` own their items as *upper* items: they
accumulate the upper-side gradient and the loss in registers; programs with
``program_id(1) == 1`` own the same items as *lower* items and recompute those pair
terms from the other side (pairwise symmetry) to accumulate the lower-side gradient.
Each program writes its own slice of a ``(2, N)`` gradient buffer and the upper
programs one float each of a ``(num_blocks,)`` partial-loss buffer; the host adds the
two gradient rows and sums the partials, so every output is produced in a fixed
order and memory stays O(N). The price is evaluating each pair's derivative twice
(the lower pass skips the log of the logistic loss).

Precision: scores of any float dtype are loaded and upcast; fp16/bf16/fp32 are
accumulated in float32 and float64 in float64 (``coef``, ``level_value`` and the
margin are passed in that accumulation dtype too). Loss and gradient come back in that
accumulation dtype (float32, or float64 for float64 scores). The exponential
surrogate overflows float32 once ``s_i - s_j < -88``; the host checks the loss and
raises :class:`OverflowError` instead of returning ``inf`` / ``nan``.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import (
    check_finite_exponential,
    compute_dtype,
    default_blocks,
    surrogate_and_derivative,
    surrogate_id,
    validate_device,
)

__all__ = [
    "label_bits_pairs_loss",
    "label_bits_pairs_loss_and_grad",
    "ordinal_pairs_loss",
    "ordinal_pairs_loss_and_grad",
]

_COSTS = ("uniform", "linear")
_TL_DTYPE = {torch.float32: tl.float32, torch.float64: tl.float64}


# --------------------------------------------------------------------------- #
# Kernel 1: ordinal pairs                                                     #
# --------------------------------------------------------------------------- #
@triton.jit
def _accumulate_tile(
    s_m, s_n, w, valid, margin, grad_acc, loss_acc, SURROGATE: tl.constexpr, OWN_UPPER: tl.constexpr,
):
    """Add one tile's valid pairs, weighted by ``w``, to the row accumulators. Rows are the
    upper items (OWN_UPPER: d/ds_upper and the loss) or the lower items (d/ds_lower)."""
    if OWN_UPPER:
        t = s_m[:, None] - s_n[None, :]
    else:
        t = s_n[None, :] - s_m[:, None]
    phi, dphi = surrogate_and_derivative(t, margin, SURROGATE, OWN_UPPER)
    # where(), not a 0/1 multiply: invalid pairs may hold inf (exponential).
    g = tl.where(valid, w * dphi, 0.0)
    if OWN_UPPER:
        grad_acc += tl.sum(g, axis=1)
        loss_acc += tl.sum(tl.where(valid, w * phi, 0.0), axis=1)
    else:
        grad_acc -= tl.sum(g, axis=1)
    return grad_acc, loss_acc


@triton.jit
def _ordinal_block(
    scores_ptr, level_ptr, level_value_ptr, group_start_ptr, group_end_ptr, coef_ptr,
    loss_part_ptr, grad_ptr, N, margin_ptr, pid,
    OWN_UPPER: tl.constexpr, COST_LINEAR: tl.constexpr, SURROGATE: tl.constexpr,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: items [pid*BLOCK_M, +BLOCK_M) as upper (OWN_UPPER) or lower items."""
    first = pid * BLOCK_M
    last = tl.minimum(first + BLOCK_M, N) - 1
    offs_m = first + tl.arange(0, BLOCK_M)
    mask_m = offs_m < N
    # The margin comes through memory in the accumulation dtype: a Python float
    # argument would be typed fp32 and round m in the float64 path.
    margin = tl.load(margin_ptr)
    s_m = tl.load(scores_ptr + offs_m, mask=mask_m, other=0.0).to(ACC)
    lvl_m = tl.load(level_ptr + offs_m, mask=mask_m, other=0)
    # group_start doubles as a group id; padding gets -1 (rows) / -2 (columns)
    # so a padded row never pairs with a padded column.
    grp_m = tl.load(group_start_ptr + offs_m, mask=mask_m, other=-1)
    if COST_LINEAR:
        val_m = tl.load(level_value_ptr + lvl_m, mask=mask_m, other=0.0).to(ACC)
    if OWN_UPPER:
        coef_m = tl.load(coef_ptr + offs_m, mask=mask_m, other=0.0).to(ACC)
        # Sorted by level descending inside a group: lowers follow their upper.
        lo = first
        hi = tl.load(group_end_ptr + last)
    else:
        lo = tl.load(group_start_ptr + first)
        hi = last + 1

    grad_acc = tl.zeros([BLOCK_M], dtype=ACC)
    loss_acc = tl.zeros([BLOCK_M], dtype=ACC)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        lvl_n = tl.load(level_ptr + offs_n, mask=mask_n, other=0)
        grp_n = tl.load(group_start_ptr + offs_n, mask=mask_n, other=-2)
        same = grp_m[:, None] == grp_n[None, :]
        if OWN_UPPER:
            valid = same & (lvl_m[:, None] > lvl_n[None, :])
        else:
            valid = same & (lvl_n[None, :] > lvl_m[:, None])
        if tl.sum(valid.to(tl.int32)) > 0:
            s_n = tl.load(scores_ptr + offs_n, mask=mask_n, other=0.0).to(ACC)
            if OWN_UPPER:
                w = tl.broadcast_to(coef_m[:, None], [BLOCK_M, BLOCK_N])
            else:
                coef_n = tl.load(coef_ptr + offs_n, mask=mask_n, other=0.0).to(ACC)
                w = tl.broadcast_to(coef_n[None, :], [BLOCK_M, BLOCK_N])
            if COST_LINEAR:
                val_n = tl.load(level_value_ptr + lvl_n, mask=mask_n, other=0.0).to(ACC)
                if OWN_UPPER:
                    w = w * (val_m[:, None] - val_n[None, :])
                else:
                    w = w * (val_n[None, :] - val_m[:, None])
            grad_acc, loss_acc = _accumulate_tile(
                s_m, s_n, w, valid, margin, grad_acc, loss_acc, SURROGATE, OWN_UPPER
            )

    tl.store(grad_ptr + offs_m, grad_acc, mask=mask_m)
    if OWN_UPPER:
        tl.store(loss_part_ptr + pid, tl.sum(loss_acc))


@triton.jit
def _ordinal_pairs_kernel(
    scores_ptr, level_ptr, level_value_ptr, group_start_ptr, group_end_ptr, coef_ptr,
    loss_part_ptr, grad_upper_ptr, grad_lower_ptr, N, margin_ptr,
    COST_LINEAR: tl.constexpr, SURROGATE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M), 2): axis 1 picks the upper-owning or lower-owning pass."""
    pid = tl.program_id(0)
    if tl.program_id(1) == 0:
        _ordinal_block(scores_ptr, level_ptr, level_value_ptr, group_start_ptr, group_end_ptr, coef_ptr,
                       loss_part_ptr, grad_upper_ptr, N, margin_ptr, pid,
                       True, COST_LINEAR, SURROGATE, ACC, BLOCK_M, BLOCK_N)
    else:
        _ordinal_block(scores_ptr, level_ptr, level_value_ptr, group_start_ptr, group_end_ptr, coef_ptr,
                       loss_part_ptr, grad_lower_ptr, N, margin_ptr, pid,
                       False, COST_LINEAR, SURROGATE, ACC, BLOCK_M, BLOCK_N)


# --------------------------------------------------------------------------- #
# Kernel 2: label bits (LoA)                                                  #
# --------------------------------------------------------------------------- #
@triton.jit
def _label_bits_block(
    scores_ptr, bits_ptr, group_start_ptr, group_end_ptr, coef_ptr, coef_stride_k,
    loss_part_ptr, grad_ptr, N, margin_ptr, pid,
    K: tl.constexpr, OWN_UPPER: tl.constexpr, SURROGATE: tl.constexpr,
    ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: items [pid*BLOCK_M, +BLOCK_M) as upper (OWN_UPPER) or lower items."""
    first = pid * BLOCK_M
    last = tl.minimum(first + BLOCK_M, N) - 1
    offs_m = first + tl.arange(0, BLOCK_M)
    mask_m = offs_m < N
    margin = tl.load(margin_ptr)
    s_m = tl.load(scores_ptr + offs_m, mask=mask_m, other=0.0).to(ACC)
    bits_m = tl.load(bits_ptr + offs_m, mask=mask_m, other=0)
    grp_m = tl.load(group_start_ptr + offs_m, mask=mask_m, other=-1)
    # Pairs run both ways inside a group, so either side scans the whole group span.
    lo = tl.load(group_start_ptr + first)
    hi = tl.load(group_end_ptr + last)

    grad_acc = tl.zeros([BLOCK_M], dtype=ACC)
    loss_acc = tl.zeros([BLOCK_M], dtype=ACC)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        bits_n = tl.load(bits_ptr + offs_n, mask=mask_n, other=0)
        grp_n = tl.load(group_start_ptr + offs_n, mask=mask_n, other=-2)
        # Bit k of `diff` is set iff label k is positive on the upper, negative on the lower.
        if OWN_UPPER:
            diff = bits_m[:, None] & ~bits_n[None, :]
        else:
            diff = bits_n[None, :] & ~bits_m[:, None]
        valid = (grp_m[:, None] == grp_n[None, :]) & (diff != 0)
        if tl.sum(valid.to(tl.int32)) > 0:
            s_n = tl.load(scores_ptr + offs_n, mask=mask_n, other=0.0).to(ACC)
            w = tl.zeros([BLOCK_M, BLOCK_N], dtype=ACC)
            for k in tl.static_range(K):
                # coef[k, upper]: a column vector when rows are the uppers, else a row vector.
                if OWN_UPPER:
                    c_k = tl.load(coef_ptr + k * coef_stride_k + offs_m, mask=mask_m, other=0.0).to(ACC)[:, None]
                else:
                    c_k = tl.load(coef_ptr + k * coef_stride_k + offs_n, mask=mask_n, other=0.0).to(ACC)[None, :]
                w += tl.where(((diff >> k) & 1) != 0, c_k, 0.0)
            grad_acc, loss_acc = _accumulate_tile(
                s_m, s_n, w, valid, margin, grad_acc, loss_acc, SURROGATE, OWN_UPPER
            )

    tl.store(grad_ptr + offs_m, grad_acc, mask=mask_m)
    if OWN_UPPER:
        tl.store(loss_part_ptr + pid, tl.sum(loss_acc))


@triton.jit
def _label_bits_pairs_kernel(
    scores_ptr, bits_ptr, group_start_ptr, group_end_ptr, coef_ptr, coef_stride_k,
    loss_part_ptr, grad_upper_ptr, grad_lower_ptr, N, margin_ptr,
    K: tl.constexpr, SURROGATE: tl.constexpr, ACC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (cdiv(N, BLOCK_M), 2): axis 1 picks the upper-owning or lower-owning pass."""
    pid = tl.program_id(0)
    if tl.program_id(1) == 0:
        _label_bits_block(scores_ptr, bits_ptr, group_start_ptr, group_end_ptr, coef_ptr, coef_stride_k,
                          loss_part_ptr, grad_upper_ptr, N, margin_ptr, pid,
                          K, True, SURROGATE, ACC, BLOCK_M, BLOCK_N)
    else:
        _label_bits_block(scores_ptr, bits_ptr, group_start_ptr, group_end_ptr, coef_ptr, coef_stride_k,
                          loss_part_ptr, grad_lower_ptr, N, margin_ptr, pid,
                          K, False, SURROGATE, ACC, BLOCK_M, BLOCK_N)


# --------------------------------------------------------------------------- #
# Host launchers                                                              #
# --------------------------------------------------------------------------- #
def _check_1d(name: str, t: torch.Tensor, n: int) -> None:
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")


def _blocks(device: torch.device, block_m: int | None, block_n: int | None) -> tuple[int, int]:
    dm, dn = default_blocks(device)
    bm, bn = block_m or dm, block_n or dn
    for name, b in (("block_m", bm), ("block_n", bn)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b}")
    return bm, bn


def _margin(margin: float, acc: torch.dtype, device: torch.device) -> torch.Tensor:
    """The margin as a 1-element device tensor in the accumulation dtype (no host sync)."""
    return torch.full((1,), float(margin), dtype=acc, device=device)


def _finish(
    loss_part: torch.Tensor, grad_parts: torch.Tensor, surrogate: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed-order reductions of the per-program partials (deterministic)."""
    loss = loss_part.sum()
    if surrogate == "exponential":
        check_finite_exponential(loss)
    return loss, grad_parts[0] + grad_parts[1]


def ordinal_pairs_loss_and_grad(
    scores: torch.Tensor,
    level: torch.Tensor,
    level_value: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    *,
    cost: str = "uniform",
    surrogate: str = "logistic",
    margin: float = 1.0,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and d loss / d scores over ordinal pairs, in one fused launch.

    Args:
        scores: (N,) float scores, sorted by (group ascending, level descending).
        level: (N,) int dense level index (0 = lowest).
        level_value: (L,) value of each level, used by ``cost="linear"``.
        group_start, group_end: (N,) int, the ``[start, end)`` span of each item's group.
        coef: (N,) per-item coefficient; a pair is weighted by its upper item's coef.
        cost: ``"uniform"`` (c = 1) or ``"linear"`` (c = value gap of the two levels).
        surrogate: ``"logistic"``, ``"hinge"``, ``"squared"`` or ``"exponential"``.
        margin: m of the hinge and squared surrogates.
        block_m, block_n: tile sizes (powers of two >= 16); defaults per device.
        num_warps: CUDA warps per program (ignored by the interpreter).

    Returns:
        ``(loss, grad)``: a 0-dim tensor and an (N,) tensor, float32 (float64 when
        ``scores`` is float64).

    Raises:
        OverflowError: the exponential surrogate overflowed (see module docstring).
    """
    if cost not in _COSTS:
        raise ValueError(f"unknown cost {cost!r}; expected one of {_COSTS}")
    sid = surrogate_id(surrogate)
    acc = compute_dtype(scores)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    n = scores.shape[0]
    for name, t in (("level", level), ("group_start", group_start), ("group_end", group_end), ("coef", coef)):
        _check_1d(name, t, n)
    validate_device(scores, level, level_value, group_start, group_end, coef)
    if n == 0:
        return scores.new_zeros((), dtype=acc), scores.new_zeros(0, dtype=acc)
    bm, bn = _blocks(scores.device, block_m, block_n)

    scores = scores.contiguous()
    level = level.to(torch.int32).contiguous()
    level_value = level_value.to(acc).contiguous()
    group_start = group_start.to(torch.int32).contiguous()
    group_end = group_end.to(torch.int32).contiguous()
    coef = coef.to(acc).contiguous()

    num_blocks = triton.cdiv(n, bm)
    loss_part = torch.empty(num_blocks, dtype=acc, device=scores.device)
    grad_parts = torch.empty((2, n), dtype=acc, device=scores.device)
    _ordinal_pairs_kernel[(num_blocks, 2)](
        scores, level, level_value, group_start, group_end, coef,
        loss_part, grad_parts[0], grad_parts[1], n, _margin(margin, acc, scores.device),
        COST_LINEAR=cost == "linear", SURROGATE=sid, ACC=_TL_DTYPE[acc],
        BLOCK_M=bm, BLOCK_N=bn, num_warps=num_warps,
    )
    return _finish(loss_part, grad_parts, surrogate)


def label_bits_pairs_loss_and_grad(
    scores: torch.Tensor,
    label_bits: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    *,
    surrogate: str = "logistic",
    margin: float = 1.0,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss and d loss / d scores over label-bit (LoA) pairs, in one fused launch.

    Args:
        scores: (N,) float scores, sorted by group.
        label_bits: (N,) int, bit k = binary label k of the item (K <= 32).
        group_start, group_end: (N,) int, the ``[start, end)`` span of each item's group.
        coef: (K, N) coefficient of label k for each item (its group's coefficient);
            K is taken from ``coef.shape[0]``.
        surrogate, margin, block_m, block_n, num_warps: as in
            :func:`ordinal_pairs_loss_and_grad`.

    Returns:
        ``(loss, grad)`` as in :func:`ordinal_pairs_loss_and_grad`.
    """
    sid = surrogate_id(surrogate)
    acc = compute_dtype(scores)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D, got shape {tuple(scores.shape)}")
    n = scores.shape[0]
    for name, t in (("label_bits", label_bits), ("group_start", group_start), ("group_end", group_end)):
        _check_1d(name, t, n)
    if coef.dim() != 2 or coef.shape[1] != n or not 1 <= coef.shape[0] <= 32:
        raise ValueError(f"coef must have shape (K, {n}) with 1 <= K <= 32, got {tuple(coef.shape)}")
    validate_device(scores, label_bits, group_start, group_end, coef)
    if n == 0:
        return scores.new_zeros((), dtype=acc), scores.new_zeros(0, dtype=acc)
    bm, bn = _blocks(scores.device, block_m, block_n)

    scores = scores.contiguous()
    label_bits = label_bits.to(torch.int32).contiguous()
    group_start = group_start.to(torch.int32).contiguous()
    group_end = group_end.to(torch.int32).contiguous()
    coef = coef.to(acc).contiguous()

    num_blocks = triton.cdiv(n, bm)
    loss_part = torch.empty(num_blocks, dtype=acc, device=scores.device)
    grad_parts = torch.empty((2, n), dtype=acc, device=scores.device)
    _label_bits_pairs_kernel[(num_blocks, 2)](
        scores, label_bits, group_start, group_end, coef, coef.stride(0),
        loss_part, grad_parts[0], grad_parts[1], n, _margin(margin, acc, scores.device),
        K=coef.shape[0], SURROGATE=sid, ACC=_TL_DTYPE[acc],
        BLOCK_M=bm, BLOCK_N=bn, num_warps=num_warps,
    )
    return _finish(loss_part, grad_parts, surrogate)


# --------------------------------------------------------------------------- #
# torch.library ops: opaque to torch.compile, differentiable by register_autograd #
# --------------------------------------------------------------------------- #
# Each op returns (loss, grad): the gradient is computed in the forward launch; backward only
# scales it by the loss's incoming gradient (no second launch). Registering them as custom ops
# lets torch.compile(fullgraph=True) capture a model that calls them without a graph break.


@torch.library.custom_op("mlloss::ordinal_pairs", mutates_args=())
def _ordinal_pairs_op(
    scores: torch.Tensor,
    level: torch.Tensor,
    level_value: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    cost: str,
    surrogate: str,
    margin: float,
    block_m: Optional[int],
    block_n: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    return ordinal_pairs_loss_and_grad(
        scores, level, level_value, group_start, group_end, coef,
        cost=cost, surrogate=surrogate, margin=margin, block_m=block_m, block_n=block_n,
    )


@torch.library.custom_op("mlloss::label_bits_pairs", mutates_args=())
def _label_bits_pairs_op(
    scores: torch.Tensor,
    label_bits: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    surrogate: str,
    margin: float,
    block_m: Optional[int],
    block_n: Optional[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    return label_bits_pairs_loss_and_grad(
        scores, label_bits, group_start, group_end, coef,
        surrogate=surrogate, margin=margin, block_m=block_m, block_n=block_n,
    )


def _fake_loss_and_grad(scores: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor]:
    acc = compute_dtype(scores)
    return scores.new_empty((), dtype=acc), scores.new_empty(scores.shape, dtype=acc)


def _save_grad(ctx, inputs, output) -> None:
    ctx.scores_dtype = inputs[0].dtype
    ctx.num_inputs = len(inputs)
    ctx.save_for_backward(output[1])


def _scale_saved_grad(ctx, grad_loss: torch.Tensor, _grad_of_grad: torch.Tensor):
    (grad,) = ctx.saved_tensors
    return ((grad * grad_loss).to(ctx.scores_dtype),) + (None,) * (ctx.num_inputs - 1)


for _op in (_ordinal_pairs_op, _label_bits_pairs_op):
    _op.register_fake(_fake_loss_and_grad)
    _op.register_autograd(_scale_saved_grad, setup_context=_save_grad)


def ordinal_pairs_loss(
    scores: torch.Tensor,
    level: torch.Tensor,
    level_value: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    *,
    cost: str = "uniform",
    surrogate: str = "logistic",
    margin: float = 1.0,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Differentiable ordinal-pairs loss (0-dim); see :func:`ordinal_pairs_loss_and_grad`."""
    return _ordinal_pairs_op(
        scores, level, level_value, group_start, group_end, coef, cost, surrogate, float(margin), block_m, block_n
    )[0]


def label_bits_pairs_loss(
    scores: torch.Tensor,
    label_bits: torch.Tensor,
    group_start: torch.Tensor,
    group_end: torch.Tensor,
    coef: torch.Tensor,
    *,
    surrogate: str = "logistic",
    margin: float = 1.0,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Differentiable label-bits (LoA) loss (0-dim); see :func:`label_bits_pairs_loss_and_grad`."""
    return _label_bits_pairs_op(
        scores, label_bits, group_start, group_end, coef, surrogate, float(margin), block_m, block_n
    )[0]
