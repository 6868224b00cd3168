"""Binary cross-entropy as a fused-loss op: the pointwise term beside the pairwise ones.

``mlloss::binary_cross_entropy`` returns the mean cross-entropy of N logits and its gradient
(sigmoid(z) - y) / N, computed in the forward pass like the pair losses (``ops.fused``), with
the same data check inside the op: as one opaque op it keeps ``torch.compile(fullgraph=True)``
working with the check on. An empty batch gives exactly 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _validation as check
from .fused import accumulation_dtype, register_fused_gradient


def binary_cross_entropy(logits: Tensor, labels: Tensor, *, validate: bool) -> Tensor:
    """Mean binary cross-entropy of ``logits`` (N,) against 0/1 ``labels`` (N, 1), differentiable."""
    return torch.ops.mlloss.binary_cross_entropy(logits, labels, validate)[0]


@torch.library.custom_op("mlloss::binary_cross_entropy", mutates_args=())
def _binary_cross_entropy_op(logits: Tensor, labels: Tensor, validate: bool) -> tuple[Tensor, Tensor]:
    if validate:
        check.raise_for_status(check.data_status(logits, labels, True), logits, labels, True, False)
    dtype = accumulation_dtype(logits)
    z = logits.to(dtype)
    y = labels[:, 0].to(dtype)
    count = max(z.shape[0], 1)
    loss = F.binary_cross_entropy_with_logits(z, y, reduction="sum") / count
    return loss, (torch.sigmoid(z) - y) / count


@_binary_cross_entropy_op.register_fake
def _binary_cross_entropy_fake(logits: Tensor, labels: Tensor, validate: bool) -> tuple[Tensor, Tensor]:
    dtype = accumulation_dtype(logits)
    return logits.new_empty((), dtype=dtype), logits.new_empty(logits.shape, dtype=dtype)


register_fused_gradient(_binary_cross_entropy_op)
