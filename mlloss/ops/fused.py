"""What every fused-loss op shares: its dtype rule, its registration and its autograd formula.

A fused-loss op's forward returns ``(loss, *statistics, grad)``: the gradient of the loss with
respect to the op's first input is computed in the forward pass (Liger-Kernel's fused losses)
and backward only scales it by the incoming gradient. The statistics are not differentiable,
and the gradient only once: a second derivative raises (``SECOND_DERIVATIVE_MESSAGE``). Of the
``torch.func`` transforms, ``grad`` and ``jacrev`` work; ``vmap`` over the inputs and forward
mode (``jvp``, ``jacfwd``, ``hessian``) raise with what to do instead.

``fused_loss_op`` registers the Python implementation as a ``torch.library`` operator
(``define``, one ``impl`` for every device, a fake and the autograd formula), which
``torch.compile`` keeps opaque, and returns the function the losses call. In eager mode that
function runs the implementation inside a ``torch.autograd.Function`` without passing through
the operator: ``torch.library.custom_op`` wraps every call in Python checks and its own autograd
layers (pytorch/pytorch#139500, #176592). One grouped ``AUCLoss`` forward + backward at N = 1,024
took 413 us of host time through a ``custom_op`` and 301 us this way (an earlier version of
benchmarks/host_time.py, interpreted kernels, this repository's 2-core CPU). Outside the
torch.func transforms the Function's C++ apply is called directly (see ``fused_loss``). A test
checks that the operator's autograd and the eager path give the same bits (tests/test_compile.py).

Device: the op runs with its scores' CUDA device current (``current_device_of``). Triton launches
a kernel on the current device, where PyTorch's ops follow their tensors: a model on cuda:1 in a
process whose current device is cuda:0 would otherwise get its kernels launched on cuda:0.

Dtypes: float64 scores are computed, and come back, in float64; float32, bfloat16 and float16
scores in float32 (fp32 accumulation), loss and gradient alike; backward casts the gradient to
the scores' dtype.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import Tensor
from torch._functorch.utils import unwrap_dead_wrappers
from torch._subclasses.fake_tensor import FakeTensor

# The namespace of every mlloss operator (torch.ops.mlloss.*).
LIBRARY = torch.library.Library("mlloss", "DEF")
# Each op's Python implementation, by its name (benchmarks/op_count.py counts what it issues).
IMPLEMENTATIONS: dict[str, Callable] = {}


def accumulation_dtype(scores: Tensor) -> torch.dtype:
    """float64 for float64 scores, float32 for the narrower floats."""
    if scores.dtype == torch.float64:
        return torch.float64
    if scores.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"scores must be a floating tensor (fp16/bf16/fp32/fp64); got dtype {scores.dtype}")


def current_device_of(tensor: Tensor):
    """A context that makes ``tensor``'s CUDA device the current one, if another is (else none)."""
    if tensor.device.type == "cuda" and tensor.device.index != torch.cuda.current_device():
        return torch.cuda.device(tensor.device)
    return contextlib.nullcontext()


