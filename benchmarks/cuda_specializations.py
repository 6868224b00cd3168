"""Every Triton specialization the losses launch on CUDA, compiled for Hopper (sm_90) on this CPU.

What it is for: knowing, without a GPU, that each kernel the library can launch on an H100 compiles
with the installed Triton (run it under the GPU image's Triton too), with its registers and spills.
``kernel_sass.py`` counts the instructions of the hot loops of hand-picked variants; this tool
covers every launch instead: the data check, the dense kernels, the layout kernels, the hardest-pair
kernels and the reductions, for each loss, surrogate, dtype, with and without groups and a mask.

Method:

1. **Record** (``TRITON_INTERPRET=1``): run one forward + backward of each case on CPU tensors
   with the library's CUDA launch choices: ``kernels._common.launch_target`` answers ``"cuda"``
   (tiles, blocks, chunks and fast math as on a GPU) and the device has H100_SMS multiprocessors.
   Every launch is recorded as (kernel, parameter types, constexpr values, ``num_warps``, and
   ``maxnreg`` where the launch caps the registers) from
   its actual arguments, then run by the interpreter: the fast branch included, whose inline PTX
   ops the interpreter computes exactly (``kernels/_common.py``), so that the call computes the
   values a GPU would, but for the approximations' own error.
2. **Compile** (worker processes with ``TRITON_INTERPRET=0``): each distinct specialization goes
   through ``triton.compile(ASTSource(...))`` for ``GPUTarget("cuda", 90, 32)`` and ptxas, as in
   ``kernel_sass.compile_sass``. A kernel that fails to compile is reported with its error, and
   the tool exits with status 1.

Parameter types are those Triton's launcher gives (``launcher_signature``): a parameter's
annotated type if it has one (the temperature's ``tl.float64``), else its argument's
(``triton.runtime.jit.mangle_type``): a tensor is a pointer to its dtype (``*u1`` for bool), a
Python int ``i32`` (``i64`` past 32 bits), a float ``fp32``. The launcher also marks 16-byte
aligned pointers and integers divisible by 16; those hints are left out here, so registers may
differ slightly from a real launch's.

Usage::

    python benchmarks/cuda_specializations.py                # all cases -> results/cuda-specializations.json
    python benchmarks/cuda_specializations.py --match AUC    # the cases whose name contains "AUC"
    python benchmarks/cuda_specializations.py --record-only  # list the specializations, compile nothing
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import inspect
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "cuda-specializations.json"
#: Streaming multiprocessors of an H100 SXM (the layout kernel's chunking reads it).
H100_SMS = 132
#: Items per case. The layout cases turn the dense kernels off (``host_path.dense_kernels_off``),
#: as a batch past ``kernels.dense.MAX_ITEMS`` does: no constexpr depends on N, the interpreter's
#: time does.
NUM_ITEMS = 300

_TL_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64")


# --------------------------------------------------------------------------- #
# Cases                                                                       #
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[], object]  # the loss module (backend="triton")
    labels: str  # "binary" (N,), "two" (N, 2) binary, "four" (N, 4) binary, "ordinal" (N,) 0..4
    layout: bool  # the layout kernels (a batch of more than kernels.dense.MAX_ITEMS items)
    grouped: bool = True
    masked: bool = False
    dtype: str = "float32"
    tasks: int = 0  # scores (N,), or (N, tasks) for a bce+ loss
    scanned: bool = False  # the counting layout's block scan, as past kernels.levels.SCAN_BLOCKS blocks
    ids: str = "int64"  # the group ids' dtype: ids of at most 32 bits stay int32 (mlloss.kernels.check.group_vector)


def cases() -> list[Case]:
    """The loss calls whose launches are recorded: every loss on the dense kernels and on the
    layout kernels, every surrogate, float32 / float64 / bfloat16, with and without groups and a
    mask, the data checks on and off."""
    import mlloss

    def auc(surrogate="logistic", validate=True, **options):
        return lambda: mlloss.AUCLoss(surrogate=surrogate, backend="triton", validate_args=validate, **options)

    out = []
    for size, layout in (("dense", False), ("layout", True)):
        for surrogate in ("logistic", "hinge", "squared", "exponential"):
            for grouped in (False, True):
                out.append(Case(f"AUC {surrogate} {size}{' groups' if grouped else ''}", auc(surrogate), "binary", layout,
                                grouped=grouped))
        out += [
            Case(f"AUC logistic {size} groups mask", auc(), "binary", layout, masked=True),
            Case(f"AUC logistic {size} groups unchecked", auc(validate=False), "binary", layout),
            Case(f"AUC logistic {size} groups float64", auc(), "binary", layout, dtype="float64"),
            Case(f"AUC logistic {size} groups bfloat16", auc(), "binary", layout, dtype="bfloat16"),
            Case(f"PDAOM {size} groups", lambda: mlloss.PDAOMLoss(backend="triton"), "binary", layout),
            Case(f"PDAOM {size} groups mask", lambda: mlloss.PDAOMLoss(backend="triton"), "binary", layout, masked=True),
            Case(f"PDAOM soft {size} groups", lambda: mlloss.PDAOMLoss(temperature=0.5, backend="triton"), "binary", layout),
            Case(f"LoA {size} groups", lambda: mlloss.LoALoss(backend="triton"), "two", layout),
            Case(f"LoA balanced {size} groups mask", lambda: mlloss.LoALoss("balanced", backend="triton"), "two", layout,
                 masked=True),
            Case(f"LaA linear {size} groups", lambda: mlloss.LaALoss(backend="triton"), "two", layout),
            Case(f"LaA uniform {size}", lambda: mlloss.LaALoss(cost="uniform", backend="triton"), "two", layout,
                 grouped=False),
            Case(f"LaA linear {size} groups mask", lambda: mlloss.LaALoss(backend="triton"), "two", layout, masked=True),
            Case(f"LaA linear 4 labels {size} groups", lambda: mlloss.LaALoss(backend="triton"), "four", layout),
            Case(f"LaA ordinal {size} groups", lambda: mlloss.LaALoss(backend="triton"), "ordinal", layout),
            Case(f"LaA hardest {size} groups", lambda: mlloss.LaALoss(pairs="hardest", backend="triton"), "two", layout),
            Case(f"LaA soft hardest {size}", lambda: mlloss.LaALoss(pairs="hardest", temperature=0.5, backend="triton"),
                 "two", layout, grouped=False),
            Case(f"LaA ordinal hardest {size} groups", lambda: mlloss.LaALoss(pairs="hardest", backend="triton"),
                 "ordinal", layout),
            Case(f"LaA ordinal soft hardest {size}",
                 lambda: mlloss.LaALoss(pairs="hardest", temperature=0.5, backend="triton"), "ordinal", layout,
                 grouped=False),
            Case(f"bce+pdaom {size} groups", lambda: mlloss.build_loss("bce+pdaom", backend="triton"), "two", layout,
                 tasks=2),
            # two task columns in one call (AUCLoss.task_columns): the score-column specializations
            Case(f"AUC task columns {size} groups mask", auc(), "two", layout, masked=True, tasks=2),
            Case(f"PDAOM soft task columns {size} groups", lambda: mlloss.PDAOMLoss(temperature=0.5, backend="triton"),
                 "two", layout, tasks=2),
            # contiguous groups: the dense kernels' run ordinals, the counting layout without a sort
            Case(f"AUC logistic {size} contiguous groups", auc(contiguous_groups=True), "binary", layout),
            Case(f"PDAOM {size} contiguous groups", lambda: mlloss.PDAOMLoss(backend="triton", contiguous_groups=True),
                 "binary", layout),
            Case(f"LaA linear {size} contiguous groups", lambda: mlloss.LaALoss(backend="triton", contiguous_groups=True),
                 "two", layout),
            # int32 group ids, as a user passes them where they fit: the kernels that read ids take *i32
            Case(f"AUC logistic {size} groups int32 ids", auc(), "binary", layout, ids="int32"),
            Case(f"PDAOM {size} groups int32 ids", lambda: mlloss.PDAOMLoss(backend="triton"), "binary", layout,
                 ids="int32"),
            Case(f"LaA linear {size} groups int32 ids", lambda: mlloss.LaALoss(backend="triton"), "two", layout,
                 ids="int32"),
        ]
    out += [  # a batch of more blocks than kernels.levels.SCAN_BLOCKS (2^20 items) scans the blocks' counts
        Case("AUC logistic layout scanned", auc(), "binary", True, grouped=False, scanned=True),
        Case("AUC logistic layout groups scanned", auc(), "binary", True, scanned=True),
        Case("LaA linear 4 labels layout groups scanned", lambda: mlloss.LaALoss(backend="triton"), "four", True,
             scanned=True),
        Case("PDAOM layout groups scanned", lambda: mlloss.PDAOMLoss(backend="triton"), "binary", True, scanned=True),
        Case("AUC logistic layout contiguous groups scanned", auc(contiguous_groups=True), "binary", True, scanned=True),
    ]
    return out


def _inputs(case: Case):
    import torch

    generator = torch.Generator().manual_seed(0)
    n = NUM_ITEMS
    scores = torch.randn((n, case.tasks) if case.tasks else (n,), generator=generator).to(getattr(torch, case.dtype))
    columns = {"binary": 1, "two": 2, "four": 4, "ordinal": 1}[case.labels]
    labels = torch.randint(0, 2, (n, columns), generator=generator).to(torch.float32)
    if case.labels == "binary":
        labels = labels[:, 0]
    elif case.labels == "ordinal":
        labels = torch.randint(0, 5, (n,), generator=generator).to(torch.float32)
    groups = (torch.randint(0, max(n // 50, 1), (n,), generator=generator).to(getattr(torch, case.ids))
              if case.grouped else None)
    mask = (torch.arange(n) % 4 != 3) if case.masked else None
    return scores, labels, groups, mask


# --------------------------------------------------------------------------- #
# Recording (under the interpreter)                                           #
# --------------------------------------------------------------------------- #
def _constexpr_json(value):
    """JSON form of a constexpr: numbers, bools, strings and None as they are, Triton dtypes by name."""
    import triton.language as tl

    if isinstance(value, tl.dtype):  # by its name in triton.language: {"tl": "float32"}
        return {"tl": next(name for name in _TL_DTYPES if getattr(tl, name) == value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"unsupported constexpr {value!r}")


def launcher_signature(fn: Callable, bound: dict) -> dict[str, str]:
    """Parameter name -> the type Triton's launcher gives it on CUDA: "constexpr", the annotated
    type of a parameter annotated with one (``t: tl.float64`` -> "fp64"), else the argument's own
    (``mangle_type``: a tensor ``*fp32``, an int ``i32``, a Python float ``fp32``)."""
    from triton.runtime.jit import KernelParam, mangle_type

    signature = {}
    for index, parameter in enumerate(inspect.signature(fn).parameters.values()):
        param = KernelParam(index, parameter, False, False)
        if param.is_constexpr:
            signature[param.name] = "constexpr"
        else:
            signature[param.name] = param.annotation_type or mangle_type(bound[param.name])
    return signature


@contextlib.contextmanager
def cuda_launch_choices(**patches: Callable) -> Iterator[None]:
    """Inside: every kernel module's ``launch_target`` answers ``"cuda"`` (tiles, blocks, chunks
    and fast math as on a GPU) and the device has H100_SMS multiprocessors; ``patches`` replace
    more functions of ``kernels._common`` by name, in every kernel module that imported them.
    Every kernel module is imported first, so that none imports a patched function for good."""
    import mlloss.kernels.check, mlloss.kernels.dense, mlloss.kernels.hardest, mlloss.kernels.levels  # noqa: E401, F401
    from mlloss.kernels import _common, pairwise

    replacements = {"launch_target": lambda device: "cuda", **patches}
    modules = [module for name, module in sys.modules.items() if name.startswith("mlloss.kernels")]
    saved = [(module, name, getattr(_common, name)) for module in modules for name in replacements
             if getattr(module, name, None) is getattr(_common, name)]
    multiprocessors = pairwise._multiprocessors
    for module, name, _ in saved:
        setattr(module, name, replacements[name])
    pairwise._multiprocessors = lambda device: H100_SMS
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        pairwise._multiprocessors = multiprocessors


@contextlib.contextmanager
def recording_cuda_launches() -> Iterator[list[dict]]:
    """Inside: the kernels get the CUDA launch choices and each launch appends its specialization
    (module, kernel, signature, constexprs, num_warps[, maxnreg]) to the yielded list; the interpreter runs
    it (see the module docstring)."""
    from triton.runtime.interpreter import InterpretedFunction

    from mlloss.kernels import _common

    if not _common.INTERPRET:
        raise RuntimeError("recording needs TRITON_INTERPRET=1 set before triton is imported")
    launches: list[dict] = []
    run = InterpretedFunction.run

    def recorded_run(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in names}
        signature = launcher_signature(self.fn, bound)
        launches.append({
            "module": self.fn.__module__,
            "kernel": self.fn.__name__,
            "signature": signature,
            "constexprs": {name: _constexpr_json(bound[name]) for name, kind in signature.items() if kind == "constexpr"},
            "num_warps": int(kwargs.get("num_warps", 4)),
            **({"maxnreg": int(kwargs["maxnreg"])} if kwargs.get("maxnreg") else {}),
        })
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recorded_run
    try:
        with cuda_launch_choices():
            yield launches
    finally:
        InterpretedFunction.run = run


@contextlib.contextmanager
def _scanned_layout() -> Iterator[None]:
    """Inside: the counting layout scans its blocks' counts at any size (kernels.levels.SCAN_BLOCKS 0)."""
    from mlloss.kernels import levels

    saved = levels.SCAN_BLOCKS
    levels.SCAN_BLOCKS = 0
    try:
        yield
    finally:
        levels.SCAN_BLOCKS = saved


