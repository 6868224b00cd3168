"""What every fused-loss op shares: its dtype rule and its autograd formula.

A fused-loss op's forward returns ``(loss, *statistics, grad)``: the gradient of the loss with
respect to the op's first input is computed in the forward pass (Liger-Kernel's fused losses)
and backward only scales it by the incoming gradient. The statistics and the gradient itself
are not differentiable.

Dtypes: float64 scores are computed, and come back, in float64; float32, bfloat16 and float16
scores in float32 (fp32 accumulation), loss and gradient alike; backward casts the gradient to
the scores' dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def accumulation_dtype(scores: Tensor) -> torch.dtype:
    """float64 for float64 scores, float32 for the narrower floats."""
    if scores.dtype == torch.float64:
        return torch.float64
    if scores.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"scores must be a floating tensor (fp16/bf16/fp32/fp64); got dtype {scores.dtype}")


def register_fused_gradient(op) -> None:
    """Register the autograd formula of a ``torch.library.custom_op`` returning (loss, ..., grad)."""
    op.register_autograd(_scale_gradient, setup_context=_save_gradient)


def _save_gradient(ctx, inputs, output) -> None:
    ctx.scores_dtype = inputs[0].dtype
    ctx.num_inputs = len(inputs)
    ctx.set_materialize_grads(False)  # no zero tensors for the outputs nobody differentiates
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(output[-1])


def _scale_gradient(ctx, grad_loss: Tensor | None, *_):
    (grad,) = ctx.saved_tensors
    scaled = None if grad_loss is None else (grad * grad_loss).to(ctx.scores_dtype)
    return (scaled,) + (None,) * (ctx.num_inputs - 1)
