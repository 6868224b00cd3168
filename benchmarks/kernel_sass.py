"""Offline SASS instruction counts of the pairwise Triton kernels' loop bodies (Hopper, sm_90).

What it is for: comparing kernel variants by what one thread executes per pair, without a GPU.
Each variant (a ``@triton.jit`` function, its signature, constexprs and ``num_warps``) is
compiled on this CPU-only machine for ``GPUTarget("cuda", 90, 32)`` through
``triton.compile(ASTSource(...))`` (Triton runs ``ptxas --gpu-name=sm_90a``; no driver needed),
with the compile options every library launch pins (``kernels._launch.COMPILE_OPTIONS``: FP
fusion on, whatever ``TRITON_DEFAULT_FP_FUSION`` says), and the cubin is disassembled with the
``cuobjdump --dump-sass`` that ships with Triton.

Method:

* **Loops.** A backward ``BRA`` (target address below the branch's own address) closes a loop
  whose body is the address range ``[target, branch]``. Back edges to the same target are one
  loop (several latches), ending at the furthest one. The ``BRA`` to itself that ends every
  function (a trap after the last ``EXIT``) is not a loop. Indirect jumps (``BRX``/``JMP``) are
  ignored: Triton's ``for`` loops compile to ``BRA``.
* **Innermost only.** A loop whose range contains another loop is dropped, so nested loops are
  never counted twice; what an outer loop adds around its inner loop is not reported.
* **Counts are static.** ``instructions`` counts every non-``NOP`` instruction in the range
  (``instructions_with_nops`` keeps the NOPs). When the body has inner forward branches (an
  ``if`` that skips a tile, a predicated tail) the range is still counted once in full, as if
  every instruction ran each iteration: ``forward_branches`` counts branches to a later address
  inside the body, so a nonzero value means some iterations run fewer instructions than counted.
  ``exits`` counts branches that leave the body (Triton's ``for`` loops are bottom-tested: the
  exit test sits just before the back edge).
  ``mufu`` counts ``MUFU.*`` (special-function unit: ex2, lg2, rcp, ...), ``shfl`` ``SHFL.*``
  (warp shuffles), ``bar`` ``BAR.*`` (CTA barriers); ``opcodes`` is the full histogram.
* **Per pair.** A variant gives ``pairs_per_iteration``, the pairs one thread handles in one
  iteration: ``BLOCK_M * BLOCK_N / (32 * num_warps)`` for a loop over ``[BLOCK_M, BLOCK_N]``
  tiles (:func:`pairs_per_thread`). Per-pair numbers are the loop's counts divided by it, and
  a variant's totals add them over its loops whose label contains ``"full"``, ``"masked"``, and
  over all loops (a pair visited by two loops, e.g. an upper-owning and a lower-owning pass,
  costs the sum). A label ending in ``"(fallback)"`` names a loop that runs only for inputs
  outside the common case (the fast logistic's row blocks whose scores spread too far for its
  factored terms): reported, and left out of the totals; so is one ending in ``"(per program)"``,
  a loop over positions, not pairs, that a program runs once before its pair loop (the dense
  kernel's search for the ends of its rows' runs, with contiguous groups).
* **Labels.** A variant names its innermost loops in address order, or in the order of its
  ``loop_key`` of each loop's opcode histogram (what the loop holds), when the compiler's layout
  varies (the fast logistic's eight loops: Triton 3.6 and 3.9 place them differently).
* **Registers and spills** come from ``ptxas -v`` of the same compilation (Triton prints the
  log when ``knobs.nvidia.dump_ptxas_log`` is set; the compile cache is bypassed so that ptxas
  runs): registers per thread, spill store / load bytes and the stack frame.

Variants come from ``MODULE:FUNC`` factories returning objects with :class:`KernelVariant`'s
attributes (duck typed): by default ``mlloss.kernels:sass_variants`` when that exists, else
:func:`legacy_variants` (the single-kernel ``_ordinal_pairs_kernel`` of LEGACY_COMMIT). Kernels must be decorated with
``TRITON_INTERPRET`` off, so every variant is compiled in a worker process started with
``TRITON_INTERPRET=0``: the tool works from a shell or test session that has the interpreter on.

Usage::

    python benchmarks/kernel_sass.py                      # all variants -> results/kernel-sass.json
    python benchmarks/kernel_sass.py --quick              # first 2 variants of each source
    python benchmarks/kernel_sass.py --match logistic     # the variants whose name contains "logistic"
    python benchmarks/kernel_sass.py --match "^ordinal logistic" "budget 64x64x4: logistic"   # either (regular expressions)
    python benchmarks/kernel_sass.py --variants-from mypkg.mod:variants --output /tmp/x.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

#: Compile target: Hopper (H100 / H200), warp size 32.
ARCH = 90
WARP_SIZE = 32
TRITON_TYPES = (
    "*fp16", "*bf16", "*fp32", "*fp64", "*u1", "*i8", "*u8", "*i16", "*i32", "*i64", "u1", "i32", "i64", "fp32", "fp64",
    "constexpr",
)
RESULTS = Path(__file__).resolve().parent / "results"
#: Name under which worker processes import this file (it is run as __main__ from benchmarks/).
_MODULE = "kernel_sass" if __name__ == "__main__" else __name__
DEFAULT_SOURCE = "mlloss.kernels:sass_variants"
LEGACY_SOURCE = f"{_MODULE}:legacy_variants"

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s*(.*?)\s*;", re.MULTILINE)
_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")
_HEX = re.compile(r"0x([0-9a-f]+)")


# --------------------------------------------------------------------------- #
# Data                                                                        #
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class KernelVariant:
    """One kernel specialization to compile; registries may return any object with these fields."""

    name: str
    kernel: object  # a triton.JITFunction decorated with TRITON_INTERPRET off
    signature: dict[str, str]  # every parameter name -> a TRITON_TYPES string
    constexprs: dict[str, object]
    num_warps: int
    pairs_per_iteration: float  # pairs one thread handles per loop iteration
    loops: tuple[str, ...]  # label of each innermost loop, in SASS address order
    # Optional: a key of (opcode histogram, pairs_per_iteration); the loops are labelled in its
    # order instead (loops whose address order changes with the Triton version).
    loop_key: Callable[[Counter, float], Any] | None = None
    maxnreg: int | None = None  # optional: the register cap of the launch (ptxas .maxnreg)


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # mnemonic with modifiers, predicate stripped: "MUFU.EX2", "BRA"
    text: str
    target: int | None  # branch target address of a BRA


@dataclass(frozen=True)
class Loop:
    start: int  # the back edge's target
    end: int  # address of the last back edge
    body: tuple[Instruction, ...]


@dataclass(frozen=True)
class Spills:
    store_bytes: int
    load_bytes: int
    stack_bytes: int


@dataclass(frozen=True)
class PerPair:
    instructions: float
    mufu: float
    shfl: float


@dataclass
class LoopReport:
    label: str
    start: str  # hex address
    end: str
    instructions: int  # non-NOP
    instructions_with_nops: int
    mufu: int
    shfl: int
    bar: int
    forward_branches: int  # branches to a later address inside the body: code some iterations skip
    exits: int  # branches leaving the body (the loop's exit test)
    per_pair: PerPair
    opcodes: dict[str, int]


@dataclass
class VariantReport:
    name: str
    num_warps: int
    pairs_per_iteration: float
    constexprs: dict[str, str]
    registers: int
    spills: Spills
    loops: list[LoopReport]
    #: per-pair sums over the loops labelled "full" / "masked" / all loops; None: no such loop
    totals: dict[str, PerPair | None] = field(default_factory=dict)


def pairs_per_thread(block_m: int, block_n: int, num_warps: int) -> float:
    """Pairs one thread handles in one iteration over a [block_m, block_n] tile."""
    return block_m * block_n / (WARP_SIZE * num_warps)


# --------------------------------------------------------------------------- #
# Compilation                                                                 #
# --------------------------------------------------------------------------- #
def _checked_signature(variant: Any) -> dict[str, str]:
    """The variant's signature in parameter order, after checking it against the kernel."""
    params = list(variant.kernel.arg_names)
    missing = [p for p in params if p not in variant.signature]
    extra = [p for p in variant.signature if p not in params]
    if missing or extra:
        raise ValueError(f"variant {variant.name!r}: signature misses {missing} / has unknown {extra}")
    bad = {p: t for p, t in variant.signature.items() if t not in TRITON_TYPES}
    if bad:
        raise ValueError(f"variant {variant.name!r}: unsupported types {bad}; expected one of {TRITON_TYPES}")
    constexpr_params = {p for p in params if variant.signature[p] == "constexpr"}
    if constexpr_params != set(variant.constexprs):
        raise ValueError(
            f"variant {variant.name!r}: constexprs {sorted(variant.constexprs)} must be exactly the "
            f"parameters typed 'constexpr' {sorted(constexpr_params)}"
        )
    return {p: variant.signature[p] for p in params}


