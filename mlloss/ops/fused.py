"""Autograd for fused-loss ops: ops whose forward returns ``(loss, *statistics, grad)``.

The gradient of the loss with respect to the op's first input is computed in the forward pass
(Liger-Kernel's fused losses); backward only scales it by the incoming gradient. The
statistics and the gradient itself are not differentiable.
"""

from __future__ import annotations

from torch import Tensor


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
