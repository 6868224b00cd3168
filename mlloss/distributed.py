"""Pairs across processes: gather a data-parallel batch so that every rank sees the global batch.

A pairwise loss on W data-parallel ranks sees only 1/W^2 of the global pairs unless the pairs are
taken across ranks (loss spec, "Distributed batches"). ``gather_batch`` all-gathers scores, labels,
groups and masks (local sizes may differ; O(N) numbers are sent, never pairs). Every rank then computes
the same global loss.

Gradient scale: the scores go through ``_GatherWithGrad``, whose backward *sums* the incoming
gradients over ranks (an all-reduce) and keeps the local slice. Each rank's loss is the same global
L, so rank r receives sum over ranks of dL/ds_r = W * dL/ds_r for its local scores; DDP then averages the
parameter gradients over the W ranks, which leaves exactly dL/dtheta of the single-process loss on
the concatenated batch. (Gathering without autograd and re-inserting the local scores would give
1/W of that: the known trap.) Every rank must call the loss, and backward, in the same order, as
with any collective.

Work: the quadratic all-pairs paths (logistic, or backend="torch"/"triton") with groups do not
repeat the global pair work on every rank: each rank computes the pairs of its share of the
groups (about 1/W of the sum of n_u^2, with the global normalisers) and ``sum_partials`` adds the
shares up, with a gradient scaled by W so that the scale above is unchanged. Without groups the
whole batch is one group and every rank computes it whole, as do the O(N log N) paths.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def world_size() -> int:
    """Number of processes in the default group (1 when torch.distributed is not initialised)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def gather_batch(
    scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Concatenate every rank's (scores (N,), labels (N, K), groups (N,) or None, mask (N,) bool
    or None) in rank order."""
    return gather_batch_with_rows(scores, labels, groups, mask)[0]


def gather_batch_with_rows(
    scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None = None
) -> tuple[tuple[Tensor, Tensor, Tensor | None, Tensor | None], tuple[int, int] | None]:
    """``gather_batch``'s result, and the positions [start, end) of this rank's items in it (None
    in a single process), by which an error about the gathered batch names this rank's items."""
    if world_size() == 1:
        return (scores, labels, groups, mask), None
    if labels.dtype in _WIDENED:  # the backends gather no int16 / int8 / wide unsigned labels
        labels = labels.to(torch.int64)
    shapes = _gather_shapes(scores, labels, groups, mask)
    sizes = [int(size) for size, _, _, _, _, _ in shapes]
    num_labels = {int(k) for _, k, _, _, _, _ in shapes}
    grouped = {bool(g) for _, _, g, _, _, _ in shapes}
    masked = {bool(m) for _, _, _, m, _, _ in shapes}
    for name, column in (("scores", 4), ("labels", 5)):  # a mismatch would abort the gather itself
        dtypes = {_DTYPES[int(shape[column])] if shape[column] >= 0 else "another dtype" for shape in shapes}
        if len(dtypes) > 1:
            raise ValueError(f"cross_device=True: ranks pass {name} of different dtypes: {sorted(map(str, dtypes))}")
    if len(num_labels) > 1:
        raise ValueError(f"cross_device=True: ranks disagree on the number of label columns: {sorted(num_labels)}")
    if len(grouped) > 1:
        raise ValueError("cross_device=True: some ranks pass groups and others pass groups=None")
    if len(masked) > 1:
        raise ValueError("cross_device=True: some ranks pass a mask and others pass mask=None")
    largest = max(sizes)
    gathered_scores = _GatherWithGrad.apply(scores, sizes, largest)
    gathered_labels = _gather_rows(labels, sizes, largest)
    gathered_groups = _gather_rows(groups, sizes, largest) if groups is not None else None
    # as bytes: not every backend gathers bool tensors
    gathered_mask = _gather_rows(mask.to(torch.uint8), sizes, largest).bool() if mask is not None else None
    start = sum(sizes[: dist.get_rank()])
    return (gathered_scores, gathered_labels, gathered_groups, gathered_mask), (start, start + scores.shape[0])


# Split the quadratic pair work over the ranks (below); False makes every rank compute the whole
# gathered batch, the behaviour before the split (benchmarks/bench_cross_device.py compares both).
SPLIT_PAIR_WORK = True


def partition() -> tuple[int, int] | None:
    """(rank, world size) to split the pair work of a gathered batch over, or None in one process."""
    return (dist.get_rank(), world_size()) if SPLIT_PAIR_WORK and world_size() > 1 else None


def sum_partials(partial: Tensor) -> Tensor:
    """The sum over ranks of each rank's partial loss (every rank gets the total). Its gradient is
    world_size times the local one, the scale that _GatherWithGrad's backward expects from a loss
    that every rank computes whole: the all-reduced gradient is then world_size times the
    gradient of the total, as before, and DDP's averaging brings it back to the exact gradient."""
    return _SumPartials.apply(partial)


def sum_over_ranks(values: Tensor) -> Tensor:
    """The sum over ranks of ``values``, detached (every rank gets it)."""
    total = values.detach().clone()
    dist.all_reduce(total)
    return total


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial: Tensor) -> Tensor:
        return sum_over_ranks(partial)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad * world_size()


class _GatherWithGrad(torch.autograd.Function):
    """All-gather in forward; in backward, the sum over ranks of the gradient, local slice kept."""

    @staticmethod
    def forward(ctx, local: Tensor, sizes: list[int], largest: int) -> Tensor:
        ctx.sizes = sizes
        ctx.rank = dist.get_rank()
        return _gather_rows(local, sizes, largest)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        total = grad.contiguous().clone()
        dist.all_reduce(total)  # every rank differentiated the same global loss
        start = sum(ctx.sizes[: ctx.rank])
        return total[start : start + ctx.sizes[ctx.rank]], None, None


# Dtypes the gathered batch's description names (an index each; -1 for any other).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8, torch.int32,
           torch.int64)
_WIDENED = (torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64)


def _gather_shapes(scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None) -> list[Tensor]:
    """Every rank's (rows, label columns, grouped, masked, scores' dtype, labels' dtype)."""
    codes = [_DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1 for t in (scores, labels)]
    local = torch.tensor(
        [scores.shape[0], labels.shape[1], groups is not None, mask is not None, *codes], dtype=torch.int64,
        device=scores.device,
    )
    shapes = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(shapes, local)
    return [shape.cpu() for shape in shapes]


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, padding])


def _gather_rows(tensor: Tensor, sizes: list[int], largest: int) -> Tensor:
    padded = _pad_rows(tensor.contiguous(), largest)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])
