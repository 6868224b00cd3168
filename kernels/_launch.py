"""Kernel launches without Triton's per-launch Python, once a kernel is compiled.

``kernel[grid](*args, **constexprs)`` on a ``@triton.jit`` function binds and specializes every
argument, hashes a cache key, merges the launch options and reads Triton's knobs, on every launch:
12-24 us of host time a launch on this repository's CPU (``benchmarks/host_time.py``; benchmarks/README.md,
"Host time"), where the compiled kernel's C launcher takes about 0.4 us. A loss call launches two to seven kernels, and at
the batch sizes recommenders train with the call is bound by its host path. PyTorch's Inductor
calls its compiled Triton kernels' launchers directly for the same reason.

``launcher(kernel)[grid](*args, **kwargs)`` launches like ``kernel[grid](...)``. The first launch
of a new *key* goes through Triton, which compiles the kernel (or finds it compiled) and returns
it; later launches with that key call the compiled kernel's launcher with the arguments in the
kernel's signature order. The key holds everything Triton specializes a launch on, and more: the
current device; the launch options (``num_warps``, ...); every constexpr's value; each tensor's
dtype and 16-byte alignment; each int's equality to 1, divisibility by 16 and width (Triton's
``do_not_specialize`` ints included, so a batch size falls in one of a few classes); the type of
each other argument. So a launch reuses a compiled kernel only where Triton would have.

Triton's own path is taken whenever this one cannot stand in for it: under the interpreter
(``TRITON_INTERPRET=1``: ``launcher`` returns the kernel, run without NumPy's floating-point
warnings, ``Interpreted``), when a launch hook is set (a
profiler such as Proton), when the kernel has pre-run hooks, and when the arguments are not the
runtime ones by position and every constexpr by name. Knob settings that change
code generation (``TRITON_DEBUG``, ...) are read by the first launch of each key.

``MLLOSS_TRITON_LAUNCH=triton`` in the environment (read at import) sends every launch through
Triton's path: the way to rule this module out when a launch misbehaves.

Every compilation, on either path, takes ``COMPILE_OPTIONS``: floating-point fusion (FMA) on.
The kernels' instruction budgets count fused multiply-adds (``benchmarks/kernel_sass.py``: the
ordinal logistic loop 11.1 instructions per pair with them, 14.3 without), and Triton 3.9 warns
at every first compilation that 3.10 turns fusion off by default (``TRITON_DEFAULT_FP_FUSION``);
``TRITON_FORCE_DISABLE_FP_FUSION=1`` still turns it off.
"""

from __future__ import annotations

import functools
import os

import torch
from triton import knobs
from triton.runtime.driver import driver

from ._common import INTERPRET

__all__ = ["COMPILE_OPTIONS", "launcher"]

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
#: Compile options of every launch (see the module docstring); not in the launch key: constant.
COMPILE_OPTIONS = {"enable_fp_fusion": True}
LAUNCH_ENV = "MLLOSS_TRITON_LAUNCH"
#: Whether launches after a kernel's first take the compiled launcher ("direct", the default) or
#: always Triton's path ("triton").
DIRECT = os.environ.get(LAUNCH_ENV, "direct") != "triton"


class Launcher:
    """A ``@triton.jit`` function's launches, each key's compiled kernel kept (see the module)."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.names = [param.name for param in kernel.params]
        constexpr = [param.is_constexpr for param in kernel.params]
        # The fast path takes the runtime arguments by position and the constexprs by name.
        self.num_runtime = constexpr.index(True) if True in constexpr else len(constexpr)
        self.keywords = {name for name, is_constexpr in zip(self.names, constexpr) if is_constexpr}
        self.keywords.update(_LAUNCH_OPTIONS)
        self.compiled: dict[tuple, tuple] = {}  # key -> (compiled kernel, its constexprs in order)

    def __getitem__(self, grid):
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, **kwargs) -> None:
        if (callable(grid) or self.kernel.pre_run_hooks or len(args) != self.num_runtime
                or not kwargs.keys() <= self.keywords):
            self.kernel[grid](*args, **kwargs, **COMPILE_OPTIONS)
            return
        device = driver.active.get_current_device()
        key = (device, tuple(kwargs.items()), *[
            (value.dtype, value.data_ptr() % 16 == 0) if isinstance(value, torch.Tensor)
            # Triton's int types are i32, i64 and u64, by range
            else (value == 1, value % 16 == 0, -(2**31) <= value < 2**31, value < 2**63) if type(value) is int
            else type(value)
            for value in args])
        entry = self.compiled.get(key)
        if entry is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            compiled = self.kernel[grid](*args, **kwargs, **COMPILE_OPTIONS)
            try:  # the constexprs in signature order: the key holds their values
                self.compiled[key] = compiled, tuple([kwargs[name] for name in self.names[len(args):]])
            except KeyError:  # a constexpr left to its default: Triton's path every time
                pass
            return
        compiled, constexprs = entry
        stream = driver.active.get_current_stream(device)
        grid = (*grid, 1, 1)
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *constexprs)


def _hooked(hook) -> bool:
    """Whether a launch hook is set: None, or an empty ``HookChain`` (Triton 3.5+), is none."""
    return hook is not None and bool(getattr(hook, "calls", True))


class TritonPath:
    """A kernel whose every launch takes Triton's path (``MLLOSS_TRITON_LAUNCH=triton``), with
    ``COMPILE_OPTIONS``."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return functools.partial(self.kernel[grid], **COMPILE_OPTIONS)


class Interpreted:
    """A kernel run by Triton's interpreter as a GPU runs it: without NumPy's floating-point
    warnings. The interpreter computes every lane of a ``tl.where`` with NumPy, which warns of
    inf - inf, 0 / 0 and overflow in lanes the select then discards (the soft extremes' empty
    parts, ``kernels/scan.py``'s merge); a GPU computes them silently."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        run = self.kernel[grid]

        def launch(*args, **kwargs):
            import numpy

            with numpy.errstate(all="ignore"):
                return run(*args, **kwargs)

        return launch


# by the kernel's id (a JITFunction's hash is its source's: 1 us)
_LAUNCHERS: dict[int, Launcher | Interpreted] = {}


def launcher(kernel):
    """The one ``Launcher`` of ``kernel`` (a module's ``@triton.jit`` function, which lives as long
    as the process); with ``MLLOSS_TRITON_LAUNCH=triton``, Triton's path every launch
    (``TritonPath``); under the interpreter, the kernel run without NumPy's warnings
    (``Interpreted``)."""
    if not INTERPRET and not DIRECT:  # read at every call: benchmarks/check_launcher.py switches it
        return TritonPath(kernel)
    found = _LAUNCHERS.get(id(kernel))
    if found is None:
        found = _LAUNCHERS[id(kernel)] = (Interpreted if INTERPRET else Launcher)(kernel)
    return found
