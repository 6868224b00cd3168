"""LaA's aggregated level of several binary label columns, ranked in one launch.

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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, validate_device

__all__ = ["pattern_ranks"]

BLOCK = 1024


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
