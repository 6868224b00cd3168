"""GPU benchmark of mlloss's pairwise losses: the Triton kernel against the torch backend, the
closed forms, and naive broadcast (eager and ``torch.compile``) and LibAUC baselines.

Sections (``--sections``, run in the order given; the default 2,5,3,1,4,6,7 puts the headline first):

1. Logistic bipartite AUC, no groups, label priors 0.5 and 0.1: mlloss ``backend="triton"`` and
   ``backend="torch"``, a naive N x N broadcast eager and under ``torch.compile``, and LibAUC
   ``PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)`` (the same mean of log(1 + exp(-(s_i - s_j)))
   over positive x negative pairs; see cases.py). LibAUC's call begins with ``assert sum(pos_mask) > 0``:
   Python's ``sum`` over the mask's N elements, one CUDA add per item and a host sync, which is most
   of its time (18 ms at N = 1,024 on an H100 at eb07a70, growing with N): the row times LibAUC as
   its users call it.
2. Logistic LaA (linear cost), two binary labels with priors 0.5 and 0.1, no groups: the headline
   case. Triton, torch backend, naive eager, naive compiled; and the Triton call compiled as a
   user's step compiles it (``mlloss-compile``, at N = 1,024 and 16,384).
3. Closed forms at N = 1,048,576 in users of ~50 items: exponential / squared / hinge ``AUCLoss``
   and ``LaALoss`` with ``backend="exact"`` (what ``"auto"`` picks for them; the reference row)
   against the Triton kernel and the torch backend on the same input; ``PDAOMLoss()`` (hardest
   pair, O(N)) against a naive scatter min / max, and its soft pairs (``temperature=0.5``: log-mean-exp
   extremes, three scanned sums a cell) against the same scatter with sums of exp (no target).
4. Grouped logistic AUC, users of ~50 items, prior 0.1: Triton, torch backend, naive masked
   broadcast (eager, compiled), LibAUC called once per user in a Python loop; and the Triton call
   on the same users in runs (``contiguous_groups=True``: no sort of the ids) and with int32 ids
   (their sort in 4 radix passes instead of 8).
5. Grouped logistic LaA, users of ~50 items, two labels: Triton, torch backend, naive (eager,
   compiled).
6. Accuracy: the float32 Triton path (CUDA: approximate special functions, float32 sums) against
   the same loss of float64 copies of the scores (the kernels' exact branch, float64 sums), the
   reference row, at N = 1,048,576 (full run: also 16,384): AUC prior 0.1 and LaA on standard
   normal scores, and AUC on well-ordered scores (+4 per level: most pairs' terms are tiny).
7. Tiles: the layout kernel (dense kernels off) with each of cases.TILE_CANDIDATES as its
   (BLOCK_M x BLOCK_N x warps) against the library's choice, AUC prior 0.1 and LaA at N = 16,384
   and 1,048,576: the data for ``pairwise.TILES["cuda"]`` (fixed per device, not autotuned at run
   time, so that the summation order depends only on the device and N).
8. Tiles in CUDA graphs (``mlloss-graph@64x32x4``: the call captured with those tiles, the replay
   timed; not in the default run): the kernels' own time, which eager calls at N = 16,384 hide
   behind their host path. AUC and LaA at N = 16,384 with cases.TILE_CANDIDATES, the grouped AUC
   and LaA (users of ~50 items) at 16,384 and 1,048,576 with cases.GROUPED_TILE_CANDIDATES: the
   data for ``pairwise.TILES["cuda"]`` at small N and ``pairwise.TILES["cuda groups"]``.
9. The fast logistic's factored terms in CUDA graphs (not in the default run): AUC and LaA with
   and without users of ~50 items at 16,384 and 1,048,576, the library's kernel (``mlloss-graph``)
   beside ``mlloss-graph@per-pair`` (its per-pair terms everywhere: the kernel before the factored
   terms) and ``mlloss-graph@uncapped`` (without ``pairwise.MAX_REGISTERS``' cap).
10. The dense kernels' threshold (``kernels/dense.py`` MAX_ITEMS, 2,048 items; not in the default
   run): the grouped AUC and LaA (users of ~50 items, as the recipe's batches) at 2,048 to 16,384
   items on the layout kernels (``mlloss-layout``, ``mlloss-graph@layout``) and on the dense ones
   (``mlloss-triton@dense``, ``mlloss-graph@dense``), eager and in CUDA graphs: whether the
   dense kernels' fewer launches and ops pay for their N^2 pairs above 2,048 items.

Sections 1-5 also run ``mlloss-graph``: the Triton call captured once in a CUDA graph and
replayed (``cases.graphed_step``), at N = 1,024 and 16,384 (sections 1 and 2) and at the grouped
and PDAOM sizes: the kernels' and copies' own time, without the host path that bounds these
calls in eager mode (no target; the report's lines put it beside the eager call). CUDA only: the
CPU smoke run records the rows as skipped. At the same sizes ``mlloss-unchecked`` times the eager
call with ``validate_args=False``: no data check, so no host sync, and the host path overlaps the
kernels (the eager rows of the targets keep the default check, whose status read waits for them),
and ``mlloss-replay`` the eager call with graph replay on (``mlloss.set_graph_replay(True)``: the
call's kernels replayed from a CUDA graph captured at its second call, the data check kept; the
host path left is the library's Python, the inputs' copies into the graph and its outputs' copies
out).

N = 1,024 to 1,048,576 (x4) in the full run; ``--quick``: N = 1,024, 16,384, 1,048,576 (grouped:
16,384 and 1,048,576), AUC prior 0.1 only, and fewer compiled rows -- every acceptance line in a
few minutes. ``torch.compile`` costs 5-30 s per (case, N), so the compiled naive rows run at every
N only in sections 2 and 5 of the full run, and at N = 16,384 elsewhere (the skip rows say so).
The cases, inputs, valid-pair counts, implementations (mlloss, the naive losses eager and compiled,
the LibAUC wrappers) and cross-checks are cases.py's, shared with the CPU runner bench_pairwise.py
(same seeds); the inputs are built on the CPU and copied to the device. This module is the GPU
runner: arguments, timing, memory, skips and the run's order; gpu_report.py writes its tables,
acceptance lines and output files (JSON and .md) and combines runs for ``--merge``.

Method (one process, one GPU). Each (case, N, implementation) row: one full-size warm-up step
(two for ``torch.compile``, whose first call compiles forward and backward, and for steps under a
second), so that Triton's JIT, Inductor and cuBLAS set-up stay outside the timing;
``first_call_s`` records the first call's wall time (the compile time for compiled rows). Then
forward + backward steps, each between two ``torch.cuda.Event``s: at least ``--min-repeats``
(5; quick 3), more for fast steps, up to about ``--target-s`` seconds of timing (1 s; quick
0.3 s) or ``--max-repeats`` steps (20; quick 30: a host-bound step of a millisecond gets 30 samples,
one of 100 ms the minimum), and at most three for steps over a second (section 6's float64 reference
rows, whose time is no target: one step, the first call, no warm-up); ``time_s`` is the median,
``time_min_s`` the minimum, ``wall_s`` the median host wall time. Each of these steps starts on an
idle device (a sync before it): for a host-bound call that is its latency. Steps under 5 ms are
also timed back to back, 20 of them with one sync at the end (``back_to_back_s``, per step), as a
training loop issues them: a call without a host sync of its own then overlaps its host path with
the kernels of the one before. Memory: before the
first timed step the gradient is cleared, ``torch.cuda.reset_peak_memory_stats()`` is called and
the baseline is ``torch.cuda.memory_allocated()`` (the inputs and whatever the warm-up keeps);
"peak extra MB" is ``max_memory_allocated()`` minus that baseline over the step: everything the
step allocates, the scores' gradient included (4 MB at N = 1,048,576). "pairs/s" is valid pairs
(the loss's pair set, the same numerator for every implementation of a case) per median second.
Every row is cross-checked against the case's reference row (the first implementation: mlloss's
Triton kernel, or the closed form in section 3): loss value relative difference and
max|g - g_ref| / max|g_ref|; for N <= 4096 the reference row is compared with a float64 naive
evaluation.

Skips (the reason is recorded in the row): a baseline whose projected peak exceeds
``--mem-limit-gb`` (default 85% of the GPU's memory) -- naive rows scale with N^2 and LibAUC with
its pos x neg matrix, extrapolated from the largest size measured so far at the measured bytes per
element (24 B before any measurement); any row but the reference whose projected step time (the
last measured time times the ratio of work: N^2 for naive rows, valid pairs otherwise; for a
tile variant ``impl@tiles``, the reference's time at this size times their ratio at the last)
exceeds ``--max-step-s`` (10 s; quick 2 s) -- but where that work ratio projects a row past the
limit, the step at the last size is rebuilt (same inputs) and its kernels' time taken with the
profiler (CUDA only; not for compiled rows), the kernels are scaled by the work and the rest of
the step (host path, launch latency, a Python loop over the items) by N, and the row is skipped
only if that projection exceeds the limit too (the work ratio alone skipped LibAUC and the torch
backend's LaA at N = 16,384 at eb07a70, projecting 4.4 and 2.1 s from host-bound steps of 18 and
8 ms at 1,024); LibAUC
when it is not importable; every row once ``--budget-s`` of the run is spent. The JSON (and its
``.md``) is rewritten after every row, so a run cut short keeps what it measured.

Acceptance lines (computed from the rows by gpu_report.py, whose docstring lists the targets;
printed, stored in the JSON and the .md): the GPU fast path's targets for Triton's pairs/s, extra
memory and call time, ``PDAOMLoss``'s time, and the naive baselines' time over Triton.

Usage::

    python benchmarks/bench_gpu.py                        # full run on CUDA
    python benchmarks/bench_gpu.py --quick --output $OUT  # every acceptance line, fewer rows
    python benchmarks/bench_gpu.py --device cpu           # smoke run: N = 256, Triton interpreted

    # a run split across commands (each under 10 minutes), then its rows combined:
    python benchmarks/bench_gpu.py --sections 2,5 --output a.json
    python benchmarks/bench_gpu.py --sections 3,1,4 --output b.json
    python benchmarks/bench_gpu.py --merge a.json b.json --output results/<gpu-slug>.json

Run times: ``--quick`` of the library at 8a59113 took about 4 minutes on an H100 (most of it
``torch.compile`` and the slow kernel of that version; ../gpu-baseline and
``results/nvidia-h100-80gb-hbm3-quick-before-8a59113.*``); at da5adbf sections 1-5 took 74 s and
sections 6-7 their 40 s budget (``results/*-da5adbf.*``); the full run is meant to take 5-8
minutes; ``--budget-s`` (500 s, quick 400 s) skips whatever is left once it is spent, so one
command stays under ten minutes.

``--device cpu`` sets ``TRITON_INTERPRET=1`` (before torch or triton is imported), runs N = 256 so
that the Triton rows run on Triton's interpreter, compiles with ``--compile-backend aot_eager`` by
default (Inductor's C++ build takes ~40 s per graph on a small CPU), times with ``perf_counter``
and measures memory as in-process peak RSS (approximate); it exercises every path but the CUDA
events and memory statistics. Its output defaults to ``results/cpu-interpret-quick.json``
(ignored by git); CUDA runs write ``results/<gpu-name-slug>[-quick].json`` unless ``--output``
names a file or a folder.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _measure  # noqa: E402
import cases  # noqa: E402
from gpu_report import GB, describe_device, format_rows, merge, output_path, write_report  # noqa: E402

SCRIPT = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(SCRIPT))
SLOW_STEP_S = 1.0  # a first call slower than this is the only warm-up; slower steps are timed at most 3 times

# Per mode: (min repeats, max repeats, seconds of timing aimed at, max projected step s, run budget s).
REPEATS = {"full": (5, 20, 1.0, 10.0, 500.0), "quick": (3, 30, 0.3, 2.0, 400.0), "smoke": (2, 3, 0.05, 30.0, 600.0)}
# Section 6's float64 reference rows ("-f64"): one step, no warm-up. Their value and gradient are
# what the section needs, and at N = 1,048,576 a float64 step takes seconds that section 7 can use.
REFERENCE_ONLY_REPEATS = (1, 1, 0.0)
# Steps faster than this are also timed back to back (BACK_TO_BACK_STEPS of them, one sync at the
# end): what a training loop sees of a host-bound call, whose host path then overlaps the kernels.
BACK_TO_BACK_BELOW_S = 5e-3
BACK_TO_BACK_STEPS = 20


# --------------------------------------------------------------------------------------------
# One row: build, warm up, time, measure memory
# --------------------------------------------------------------------------------------------


class DeviceClock:
    """Step timing and peak extra memory: CUDA events and allocator statistics, or, on the CPU
    (smoke mode), ``perf_counter`` and in-process peak RSS (approximate)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        self.memory_method = (
            "torch.cuda.max_memory_allocated() over the first timed step - memory_allocated() before it"
            if self.cuda else "in-process VmHWM - VmRSS baseline (approximate: earlier rows' heap is reused)"
        )

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def wall(self, step: Callable[[], Any]) -> float:
        self.sync()
        start = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - start

    def start_memory(self) -> float:
        if self.cuda:
            self.sync()
            self.torch.cuda.reset_peak_memory_stats()
            return self.torch.cuda.memory_allocated() / _measure.MB
        return _measure.reset_peak()[0]

    def peak_memory(self) -> float:
        if self.cuda:
            self.sync()
            return self.torch.cuda.max_memory_allocated() / _measure.MB
        return _measure.peak_mb()

    def back_to_back(self, step: Callable[[], Any], steps: int) -> float:
        """Wall seconds per step of ``steps`` steps issued without a sync between them."""
        self.sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        self.sync()
        return (time.perf_counter() - start) / steps

    @property
    def times_kernels(self) -> bool:
        """Whether ``kernel_seconds`` can tell a step's kernels from its host path (CUDA only)."""
        return self.cuda

    def kernel_seconds(self, step: Callable[[], Any]) -> float:
        """The device time of one step's kernels and copies, summed (the profiler's CUDA activity)."""
        from torch.profiler import ProfilerActivity, profile

        self.sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            self.sync()
        return sum(event.self_device_time_total for event in prof.key_averages()) / 1e6

    def timed(self, step: Callable[[], Any]) -> tuple[Any, float, float]:
        """(step result, device seconds, host wall seconds) of one step."""
        if not self.cuda:
            start = time.perf_counter()
            result = step()
            elapsed = time.perf_counter() - start
            return result, elapsed, elapsed
        start_event = self.torch.cuda.Event(enable_timing=True)
        end_event = self.torch.cuda.Event(enable_timing=True)
        self.sync()
        wall_start = time.perf_counter()
        start_event.record()
        result = step()
        end_event.record()
        end_event.synchronize()
        wall = time.perf_counter() - wall_start
        return result, start_event.elapsed_time(end_event) / 1e3, wall

    def release(self) -> None:
        """Return a finished row's device memory (the next row may need all of it); a no-op on the
        CPU, where ``start_memory`` collects anyway."""
        if self.cuda:
            gc.collect()
            self.torch.cuda.empty_cache()


