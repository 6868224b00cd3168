"""The suite's interpreter patching (``triton_interpreter.py``): one patch of the language per
launch, restored when the launch ends, no unread overflow bounds, and the same results as
Triton's own interpreter."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter's patching: TRITON_INTERPRET=1", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _twice(x):
    return tl.sum(x * 2.0, axis=0)


@triton.jit
def _calls_kernel(x_ptr, out_ptr, CALLS: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, 16))
    total = 0.0
    for _ in tl.static_range(CALLS):
        total += _twice(x)
    tl.store(out_ptr, total)


def _launch(calls: int) -> float:
    x = torch.arange(16, dtype=torch.float32)
    out = torch.zeros(1)
    _calls_kernel[(1,)](x, out, CALLS=calls)
    return float(out)


def test_a_launch_patches_the_language_once_and_restores_it(monkeypatch):
    """Twelve device function calls, each calling tl.sum (another JIT function), in one launch:
    Triton's patching runs for the launch and once for tl.sum's module, not 24 more times; the
    language is Triton's own again after the launch."""
    wrapper = interpreter._patch_lang
    assert hasattr(wrapper, "original"), "conftest did not install triton_interpreter's patching"
    patched = []

    def counting(fn):
        patched.append(fn.__name__)
        return triton_patch(fn)

    triton_patch = wrapper.original
    monkeypatch.setattr(wrapper, "original", counting)
    assert _launch(12) == 12 * 2 * sum(range(16))
    assert patched[0] == "_calls_kernel" and len(patched) <= 2, patched
    assert tl.core.is_builtin(tl.arange)


def test_installing_it_again_wraps_triton_once():
    from triton_interpreter import patch_the_language_once_per_launch

    wrapper = interpreter._patch_lang
    assert patch_the_language_once_per_launch() is True
    assert interpreter._patch_lang is wrapper and not hasattr(wrapper.original, "original")


@triton.jit
def _product_kernel(a_ptr, b_ptr, out_ptr):
    offsets = tl.arange(0, 4)
    tl.store(out_ptr + offsets, tl.load(a_ptr + offsets) * tl.load(b_ptr + offsets))


def _int32_products() -> torch.Tensor:
    a = torch.tensor([3, 1 << 20, -(1 << 20), 1 << 16], dtype=torch.int32)
    b = torch.tensor([5, 1 << 12, 1 << 12, 1 << 15], dtype=torch.int32)
    out = torch.empty(4, dtype=torch.int32)
    _product_kernel[(1,)](a, b, out)
    return out


def test_integer_arithmetic_gives_the_same_values_without_the_unread_overflow_bounds(monkeypatch):
    """The suite's interpreter computes no overflow bounds (nothing reads them without debug), and
    the values do not change: int32 products wrap modulo 2**32 either way, as on a GPU (2**32 -> 0,
    -2**32 -> 0, 2**31 -> -2**31); in debug mode Triton's own arithmetic checks them and refuses."""
    import dataclasses

    from triton_interpreter import skip_the_unchecked_overflow_arithmetic

    builder = interpreter.interpreter_builder
    assert skip_the_unchecked_overflow_arithmetic() is True and builder.options.sanitize_overflow is False
    wrapped = [15, 0, 0, -(1 << 31)]
    assert _int32_products().tolist() == wrapped
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    assert _int32_products().tolist() == wrapped  # Triton's default: the bounds computed, not checked
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    assert skip_the_unchecked_overflow_arithmetic() is False and builder.options.sanitize_overflow is True
    with pytest.raises(Exception, match="int32 overflow detected for operation mul"):
        _int32_products()


@triton.jit
def _reduced_bounds_kernel(x_ptr, out_ptr, B: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, B))
    steps = 0
    for _ in range(tl.min(x, axis=0), tl.max(x, axis=0)):  # loop bounds a reduction computed, as kernels.dense's
        steps += 1
    tl.store(out_ptr, steps)


def test_the_numpy_check_names_the_versions_whose_interpreter_fails_on_computed_loop_bounds():
    from mlloss.kernels._common import interpreter_numpy_problem

    assert "triton-lang/triton#9171" in interpreter_numpy_problem("3.6.0", "2.4.6")
    assert "numpy<2.4" in interpreter_numpy_problem("3.6.0+git1a2b", "2.4.0rc1")
    assert interpreter_numpy_problem("3.6rc1", "2.4.6") is not None  # the minor's leading digits: 6, not 61
    for triton_version, numpy_version in (("3.7.0", "2.4.6"), ("3.10.1", "2.5.0"), ("3.6.0", "2.3.5"), ("3.5.1", "1.26.4")):
        assert interpreter_numpy_problem(triton_version, numpy_version) is None
    # against the installed versions: the check says a launch fails exactly when it does
    import numpy

    x, out = torch.tensor([3, 9, 5, 17], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    if interpreter_numpy_problem(triton.__version__, numpy.__version__) is None:
        _reduced_bounds_kernel[(1,)](x, out, B=4)
        assert int(out) == 14
    else:
        with pytest.raises(Exception, match="0-dimensional"):
            _reduced_bounds_kernel[(1,)](x, out, B=4)
