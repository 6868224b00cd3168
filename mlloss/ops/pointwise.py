"""Binary cross-entropy as a fused-loss op: the pointwise term beside the pairwise ones.

``mlloss::binary_cross_entropy`` takes scores (N, K), one column per task, as logits or as
probabilities (models whose heads end in a sigmoid, as torch-rechub's do), and 0/1 labels
(N, K). It returns the sum over tasks of each task's mean cross-entropy, the per-task means and
the gradient, computed in the forward pass like the pair losses (``ops.fused``), with the data
check inside the op: as one opaque op it keeps ``torch.compile(fullgraph=True)`` working with the
check on. An empty batch gives exactly 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _validation as check
from .fused import accumulation_dtype, register_fused_gradient


def binary_cross_entropy(scores: Tensor, labels: Tensor, *, probabilities: bool, validate: bool) -> tuple[Tensor, Tensor]:
    """(sum over tasks of the mean cross-entropy, differentiable; per-task means (K,), detached)
    of ``scores`` (N, K) against 0/1 ``labels`` (N, K)."""
    loss, task_losses, _ = torch.ops.mlloss.binary_cross_entropy(scores, labels, probabilities, validate)
    return loss, task_losses


@torch.library.custom_op("mlloss::binary_cross_entropy", mutates_args=())
def _binary_cross_entropy_op(
    scores: Tensor, labels: Tensor, probabilities: bool, validate: bool
) -> tuple[Tensor, Tensor, Tensor]:
    if validate:
        check.check_cross_entropy_batch(scores, labels, probabilities=probabilities)
    dtype = accumulation_dtype(scores)
    z = scores.to(dtype)
    y = labels.to(dtype)
    count = max(z.shape[0], 1)
    if probabilities:
        # torch's own rule: log clamped at -100, and the slope's denominator at 1e-12.
        task_sums = F.binary_cross_entropy(z, y, reduction="none").sum(0)
        grad = (z - y) / (z * (1 - z)).clamp(min=1e-12) / count
    else:
        task_sums = F.binary_cross_entropy_with_logits(z, y, reduction="none").sum(0)
        grad = (torch.sigmoid(z) - y) / count
    task_losses = task_sums / count
    # Elementwise ops give transposed scores (a model's logits.t()) a transposed gradient; the
    # fake below, and so torch.compile, expects a contiguous one (a no-op for contiguous scores).
    return task_losses.sum(), task_losses, grad.contiguous()


@_binary_cross_entropy_op.register_fake
def _binary_cross_entropy_fake(scores: Tensor, labels: Tensor, probabilities: bool, validate: bool):
    dtype = accumulation_dtype(scores)
    return (
        scores.new_empty((), dtype=dtype),
        scores.new_empty(scores.shape[1:], dtype=dtype),
        scores.new_empty(scores.shape, dtype=dtype),
    )


register_fused_gradient(_binary_cross_entropy_op)