@contextlib.contextmanager
def _ptxas_log() -> Iterator[io.StringIO]:
    """Collect the ``ptxas -v`` log Triton prints; bypass its cache so that ptxas runs."""
    from triton import knobs

    log = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope():
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(log):
            yield log


def _parse_ptxas_log(log: str, name: str) -> tuple[int, Spills]:
    registers = re.search(r"Used (\d+) registers", log)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not registers or not frame:
        raise RuntimeError(f"variant {name!r}: no register / spill line in the ptxas log:\n{log}")
    stack, stores, loads = (int(g) for g in frame.groups())
    return int(registers.group(1)), Spills(store_bytes=stores, load_bytes=loads, stack_bytes=stack)


def _disassemble(cubin: bytes) -> str:
    from triton import knobs

    cuobjdump = knobs.nvidia.cuobjdump.path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([cuobjdump, "--dump-sass", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cuobjdump} --dump-sass failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def compile_sass(variant: Any) -> tuple[str, int, Spills]:
    """Compile ``variant`` for sm_90; return its SASS listing, registers per thread and spills."""
    import triton
    from triton.backends.compiler import GPUTarget

    if not isinstance(variant.kernel, triton.runtime.JITFunction):
        raise TypeError(
            f"variant {variant.name!r}: kernel must be a triton.JITFunction, got {type(variant.kernel).__name__} "
            "(an InterpretedFunction when TRITON_INTERPRET=1 as it was decorated); run "
            "`python benchmarks/kernel_sass.py`, whose workers turn the interpreter off"
        )
    source = triton.compiler.ASTSource(
        fn=variant.kernel, signature=_checked_signature(variant), constexprs=dict(variant.constexprs)
    )
    try:  # the compile options every launch of the library pins (FP fusion), if this version has them
        from mlloss.kernels._launch import COMPILE_OPTIONS
    except ImportError:
        COMPILE_OPTIONS = {}
    with _ptxas_log() as log:
        options = {"num_warps": variant.num_warps, **COMPILE_OPTIONS}
        if getattr(variant, "maxnreg", None):  # the register cap the launch passes
            options["maxnreg"] = variant.maxnreg
        compiled = triton.compile(source, target=GPUTarget("cuda", ARCH, WARP_SIZE), options=options)
    registers, spills = _parse_ptxas_log(log.getvalue(), variant.name)
    return _disassemble(compiled.asm["cubin"]), registers, spills


# --------------------------------------------------------------------------- #
# SASS analysis                                                               #
# --------------------------------------------------------------------------- #
def parse_sass(sass_text: str) -> list[Instruction]:
    """The instructions of the one function in a ``cuobjdump --dump-sass`` listing."""
    functions = sass_text.count("Function :")
    if functions > 1:
        raise ValueError(f"sass_text holds {functions} functions; expected one kernel")
    instructions = []
    for match in _INSTRUCTION.finditer(sass_text):
        text = match.group(2)
        opcode = _PREDICATE.sub("", text).split()[0]
        target = None
        if opcode == "BRA" or opcode.startswith("BRA."):
            targets = _HEX.findall(text)
            if not targets:
                raise ValueError(f"branch without a target address: {text!r}")
            target = int(targets[-1], 16)
        instructions.append(Instruction(int(match.group(1), 16), opcode, text, target))
    if not instructions:
        raise ValueError("sass_text has no instructions (expected cuobjdump --dump-sass output)")
    return instructions


def innermost_loops(sass_text: str) -> list[Loop]:
    """Innermost loops of a SASS listing, in address order (see the module docstring)."""
    instructions = parse_sass(sass_text)
    ends: dict[int, int] = {}
    for ins in instructions:
        if ins.target is not None and ins.target < ins.address:
            ends[ins.target] = max(ends.get(ins.target, ins.address), ins.address)
    spans = sorted(ends.items())
    innermost = [
        (start, end) for start, end in spans
        if not any((s, e) != (start, end) and start <= s and e <= end for s, e in spans)
    ]
    return [
        Loop(start, end, tuple(i for i in instructions if start <= i.address <= end))
        for start, end in innermost
    ]


def loop_report(label: str, loop: Loop, pairs_per_iteration: float) -> LoopReport:
    """Counts of one loop, and per pair given the pairs a thread handles per iteration."""
    opcodes = Counter(i.opcode for i in loop.body)
    non_nop = len(loop.body) - opcodes["NOP"]

    def family(prefix: str) -> int:
        return sum(n for op, n in opcodes.items() if op.split(".")[0] == prefix)

    mufu, shfl = family("MUFU"), family("SHFL")
    branches = [i for i in loop.body if i.target is not None and i.address != loop.end]
    exits = sum(1 for i in branches if not loop.start <= i.target <= loop.end)
    forward = sum(1 for i in branches if i.address < i.target <= loop.end)
    return LoopReport(
        label=label, start=hex(loop.start), end=hex(loop.end),
        instructions=non_nop, instructions_with_nops=len(loop.body),
        mufu=mufu, shfl=shfl, bar=family("BAR"), forward_branches=forward, exits=exits,
        per_pair=PerPair(non_nop / pairs_per_iteration, mufu / pairs_per_iteration, shfl / pairs_per_iteration),
        opcodes=dict(opcodes.most_common()),
    )


#: The end of the label of a loop that the totals leave out (see the module docstring).
FALLBACK = "(fallback)"
PER_PROGRAM = "(per program)"


def _sum_per_pair(loops: Sequence[LoopReport]) -> PerPair | None:
    if not loops:
        return None
    return PerPair(*(sum(getattr(loop.per_pair, f) for loop in loops) for f in ("instructions", "mufu", "shfl")))


def analyse(variant: Any) -> VariantReport:
    """Compile ``variant`` and count its innermost loops; their number must match ``variant.loops``."""
    if not variant.pairs_per_iteration > 0:
        raise ValueError(
            f"variant {variant.name!r}: pairs_per_iteration must be > 0, got {variant.pairs_per_iteration}"
        )
    sass, registers, spills = compile_sass(variant)
    loops = innermost_loops(sass)
    if len(loops) != len(variant.loops):
        found = ", ".join(f"[{hex(loop.start)}, {hex(loop.end)}]" for loop in loops)
        raise ValueError(
            f"variant {variant.name!r}: SASS has {len(loops)} innermost loops ({found}) but "
            f"variant.loops names {len(variant.loops)}: {variant.loops}"
        )
    key = getattr(variant, "loop_key", None)
    if key is not None:  # labelled by what the loops hold, not where the compiler put them
        loops = sorted(loops, key=lambda loop: key(Counter(i.opcode for i in loop.body), variant.pairs_per_iteration))
    reports = [loop_report(label, loop, variant.pairs_per_iteration) for label, loop in zip(variant.loops, loops)]
    counted = [r for r in reports if not r.label.endswith((FALLBACK, PER_PROGRAM))]
    return VariantReport(
        name=variant.name, num_warps=variant.num_warps, pairs_per_iteration=variant.pairs_per_iteration,
        constexprs={k: str(v) for k, v in variant.constexprs.items()},
        registers=registers, spills=spills, loops=reports,
        totals={kind: _sum_per_pair([r for r in counted if kind in r.label]) for kind in ("full", "masked")}
        | {"all": _sum_per_pair(counted)}
        | {f"fallback {kind}": _sum_per_pair([r for r in reports if r.label.endswith(FALLBACK) and kind in r.label])
           for kind in ("full", "masked")},
    )


# --------------------------------------------------------------------------- #
# Variant sources                                                             #
# --------------------------------------------------------------------------- #
#: The last commit of the single-kernel design (one loop per pass, before the variant registry):
#: :func:`legacy_variants` compiles its ``_ordinal_pairs_kernel`` as the baseline.
LEGACY_COMMIT = "999274ccc93e805dcc5884b8255523753cceee44"
REPO = Path(__file__).resolve().parents[1]


def _write_atomically(path: Path, text: str) -> None:
    """Concurrent runs may write the same file: each writes its own copy and renames it."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)


def _legacy_kernels_module(name: str):
    """``kernels/<name>.py`` at LEGACY_COMMIT: ``pairwise.py`` and ``_common.py`` are read with
    ``git show`` into a package under the temp folder, imported as ``mlloss_legacy_<commit>``."""
    package = f"mlloss_legacy_{LEGACY_COMMIT[:12]}"
    root = Path(tempfile.gettempdir()) / "kernel-sass"
    folder = root / package
    if not (folder / "__init__.py").exists():  # written last: the package is complete
        folder.mkdir(parents=True, exist_ok=True)
        for file in ("_common.py", "pairwise.py"):
            source = subprocess.run(["git", "-C", str(REPO), "show", f"{LEGACY_COMMIT}:kernels/{file}"],
                                    capture_output=True, text=True)
            if source.returncode != 0:
                raise RuntimeError(f"git show {LEGACY_COMMIT}:kernels/{file} failed: {source.stderr.strip()}")
            _write_atomically(folder / file, source.stdout)
        _write_atomically(folder / "__init__.py", "")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"{package}.{name}")


def legacy_variants() -> list[KernelVariant]:
    """``_ordinal_pairs_kernel`` at LEGACY_COMMIT (fp32, 64 x 64 tiles, 4 warps): linear cost
    then uniform, each surrogate. Its SASS holds the lower-owning pass's loop first."""
    import triton.language as tl

    kernel = _legacy_kernels_module("pairwise")._ordinal_pairs_kernel
    signature = {p: "*fp32" for p in kernel.arg_names if p.endswith("_ptr")}
    signature |= {"level_ptr": "*i32", "group_start_ptr": "*i32", "group_end_ptr": "*i32", "N": "i32"}
    signature |= {p: "constexpr" for p in ("COST_LINEAR", "SURROGATE", "ACC", "BLOCK_M", "BLOCK_N")}
    return [
        KernelVariant(
            name=f"legacy ordinal {surrogate} {cost}", kernel=kernel, signature=signature,
            constexprs={"COST_LINEAR": cost == "linear", "SURROGATE": sid, "ACC": tl.float32,
                        "BLOCK_M": 64, "BLOCK_N": 64},
            num_warps=4, pairs_per_iteration=pairs_per_thread(64, 64, 4),
            loops=("lower-owning", "upper-owning"),
        )
        for cost in ("linear", "uniform")
        for surrogate, sid in _legacy_kernels_module("_common").SURROGATES.items()
    ]


def load_variants(source: str) -> list[Any]:
    """Call the ``MODULE:FUNC`` factory named by ``source``."""
    module_name, sep, func_name = source.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"variants source must be MODULE:FUNC, got {source!r}")
    factory = getattr(importlib.import_module(module_name), func_name, None)
    if factory is None:
        raise ValueError(f"variants source {source!r}: {module_name} has no attribute {func_name!r}")
    return list(factory())


