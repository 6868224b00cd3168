"""Shared pieces of the Triton kernels: the surrogate terms of one pair and launch plumbing.

The Triton tier's surrogate maths is ``reverse_margin_terms``, written once and used by every
kernel (``pairwise``, ``hardest``); it branches on a surrogate's index in the one table of names,
``mlloss.surrogates.TABLE`` (the PyTorch tier's formulas), whose order fixes the ids. A new
surrogate gets one more branch here. A pair's terms are written in its *reverse margin* x = s_lower - s_upper (= -t, t the margin
of the loss spec): every surrogate is then a function f(x) with a non-negative "pull"
f'(x) = -phi'(t), the force that raises the upper item and lowers the lower one
(loss spec, table):

* logistic     f = softplus(x) = max(x, 0) + log(1 + exp(-|x|)),  pull = sigmoid(x)
* hinge        f = max(0, m + x),                                  pull = 1 where m + x > 0
* squared      f = (m + x)^2,                                      pull = 2 (m + x)
* exponential  f = exp(x),                                         pull = exp(x)

Two branches, chosen at trace time by the ``FAST`` constexpr:

* fast (CUDA, float32): the special-function unit's approximations ``ex2.approx``,
  ``lg2.approx`` and ``rcp.approx`` through inline PTX. The caller multiplies the scores by
  log2(e) once per tile row/column (``score_scale``), so x arrives in base-2 units and no
  per-pair multiply is needed; ``value_scale`` = ln 2 turns the base-2 softplus back into the
  natural-log loss once per row. 3 special-function ops per pair with the value, 2 without.
  (The logistic value's reciprocal 1 / (1 + 2^-|x|) on the FMA pipe instead, a line and three
  Newton steps, was an option until an H100 timed it: 7% slower for AUC and 10% for LaA at
  N = 2^20, ``benchmarks/results/nvidia-h100-80gb-hbm3-tiles-8fc0c10.md``.)
* exact (the interpreter, float64, CPU): ``tl.exp``/``tl.log`` and IEEE division; the log1p is
  Goldberg's trick, since libdevice calls do not run in the interpreter.

The fast logistic has a second form for a whole tile, ``factored_logistic_terms``: 2^x of the pair
(m, n) is a_m * b_n, one ex2 per row (once per row block) and one per column of the tile, so that
a pair costs rcp (and lg2 with the value) and an FMA: 3 special-function ops a pair over the two
passes instead of 5. It serves row blocks whose scores span at most 64 in base-2 units
(``factored_span``); the kernel runs the per-pair terms for the others.

The interpreter cannot run inline PTX. There ``_special`` computes the same functions exactly
(``tl.exp2``, ``tl.log2``, division), so that the fast branch's base-2 algebra runs and is tested
on the CPU when a test asks for it (``benchmarks/cuda_specializations.py`` records the CUDA
launches that way); the approximations' own error (about 2^-22 relative) is a GPU measurement.
"""

from __future__ import annotations

import re

import torch
import triton
import triton.language as tl

from .._validation import check_choice, check_one_device
from ..surrogates import NAMES

__all__ = [
    "INTERPRET",
    "LOG2E",
    "SURROGATES",
    "cdiv",
    "factored_logistic_terms",
    "factored_rows",
    "factored_span",
    "fast_math",
    "int32_addressable",
    "launch_target",
    "next_cell",
    "rank_at",
    "reverse_margin_terms",
    "score_scale",
    "surrogate_id",
    "tl_dtype",
    "validate_device",
    "value_scale",
]

#: Whether ``@triton.jit`` produced interpreted (CPU, numpy) functions. Triton decides this
#: once, when the kernels are decorated at import time.
INTERPRET: bool = bool(triton.knobs.runtime.interpret)


