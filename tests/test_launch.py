"""kernels/_launch.py: a launch reuses a compiled kernel only where Triton would have.

The fast path runs only with compiled kernels (not under the interpreter), so the check runs in a
subprocess with ``TRITON_INTERPRET=0``: the kernels are compiled for sm_90 and launched through
``benchmarks/host_time.py``'s stand-in driver (compiles, launches nothing). For arguments that
differ in everything Triton specializes on (alignment, ints equal to 1 or divisible by 16,
dtypes, constexprs), each launch's key must name the compiled kernel that Triton's own launch
path returns for the same arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

SCRIPT = r"""
import itertools, sys
sys.path.insert(0, sys.argv[1])
import host_time  # sets TRITON_INTERPRET=0 before triton is imported
import torch
from triton import knobs
from mlloss.kernels import _launch
from mlloss.kernels.levels import _pattern_rank_kernel

with host_time.compiled_cuda_launches():
    fast = _launch.launcher(_pattern_rank_kernel)
    base = torch.zeros(4096, dtype=torch.int32)
    table = torch.zeros(64, dtype=torch.int32)
    configs = []
    for offset, out_offset, n, k, dtype in itertools.product((0, 1), (0, 3), (1, 16, 1000), (2, 3),
                                                            (torch.int32, torch.float32)):
        labels = base.to(dtype)[offset:offset + 2 * n].view(n, 2)[:, :1].expand(n, k)
        out = base[out_offset:out_offset + n]
        args = (labels, labels.stride(0), labels.stride(1), table, out, out, out, out, n)  # no check: 3 unread pointers
        configs.append((args, dict(K=k, BLOCK=1024, CHECK=False, MASKED=False, BAD_SCORE=1, BAD_LABEL=2)))
    seen = {}
    for args, kwargs in configs * 2:
        fast[(1,)](*args, **kwargs)
        triton_kernel = _pattern_rank_kernel[(1,)](*args, **kwargs, **_launch.COMPILE_OPTIONS)  # Triton's own path
        keys = [key for key, (kernel, _) in fast.compiled.items() if kernel is triton_kernel]
        assert keys, "the launch's compiled kernel is not Triton's"
        for key in keys:
            assert seen.setdefault(key, triton_kernel) is triton_kernel, key
    distinct_triton = len({id(kernel) for kernel in seen.values()})
    assert distinct_triton > 1, "the configurations should make Triton compile several specializations"
    assert len(fast.compiled) >= distinct_triton

    # The pattern kernel's ints are all do_not_specialize; the combine kernel's num_problems is
    # specialized (equal to 1, divisible by 16, neither): each class its own compiled kernel.
    import triton.language as tl
    from mlloss.kernels.reduce import _combine_kernel
    combine = _launch.launcher(_combine_kernel)
    grad = torch.zeros(17 * 64, dtype=torch.float64)
    sums = torch.zeros(17 * 3 * 64, dtype=torch.float64)
    by_key = {}
    for problems in (1, 16, 17, 32, 1, 17):
        args = (grad, 0, 64, sums, sums, grad, sums, sums, sums, 64, problems, 1)
        kwargs = dict(MEAN=True, HAS_MIXING=False, CHECK=False, ACC=tl.float64, BLOCK=64, SUM_BLOCK=4, SEPARATE=False)
        combine[(1,)](*args, **kwargs)
        triton_kernel = _combine_kernel[(1,)](*args, **kwargs, **_launch.COMPILE_OPTIONS)
        keys = [key for key, (kernel, _) in combine.compiled.items() if kernel is triton_kernel]
        assert keys, f"num_problems={problems}: the launch's compiled kernel is not Triton's"
        for key in keys:
            assert by_key.setdefault(key, triton_kernel) is triton_kernel, (problems, key)
    assert len({id(kernel) for kernel in by_key.values()}) == 3, "1, multiples of 16 and the others"

    # After the first launch of a key, a launch does not enter Triton's launch path ...
    from triton.runtime.jit import JITFunction
    entered = [0]
    jit_run = JITFunction.run
    def counted(self, *a, **kw):
        entered[0] += 1
        return jit_run(self, *a, **kw)
    JITFunction.run = counted
    args, kwargs = configs[0]
    for _ in range(5):
        fast[(1,)](*args, **kwargs)
    assert entered[0] == 0, entered
    # ... unless a launch hook is set: Triton's path hands it to the launcher (which the stand-in
    # driver's launcher does not call)
    def hook(metadata):
        pass
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        fast[(1,)](*args, **kwargs)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert entered[0] == 1, entered
    JITFunction.run = jit_run