def default_sources() -> list[str]:
    """``mlloss.kernels:sass_variants`` when the library has it, else the legacy kernel."""
    try:
        kernels = importlib.import_module("mlloss.kernels")
    except ImportError as exc:
        raise RuntimeError(f"cannot import mlloss.kernels to look for sass_variants ({exc}); "
                           f"name a source with --variants-from, e.g. {LEGACY_SOURCE}") from exc
    return [DEFAULT_SOURCE if hasattr(kernels, "sass_variants") else LEGACY_SOURCE]


# --------------------------------------------------------------------------- #
# Worker processes (TRITON_INTERPRET=0) and the CLI                           #
# --------------------------------------------------------------------------- #
def _variant_names(source: str) -> list[str]:
    return [v.name for v in load_variants(source)]


def _analyse_from(source: str, index: int) -> dict:
    return asdict(analyse(load_variants(source)[index]))


@contextlib.contextmanager
def _interpreter_off_for_children() -> Iterator[None]:
    """Spawned workers inherit os.environ: turn the interpreter off for them, restore after."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def run_sources(sources: Sequence[str], quick: bool, jobs: int, match: Sequence[str] = ()) -> list[dict]:
    """Analyse every variant of ``sources`` (first two of each with ``quick``; only names in which
    one of the regular expressions of ``match`` is found, when given) in worker processes."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    with _interpreter_off_for_children(), ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        names = dict(zip(sources, pool.map(_variant_names, sources)))
        chosen = {s: [i for i, name in enumerate(names[s]) if not match or any(re.search(text, name) for text in match)]
                  for s in sources}
        if not any(chosen.values()):  # analysed nothing, and wrote a JSON of no variants over --output
            raise ValueError(f"--match {' '.join(map(repr, match))} is found in no variant name of {', '.join(sources)} "
                             f"(re.search); the variants: {', '.join(name for s in sources for name in names[s])}")
        tasks = [(s, i) for s in sources for i in (chosen[s][:2] if quick else chosen[s])]
        futures = [pool.submit(_analyse_from, s, i) for s, i in tasks]
        return [f.result() for f in futures]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_report(report: dict) -> list[str]:
    """One line for the variant, then one per loop."""
    totals, spills = report["totals"], report["spills"]
    # A pair runs through one loop of each pass: the full loops of both passes (tiles every row
    # covers), or the masked ones; with no such labels (one loop per pass), all loops; then the
    # fallback loops' (the fast logistic's row blocks that do not fit its factored terms).
    kinds = [kind for kind in ("full", "masked") if totals[kind]] or ["all"]
    kinds += [kind for kind in ("fallback full", "fallback masked") if totals.get(kind)]
    per_kind = " | ".join(
        f"{kind}: {_fmt(totals[kind]['instructions'])} instr, {_fmt(totals[kind]['mufu'])} MUFU, "
        f"{_fmt(totals[kind]['shfl'])} SHFL per pair"
        for kind in kinds
    )
    lines = [
        f"{report['name']}: {per_kind} | {report['registers']} regs, spills "
        f"{spills['store_bytes']} B st / {spills['load_bytes']} B ld, stack {spills['stack_bytes']} B"
    ]
    for loop in report["loops"]:
        per_pair = loop["per_pair"]
        lines.append(
            f"    {loop['label']:<16} [{loop['start']}, {loop['end']}] {loop['instructions']} instr "
            f"({loop['forward_branches']} skip, {loop['exits']} exit branches): "
            f"{per_pair['instructions']:.1f} instr/pair, "
            f"MUFU {loop['mufu']} ({per_pair['mufu']:.2f}/pair), SHFL {loop['shfl']} "
            f"({per_pair['shfl']:.2f}/pair), BAR {loop['bar']}"
        )
    return lines


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the first 2 variants of each source")
    parser.add_argument("--match", nargs="+", default=(), metavar="TEXT",
                        help="only the variants in whose name one of these regular expressions is found (re.search)")
    parser.add_argument("--output", type=Path, help="JSON path (default results/kernel-sass[-quick].json)")
    parser.add_argument("--variants-from", action="append", metavar="MODULE:FUNC",
                        help=f"variant factory, repeatable (default {DEFAULT_SOURCE} if it exists, "
                             f"else {LEGACY_SOURCE})")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="worker processes")
    args = parser.parse_args(argv)
    for text in args.match:  # else re.error, naming no option, once the workers have listed the variants
        try:
            re.compile(text)
        except re.error as error:
            parser.error(f"--match {text!r} is not a regular expression: {error}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    sources = args.variants_from or default_sources()
    reports = run_sources(sources, args.quick, args.jobs, args.match)
    for report in reports:
        print("\n".join(format_report(report)))

    import triton

    output = args.output or RESULTS / ("kernel-sass-quick.json" if args.quick else "kernel-sass.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        "triton": triton.__version__,
        "target": f"sm_{ARCH}a (cuda capability {ARCH}, warp size {WARP_SIZE})",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sources": sources,
        "counting": "static non-NOP instructions of each innermost loop's [target, back edge] range, "
                    "divided by pairs_per_iteration; see benchmarks/kernel_sass.py",
        "variants": reports,
    }, indent=2) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