def record(selected: Sequence[Case]) -> dict[str, list[dict]]:
    """Case name -> the specializations its forward + backward launched, in launch order."""
    from host_path import dense_kernels_off

    out = {}
    for case in selected:
        scores, labels, groups, mask = _inputs(case)
        loss = case.make()
        scores.requires_grad_(True)
        with contextlib.ExitStack() as stack:
            launches = stack.enter_context(recording_cuda_launches())
            if case.layout:
                stack.enter_context(dense_kernels_off())
            if case.scanned:
                stack.enter_context(_scanned_layout())
            value = loss(scores, labels, groups, **({"mask": mask} if mask is not None else {}))
            value.backward()
        out[case.name] = launches
    return out


def distinct(recorded: dict[str, list[dict]]) -> list[dict]:
    """The distinct specializations, each with the cases that launch it."""
    table: dict[str, dict] = {}
    for case, launches in recorded.items():
        for launch in launches:
            key = json.dumps(launch, sort_keys=True)
            table.setdefault(key, dict(launch, cases=[]))
            if case not in table[key]["cases"]:
                table[key]["cases"].append(case)
    return list(table.values())


def _record_in_child(match: str | None) -> dict[str, list[dict]]:
    """Record in a fresh interpreter process (the compile workers need the interpreter off)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import cuda_specializations as c; "
        "m = sys.argv[2] or None; json.dump(c.record([x for x in c.cases() if m is None or m in x.name]), sys.stdout)"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).resolve().parent), match or ""],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"recording failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


# --------------------------------------------------------------------------- #
# Compiling (interpreter off)                                                 #
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class _Variant:
    """What ``kernel_sass.compile_sass`` reads."""

    name: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int
    maxnreg: int | None = None


def _compile(spec: dict) -> dict:
    import triton.language as tl

    from kernel_sass import compile_sass

    start = time.perf_counter()
    try:
        kernel = getattr(importlib.import_module(spec["module"]), spec["kernel"])
        constexprs = {k: getattr(tl, v["tl"]) if isinstance(v, dict) else v for k, v in spec["constexprs"].items()}
        _, registers, spills = compile_sass(_Variant(spec["kernel"], kernel, spec["signature"], constexprs,
                                                     spec["num_warps"], spec.get("maxnreg")))
    except Exception as exc:  # noqa: BLE001  (reported per specialization)
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
    return {"ok": True, "registers": registers, "spill_store_bytes": spills.store_bytes,
            "spill_load_bytes": spills.load_bytes, "seconds": round(time.perf_counter() - start, 2)}


def compile_all(specs: Sequence[dict], jobs: int) -> list[dict]:
    """Compile every specialization in spawned workers with the interpreter off."""
    from kernel_sass import _interpreter_off_for_children

    # Spawned workers import this module by name (``_compile``): benchmarks/ on their path first.
    with _interpreter_off_for_children(), ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
        initializer=sys.path.insert, initargs=(0, str(Path(__file__).resolve().parent)),
    ) as pool:
        results = list(pool.map(_compile, specs))
    return [dict(spec, **result) for spec, result in zip(specs, results)]


def describe(spec: dict) -> str:
    """kernel[constexprs](its pointers' element types) num_warps."""
    constexprs = ", ".join(f"{k}={v['tl'] if isinstance(v, dict) else v}" for k, v in spec["constexprs"].items())
    pointers = ",".join(sorted({t[1:] for t in spec["signature"].values() if t.startswith("*")}))
    cap = f" maxnreg={spec['maxnreg']}" if spec.get("maxnreg") else ""
    return f"{spec['kernel']}[{constexprs}]({pointers}) num_warps={spec['num_warps']}{cap}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", help="only the cases whose name contains this text")
    parser.add_argument("--record-only", action="store_true", help="list the specializations, compile nothing")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="compile worker processes")
    parser.add_argument("--output", type=Path, help="JSON path (default results/cuda-specializations.json)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")

    recorded = _record_in_child(args.match)
    if not recorded:
        parser.error(f"no case name contains {args.match!r}")
    specs = distinct(recorded)
    print(f"{len(recorded)} cases launch {len(specs)} distinct specializations")
    if args.record_only:
        for spec in specs:
            print(f"  {describe(spec)}  ({len(spec['cases'])} cases)")
        return 0
    results = compile_all(specs, args.jobs)
    for result in results:
        status = (f"{result['registers']} regs, spills {result['spill_store_bytes']} B st / "
                  f"{result['spill_load_bytes']} B ld" if result["ok"] else f"FAILED: {result['error']}")
        print(f"  {describe(result)}: {status}")
    failed = [r for r in results if not r["ok"]]

    import triton

    output = args.output or RESULTS
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "triton": triton.__version__,
        "target": "sm_90a (cuda capability 90, warp size 32)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cases": {case: len(launches) for case, launches in recorded.items()},
        "compiled": len(results) - len(failed),
        "failed": len(failed),
        "specializations": results,
    }, indent=2) + "\n")
    print(f"{len(results) - len(failed)} of {len(results)} compiled for sm_90; wrote {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