def fused_loss_op(implementation: Callable, fake: Callable, *, eager: Callable | None = None) -> Callable:
    """Register ``implementation`` (annotated: its schema is inferred from them; returns
    ``(loss, ..., grad)``) as the operator ``mlloss::<its name without leading underscores and
    ``_op``>``, with ``fake`` for meta and fake tensors and the autograd formula below, and return
    a function of its arguments that differentiates the loss with respect to the first: under
    ``torch.compile`` (and for meta or fake tensors) the operator, opaque to the compiler; in
    eager mode ``eager`` (default: the implementation; the same results by other means, such as
    ``replay``'s CUDA graphs, which must not run inside a compiled graph's memory pool) inside a
    ``torch.autograd.Function``, without the dispatcher's round trip through the operator.
    Either way it runs on its scores' device."""
    name = implementation.__name__.strip("_").removesuffix("_op")
    LIBRARY.define(name + torch.library.infer_schema(implementation, mutates_args=()))

    def on_scores_device(*inputs, run=implementation):
        with current_device_of(inputs[0]):
            return run(*inputs)

    LIBRARY.impl(name, on_scores_device, "CompositeExplicitAutograd")  # the same code on every device
    eager = eager or implementation
    qualname = f"mlloss::{name}"
    torch.library.register_fake(qualname, fake, lib=LIBRARY)
    torch.library.register_autograd(qualname, _scale_gradient, setup_context=_save_gradient, lib=LIBRARY)
    IMPLEMENTATIONS[name] = implementation
    op = getattr(torch.ops.mlloss, name).default

    class FusedGradient(torch.autograd.Function):
        # forward without ctx and a separate setup_context: the form torch.func.grad accepts
        @staticmethod
        def forward(*inputs):
            return on_scores_device(*inputs, run=eager)

        @staticmethod
        def setup_context(ctx, inputs, outputs):
            _save_gradient(ctx, inputs, outputs)
            # For a second derivative's error (``_scale_gradient``) only, so not saved for
            # backward: scores changed in place after the call (logits.sigmoid_()) keep working.
            ctx.scores = inputs[0]

        backward = staticmethod(_scale_gradient)

        @staticmethod
        def vmap(info, in_dims, *inputs):
            raise RuntimeError(BATCHING_MESSAGE)

        @staticmethod
        def jvp(ctx, *tangents):
            raise RuntimeError(FORWARD_MODE_MESSAGE)

    # ``Function.apply`` binds the arguments to ``forward``'s signature on every call (for
    # ``forward(*inputs)`` a no-op, about 14 us of inspect.signature on this repository's CPU)
    # before the C++ apply it ends in. Outside the torch.func transforms, which need that path,
    # the C++ apply is called directly: the same autograd node and outputs.
    autograd_apply = super(torch.autograd.Function, FusedGradient).apply

    def fused_loss(*inputs):
        scores = inputs[0]
        if torch.compiler.is_compiling() or scores.is_meta or isinstance(scores, FakeTensor):
            return op(*inputs)  # traced: the fake gives the outputs' shapes and dtypes
        if torch._C._are_functorch_transforms_active():
            return FusedGradient.apply(*inputs)
        return autograd_apply(*unwrap_dead_wrappers(inputs))

    fused_loss.__name__ = fused_loss.__qualname__ = name
    return fused_loss


def _save_gradient(ctx, inputs, output) -> None:
    ctx.scores_dtype = inputs[0].dtype
    ctx.num_inputs = len(inputs)
    ctx.set_materialize_grads(False)  # no zero tensors for the outputs nobody differentiates
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(output[-1])


def _scale_gradient(ctx, grad_loss: Tensor | None, *_):
    (grad,) = ctx.saved_tensors
    scaled = None if grad_loss is None else (grad * grad_loss).to(ctx.scores_dtype)
    scores = getattr(ctx, "scores", None)  # eager calls; a compiled graph has no double backward
    if scaled is not None and torch.is_grad_enabled() and scores is not None and scores.requires_grad:
        # backward(create_graph=True): the gradient depends on the scores, but through a formula
        # no autograd graph records. Differentiating it would silently drop that dependence (a
        # gradient penalty's share of the parameters' gradient); it raises instead.
        scaled = _NoSecondDerivative.apply(scores, scaled)
    return (scaled,) + (None,) * (ctx.num_inputs - 1)


SECOND_DERIVATIVE_MESSAGE = (
    "mlloss losses compute their gradient in the forward pass, as a formula without an autograd graph: "
    "their second derivatives (a gradient penalty on the scores, a Hessian-vector product) are not supported. "
    "backward(create_graph=True) works as long as nothing differentiates the losses' gradient again"
)


# What the eager path (``FusedGradient``) says to the torch.func transforms it does not support.
BATCHING_MESSAGE = (
    "mlloss losses do not support torch.vmap over their inputs (per-sample gradients, a batch of batches): "
    "their pairs, groups and data check depend on each batch's values. Call the loss once per batch in a loop"
)
FORWARD_MODE_MESSAGE = (
    "mlloss losses support reverse-mode autograd only (loss.backward(), torch.autograd.grad, torch.func.grad, "
    "torch.func.jacrev); forward-mode AD (torch.func.jvp, jacfwd, hessian, torch.autograd.forward_ad) is not supported"
)


class _NoSecondDerivative(torch.autograd.Function):
    """The first derivative as it is, tied to the scores by a node that raises when a second
    derivative reaches it (``torch.autograd.function.once_differentiable`` ties it only to the
    incoming gradient, which is a constant in ``loss.backward(create_graph=True)``)."""

    generate_vmap_rule = True  # torch.func.jacrev batches the backward pass over the loss's cotangents

    @staticmethod
    def forward(scores: Tensor, gradient: Tensor) -> Tensor:
        return gradient.view_as(gradient)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(SECOND_DERIVATIVE_MESSAGE)