def interpreter_numpy_problem(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton's interpreter cannot run every kernel with these versions, or None.

    Before Triton 3.7 the interpreter turns a loop bound that a kernel computed (a reduction: the
    layout kernels' block ranges, the dense kernels' run bounds) into a Python int with ``int(array)``,
    which NumPy 2.4 refuses for an array of one element (triton-lang/triton#9171, fixed in 3.7):
    those launches fail with ``InterpreterError: ... only 0-dimensional arrays can be converted``.
    """
    def major_minor(version: str) -> tuple[int, ...]:  # the leading digits of the first two fields: "2.4rc1" -> (2, 4)
        return tuple(int(re.match(r"\d*", part).group() or 0) for part in (version.split(".") + ["0"])[:2])

    if major_minor(triton_version) < (3, 7) and major_minor(numpy_version) >= (2, 4):
        return (f"Triton {triton_version}'s interpreter (TRITON_INTERPRET=1) fails on the kernels' computed loop "
                f"bounds with NumPy {numpy_version} (triton-lang/triton#9171, fixed in Triton 3.7): install "
                "'numpy<2.4' or 'triton>=3.7' to run the Triton kernels on the CPU")
    return None


if INTERPRET:
    import warnings

    import numpy

    _problem = interpreter_numpy_problem(triton.__version__, numpy.__version__)
    if _problem is not None:
        warnings.warn(_problem, RuntimeWarning, stacklevel=2)

# Batch sizes are launch arguments that Triton does not specialize on: each launched kernel names
# them in its ``do_not_specialize`` (N; block, chunk and rank counts and strides, which follow N).
# Triton compiles a kernel again for each new pattern of its int arguments (equal to 1, a multiple
# of 16, neither). With the sizes specialized, batches whose size changes (users kept whole make N
# vary around the batch size) compiled the kernels again, a pause in training each time (four
# batches compiled most kernels two or three times: tests/test_cuda_specializations.py). Likewise
# the alignment of the pointers that the dense kernels and the data check read from the caller's
# tensors as they are (groups, mask, labels: slices of a data set's columns start anywhere). The
# kernels' SASS figures (benchmarks/kernel_sass.py) are those of code compiled without these hints.

#: Surrogate name -> the integer the kernels branch on (a ``tl.constexpr``: every surrogate
#: compiles to its own straight-line loop), in the order of the one table of names.
SURROGATES: dict[str, int] = {name: index for index, name in enumerate(NAMES)}

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints, for grids and block counts. (``triton.cdiv`` is a
    ``ConstexprFunction`` in Triton 3.9, about 2 us a call, several per loss call.)"""
    return -(-a // b)


def int32_addressable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when the offset of its last element (from its strides) fits in int32, as
    the kernels that read a caller's strided view compute it, else a contiguous copy."""
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0)
    return tensor if last < 2**31 else tensor.contiguous()


def surrogate_id(surrogate: str) -> int:
    """Map a surrogate name to the kernels' constexpr id, rejecting unknown names."""
    return SURROGATES[check_choice("surrogate", surrogate, NAMES)]


def tl_dtype(dtype: torch.dtype):
    return {torch.float32: tl.float32, torch.float64: tl.float64}[dtype]


def launch_target(device: torch.device) -> str:
    """``"cuda"`` for kernels compiled for a CUDA device, else ``"interpreter"``: the key of every
    per-target launch choice (tiles, blocks, chunks, fast math). The one place that decides it, so
    that ``benchmarks/cuda_specializations.py`` can record the CUDA choices under the interpreter."""
    return "cuda" if device.type == "cuda" and not INTERPRET else "interpreter"


def fast_math(device: torch.device, accumulation: torch.dtype) -> bool:
    """The approximate special functions: compiled CUDA kernels accumulating in float32."""
    return launch_target(device) == "cuda" and accumulation == torch.float32


def score_scale(surrogate: str, fast: bool) -> float:
    """Factor applied to the scores so that the fast branch sees x in base-2 units."""
    return LOG2E if fast and surrogate in ("logistic", "exponential") else 1.0


def value_scale(surrogate: str, fast: bool) -> float:
    """Factor turning the accumulated values back into the loss (ln 2 for the base-2 softplus)."""
    return LN2 if fast and surrogate == "logistic" else 1.0


def validate_device(*tensors: torch.Tensor | None) -> None:
    """All inputs (None for an absent optional one) on one device, and one that Triton runs on:
    CUDA, or the CPU under the interpreter (``TRITON_INTERPRET=1`` set before triton was imported)."""
    device = check_one_device(*(tensor for tensor in tensors if tensor is not None))
    if device.type == "cpu" and not INTERPRET:
        raise RuntimeError(
            "the Triton kernels need CUDA tensors; to run them on the CPU set TRITON_INTERPRET=1 "
            "before importing triton / mlloss.kernels"
        )


# The special-function unit's approximations, one ``_special`` op each: "ex2" (2^x), "ex2_neg"
# (2^-x), "ex2_neg_abs" (2^-|x|), "lg2" (log2 x), "rcp" (1 / x). The negation and absolute value
# of ex2_neg / ex2_neg_abs are written in PTX so that ptxas folds them into the unit's operand
# modifiers (computed in LLVM they cost a sign-bit LOP3 per pair). The PTX strings are literals,
# not module constants: Triton compares every module constant a kernel reads with its value at
# compile time on each launch (about 0.5 us each, benchmarks/host_time.py).
if INTERPRET:

    @triton.jit
    def _special(x, OP: tl.constexpr):
        """The interpreter's stand-in for the PTX op (see the module docstring): exact."""
        if OP == "ex2":
            y = tl.exp2(x)
        elif OP == "ex2_neg":
            y = tl.exp2(-x)
        elif OP == "ex2_neg_abs":
            y = tl.exp2(-tl.abs(x))
        elif OP == "lg2":
            y = tl.log2(x)
        else:
            tl.static_assert(OP == "rcp")
            y = 1.0 / x
        return y

else:

    @triton.jit
    def _special(x, OP: tl.constexpr):
        """One special-function-unit op of float32 x, as inline PTX."""
        if OP == "ex2":
            ptx: tl.constexpr = "ex2.approx.ftz.f32 $0, $1;"
        elif OP == "ex2_neg":
            ptx: tl.constexpr = "{ .reg .f32 t; neg.f32 t, $1; ex2.approx.ftz.f32 $0, t; }"
        elif OP == "ex2_neg_abs":
            ptx: tl.constexpr = "{ .reg .f32 t; abs.f32 t, $1; neg.f32 t, t; ex2.approx.ftz.f32 $0, t; }"
        elif OP == "lg2":
            ptx: tl.constexpr = "lg2.approx.ftz.f32 $0, $1;"
        else:
            tl.static_assert(OP == "rcp")
            ptx: tl.constexpr = "rcp.approx.ftz.f32 $0, $1;"
        return tl.inline_asm_elementwise(ptx, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _log1p_small(e):
    """log(1 + e) for e in [0, 1] without libdevice: with u = fl(1 + e), log(u) * e / (u - 1)
    cancels the rounding error of forming u; when u rounds to 1, log1p(e) == e."""
    u = 1.0 + e
    return tl.where(u == 1.0, e, tl.log(u) * e / tl.where(u == 1.0, 1.0, u - 1.0))


@triton.jit
def reverse_margin_terms(x, margin, SURROGATE: tl.constexpr, NEED_VALUE: tl.constexpr, FAST: tl.constexpr):
    """(f(x), f'(x)) of the module docstring for reverse margins x (base-2 units when FAST and
    the surrogate is logistic or exponential). Without NEED_VALUE the value is 0 and costs
    nothing. The fast logistic value is in base-2 units (times ln 2 afterwards)."""
    if SURROGATE == 0:  # logistic (the ids: mlloss.surrogates.TABLE's order)
        if FAST:
            if NEED_VALUE:
                # One exp of -|x| serves both terms and cannot overflow.
                e = _special(x, "ex2_neg_abs")
                r = _special(1.0 + e, "rcp")
                pull = tl.where(x >= 0, r, e * r)
                value = tl.maximum(x, 0.0) + _special(1.0 + e, "lg2")
            else:
                # sigmoid(x) = 1 / (1 + 2^-x'): 2^-x' = inf gives 0, 2^-x' = 0 gives 1.
                pull = _special(1.0 + _special(x, "ex2_neg"), "rcp")
                value = 0.0
        else:
            e = tl.exp(-tl.abs(x))
            pull = tl.where(x >= 0, 1.0, e) / (1.0 + e)
            if NEED_VALUE:
                value = tl.maximum(x, 0.0) + _log1p_small(e)
            else:
                value = 0.0
    elif SURROGATE == 1:  # hinge
        gap = margin + x
        pull = tl.where(gap > 0, 1.0, 0.0)  # subgradient 0 at the kink
        value = tl.maximum(gap, 0.0, propagate_nan=tl.PropagateNan.ALL)  # a NaN score stays NaN
    elif SURROGATE == 2:  # squared
        gap = margin + x
        pull = 2.0 * gap
        value = gap * gap
    else:  # exponential
        if FAST:
            pull = _special(x, "ex2")
        else:
            pull = tl.exp(x)
        value = pull
    return value, pull


@triton.jit
def shared_pull(pull, share):
    """An item's part of a max-violation pair's pull: ``pull * share``, and 0 where it has no
    share even if the pull is infinite (the pair of an unchecked infinite score: inf * 0 would
    make NaN the gradient of every item of the group but the extremes, where the PyTorch tier
    gives 0); a NaN pull stays NaN."""
    return tl.where((share == 0) & (pull == pull), 0.0, pull * share)


@triton.jit
def factored_span(s_m, row_mask):
    """(fits, centre) of a row block of base-2 scores for ``factored_logistic_terms``: whether
    the scores span at most 64 (natural scores within ~44 of each other; an infinity fails; a
    NaN is skipped by CUDA's max and min and fails the interpreter's, and its terms are NaN either
    way) and the middle of their range."""
    top = tl.max(tl.where(row_mask, s_m, -float("inf")), axis=0)
    bottom = tl.min(tl.where(row_mask, s_m, float("inf")), axis=0)
    centre = 0.5 * top + 0.5 * bottom  # not (top + bottom) / 2, which overflows near the float max
    return top - bottom <= 64.0, centre


@triton.jit
def factored_rows(s_m, centre, row_mask):
    """Each row's factor a = 2^(centre - s_m) for ``factored_logistic_terms``, in [2^-32, 2^32]
    for a block that fits (``factored_span``); 1 outside ``row_mask``."""
    return tl.where(row_mask, _special(centre - s_m, "ex2"), 1.0)


@triton.jit
def factored_logistic_terms(a, s_n, centre, NEED_VALUE: tl.constexpr):
    """The fast logistic's (value, pull) of a tile whose 2^x factors into a row and a column term.

    With base-2 scores, the pair of row item m and column item n has 2^x = 2^(s_n - s_m) =
    a_m * b_n: a_m = 2^(centre - s_m) once per row (``factored_rows``, for a block that fits:
    a_m in [2^-32, 2^32]) and b_n = 2^(s_n - centre) once per column here. A pair then costs one FMA
    for q = 1 + 2^x, ``rcp`` (and ``lg2`` with the value): 2 special-function ops with the value
    and 1 without, instead of 3 and 2 (``reverse_margin_terms``), as ex2 moves from the pairs to
    the columns.

    b_n is capped at 2^92 (then a_m b_n <= 2^124: q, 1 / q and the products stay normal floats);
    past the cap x >= 60, so the pull 2^x / q is 1 and the softplus log2(q) + the excess
    ``t - 92`` to float32 precision. Below, b_n may flush to 0 (x <= -94: value and pull 0). NaN
    scores stay NaN. Returns the value (base-2 units, 0 without NEED_VALUE) and the pull: 1 / q
    for lower rows, and for upper rows (NEED_VALUE) b_n / q, the pull divided by a_m, which the
    caller multiplies back once per row after the tile loops."""
    t = s_n - centre
    b = _special(tl.minimum(t, 92.0, propagate_nan=tl.PropagateNan.ALL), "ex2")
    q = a[:, None] * b[None, :] + 1.0
    r = _special(q, "rcp")
    if NEED_VALUE:
        value = _special(q, "lg2") + tl.maximum(t - 92.0, 0.0)[None, :]
        pull = b[None, :] * r
    else:
        value = 0.0
        pull = r
    return value, pull


@triton.jit
def rank_at(order_row, rank_row, positions, mask):
    """The level rank of the item at each sorted position of a ``PairLayout`` (0 outside ``mask``)."""
    return tl.load(rank_row + tl.load(order_row + positions, mask=mask, other=0), mask=mask, other=0)


@triton.jit
def group_spans(group_start_ptr, group_end_ptr, positions, mask, N, HAS_GROUPS: tl.constexpr):
    """(start, end) of each position's group in a ``PairLayout``: [0, N) without groups, and
    [0, 1) outside ``mask`` with them."""
    if HAS_GROUPS:
        start = tl.load(group_start_ptr + positions, mask=mask, other=0)
        end = tl.load(group_end_ptr + positions, mask=mask, other=1)
    else:
        start = tl.zeros_like(positions)
        end = tl.zeros_like(positions) + N
    return start, end


@triton.jit
def next_cell(order_row, rank_row, cell_end_row, start, group_end, mask):
    """One step of a walk over a group's cells in level order (a ``PairLayout``'s positions
    sorted by level within each group): (here, end, level) of the cell that starts at position
    ``start``: ``here`` while the walk is inside the group (and ``mask``), the cell's end
    position and its level's rank. The next step starts at ``where(here, end, start)``. One step
    per level present visits every cell of the group: a loop of a fixed count for problems of a
    few levels (``mlloss.ops.layout.MAX_WALK_LEVELS``), or until no walk of a block is ``here``."""
    here = mask & (start < group_end)
    level = rank_at(order_row, rank_row, start, here)
    end = tl.load(cell_end_row + start, mask=here, other=0)
    return here, end, level
