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

Work: the PyTorch tier's quadratic all-pairs sums (logistic on the CPU, or backend="torch") with
groups do not repeat the global pair work on every rank: each rank computes the pairs of its share
of the groups (about 1/W of the sum of n_u^2, with the global normalisers) and ``sum_shares`` adds
the shares up, with a gradient scaled by W so that the scale above is unchanged. Without groups the
whole batch is one group and every rank computes it whole, as do the O(N log N) paths and the
Triton kernels (which ``backend="auto"`` takes for the logistic surrogate on CUDA).

Errors: a rank whose own batch fails its checks before the gather (``refusing_together``), or
whose share of the pairs fails (``share_failed``), says so in the collective that the other
ranks are in, and every rank raises, instead of the others waiting for it in the gather or the
sum of the shares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
    if groups is not None:  # int32 or int64 (check.group_vector): one dtype on every rank
        groups = groups.to(torch.int64)
    shapes = _exchange_descriptions(_describe(scores, labels, groups, mask))
    refused = [rank for rank, shape in enumerate(shapes) if int(shape[0]) == _REFUSED]
    if refused:
        raise ValueError(
            f"cross_device=True: rank(s) {refused} refused their local batch (the error raised there names the "
            "argument and the wrong value); no batch was gathered"
        )
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


@contextmanager
def refusing_together(cross_device: bool, device: torch.device | None) -> Iterator[None]:
    """Runs a rank's checks of its own batch before ``gather_batch``: when they raise (TypeError,
    ValueError) and ``cross_device``, the rank joins the gather's first collective as refused
    (on ``device``, the batch's, or None when the scores are no tensor), so that every other
    rank raises too rather than wait for it; then the error goes on."""
    try:
        yield
    except (TypeError, ValueError):
        if cross_device and world_size() > 1:
            refused = torch.tensor([_REFUSED, 0, 0, 0, -1, -1], dtype=torch.int64)
            _exchange_descriptions(refused.to(device if device is not None else _backend_device()))
        raise


def sum_shares(loss_share: Tensor, problem_shares: Tensor) -> tuple[Tensor, Tensor]:
    """(the loss, the problems' losses (B,) detached): each the sum over ranks of each rank's share,
    in one all-reduce (every rank gets the totals). The loss's gradient is world_size times the
    local one, the scale that _GatherWithGrad's backward expects from a loss that every rank
    computes whole: the all-reduced gradient is then world_size times the gradient of the total,
    as before, and DDP's averaging brings it back to the exact gradient. A rank whose share
    raised calls ``share_failed`` instead; then every rank raises."""
    return _SumShares.apply(loss_share, problem_shares)


def share_failed(error: Exception, num_problems: int, device: torch.device) -> None:
    """Joins ``sum_shares``' all-reduce for a rank whose share of the pairs raised ``error``, which
    its caller raises next: the other ranks then raise an error of its kind (``_FAILURES``)."""
    _reduce_shares(torch.zeros(1 + num_problems, dtype=torch.float64, device=device), _failure_code(error))


class _SumShares(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss_share: Tensor, problem_shares: Tensor) -> tuple[Tensor, Tensor]:
        shares = torch.cat([loss_share.detach().to(torch.float64).reshape(1), problem_shares.to(torch.float64)])
        totals = _reduce_shares(shares, 0)
        problem_totals = totals[1:].clone()
        ctx.mark_non_differentiable(problem_totals)
        return totals[0].to(loss_share.dtype).clone(), problem_totals

    @staticmethod
    def backward(ctx, grad: Tensor, _: Tensor) -> tuple[Tensor, None]:
        return grad * world_size(), None


def _reduce_shares(shares: Tensor, failure: int) -> Tensor:
    """The sum over ranks of ``shares`` in one all-reduce, beside each rank's failure code (0: its
    share is there); raises on a rank whose share is there when another rank's failed."""
    codes = torch.zeros(world_size(), dtype=torch.float64, device=shares.device)
    codes[dist.get_rank()] = failure
    packed = torch.cat([shares, codes])
    dist.all_reduce(packed)
    failed = {rank: int(code) for rank, code in enumerate(packed[shares.shape[0]:].tolist()) if code}
    if failed and not failure:
        raise _FAILURES.get(min(failed.values()), RuntimeError)(
            f"cross_device=True: rank(s) {sorted(failed)} failed to compute their share of the pairs (the error "
            "raised there says why), so the loss over the gathered batch has no value on this rank either"
        )
    return packed[: shares.shape[0]]


# The kinds of error a failed share reports to the other ranks by code, who raise the kind of
# the lowest code among the failed ranks (3, any other error, as a RuntimeError).
_FAILURES = {1: OverflowError, 2: ValueError}


def _failure_code(error: Exception) -> int:
    return next((code for code, kind in _FAILURES.items() if isinstance(error, kind)), 3)


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


# The row count by which a rank whose batch failed its own checks says so (``refusing_together``).
_REFUSED = -1
# Dtypes the gathered batch's description names (an index each; -1 for any other).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.uint8, torch.int32,
           torch.int64)
_WIDENED = (torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64)


def _describe(scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None) -> Tensor:
    """This rank's (rows, label columns, grouped, masked, scores' dtype, labels' dtype)."""
    codes = [_DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1 for t in (scores, labels)]
    return torch.tensor(
        [scores.shape[0], labels.shape[1], groups is not None, mask is not None, *codes], dtype=torch.int64,
        device=scores.device,
    )


def _exchange_descriptions(local: Tensor) -> list[Tensor]:
    """Every rank's description (``_describe``, or a refusal), in rank order."""
    shapes = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(shapes, local)
    return [shape.cpu() for shape in shapes]


def _backend_device() -> torch.device:
    """Where the default group's collectives take tensors when no batch says (NCCL: the GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _pad_rows(tensor: Tensor, rows: int) -> Tensor:
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, padding])


def _gather_rows(tensor: Tensor, sizes: list[int], largest: int) -> Tensor:
    padded = _pad_rows(tensor.contiguous(), largest)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)])
