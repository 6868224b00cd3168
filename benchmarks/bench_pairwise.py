"""CPU benchmark of mlloss's exact pairwise losses against LibAUC and naive broadcast baselines.

Sections (``--sections 1,2,3,4``):

1. Logistic bipartite AUC, no groups, label priors 0.5 and 0.1: ``mlloss.AUCLoss("logistic")``
   (blocked all-pairs torch path) vs LibAUC ``PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)``
   vs a naive N x N broadcast. All three compute mean over pos x neg pairs of
   log(1 + exp(-(s_i - s_j))): LibAUC's logistic surrogate is log(1 + exp(-hparam * t)) on the raw
   predictions (no sigmoid, no margin), so hparam=1.0 is the same math; it is evaluated as
   torch.log(1 + torch.exp(.)), which overflows for t < -88 in float32 (not reached here: scores
   are N(0, 1)).
2. Logistic LaA (label aggregation, linear cost), two binary labels with priors 0.5 and 0.1, no
   groups: ``mlloss.LaALoss()`` vs naive broadcast. Acceptance: N = 65,536 under 512 MB extra peak.
3. Closed forms at scale: N = 1,000,000 items in 20,000 user groups (random 40-bit ids):
   exponential / squared / hinge ``AUCLoss`` and ``LaALoss`` (backend "auto" = closed form),
   each cross-checked against mlloss's blocked all-pairs path (backend="torch") on the same
   input, and ``PDAOMLoss()`` against a naive scatter min/max. Acceptance: exponential and
   squared under 2 s.
4. Grouped logistic AUC (users of ~50 items, prior 0.1): mlloss vs naive masked N x N broadcast
   vs LibAUC called once per user in a Python loop (mean over users with both classes, which is
   mlloss's ``reduction="mean"``).

Every (case, N, implementation) runs in a fresh process (see ``_measure`` for the memory method);
time is forward + backward wall time, the min over 3-4 full-size runs after a warm-up on a tiny
input, with ``torch.set_num_threads(2)`` and OMP_WAIT_POLICY=PASSIVE (``--omp-wait-policy``: on a
shared machine the default spinning OpenMP barrier made 2-thread ops up to 6x slower). "peak extra
MB" is the first full-size run's peak RSS above the baseline; "peak all runs MB" the peak over all
the full-size runs (grows when the C allocator keeps freed buffers between steps). Baselines whose
projected peak exceeds ``--mem-limit-gb`` (8) are skipped, and the naive LaA / grouped baselines
stop at N = 8192 to keep the full run near 15 minutes. "pairs/s" is valid pairs (the loss's pair
set, the same numerator for every implementation of a case) per second. "value rel. diff" compares each row with
the case's reference row (mlloss; for section 3 the closed form); the reference row shows, for
N <= 4096, its own difference from a float64 naive evaluation. "grad rel. diff" is
max|g - g_ref| / max|g_ref|.

The workers import mlloss from a copy of ``mlloss/`` taken at start (``--no-snapshot`` to use the
live tree), and the JSON records the git commit, the dirty library files and a hash of the sources.

Usage::

    python benchmarks/bench_pairwise.py                 # full run: ~10 min on 2 idle cores, ~16 busy
    python benchmarks/bench_pairwise.py --quick         # smoke test (~20-30 s): small sizes, one process
    python benchmarks/bench_pairwise.py --sections 1,3 --output benchmarks/results/x.json

``--quick`` runs every case in the driver process (memory numbers approximate: earlier cases'
heap is reused) and writes ``results/cpu-2core-quick.json`` unless ``--output`` is given.

The cases, inputs, pair counts, implementations (mlloss and the baselines) and cross-checks are
``cases.py``'s, shared with the GPU runner bench_gpu.py; this module is the CPU runner.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _measure  # noqa: E402
import cases  # noqa: E402

SCRIPT = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(SCRIPT))
DEFAULT_OUTPUT = os.path.join(os.path.dirname(SCRIPT), "results", "cpu-2core.json")
THREADS = 2


# --------------------------------------------------------------------------------------------
# One case in a worker (or in the driver with --in-process)
# --------------------------------------------------------------------------------------------


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the inputs, warm up, measure; save value and gradient to ``out_prefix + .grad.pt``."""
    import torch

    torch.set_num_threads(THREADS)
    inputs = cases.make_inputs(spec)
    tiny = cases.make_inputs(spec, n=min(256, spec["n"]))
    step, warm = cases.build_step(spec, inputs), cases.build_step(spec, tiny)
    load_before = os.getloadavg()
    measured = _measure.measure_step(step, warm, repeats=spec["repeats"], long_run_s=spec["long_run_s"])
    value = float(measured.pop("result"))
    torch.save({"value": value, "grad": inputs[0].grad.detach().clone()}, spec["out_prefix"] + ".grad.pt")
    import mlloss

    measured.update(
        value=value,
        mlloss_file=mlloss.__file__,
        loadavg_before=list(load_before),
        loadavg_after=list(os.getloadavg()),
        threads=torch.get_num_threads(),
    )
    return measured


