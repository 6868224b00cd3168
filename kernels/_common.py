"""Shared pieces of the pairwise Triton kernels: surrogate math and launch plumbing.

The device helpers here are written to run both compiled on CUDA and under
``TRITON_INTERPRET=1`` on the CPU, which rules out libdevice (``log1p`` and
friends fail in the interpreter). Everything is computed from a single
``exp(-|t|)`` so no intermediate can overflow for the bounded surrogates.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "INTERPRET",
    "SURROGATES",
    "check_finite_exponential",
    "compute_dtype",
    "default_blocks",
    "surrogate_and_derivative",
    "surrogate_id",
    "validate_device",
]

#: Whether ``@triton.jit`` produced interpreted (CPU, numpy) functions. Triton
#: decides this once, when the kernels are decorated at import time.
INTERPRET: bool = bool(triton.knobs.runtime.interpret)

#: Surrogate name -> the integer the kernels branch on (a ``tl.constexpr``,
#: so every surrogate compiles to its own straight-line kernel).
SURROGATES: dict[str, int] = {"logistic": 0, "hinge": 1, "squared": 2, "exponential": 3}


def surrogate_id(surrogate: str) -> int:
    """Map a surrogate name to the kernel's constexpr id, rejecting unknown names."""
    try:
        return SURROGATES[surrogate]
    except KeyError:
        raise ValueError(f"unknown surrogate {surrogate!r}; expected one of {sorted(SURROGATES)}") from None


def compute_dtype(scores: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64, every narrower float is upcast to float32."""
    if scores.dtype == torch.float64:
        return torch.float64
    if scores.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise TypeError(f"scores must be a floating tensor (fp16/bf16/fp32/fp64), got {scores.dtype}")


def validate_device(*tensors: torch.Tensor) -> None:
    """All inputs must share one device, and that device must be one Triton can run on.

    Compiled Triton needs CUDA tensors; the interpreter (``TRITON_INTERPRET=1`` set
    before triton was imported) runs on CPU tensors.
    """
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"all inputs must be on one device, got {device} and {t.device}")
    if device.type == "cpu" and not INTERPRET:
        raise RuntimeError(
            "the Triton pairwise kernels need CUDA tensors; to run them on the CPU set "
            "TRITON_INTERPRET=1 before importing triton / mlloss.kernels"
        )


def default_blocks(device: torch.device) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) when the caller gives none.

    The interpreter pays ~ms per program-and-tile step regardless of the tile size,
    so big tiles are cheapest there. On CUDA, 64 x 64 keeps the fp32 tile plus its
    exp/log temporaries in registers at 4 warps (the flash-attention sweet spot);
    block sizes are fixed rather than autotuned so that the partial-loss buffer has a
    known size and results are reproducible run to run.
    """
    if device.type == "cpu":
        return 128, 128
    return 64, 64


def check_finite_exponential(loss: torch.Tensor) -> None:
    """Raise if the exponential surrogate overflowed the accumulation dtype.

    Every pair term ``coef * c * exp(-t)`` is >= 0 and each gradient entry is a
    partial sum of those terms, so a finite loss bounds every gradient entry:
    checking the scalar loss (one device sync, only for this surrogate) is enough.
    ``exp(-t)`` overflows float32 once ``t < -88.7``.
    """
    if not bool(torch.isfinite(loss)):
        raise OverflowError(
            "exponential surrogate overflowed in the Triton pairwise kernel "
            f"(loss = {loss.item()}): some pair has s_i - s_j below about -88 (float32) or "
            "-709 (float64). Use the library's exact O(N) log-domain exponential path, or "
            "rescale the scores."
        )


@triton.jit
def _log1p_small(e):
    """log(1 + e) for e in [0, 1], accurate for tiny e without libdevice.

    Goldberg's trick: with u = fl(1 + e), log(u) * e / (u - 1) cancels the rounding
    error of forming u; when u rounds to exactly 1, log1p(e) == e to working precision.
    """
    u = 1.0 + e
    return tl.where(u == 1.0, e, tl.log(u) * e / (u - 1.0))


@triton.jit
def surrogate_and_derivative(t, margin, SURROGATE: tl.constexpr, NEED_PHI: tl.constexpr):
    """phi(t) and phi'(t) for the margin t = s_upper - s_lower.

    SURROGATE: 0 logistic  phi = softplus(-t) = max(-t, 0) + log1p(exp(-|t|)),
                           phi' = -sigmoid(-t), both from one e = exp(-|t|);
               1 hinge     phi = max(0, m - t), phi' = -1 where m - t > 0 else 0
                           (subgradient 0 at the kink t == m);
               2 squared   phi = (m - t)^2, phi' = -2 (m - t);
               3 exponential phi = exp(-t), phi' = -exp(-t) (overflows for very
                           negative t; the host checks the loss is finite).
    With NEED_PHI false (the column-owning pass, which only needs gradients) phi is
    returned as 0 and its log is never evaluated.
    """
    if SURROGATE == 0:
        e = tl.exp(-tl.abs(t))
        # sigmoid(-t) = e / (1 + e) for t >= 0 and 1 / (1 + e) for t < 0.
        dphi = -tl.where(t >= 0, e, 1.0) / (1.0 + e)
        if NEED_PHI:
            phi = tl.maximum(-t, 0.0) + _log1p_small(e)
        else:
            phi = tl.zeros_like(t)
    elif SURROGATE == 1:
        z = margin - t
        dphi = tl.where(z > 0, -1.0, 0.0).to(t.dtype)
        phi = tl.maximum(z, 0.0)
    elif SURROGATE == 2:
        z = margin - t
        dphi = -2.0 * z
        phi = z * z
    else:
        e = tl.exp(-t)
        dphi = -e
        phi = e
    return phi, dphi
