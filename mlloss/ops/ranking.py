"""One entry point for every pairwise loss: ordinal levels, optional groups, one switch of backend.

AUC is the two-level case (level = label), LaA the multi-level case (level = aggregated label),
LoA a weighted sum of AUC terms. This module builds the layout, the exact normalisers and the
group reduction, then hands the pair sums to the chosen path:

* ``"exact"``: the closed forms in ``closed_form`` (exponential, squared, hinge), O(N log N);
* ``"torch"``: the blocked all-pairs path in ``allpairs`` (any surrogate, O(valid pairs) work);
* ``"triton"``: the fused tiled kernels of ``mlloss.kernels`` (CUDA tensors, or CPU tensors under
  ``TRITON_INTERPRET=1``), O(valid pairs) work and O(N) memory;
* ``"auto"``: ``"exact"`` when the surrogate has a closed form, else ``"triton"`` for CUDA tensors
  and ``"torch"`` on the CPU.

The O(N) and O(N log N) paths run in float64 whatever the input dtype; the all-pairs path runs in
float32 for float32/bf16/fp16 input (fp32 accumulation) and float64 for float64 input. The loss
comes back in float32, or float64 for float64 input; the gradient in the input's dtype.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from . import allpairs, closed_form, hardest
from .layout import group_pair_cost, ordinal_layout, pair_cost_matrix, reduction_coefficients

CLOSED_FORMS = ("exponential", "squared", "hinge")


@dataclass(frozen=True)
class PairTerm:
    """A loss value with the batch facts worth logging beside it."""

    loss: Tensor
    valid_pairs: Tensor  # number of valid pairs (item pairs; level pairs for pairs="hardest")
    groups_with_pairs: Tensor  # groups that contributed to the reduction
    partial: bool = False  # the loss covers only this rank's share of the groups (see ``partition``)


def loss_dtype(scores: Tensor) -> torch.dtype:
    """float64 for float64 scores, else float32 (fp32 accumulation for fp32/bf16/fp16)."""
    return torch.float64 if scores.dtype == torch.float64 else torch.float32


def zero_loss(scores: Tensor) -> Tensor:
    """An exact 0 loss whose gradient with respect to ``scores`` is zero (not missing)."""
    return scores.sum().to(loss_dtype(scores)) * 0


def resolve_backend(backend: str, surrogate: str, pairs: str, device: torch.device) -> str:
    """The path that ``backend`` selects for this surrogate (``pairs="hardest"`` is always O(N))."""
    if pairs == "hardest":
        return "hardest"
    if backend == "auto":
        if surrogate in CLOSED_FORMS:
            return "exact"
        return "triton" if device.type == "cuda" and _triton_available() else "torch"
    return backend


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def ordinal_ranking_loss(
    scores: Tensor,
    levels: Tensor,
    groups: Tensor | None,
    *,
    cost: str,
    surrogate: str,
    margin: float,
    pairs: str,
    temperature: float | None,
    reduction: str,
    backend: str,
    partition: tuple[int, int] | None = None,
) -> PairTerm:
    """The pairwise loss of ``scores`` (N,) for float64 ``levels`` (N,) and int64 ``groups``.

    ``partition=(rank, world_size)``, for a batch gathered from every rank: on the quadratic
    all-pairs paths with groups, compute only the groups this rank owns (contiguous groups of
    about equal sum of n_u^2), with the global normalisers, and return ``partial=True``; the
    ranks' partial losses sum to the loss. Other paths ignore it (they are O(N log N) at most).
    """
    output_dtype = loss_dtype(scores)
    if scores.numel() < 2:  # no pair at all
        nothing = torch.zeros((), dtype=torch.float64)
        return PairTerm(zero_loss(scores), nothing, nothing.to(torch.int64))
    layout = ordinal_layout(levels, groups)
    cost_matrix = pair_cost_matrix(layout.level_values, cost).to(scores.device)
    path = resolve_backend(backend, surrogate, pairs, scores.device)

    if path == "hardest":
        loss, groups_with_pairs = hardest.hardest_pair_loss(
            scores.to(torch.float64)[layout.order], layout, cost_matrix, surrogate, margin,
            reduction, temperature,
        )
        present = layout.counts > 0
        level_pairs = group_pair_cost(present, (cost_matrix > 0).to(torch.float64)).sum()
        return PairTerm(_finish(loss, output_dtype, surrogate), level_pairs, groups_with_pairs)

    group_cost = group_pair_cost(layout.counts, cost_matrix)
    valid_pairs = group_pair_cost(layout.counts, (cost_matrix > 0).to(torch.float64)).sum()
    groups_with_pairs = (group_cost > 0).sum()
    if not bool(groups_with_pairs):
        return PairTerm(zero_loss(scores), valid_pairs, groups_with_pairs)
    coefficients = reduction_coefficients(group_cost, reduction)

    if path == "exact":
        ordered = scores.to(torch.float64)[layout.order]
        if surrogate == "exponential":
            loss = closed_form.exponential_all_pairs(ordered, layout, cost_matrix, coefficients)
        elif surrogate == "squared":
            loss = closed_form.squared_all_pairs(ordered, layout, cost_matrix, coefficients, margin)
        else:
            loss = closed_form.hinge_all_pairs(ordered, layout, cost_matrix, coefficients, margin)
        return PairTerm(_finish(loss, output_dtype, surrogate), valid_pairs, groups_with_pairs)

    partial = partition is not None and groups is not None and partition[1] > 1
    if partial:  # keep this rank's groups: a smaller layout with the global coefficients
        owned = _owned_groups(layout.group_sizes, *partition)[layout.group]
        kept = layout.order[owned]
        scores = scores[kept]
        if kept.numel() < 2:  # this rank owns no pair
            return PairTerm(zero_loss(scores), valid_pairs, groups_with_pairs, partial)
        item_coefficients = coefficients[layout.group[owned]]
        layout = ordinal_layout(levels[kept], groups[kept])
        cost_matrix = pair_cost_matrix(layout.level_values, cost).to(scores.device)  # levels may be fewer
        coefficients = torch.zeros(layout.num_groups, dtype=coefficients.dtype, device=coefficients.device)
        coefficients[layout.group] = item_coefficients[layout.order]  # equal within a group
    if path == "torch":
        ordered = scores.to(output_dtype)[layout.order]
        loss = allpairs.all_pairs_loss(ordered, layout, cost_matrix, coefficients, surrogate, margin)
    else:
        loss = _triton_all_pairs(scores[layout.order], layout, cost, coefficients, surrogate, margin)
    return PairTerm(_finish(loss, output_dtype, surrogate), valid_pairs, groups_with_pairs, partial)


def _owned_groups(group_sizes: Tensor, rank: int, world_size: int) -> Tensor:
    """(G,) bool: the groups of ``rank`` when consecutive groups are split into ``world_size``
    runs of about equal work (sum of n_u^2); every rank computes the same split."""
    work = group_sizes.to(torch.float64) ** 2
    done_before = torch.cumsum(work, 0) - work
    owner = torch.floor((done_before + work / 2) * world_size / work.sum()).clamp(max=world_size - 1)
    return owner == rank


def _triton_all_pairs(
    scores_sorted: Tensor,
    layout,
    cost: str,
    group_coefficients: Tensor,
    surrogate: str,
    margin: float,
) -> Tensor:
    """The fused Triton kernel over the layout: per-item group spans and coefficients."""
    from ..kernels.pairwise import ordinal_pairs_loss  # imports triton only when asked for

    sizes = layout.group_sizes
    ends = torch.cumsum(sizes, 0)
    return ordinal_pairs_loss(
        scores_sorted,
        layout.level,
        layout.level_values,
        (ends - sizes)[layout.group],
        ends[layout.group],
        group_coefficients[layout.group],
        cost=cost,
        surrogate=surrogate,
        margin=margin,
    )


def _finish(loss: Tensor, dtype: torch.dtype, surrogate: str) -> Tensor:
    loss = loss.to(dtype)
    if not bool(torch.isfinite(loss)):
        warnings.warn(
            f"the {surrogate} pairwise loss overflowed {dtype} (value {loss.item()}); score "
            f"differences are too large for this surrogate. Use float64 scores, a bounded "
            f"surrogate ('logistic', 'hinge'), or scale the scores down.",
            RuntimeWarning,
            stacklevel=3,
        )
    return loss