def worker_main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    measured = run_case(spec)
    with open(spec["out_prefix"] + ".result.json", "w") as handle:
        json.dump(measured, handle)


# --------------------------------------------------------------------------------------------
# Driver: sections, skips, tables
# --------------------------------------------------------------------------------------------


def run_section(section: int, args, tmpdir: str, env_extra: dict[str, str]) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    planned = cases.cpu_cases(section, args.quick)
    libauc_missing = cases.libauc_missing(planned)  # optional peer: its rows are skipped with the reason
    for case in planned:
        measured_per_element: dict[str, tuple[float, float]] = {}  # impl -> (elements, MB)
        for n in case["sizes"]:
            spec_base = {k: v for k, v in case.items() if k not in ("sizes", "impls", "max_n")}
            spec_base.update(n=n, seed=args.seed, repeats=args.repeats, long_run_s=args.long_run_s)
            inputs = cases.make_inputs(spec_base)
            pairs = cases.count_pairs(spec_base, inputs[1], inputs[2])
            f64 = cases.float64_reference(spec_base, inputs)
            reference: dict[str, Any] | None = None
            for impl in case["impls"]:
                spec = dict(spec_base, impl=impl)
                row = dict(section=section, case=case["case"], n=n, impl=impl, pairs=pairs)
                elements = cases.quadratic_elements(impl, n, pairs)
                if impl.startswith("libauc") and libauc_missing:
                    row["skipped"] = libauc_missing
                    rows.append(row)
                    print(f"  skip {case['case']} N={n} {impl}: {libauc_missing}", flush=True)
                    continue
                if elements is not None:
                    projected_mb = cases.projected_peak_mb(impl, elements, measured_per_element.get(impl))
                    row["projected_peak_mb"] = projected_mb
                    cap = case.get("max_n", {}).get(impl)
                    if projected_mb > args.mem_limit_gb * 1024:
                        row["skipped"] = f"projected {projected_mb / 1024:.1f} GB > {args.mem_limit_gb:g} GB"
                    elif cap is not None and n > cap:
                        row["skipped"] = f"time budget: run up to N={cap} here (projected {projected_mb / 1024:.1f} GB)"
                    if "skipped" in row:
                        rows.append(row)
                        print(f"  skip {case['case']} N={n} {impl}: {row['skipped']}", flush=True)
                        continue
                if args.snapshot is None:  # measuring the live working tree: flag edits mid-run
                    row["library_sha256"] = _measure.library_hash(REPO_ROOT)
                    if row["library_sha256"] != args.library_sha256:
                        print(f"  WARNING: the mlloss sources changed during the run "
                              f"({args.library_sha256} -> {row['library_sha256']})", flush=True)
                spec["out_prefix"] = os.path.join(tmpdir, f"s{section}-{len(rows)}-{impl}-{n}")
                if args.in_process:
                    result = run_case(spec)
                    result["memory_isolation"] = "in-process (approximate: earlier cases' heap is reused)"
                else:
                    result = _measure.run_worker(SCRIPT, spec, timeout_s=args.timeout, env_extra=env_extra)
                    result["memory_isolation"] = "fresh process"
                row.update(result)
                if "error" not in result:
                    if elements is not None and result["peak_extra_mb"] > 0:
                        measured_per_element[impl] = (elements, result["peak_extra_mb"])
                    row["pairs_per_s"] = pairs / result["time_s"] if case["kind"] != "pdaom" else None
                    saved = torch.load(spec["out_prefix"] + ".grad.pt")
                    reference = cases.check_against_reference(row, saved["value"], saved["grad"], reference, f64)
                    os.remove(spec["out_prefix"] + ".grad.pt")
                rows.append(row)
                print(f"  {case['case']} N={n} {impl}: " + (
                    result["error"] if "error" in result else
                    f"{result['time_s'] * 1e3:.1f} ms, peak extra {result['peak_extra_mb']:.0f} MB, "
                    f"load {result['loadavg_before'][0]:.2f}"), flush=True)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    headers = ["case", "N", "implementation", "time ms", "peak extra MB", "peak all runs MB", "pairs/s",
               "value rel. diff", "grad rel. diff"]
    table = []
    for row in rows:
        if "skipped" in row:
            table.append([row["case"], row["n"], row["impl"], f"skipped: {row['skipped']}", "-", "-", "-", "-", "-"])
            continue
        if "error" in row:
            table.append([row["case"], row["n"], row["impl"], f"error: {row['error'][:80]}", "-", "-", "-", "-", "-"])
            continue
        diff, grad = cases.cross_check_cells(row)
        pairs_per_s = "-" if row.get("pairs_per_s") is None else f"{row['pairs_per_s']:.3g}"
        table.append([
            row["case"], row["n"], row["impl"], f"{row['time_s'] * 1e3:.1f}",
            f"{row['peak_extra_mb']:.0f}", f"{row['peak_extra_all_runs_mb']:.0f}", pairs_per_s, diff, grad,
        ])
    return _measure.markdown_table(headers, table)


