"""The cross-entropy plus a weighted pairwise term, as one op: ``bce+auc`` and ``bce+pdaom``.

``mlloss::bce_plus_pair_loss`` returns ``bce + lam * ranking`` of a multi-task model's (N, K)
logits (or its one (N,) column) and (N, K) 0/1 labels: each task's mean cross-entropy, and the
pairwise loss of each task's column (``dispatch``'s op: every tier, the data check, graph replay)
on the scores the ranking sees, sigmoid(logit) by default; divided by the items counted for a
summed ranking (PDAOM: Sun et al. Eq. 7 over N). The gradient with respect to the logits is
made in the forward pass, chain rule included (``fused``), so that backward is one node.

Why one op: the two ops, the sigmoid and the sum each add a node to the autograd graph and a
pass through the library's host path, and at the batch sizes recommenders train with a GPU step
is bound by its host. One forward + backward on (1,024, 2) logits took 561 us of host time for
``bce+auc`` and 610 us for ``bce+pdaom`` as four nodes, 423-451 and 417-421 us as this one, where
the cross-entropy alone takes about 200 us (``benchmarks/host_time.py --match "task columns"``:
the Triton tier, the kernels compiled for Hopper, their launches stood in for, on this
repository's CPU; ``benchmarks/results/host-time-ab-bce-one-op.md``). The ranking reads the
cross-entropy's own sigmoid, and the objective adds 3 kernel ops to a ``bce`` step of the recipe
where the ops composed added 6-9 (docs/recipe.md).

Same values as the ops composed, up to the order of the float operations: the tests compare both
with the float64 brute force.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .dispatch import _pair_loss, _pair_loss_fake, pair_flags
from .fused import accumulation_dtype, fused_loss_op
from .pointwise import cross_entropy_terms

# The cross-entropy's own switches, after the pair op's flags: (scores are probabilities, the
# ranking sees sigmoid(scores), the ranking is summed over groups and divided by the items,
# the cross-entropy's data check).
_BCE_FLAGS = 4


def bce_plus_pair_loss(
    scores: Tensor,
    labels: Tensor,
    groups: Tensor | None,
    mask: Tensor | None,
    *,
    mixing: Tensor | None,
    lam: float,
    probabilities: bool,
    sigmoid: bool,
    summed: bool,
    validate_bce: bool,
    **pair_options,
) -> tuple[Tensor, Tensor, Tensor]:
    """(``bce + lam * ranking``, differentiable; the pair op's statistics (3 * K,) float64, the
    ranking's losses per task before ``lam`` and before the division by the items; the per-task
    mean cross-entropies (K,), detached) of ``scores`` (N, K) against 0/1 ``labels`` (N, K).

    ``ranking = sum_k mixing_k R_k(t(scores[:, k]))`` (``mixing`` None: ones), ``t`` the sigmoid
    (``sigmoid``) or the identity; divided by the items counted (N, or the mask's) when
    ``summed``. ``mask`` (N,) bool: the items that count in both terms. ``pair_options``: those
    of ``dispatch.pair_loss`` (surrogate, pairs, reduction, backend, validate, ...); not its
    partition: one process's batch."""
    flags, values = pair_flags(scores, groups, **pair_options)
    flags += [int(probabilities), int(sigmoid), int(summed), int(validate_bce)]
    loss, stats, bce_tasks, _ = _bce_plus_pair_fused(scores, labels, groups, mask, mixing, flags, [*values, float(lam)])
    return loss, stats, bce_tasks


def _bce_plus_pair_loss_op(
    scores: Tensor,
    labels: Tensor,
    groups: Optional[Tensor],
    mask: Optional[Tensor],
    mixing: Optional[Tensor],
    flags: list[int],
    values: list[float],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss (), the pair op's stats (3 * K,) float64, the cross-entropies (K,), grad (N, K))."""
    return _bce_plus_pair(scores, labels, groups, mask, mixing, flags, values, replayable=False)


def _bce_plus_pair_eager(*inputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_bce_plus_pair_loss_op`` of an eager call: its pairwise part replayed from a CUDA graph
    when ``replay`` is on."""
    return _bce_plus_pair(*inputs, replayable=True)


def _bce_plus_pair(scores, labels, groups, mask, mixing, flags, values, *, replayable: bool):
    probabilities, sigmoid, summed, validate_bce = map(bool, flags[-_BCE_FLAGS:])
    lam = values[-1]
    bce = cross_entropy_terms(scores, labels, mask, probabilities, validate_bce)
    # sigmoid(logits): the cross-entropy's own, in float32 at least (half-precision probabilities
    # tie: bfloat16 keeps 8 bits), 0.5 outside the mask (a filler row's NaN would make its zero
    # gradient NaN, 0 * NaN)
    ranked = bce.probability if sigmoid else scores
    one_column = scores.shape[1] == 1  # (N,) scores: the pair op's score columns are K > 1
    loss, stats, grad = _pair_loss(ranked[:, 0] if one_column else ranked, labels, groups, mask, mixing, None,
                                   flags[:-_BCE_FLAGS], values[:-1], replayable=replayable, first_check=bce.data_check)
    if one_column:
        grad = grad[:, None]
    if sigmoid:
        grad = torch.ops.aten.sigmoid_backward(grad, ranked)
    if summed:  # Eq. 7 over N: the items that count, at least one (the cross-entropy's count)
        if isinstance(bce.items, Tensor):
            loss, grad = loss / bce.items, grad / bce.items
        else:
            lam = lam / bce.items
    total = torch.add(bce.loss, loss, alpha=lam)
    grad = torch.add(bce.grad, grad.to(bce.grad.dtype), alpha=lam)
    return total, stats, bce.task_losses, grad


def _bce_plus_pair_fake(scores, labels, groups, mask, mixing, flags, values):
    loss, stats, _ = _pair_loss_fake(scores[:, 0] if scores.shape[1] == 1 else scores, labels, groups, mask, mixing,
                                     None)
    dtype = accumulation_dtype(scores)
    return loss, stats, scores.new_empty(scores.shape[1:], dtype=dtype), scores.new_empty(scores.shape, dtype=dtype)


_bce_plus_pair_fused = fused_loss_op(_bce_plus_pair_loss_op, _bce_plus_pair_fake, eager=_bce_plus_pair_eager)