def measure_row(step, scores, clock: DeviceClock, *, compiled: bool, repeats: tuple[int, int, float],
                warm_up: bool = True) -> dict[str, Any]:
    """Warm up, then time ``repeats`` steps; the first timed step also gives the peak extra memory.
    ``warm_up=False`` (a reference row whose time is no target): one step, the first call, timed."""
    min_repeats, max_repeats, target_s = repeats
    first_call = last_warm = 0.0
    warmup_steps = 0
    if warm_up:
        first_call = last_warm = clock.wall(step)
        warmup_steps = 1
        if compiled or first_call < SLOW_STEP_S:
            last_warm = clock.wall(step)
            warmup_steps = 2
    count = int(min(max(target_s / max(last_warm, 1e-6), min_repeats), max_repeats)) if warm_up else 1
    if last_warm > SLOW_STEP_S:  # multi-second steps: a median of three is enough
        count = min(count, 3)
    scores.grad = None
    baseline = clock.start_memory()
    times, walls, peak = [], [], None
    loss = None
    for index in range(count):
        loss, device_s, wall_s = clock.timed(step)
        times.append(device_s)
        walls.append(wall_s)
        if index == 0:
            peak = clock.peak_memory() - baseline
    value = float(loss)
    back_to_back = None
    if warm_up and statistics.median(times) < BACK_TO_BACK_BELOW_S:
        back_to_back = clock.back_to_back(step, BACK_TO_BACK_STEPS)
    return {
        "value": value,
        "times_s": times,
        "time_s": statistics.median(times),
        "time_min_s": min(times),
        "wall_s": statistics.median(walls),
        "back_to_back_s": back_to_back,
        "first_call_s": first_call if warm_up else walls[0],
        "warmup_steps": warmup_steps,
        "peak_extra_mb": peak,
        "baseline_mb": baseline,
    }


