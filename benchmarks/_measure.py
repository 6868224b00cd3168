"""Measurement helpers shared by the benchmarks: peak memory, timing, subprocess workers, tables.

Memory method (one method, used for every case): each (implementation, N) case runs in a fresh
Python process (``subprocess``, fork + exec, so nothing is inherited from the driver). In that
process the inputs are created and the loss is run once on a tiny input (imports, first-call
allocations and thread pools are then paid), the kernel's peak-RSS counter is reset by writing
``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), and the baseline is the current ``VmRSS``.
After one full-size forward + backward, "peak extra" is ``VmHWM - baseline``: the resident-set
high-water mark of the step, the same quantity as ``ru_maxrss`` after minus before, but without
``ru_maxrss``'s inheritance of the parent's peak across ``exec``. If ``clear_refs`` cannot be
written, the baseline is ``VmHWM`` itself (the ``ru_maxrss`` method: peak after minus peak
before), and the JSON records which method was used.

RSS counts what the process holds from the OS, so memory a loss frees but the C allocator (glibc
malloc by default) keeps in its heap counts too. That is what a user's process pays; the JSON also
records the RSS still held after the step (``rss_after_mb``) so that allocator retention can be
told apart from live tensors. ``--malloc-mmap-threshold`` reruns the workers with glibc's dynamic
mmap threshold pinned, which returns every large buffer to the OS on free.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

MB = 1024 * 1024


def read_status_kb() -> dict[str, int]:
    """VmRSS / VmHWM of this process in kB, from /proc/self/status."""
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def reset_peak() -> tuple[float, str]:
    """Reset the peak-RSS counter if the kernel allows; return (baseline MB, method name)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return read_status_kb()["VmRSS"] / 1024, "VmHWM after clear_refs reset - VmRSS baseline"
    except OSError:
        return read_status_kb()["VmHWM"] / 1024, "VmHWM after - VmHWM before (ru_maxrss method)"


def peak_mb() -> float:
    return read_status_kb()["VmHWM"] / 1024


def rss_mb() -> float:
    return read_status_kb()["VmRSS"] / 1024


def measure_step(
    step: Callable[[], Any],
    warmup: Callable[[], Any],
    *,
    repeats: int,
    long_run_s: float = 15.0,
) -> dict[str, Any]:
    """Warm up, reset the peak counter, run the full-size step once for memory, then time repeats.

    Returns the first run's result, its peak extra memory, and all full-size run times (the first
    included). When the first run takes longer than ``long_run_s`` one repeat fewer is run.
    """
    warmup()
    baseline, method = reset_peak()
    start = time.perf_counter()
    result = step()
    times = [time.perf_counter() - start]
    peak_first = peak_mb() - baseline
    gc.collect()
    rss_after = rss_mb() - baseline
    extra = repeats - 1 if times[0] > long_run_s else repeats
    for _ in range(max(extra, 0)):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "result": result,
        "times_s": times,
        "time_s": min(times),
        "peak_extra_mb": peak_first,
        "peak_extra_all_runs_mb": peak_mb() - baseline,
        "rss_after_mb": rss_after,
        "baseline_rss_mb": baseline,
        "memory_method": method,
    }