def acceptance_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if "error" in row or "skipped" in row or row["impl"] != "mlloss":
            continue
        if row["section"] == 2 and row["n"] == 65536:
            ok = row["peak_extra_mb"] < 512
            lines.append(f"- LaALoss(surrogate='logistic'), N=65,536, 2 labels: peak extra "
                         f"{row['peak_extra_mb']:.0f} MB (< 512 MB: {'PASS' if ok else 'FAIL'}); "
                         f"RSS still held after the step {row['rss_after_mb']:.0f} MB; "
                         f"time {row['time_s']:.2f} s")
        if row["section"] == 3 and row["n"] >= 1_000_000 and any(
            s in row["case"] for s in ("exponential", "squared")
        ) and not row["case"].startswith("PDAOM"):
            ok = row["time_s"] < 2.0
            lines.append(f"- {row['case']}, N={row['n']:,}: {row['time_s']:.2f} s "
                         f"(< 2 s: {'PASS' if ok else 'FAIL'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--sections", default="1,2,3,4", help="comma-separated sections to run")
    parser.add_argument("--output", default=None, help=f"JSON path (default {DEFAULT_OUTPUT})")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed full-size runs after the memory run (default 3, quick 1)")
    parser.add_argument("--long-run-s", type=float, default=5.0,
                        help="one repeat fewer when the first full-size run exceeds this many seconds")
    parser.add_argument("--mem-limit-gb", type=float, default=8.0,
                        help="skip baseline cases whose projected peak exceeds this")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-case worker timeout, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-process", action="store_true",
                        help="run every case in this process (no fresh process per case; memory numbers "
                             "approximate); implied by --quick unless --fresh-process is given")
    parser.add_argument("--fresh-process", action="store_true", help="with --quick, still isolate cases")
    parser.add_argument("--omp-wait-policy", default="PASSIVE",
                        help="OMP_WAIT_POLICY for the measured processes (default PASSIVE; 'unset' leaves "
                             "it unset). With other processes on the cores, the default spinning OpenMP "
                             "barrier makes every 2-thread op wait for a descheduled thread")
    parser.add_argument("--no-snapshot", action="store_true",
                        help="import mlloss from the working tree in every worker instead of from a copy "
                             "taken at start (the copy keeps one version if the tree is edited mid-run)")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=None,
                        help="set MALLOC_MMAP_THRESHOLD_ (bytes) in the workers (pins glibc's mmap threshold)")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.quick and not args.fresh_process:
        args.in_process = True
    output = args.output or (DEFAULT_OUTPUT if not args.quick else
                             os.path.join(os.path.dirname(DEFAULT_OUTPUT), "cpu-2core-quick.json"))
    try:
        sections = [int(s) for s in args.sections.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sections takes comma-separated integers; got {args.sections!r}")
    unknown = [section for section in sections if section not in cases.CPU_SECTION_TITLES]
    if unknown or not sections:  # an unknown one was a KeyError after the sections before it had run, unwritten
        parser.error(f"--sections must name sections of {sorted(cases.CPU_SECTION_TITLES)}; got {args.sections!r}")
    snapshot = None
    if not args.no_snapshot:
        snapshot = os.environ.get("MLLOSS_BENCH_SNAPSHOT") or _measure.snapshot_library(
            REPO_ROOT, tempfile.mkdtemp(prefix="mlloss-bench-src-"))
    env_extra = {"OMP_NUM_THREADS": str(THREADS)}
    if snapshot:
        env_extra["MLLOSS_BENCH_SNAPSHOT"] = snapshot
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != snapshot]
        env_extra["PYTHONPATH"] = os.pathsep.join([snapshot, *inherited])
    if args.omp_wait_policy.lower() != "unset":
        env_extra["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if args.malloc_mmap_threshold is not None:
        env_extra["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    if args.in_process and any(os.environ.get(k) != v for k, v in env_extra.items()):
        # OpenMP and glibc read these at start-up: re-execute this driver with them set.
        os.environ.update(env_extra)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if snapshot and snapshot not in sys.path:
        sys.path.insert(0, snapshot)

    import torch

    torch.set_num_threads(THREADS)
    device = _measure.device_description()
    provenance = _measure.source_provenance(REPO_ROOT)
    provenance["measured"] = "snapshot of the working tree taken at start" if snapshot else "working tree"
    args.library_sha256 = provenance["library_sha256"]
    args.snapshot = snapshot
    device["torch_threads"] = THREADS
    started = time.perf_counter()
    print(f"device: {device['cpu_model']}, {device['logical_cpus']} logical CPUs, torch {device['torch']}, "
          f"load average {tuple(round(x, 2) for x in device['loadavg_start'])}", flush=True)
    _measure.print_provenance(provenance)
    all_rows: list[dict[str, Any]] = []
    markdown = []
    with tempfile.TemporaryDirectory(prefix="mlloss-bench-") as tmpdir:
        for section in sections:
            load_start = os.getloadavg()
            print(f"\nrunning {cases.CPU_SECTION_TITLES[section]} ...", flush=True)
            rows = run_section(section, args, tmpdir, env_extra)
            load_end = os.getloadavg()
            table = format_rows(rows)
            block = (f"\n## {cases.CPU_SECTION_TITLES[section]}\n\nload average (1, 5, 15 min) at start "
                     f"{tuple(round(x, 2) for x in load_start)}, at end {tuple(round(x, 2) for x in load_end)}"
                     f"\n\n{table}\n")
            print(block, flush=True)
            markdown.append(block)
            all_rows.extend(rows)
    accept = acceptance_lines(all_rows)
    if accept:
        block = "\n## Acceptance\n\n" + "\n".join(accept) + "\n"
        print(block)
        markdown.append(block)
    device["loadavg_end"] = list(os.getloadavg())
    try:
        import libauc

        device["libauc"] = libauc.__version__
    except Exception:  # noqa: BLE001
        device["libauc"] = None
    import mlloss

    device["mlloss"] = mlloss.__version__
    report = {
        "device": device,
        "provenance": dict(provenance, working_tree_sha256_end=_measure.library_hash(REPO_ROOT)),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "settings": {
            "quick": args.quick, "sections": sections, "repeats": args.repeats,
            "long_run_s": args.long_run_s, "mem_limit_gb": args.mem_limit_gb, "seed": args.seed,
            "threads": THREADS, "malloc_mmap_threshold": args.malloc_mmap_threshold,
            "omp_wait_policy": args.omp_wait_policy, "in_process": args.in_process,
            "worker_env": env_extra,
            "memory_method": _measure.__doc__.split("\n\n")[1].replace("\n", " "),
            "time_method": "forward+backward wall time, min over the full-size runs (the memory run "
                           "included) after a warm-up on a 256-item input",
        },
        "total_wall_s": time.perf_counter() - started,
        "results": all_rows,
        "acceptance": accept,
    }
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as handle:
        json.dump(report, handle, indent=1)
    with open(os.path.splitext(output)[0] + ".md", "w") as handle:
        handle.write(f"# mlloss pairwise benchmark\n\ndevice: {device['cpu_model']}, {device['logical_cpus']} "
                     f"logical CPUs, torch {device['torch']}, {device['date_utc']}\n\ncommand: "
                     f"`{report['command']}`\n" + "".join(markdown))
    if snapshot:
        import shutil

        shutil.rmtree(snapshot, ignore_errors=True)
    print(f"\nwrote {output} ({report['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