class Projector:
    """Projected peak memory and step time of an implementation at the next size, from the
    largest size measured so far in the same case."""

    def __init__(self, mem_limit_gb: float, max_step_s: float) -> None:
        self.mem_limit_gb = mem_limit_gb
        self.max_step_s = max_step_s
        self.seen: dict[str, dict[str, float]] = {}  # impl -> its last measurement
        self.times: dict[tuple[str, int], float] = {}  # (impl, n) -> its median step time

    @staticmethod
    def work(impl: str, n: int, pairs: float) -> float:
        return float(n) * n if impl in ("naive", "naive-compile") else max(pairs, float(n))

    def skip_reason(self, row: dict[str, Any], *, time_limited: bool = True) -> str | None:
        """Why ``row`` should not run, or None; ``time_limited=False`` checks memory only."""
        impl, n, pairs = row["impl"], row["n"], row["pairs"]
        seen = self.seen.get(impl)
        elements = cases.quadratic_elements(impl, n, pairs)
        if elements is not None:
            measured = None
            if seen and seen["elements"] and seen["peak_mb"] and seen["peak_mb"] > 0:
                measured = (seen["elements"], seen["peak_mb"])
            projected_mb = cases.projected_peak_mb(impl, elements, measured)
            row["projected_peak_mb"] = projected_mb
            if projected_mb > self.mem_limit_gb * 1024:
                return f"projected peak {projected_mb / 1024:.3g} GB > {self.mem_limit_gb:.3g} GB"
        if seen:
            work_ratio = self.work(impl, n, pairs) / seen["work"]
            projected_s = seen["time_s"] * work_ratio
            basis = ""
            base, _, variant = impl.partition("@")
            earlier = (base, seen["n"])
            if variant and (base, n) in self.times and earlier in self.times:
                # A tile variant of the reference runs its kernels: its time at this size is the
                # reference's times their ratio at the last size (the work ratio from a
                # host-bound small size overestimates it tenfold and more)
                projected_s = self.times[(base, n)] * seen["time_s"] / self.times[earlier]
            elif seen.get("kernel_s") is not None:
                # The step's kernels scale with the work, the rest of it (host path, launch
                # latency, a Python loop over the items) with N at most
                kernel_s = min(seen["kernel_s"], seen["time_s"])
                projected_s = kernel_s * work_ratio + (seen["time_s"] - kernel_s) * n / seen["n"]
                basis = (f" (its kernels' {kernel_s * 1e3:.3g} ms of the {seen['time_s'] * 1e3:.3g} ms step "
                         f"at N={seen['n']:,} scaled by the work, the rest by N)")
                row["projected_from_kernel_s"] = kernel_s
            row["projected_time_s"] = projected_s
            if time_limited and projected_s > self.max_step_s:
                return f"projected step {projected_s:.3g} s > {self.max_step_s:g} s{basis}"
        return None

    def refinable(self, impl: str) -> bool:
        """Whether the projection of ``impl`` can still use its kernels' time at its last size: a
        measured row, not yet profiled, not a tile variant, not compiled (a rebuild recompiles)."""
        seen = self.seen.get(impl)
        return (seen is not None and seen.get("kernel_s") is None and "@" not in impl
                and impl not in cases.COMPILED_IMPLS)

    def record_kernel_time(self, impl: str, kernel_s: float) -> None:
        self.seen[impl]["kernel_s"] = kernel_s

    def record(self, row: dict[str, Any]) -> None:
        impl, n, pairs = row["impl"], row["n"], row["pairs"]
        self.seen[impl] = {
            "elements": cases.quadratic_elements(impl, n, pairs) or 0.0,
            "peak_mb": row.get("peak_extra_mb") or 0.0,
            "time_s": row["time_s"],
            "work": self.work(impl, n, pairs),
            "n": n,
            "kernel_s": None,
        }
        self.times[(impl, n)] = row["time_s"]