def run_worker(
    script: str, spec: dict[str, Any], *, timeout_s: float, env_extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python script --worker SPEC`` in a fresh process; return its JSON result or an error."""
    spec_path = spec["out_prefix"] + ".spec.json"
    result_path = spec["out_prefix"] + ".result.json"
    with open(spec_path, "w") as handle:
        json.dump(spec, handle)
    env = dict(os.environ)
    env.update(env_extra or {})
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, script, "--worker", spec_path],
            capture_output=True, text=True, timeout=timeout_s, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout_s:.0f} s"}
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not os.path.exists(result_path):
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        reason = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit {proc.returncode}"
        return {"error": f"{reason}: {' | '.join(tail)}"}
    with open(result_path) as handle:
        result = json.load(handle)
    result["worker_wall_s"] = wall
    return result


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or "unknown" (the float bits of a run, hence a
    recipe's test metrics, can differ between CPU models for the same code: vectorised kernels
    sum in other orders)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def device_description() -> dict[str, Any]:
    import torch

    model = cpu_model()
    try:
        with open("/proc/meminfo") as meminfo:
            total_kb = int(meminfo.readline().split()[1])
    except OSError:
        total_kb = 0
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(total_kb / MB, 1),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": list(os.getloadavg()),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def host_speed(device: str = "cpu", rounds: int = 5) -> dict[str, float]:
    """The host's speed at what a host-bound loss call is made of, in microseconds an operation
    (each the smallest of ``rounds`` rounds): a Python function call (``python_call_us``), an eager
    op on 16-element CPU tensors (``cpu_op_us``: PyTorch's dispatch), and with ``device="cuda"`` the
    same op on CUDA tensors (``cuda_op_us``: the host's side of a kernel launch, fewer launches a
    round than the launch queue holds). Eager rows of two machines compare through these: at
    N = 1,024 a call's time is its host's."""
    import torch

    def smallest(run, count: int) -> float:
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            run(count)
            times.append(time.perf_counter() - start)
        return round(1e6 * min(times) / count, 3)

    def increment(x):
        return x + 1

    def python_calls(count: int) -> None:
        for i in range(count):
            increment(i)

    def ops_on(target: str):
        a, b, out = (torch.ones(16, device=target) for _ in range(3))

        def ops(count: int) -> None:
            for _ in range(count):
                torch.add(a, b, out=out)
            if target == "cuda":
                torch.cuda.synchronize()
        ops(10)  # first-call costs out of the rounds
        return ops

    speed = {"python_call_us": smallest(python_calls, 100_000), "cpu_op_us": smallest(ops_on("cpu"), 2_000)}
    if device == "cuda":
        speed["cuda_op_us"] = smallest(ops_on("cuda"), 500)
    return speed


def host_speed_words(speed: dict[str, float]) -> str:
    """``host_speed`` in words."""
    words = {"python_call_us": "a Python call", "cpu_op_us": "an eager op on the CPU",
             "cuda_op_us": "an eager op's CUDA launch"}
    return ", ".join(f"{words[key]} {value:.3g} us" for key, value in speed.items())


def device_name(device: Any) -> str:
    """A benchmark's device in words: the GPU's name, or the CPU and its torch threads."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def source_provenance(repo_root: str) -> dict[str, Any]:
    """Git commit and dirty state of the library, plus a hash of its sources (detects edits mid-run)."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", repo_root, *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        # only the trailing newline: a porcelain line's first column is its staged state (" M": unstaged)
        return out.stdout.rstrip("\n") if out.returncode == 0 else None

    status = git("status", "--porcelain", "--", "mlloss", "kernels")
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "library_dirty_files": status.splitlines() if status else [],
        "library_sha256": library_hash(repo_root),
    }


def print_provenance(provenance: dict[str, Any], tail: str = "") -> None:
    """Print a run's library line from ``source_provenance``: commit, dirty files, source hash, ``tail``."""
    print(f"mlloss at {provenance['git_commit']}, dirty library files: {provenance['library_dirty_files']}, "
          f"sources sha256 {provenance['library_sha256']}{tail}", flush=True)


def snapshot_library(repo_root: str, target: str) -> str:
    """Copy mlloss/ (and kernels/ as mlloss/kernels, as installed) into ``target``; return it.

    Workers get ``target`` first on PYTHONPATH, which wins over the editable install's finder
    (appended to ``sys.meta_path``), so a run measures one version even if the tree is edited.
    """
    import shutil

    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(os.path.join(repo_root, "mlloss"), os.path.join(target, "mlloss"), ignore=ignore)
    kernels = os.path.join(repo_root, "kernels")
    if os.path.isdir(kernels) and not os.path.exists(os.path.join(target, "mlloss", "kernels")):
        shutil.copytree(kernels, os.path.join(target, "mlloss", "kernels"), ignore=ignore)
    return target


def library_hash(repo_root: str) -> str:
    """sha256 over the library's Python sources (mlloss/ and kernels/), path-sorted."""
    import hashlib

    digest = hashlib.sha256()
    for folder in ("mlloss", "kernels"):
        base = os.path.join(repo_root, folder)
        for root, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    digest.update(os.path.relpath(path, repo_root).encode())
                    with open(path, "rb") as handle:
                        digest.update(handle.read())
    return digest.hexdigest()[:16]


def fmt_num(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
