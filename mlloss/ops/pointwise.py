"""Binary cross-entropy as a fused-loss op: the pointwise term beside the pairwise ones.

``mlloss::binary_cross_entropy`` takes scores (N, K), one column per task, as logits or as
probabilities (models whose heads end in a sigmoid, as torch-rechub's do), and 0/1 labels
(N, K). It returns the sum over tasks of each task's mean cross-entropy, the per-task means and
the gradient, computed in the forward pass like the pair losses (``ops.fused``), with the data
check inside the op: as one opaque op it keeps ``torch.compile(fullgraph=True)`` working with the
check on. An empty batch gives exactly 0. An optional (N,) bool ``mask`` leaves out the items
that are False (a fixed-size batch's filler rows): their values are never read, the means are
over the other items, and their gradient is exactly 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _validation as check
from .fused import accumulation_dtype, fused_loss_op


def binary_cross_entropy(
    scores: Tensor, labels: Tensor, mask: Tensor | None = None, *, probabilities: bool, validate: bool
) -> tuple[Tensor, Tensor]:
    """(sum over tasks of the mean cross-entropy, differentiable; per-task means (K,), detached)
    of ``scores`` (N, K) against 0/1 ``labels`` (N, K), over the items of ``mask`` (N,) if given."""
    loss, task_losses, _ = _binary_cross_entropy_fused(scores, labels, mask, probabilities, validate)
    return loss, task_losses


def _binary_cross_entropy_op(
    scores: Tensor, labels: Tensor, mask: Tensor | None, probabilities: bool, validate: bool
) -> tuple[Tensor, Tensor, Tensor]:
    terms = cross_entropy_terms(scores, labels, mask, probabilities, validate)
    if terms.data_check is not None:
        terms.data_check.run()
    return terms.loss, terms.task_losses, terms.grad


class CrossEntropyTerms(NamedTuple):
    loss: Tensor  # the sum over tasks of their means, ()
    task_losses: Tensor  # (K,)
    grad: Tensor  # (N, K)
    # the probabilities of the items (the scores given as probabilities, else the sigmoid of the
    # logits), 0.5 or 0 outside the mask: what a ranking term on probabilities reads (bce_ranking)
    probability: Tensor
    items: int | Tensor  # the items counted, at least 1: N, or the mask's count (a tensor, in the dtype)
    data_check: check.PendingCheck | None  # the data check of the scores and labels, for the caller to read and finish


def cross_entropy_terms(
    scores: Tensor, labels: Tensor, mask: Tensor | None, probabilities: bool, validate: bool
) -> CrossEntropyTerms:
    """The op's terms, in the accumulation dtype, and with ``validate`` its data check, made on the
    device and left for the caller to read and finish (``_validation.PendingCheck``)."""
    if mask is not None:  # left-out items become (0, 0), valid as logits and as probabilities
        keep, zero = mask[:, None], mask.new_zeros(())  # a 0-dim bool 0 takes each tensor's dtype
        scores, labels = torch.where(keep, scores, zero), torch.where(keep, labels, zero)
    pending = check.cross_entropy_check(scores, labels, probabilities=probabilities, mask=mask) if validate else None
    dtype = accumulation_dtype(scores)
    z = scores.to(dtype)
    if probabilities and pending is not None:
        # Until the check is read, torch's cross-entropy of probabilities sees them in [0, 1] (it
        # refuses others, NaN too: on CUDA a device-side assert); a batch the check passes is unchanged.
        z = z.clamp(0, 1).nan_to_num(0.5)
    y = labels.to(dtype)
    count: int | Tensor
    if mask is None:
        count = max(z.shape[0], 1)
    else:  # a weight of 1/count on the items that count, 0 on the others
        count = mask.sum(dtype=dtype).clamp(min=1)
        weight = keep / count
    if probabilities:
        # torch's own rule: log clamped at -100, and the slope's denominator at 1e-12.
        losses = F.binary_cross_entropy(z, y, reduction="none")
        slopes = (z - y) / (z * (1 - z)).clamp(min=1e-12)
        probability = z
    else:
        losses = F.binary_cross_entropy_with_logits(z, y, reduction="none")
        probability = torch.sigmoid(z)
        slopes = probability - y
    if mask is None:
        task_losses, grad = losses.sum(0) / count, slopes / count
    else:
        task_losses, grad = (losses * weight).sum(0), slopes * weight
    # Elementwise ops give transposed scores (a model's logits.t()) a transposed gradient; the
    # fake below, and so torch.compile, expects a contiguous one (a no-op for contiguous scores).
    return CrossEntropyTerms(task_losses.sum(), task_losses, grad.contiguous(), probability, count, pending)


def _binary_cross_entropy_fake(scores: Tensor, labels: Tensor, mask: Tensor | None, probabilities: bool, validate: bool):
    dtype = accumulation_dtype(scores)
    return (
        scores.new_empty((), dtype=dtype),
        scores.new_empty(scores.shape[1:], dtype=dtype),
        scores.new_empty(scores.shape, dtype=dtype),
    )


_binary_cross_entropy_fused = fused_loss_op(_binary_cross_entropy_op, _binary_cross_entropy_fake)