def kernel_time_at(spec: dict[str, Any], args, clock: DeviceClock) -> float:
    """The kernels' time of one step of ``spec`` (its implementation at its N), rebuilt from the
    same seeded inputs and warmed up once."""
    inputs = cases.on_device(cases.make_inputs(spec), args.device)
    try:
        step = cases.build_step(spec, inputs, args.compile_backend)
        step()
        return clock.kernel_seconds(step)
    finally:
        del inputs
        clock.release()


def run_case(case: dict[str, Any], args, clock: DeviceClock, libauc_missing: str | None,
             started: float, on_row: Callable[[dict[str, Any]], None]) -> None:
    import torch

    projector = Projector(args.mem_limit_gb, args.max_step_s)
    for n in case["sizes"]:
        spec_base = {k: v for k, v in case.items() if k not in ("sizes", "impls", "dense_case", "only_at")}
        spec_base.update(n=n, seed=args.seed)
        cpu_inputs = cases.make_inputs(spec_base)
        pairs = cases.count_pairs(spec_base, cpu_inputs[1], cpu_inputs[2])
        elements = cases.group_pair_elements(cpu_inputs[2], n)
        reference: dict[str, Any] | None = None
        f64: float | None = None
        f64_done = False
        for impl in case["impls"]:
            row = dict(section=case["section"], case=case["case"], n=n, impl=impl, pairs=pairs,
                       pair_elements=elements)
            if case.get("dense_case"):
                row["dense_case"] = case["dense_case"]
            reason = None
            if not pairs:  # a small N may hold none (no positive, or no user with both): a loss of 0, by
                # which the cross-checks' relative differences divide (--sizes 1 ended the run there)
                reason = f"no pairs at N={n:,} (seed {args.seed}): nothing to time or cross-check"
            elif time.perf_counter() - started > args.budget_s:
                reason = f"run budget of {args.budget_s:.0f} s spent"
            elif impl.startswith("libauc") and libauc_missing:
                reason = libauc_missing
            elif impl.partition("@")[0] in ("mlloss-graph", "mlloss-replay") and not clock.cuda:
                reason = "a CUDA graph needs a CUDA device"
            elif n not in case.get("only_at", {}).get(impl, [n]):
                sizes = ", ".join(f"{size:,}" for size in case["only_at"][impl])
                reason = f"run time: this mode runs {impl} here only at N={sizes}"
            else:
                # The reference row always runs: a small-N step is mostly launch overhead, so the
                # work-ratio projection overestimates it, and every other row is checked against it.
                reason = projector.skip_reason(row, time_limited=impl != case["impls"][0])
                if reason and reason.startswith("projected step") and clock.times_kernels and projector.refinable(impl):
                    # A small N's step is mostly host path and launch latency, which the work
                    # ratio (N^2, pairs) overstates: profile that step's kernels, project again.
                    earlier = dict(spec_base, n=projector.seen[impl]["n"], impl=impl)
                    try:
                        projector.record_kernel_time(impl, kernel_time_at(earlier, args, clock))
                        reason = projector.skip_reason(row)
                    except Exception as exc:  # noqa: BLE001 -- keep the first projection
                        row["kernel_time_error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            if reason:
                row["skipped"] = reason
                on_row(row)
                print(f"  skip {case['case']} N={n} {impl}: {reason}", flush=True)
                continue
            # Fresh device copies per row: no implementation sees another's autograd state.
            inputs = cases.on_device(cpu_inputs, args.device)
            if not f64_done:
                f64, f64_done = cases.float64_reference(spec_base, inputs), True
            try:
                step = cases.build_step(dict(spec_base, impl=impl), inputs, args.compile_backend)
                reference_only = impl.endswith("-f64")
                result = measure_row(step, inputs[0], clock, compiled=impl in cases.COMPILED_IMPLS,
                                     repeats=REFERENCE_ONLY_REPEATS if reference_only else args.repeats,
                                     warm_up=not reference_only)
                grad = inputs[0].grad.detach().clone()
                if impl in cases.COMPILED_IMPLS:
                    result.update(cases.compile_counters())
                del step
            except Exception as exc:  # noqa: BLE001 -- record the failure (e.g. out of memory) and go on
                message = " ".join(str(exc).split())[:300]
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    message = "out of memory: " + message
                row["error"] = f"{type(exc).__name__}: {message}"
            if "error" in row:  # outside the except block: its traceback no longer holds the tensors
                print(f"  {case['case']} N={n} {impl}: {row['error']}", flush=True)
                del inputs
                clock.release()
                on_row(row)
                continue
            row.update(result)
            row["pairs_per_s"] = pairs / result["time_s"] if case["kind"] != "pdaom" else None
            reference = cases.check_against_reference(row, result["value"], grad, reference, f64)
            projector.record(row)
            on_row(row)
            extra = "" if result["peak_extra_mb"] is None else f", peak extra {result['peak_extra_mb']:.0f} MB"
            print(f"  {case['case']} N={n} {impl}: {result['time_s'] * 1e3:.2f} ms (median of "
                  f"{len(result['times_s'])}){extra}, first call {result['first_call_s']:.2f} s", flush=True)
            del inputs, grad
            clock.release()


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default), or cpu: smoke run with TRITON_INTERPRET=1 and N = 256")
    parser.add_argument("--quick", action="store_true",
                        help="N = 1k, 16k, 1M (grouped 16k, 1M), fewer baselines: every acceptance line")
    parser.add_argument("--sections", default="2,5,3,1,4,6,7", help="comma-separated sections, run in this order")
    parser.add_argument("--sizes", default=None, help="comma-separated N for every section (overrides the mode's)")
    parser.add_argument("--impls", default=None,
                        help="comma-separated implementations to keep (default all); the first kept is the reference")
    parser.add_argument("--output", default=None, help="JSON path or folder (default results/<gpu-slug>.json)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="combine earlier runs' JSONs into --output")
    parser.add_argument("--mem-limit-gb", type=float, default=None,
                        help="skip baselines projected above this peak (default 85%% of the GPU; 8 on cpu)")
    parser.add_argument("--max-step-s", type=float, default=None,
                        help="skip rows whose projected step exceeds this (default 10 s, quick 2 s)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip the remaining rows after this many seconds (default 500, quick 400)")
    parser.add_argument("--min-repeats", type=int, default=None)
    parser.add_argument("--max-repeats", type=int, default=None)
    parser.add_argument("--target-s", type=float, default=None, help="seconds of timed steps aimed at per row")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend of the compiled rows, naive-compile and mlloss-compile "
                             "(default inductor; aot_eager on cpu)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.command = " ".join(["python", *(sys.argv if argv is None else ["benchmarks/bench_gpu.py", *argv])])
    args.mode = "smoke" if args.device == "cpu" else ("quick" if args.quick else "full")
    min_repeats, max_repeats, target_s, max_step_s, budget_s = REPEATS[args.mode]
    if args.max_repeats is not None and args.max_repeats < 1:  # no timed step: every row a TypeError
        parser.error(f"--max-repeats must be >= 1; got {args.max_repeats}")
    args.repeats = (args.min_repeats or min_repeats, args.max_repeats or max_repeats, args.target_s or target_s)
    if args.repeats[0] > args.repeats[1]:  # the count is capped at the maximum: the minimum went unheeded
        parser.error(f"--min-repeats must not exceed --max-repeats; got {args.repeats[0]} and {args.repeats[1]} "
                     f"(the {args.mode} run's defaults: {min_repeats} and {max_repeats})")
    args.max_step_s = args.max_step_s or max_step_s
    args.budget_s = args.budget_s or budget_s
    args.compile_backend = args.compile_backend or ("aot_eager" if args.device == "cpu" else "inductor")

    def integers(option: str, text: str) -> list[int]:
        try:
            return [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            parser.error(f"--{option} takes comma-separated integers; got {text!r}")

    args.section_list = integers("sections", args.sections)
    if not args.section_list:
        parser.error(f"--sections names no section; got {args.sections!r}")
    args.size_list = integers("sizes", args.sizes) if args.sizes else None
    if args.size_list is not None and min(args.size_list, default=0) < 1:
        parser.error(f"--sizes must be >= 1 (each value); got {args.sizes}")
    args.impl_list = [s.strip() for s in args.impls.split(",") if s.strip()] if args.impls else None

    def implementations(sections) -> set[str]:
        return {impl for section in sections for case in cases.gpu_cases(section, args.mode, args.size_list)
                for impl in case["impls"]}

    try:  # an unknown section raises here, before any row
        planned = implementations(args.section_list)
    except ValueError as error:
        parser.error(f"--sections {args.sections}: {error}")
    if args.impl_list:  # a name in no section (a typo), or none in these sections: rows silently left out
        known = implementations(cases.GPU_SECTION_TITLES)
        unknown = [impl for impl in args.impl_list if impl not in known]
        if unknown:
            parser.error(f"--impls {','.join(unknown)}: no section runs it; the implementations: {', '.join(sorted(known))}")
        if not planned & set(args.impl_list):
            parser.error(f"--impls {args.impls}: none in sections {args.sections}, which run {', '.join(sorted(planned))}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.merge:
        if not args.output:
            sys.exit("bench_gpu.py: --merge needs --output")
        merge(args.merge, args.output, args.command)
        return
    if args.device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("bench_gpu.py: --device cpu needs TRITON_INTERPRET=1 set before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"  # before torch / triton are imported

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_gpu.py: --device cuda asked, but torch.cuda.is_available() is False (torch "
                 f"{torch.__version__}, built for CUDA {torch.version.cuda}). Run it on a GPU machine, or "
                 f"use --device cpu for the Triton-interpreter smoke run.")
    snapshot = _measure.snapshot_library(REPO_ROOT, tempfile.mkdtemp(prefix="mlloss-bench-src-"))
    try:
        sys.path.insert(0, snapshot)  # mlloss with kernels/ as mlloss.kernels, installed or not
        run(args)
    finally:
        sys.path.remove(snapshot)
        shutil.rmtree(snapshot, ignore_errors=True)


def run(args: argparse.Namespace) -> None:
    import mlloss
    import torch

    if args.mem_limit_gb is None:
        args.mem_limit_gb = (0.85 * torch.cuda.get_device_properties(0).total_memory / GB
                             if args.device == "cuda" else 8.0)
    planned = [case for section in args.section_list
               for case in cases.gpu_cases(section, args.mode, args.size_list)]
    for case in planned:
        if args.impl_list:
            case["impls"] = [impl for impl in case["impls"] if impl in args.impl_list]
    libauc_missing = cases.libauc_missing(planned)  # optional peer: its rows are skipped with the reason

    device = describe_device(args.device)
    device["mlloss"] = mlloss.__version__
    output = output_path(args, device)
    provenance = _measure.source_provenance(REPO_ROOT)
    provenance["measured"] = "snapshot of the working tree taken at start"
    started = time.perf_counter()
    print(f"device: {device.get('gpu_name') or device['cpu_model'] + ' (CPU smoke run, Triton interpreted)'}, "
          f"torch {device['torch']}, triton {device['triton']}, libauc {device['libauc']}; host: "
          f"{_measure.host_speed_words(device['host_speed'])}", flush=True)
    _measure.print_provenance(provenance, f"; writing {output}")
    report: dict[str, Any] = {
        "device": device,
        "provenance": provenance,
        "command": args.command,
        "settings": {
            "mode": args.mode, "sections": args.section_list, "sizes": args.size_list, "impls": args.impl_list,
            "seed": args.seed,
            "repeats_min_max_target_s": list(args.repeats), "max_step_s": args.max_step_s,
            "budget_s": args.budget_s, "mem_limit_gb": args.mem_limit_gb,
            "compile_backend": args.compile_backend, "compile_dynamic": False,
            "memory_method": DeviceClock(args.device).memory_method,
            "time_method": "forward+backward, median over the timed steps after 1-2 full-size warm-up "
                           "steps; CUDA events around each step, a sync before it (perf_counter on the CPU); "
                           f"back_to_back_s: {BACK_TO_BACK_STEPS} steps without a sync between them, per step, "
                           f"for steps under {BACK_TO_BACK_BELOW_S * 1e3:g} ms",
        },
        "results": [],
    }

    def on_row(row: dict[str, Any]) -> None:
        report["results"].append(row)
        report["total_wall_s"] = time.perf_counter() - started
        write_report(output, report)

    clock = DeviceClock(args.device)
    for section in args.section_list:
        print(f"\nrunning {cases.GPU_SECTION_TITLES[section]} ...", flush=True)
        for case in planned:
            if case["section"] == section:
                run_case(case, args, clock, libauc_missing, started, on_row)
        print("\n" + format_rows([r for r in report["results"] if r["section"] == section]), flush=True)
    report["provenance"]["working_tree_sha256_end"] = _measure.library_hash(REPO_ROOT)
    report["device"]["loadavg_end"] = list(os.getloadavg())
    report["total_wall_s"] = time.perf_counter() - started
    write_report(output, report)
    print("\n## Acceptance\n\n" + "\n".join(report["acceptance"]))
    print(f"\nwrote {output} ({report['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
