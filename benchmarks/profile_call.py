"""Where one forward + backward of a loss spends its time: the host (Python, aten dispatch, kernel
launches) or the device (the kernels), from ``torch.profiler``.

What it is for: telling whether a call is bound by its kernels or by its host path, which decides
what to speed up. It runs ``bench_gpu.py``'s logistic AUC and LaA cases at N = 16,384, and its
grouped AUC and PDAOM cases at N = 2^20, and the grouped AUC at 16,384 too (``cases.py``: the same seeded inputs and losses as its
``mlloss-triton`` rows) and times ``--steps`` calls (wall clock, one synchronisation at the end, so that
host work and kernels overlap as in training), then profiles ``--profiled`` more and prints the ops
by device time and by host time, with the device time per call, and where the host's time goes by
Python function (cProfile: the library's Python, PyTorch's and Triton's, and calls into C).

Usage::

    python benchmarks/profile_call.py                          # CUDA if available, each case at its target size
    python benchmarks/profile_call.py --impls mlloss-triton mlloss-replay --cases AUC PDAOM  # and replayed
    python benchmarks/profile_call.py --device cpu --num-items 256 --output /tmp/profile.txt

On the CPU the kernels run on the host too (``TRITON_INTERPRET=1`` for ``backend="triton"``):
only the CUDA figures separate the two.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
from _measure import device_name, host_speed, host_speed_words  # noqa: E402

# bench_gpu.py's cases (``cases.py``: the same seeded inputs as its rows), on the Triton backend, each
# at the size of its GPU target: the calls at N = 16,384 and the grouped ones at N = 2^20 (users of ~50);
# the grouped AUC also at 16,384, so that the layout kernels' time is seen at both sizes (at 2^20 the
# grouped positions kernel took 92-96 us, 20% of the call in a CUDA graph with today's tiles: how it
# scales with the blocks, whose counts every program sums, decides whether it needs a scan of its own).
CASES = {"AUC": cases.auc_logistic(0.1), "LaA": cases.laa_logistic(), "grouped-AUC": cases.grouped_auc_logistic(),
         "grouped-AUC-16K": cases.grouped_auc_logistic(), "PDAOM": cases.pdaom(group_size=cases.GROUP_SIZE)}
SIZES = {"AUC": 16_384, "LaA": 16_384, "grouped-AUC": 1 << 20, "grouped-AUC-16K": 16_384, "PDAOM": 1 << 20}


def profile_case(name: str, num_items: int, device: torch.device, steps: int, profiled: int, seed: int,
                 impl: str = "mlloss-triton") -> str:
    spec = dict(CASES[name], impl=impl, n=num_items, seed=seed)
    inputs = cases.on_device(cases.make_inputs(spec), device)
    step = cases.build_step(spec, inputs)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(3):  # compiles the kernels
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    per_step = (time.perf_counter() - start) / steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(profiled):
            step()
        sync()
    averages = prof.key_averages()
    replayed = " with graph replay on" if impl == "mlloss-replay" else ""
    lines = [f"## {spec['case']}, N = {num_items:,}, {device.type}{replayed}: {1e3 * per_step:.3f} ms per forward "
             f"+ backward (wall clock, {steps} calls)"]
    if device.type == "cuda":
        device_us = sum(e.self_device_time_total for e in averages) / profiled
        lines.append(f"device time per call: {device_us / 1e3:.3f} ms (kernels and copies, from the profile)")
        lines.append(averages.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))
    lines.append(averages.table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
    lines.append(python_profile(step, profiled, sync))
    return "\n".join(lines)


# Whose code a cProfile entry is: the library's (mlloss/, kernels/), PyTorch's or Triton's Python,
# or a call into C (cProfile files builtins and C methods under "~": aten ops, the kernels' launchers).
REPO = Path(__file__).resolve().parents[1]
OWNERS = ("mlloss Python", "torch Python", "triton Python", "C calls", "other Python")


def _owner(filename: str) -> str:
    if filename == "~":
        return "C calls"
    path = Path(filename).resolve()
    if path.is_relative_to(REPO / "mlloss") or path.is_relative_to(REPO / "kernels"):
        return "mlloss Python"
    parts = path.parts
    return "torch Python" if "torch" in parts else "triton Python" if "triton" in parts else "other Python"


def python_profile(step, calls: int, sync) -> str:
    """Where the host's time of ``calls`` calls goes by the Python functions' own time (cProfile,
    which slows Python calls more than C ones: compare shares across machines, not times): per
    owner (``OWNERS``) and the 12 functions with the most."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    sync()
    profiler.disable()
    entries = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own, cumulative, callers)
    own = {owner: 0.0 for owner in OWNERS}
    for (filename, _, _), (_, _, tottime, _, _) in entries.items():
        own[_owner(filename)] += tottime
    total = sum(own.values()) or 1.0
    lines = [f"Python profile (cProfile, {calls} calls): {1e6 * total / calls:.0f} us a call under the profiler; "
             + ", ".join(f"{owner} {100 * seconds / total:.0f}%" for owner, seconds in own.items()),
             "own us/call  calls/call  function"]
    top = sorted(entries.items(), key=lambda entry: -entry[1][2])[:12]
    for (filename, line, name), (_, count, tottime, _, _) in top:
        where = name if filename == "~" else f"{Path(filename).name}:{line}({name})"
        lines.append(f"{1e6 * tottime / calls:11.1f}  {count / calls:10.1f}  {where}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-items", type=int, default=None,
                        help="items per call of every case (default: each case's target size, " +
                        ", ".join(f"{name} {size:,}" for name, size in SIZES.items()) + ")")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--impls", nargs="+", default=["mlloss-triton"], choices=["mlloss-triton", "mlloss-replay"],
                        help="each case's eager call as it is, and/or replayed from its CUDA graph "
                             "(mlloss.set_graph_replay: the host path left)")
    parser.add_argument("--steps", type=int, default=50, help="timed calls")
    parser.add_argument("--profiled", type=int, default=10, help="profiled calls")
    parser.add_argument("--seed", type=int, default=0, help="bench_gpu.py's --seed")
    parser.add_argument("--output", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    # --steps 0 or --profiled 0: a ZeroDivisionError after a case's warm-up (below 0: negative times);
    # --num-items 0 silently took each case's target size (2^20 for some), below 0 failed in torch.randn
    for name in ("steps", "profiled", "num_items"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {value}")
    device = torch.device(args.device)
    header = (f"# profile_call.py: {device_name(device)}, torch {torch.__version__}\n"
              f"host: {host_speed_words(host_speed(device.type))}")
    sections = [header]
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
    for impl in args.impls:
        for name in args.cases:
            with contextlib.redirect_stderr(io.StringIO()):  # the profiler's warnings
                sections.append(profile_case(name, args.num_items or SIZES[name], device, args.steps, args.profiled,
                                             args.seed, impl))
            if args.output:  # after each case: a stage stopped at its time limit keeps the cases done
                args.output.write_text("\n\n".join(sections) + "\n")
    report = "\n\n".join(sections) + "\n"
    print(report)
    return report


if __name__ == "__main__":
    main()