print("ok", len(fast.compiled), distinct_triton)
"""


def test_a_launch_reuses_a_compiled_kernel_only_where_triton_would():
    env = dict(os.environ, TRITON_INTERPRET="0")
    env.pop("MLLOSS_TRITON_LAUNCH", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(BENCHMARKS)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("ok"), done.stdout


def test_the_environment_switch_sends_every_launch_through_triton():
    """MLLOSS_TRITON_LAUNCH=triton: launcher() launches through the kernel itself, also for compiled
    kernels, with the library's compile options."""
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import host_time\n"
              "from mlloss.kernels import _launch\n"
              "from mlloss.kernels.levels import _pattern_rank_kernel\n"
              "path = _launch.launcher(_pattern_rank_kernel)\n"
              "assert not _launch.DIRECT and type(path) is _launch.TritonPath and path.kernel is _pattern_rank_kernel\n"
              "assert path[(1,)].keywords == _launch.COMPILE_OPTIONS\n"
              "print('ok')")
    env = dict(os.environ, TRITON_INTERPRET="0", MLLOSS_TRITON_LAUNCH="triton")
    done = subprocess.run([sys.executable, "-c", script, str(BENCHMARKS)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-2000:] + done.stderr[-2000:]


FUSION_SCRIPT = r"""
import sys, warnings
sys.path.insert(0, sys.argv[1])
import host_time  # sets TRITON_INTERPRET=0 before triton is imported
import torch
from mlloss.kernels import _launch
from mlloss.kernels.levels import _pattern_rank_kernel

labels, out = torch.zeros(64, 2, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
args = (labels, 2, 1, torch.zeros(64, dtype=torch.int32), out, out, out, out, 64)  # no check: 3 unread pointers
constants = dict(K=2, BLOCK=1024, CHECK=False, MASKED=False, BAD_SCORE=1, BAD_LABEL=2)
with host_time.compiled_cuda_launches(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for direct in (True, False):
        _launch.DIRECT = direct
        _launch.launcher(_pattern_rank_kernel)[(1,)](*args, **constants, num_warps=2 if direct else 1)
    fast = _launch.launcher.__globals__["_LAUNCHERS"][id(_pattern_rank_kernel)]
    compiled = [kernel for kernel, _ in fast.compiled.values()]
    compiled += list(_pattern_rank_kernel.device_caches[0][0].values())
    assert compiled and all(kernel.metadata.enable_fp_fusion for kernel in compiled), compiled
    assert not [str(w.message) for w in caught if "FP_FUSION" in str(w.message)], caught
    unfused = _pattern_rank_kernel[(1,)](*args, **constants, num_warps=4)  # Triton's default here
    assert not unfused.metadata.enable_fp_fusion
print("ok")
"""


def test_every_launch_compiles_with_fp_fusion_whatever_tritons_default():
    """TRITON_DEFAULT_FP_FUSION=0, Triton 3.10's announced default: the library's launches, direct
    and through Triton's path, still compile with fused multiply-adds (the kernels' instruction
    budgets count them) and Triton does not warn; a launch of the kernel itself gets Triton's
    default, no fusion."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0")
    env.pop("MLLOSS_TRITON_LAUNCH", None)
    done = subprocess.run([sys.executable, "-c", FUSION_SCRIPT, str(BENCHMARKS)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout[-3000:] + done.stderr[-3000:]


def test_under_the_interpreter_a_launch_goes_through_triton():
    """Under TRITON_INTERPRET=1 (this suite) the launcher hands every launch to Triton's
    interpreter, which runs it without NumPy's floating-point warnings: a GPU computes the
    discarded lanes of a select silently (the soft max-violation kernels' empty parts, inf - inf
    and 0 / 0, warned "invalid value encountered in subtract")."""
    import warnings

    import mlloss

    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from mlloss.kernels import _launch
    from mlloss.kernels.levels import pattern_ranks

    if not _launch.INTERPRET:
        pytest.skip("compiled kernels: the subprocess test covers them")
    labels = torch.tensor([[0, 1], [1, 1], [1, 0]], dtype=torch.int32)
    ranks = pattern_ranks(labels, torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    assert ranks.tolist() == [[2, 3, 1]]
    kernel = pattern_ranks.__globals__["_pattern_rank_kernel"]
    assert _launch.launcher(kernel).kernel is kernel and _launch.launcher(kernel) is _launch.launcher(kernel)
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(60, generator=gen, requires_grad=True)
    labels = torch.randint(0, 2, (60, 2), generator=gen).float()
    groups = torch.randint(0, 12, (60,), generator=gen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for loss in (mlloss.PDAOMLoss(temperature=0.5, backend="triton"),
                     mlloss.LaALoss(pairs="hardest", temperature=0.5, backend="triton")):
            loss(scores, labels[:, 0] if isinstance(loss, mlloss.PDAOMLoss) else labels, groups).backward()
    assert not [str(w.message) for w in caught if w.category is RuntimeWarning]


def test_a_call_makes_the_scores_cuda_device_current(monkeypatch):
    """Triton launches on the current CUDA device; PyTorch's ops follow their tensors. A loss of
    scores on cuda:1 while cuda:0 is current enters ``torch.cuda.device(cuda:1)`` for the call (a
    model on a second GPU in a process that never called set_device); on the current device, or on
    the CPU, it enters nothing. (Stand-ins for the device calls: this machine may have no GPU.)"""
    import contextlib

    import torch

    import mlloss
    from mlloss.ops import fused

    entered = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda device: entered.append(device) or contextlib.nullcontext())

    class OnDevice:
        def __init__(self, index):
            self.device = torch.device("cuda", index)

    with fused.current_device_of(OnDevice(1)):
        pass
    with fused.current_device_of(OnDevice(0)):
        pass
    with fused.current_device_of(torch.zeros(2)):
        pass
    assert entered == [torch.device("cuda", 1)]

    seen = []
    guard = fused.current_device_of
    monkeypatch.setattr(fused, "current_device_of", lambda scores: seen.append(scores) or guard(scores))
    scores = torch.tensor([0.3, -0.2, 0.5, 0.1])
    mlloss.AUCLoss(backend="torch")(scores, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert len(seen) == 1 and seen[0] is scores  # every call of the op goes through the guard
