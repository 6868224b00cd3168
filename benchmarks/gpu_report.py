"""The report part of the GPU benchmark runner ``bench_gpu.py``: its tables, acceptance lines,
device description, output paths, JSON and Markdown files, and ``--merge``.

``bench_gpu.py`` measures the rows (timing, memory, skips) and calls ``write_report`` after every
row, ``format_rows`` for each section's table on the console, ``describe_device`` and
``output_path`` at the start, and ``merge`` for ``--merge``; nothing else imports this module.
torch is imported only inside ``describe_device``: ``bench_gpu.py --device cpu`` sets
``TRITON_INTERPRET`` before torch or triton is imported, after this module is.

Acceptance lines (computed from the rows, printed, stored in the JSON and the .md), the targets of
the GPU fast path: Triton AUC and LaA at N = 1,048,576 >= 6e11 valid pairs/s and <= 48 MB extra
memory; the whole call at N = 16,384 <= 0.3 ms (AUC and LaA); grouped AUC and LaA at
N = 1,048,576 in users of ~50 items <= 1 ms; ``PDAOMLoss`` at N = 1,048,576 <= 0.5 ms; then
naive eager and naive ``torch.compile`` time over Triton at N = 16,384 (>= 20x, >= 5x); the float32
loss within 1e-5 relative of the float64 one at N = 1,048,576 (section 6, each case run). Lines
without a target: the ``mlloss-graph`` rows (the call in a CUDA graph) beside the eager call (and
the eager call with ``validate_args=False``, ``mlloss-unchecked``: no host sync, and with graph
replay on, ``mlloss-replay``), LaA at the recipe's batch (N = 1,024: each of these ways, and the
call under ``torch.compile``, beside naive eager and naive ``torch.compile``), and section 7's tiles. A line gives a verdict (PASS / FAIL) only for a CUDA run that measured the target N; otherwise it says
"no verdict" and why.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import _measure
import cases
from cases import HEADLINE_MEMORY_N, HEADLINE_SPEEDUP_N, LAA_CASE, RECIPE_BATCH_N

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
GB = 1024**3

# The GPU targets of the fast-path issue (logistic, forward + backward, one H100).
PAIRS_PER_S_TARGET = 6e11  # AUC and LaA at N = 1,048,576
SMALL_CALL_TARGET_S = 0.3e-3  # the whole call at N = 16,384
GROUPED_CALL_TARGET_S = 1e-3  # N = 1,048,576 in users of ~50 items
PDAOM_CALL_TARGET_S = 0.5e-3  # PDAOMLoss at N = 1,048,576
MEMORY_TARGET_MB = 48.0  # extra memory at N = 1,048,576
ACCURACY_TARGET = 1e-5  # float32 loss vs float64, relative, at N = 1,048,576 (section 6)


def format_rows(rows: list[dict[str, Any]]) -> str:
    """One section's rows as a markdown table (skipped and failed rows say why)."""
    headers = ["case", "N", "implementation", "median ms", "min ms", "back-to-back ms", "peak extra MB", "pairs/s",
               "value rel. diff", "grad rel. diff", "first call s"]
    table = []
    for row in rows:
        head = [row["case"], f"{row['n']:,}", row["impl"]]
        if "skipped" in row or "error" in row:
            note = f"skipped: {row['skipped']}" if "skipped" in row else f"error: {row['error'][:100]}"
            table.append(head + [note] + ["-"] * 7)
            continue
        diff, grad = cases.cross_check_cells(row)
        table.append(head + [
            f"{row['time_s'] * 1e3:.3g}", f"{row['time_min_s'] * 1e3:.3g}",
            _measure.fmt_num(None if row.get("back_to_back_s") is None else row["back_to_back_s"] * 1e3, ".3g"),
            _measure.fmt_num(row["peak_extra_mb"], ".1f"), _measure.fmt_num(row.get("pairs_per_s"), ".3g"),
            diff, grad, f"{row['first_call_s']:.2f}",
        ])
    return _measure.markdown_table(headers, table)


def _measured(rows, case: str, impl: str) -> list[dict[str, Any]]:
    return sorted((r for r in rows if r["case"] == case and r["impl"] == impl and "time_s" in r),
                  key=lambda r: r["n"])


def _verdict(ok: bool, at_target: bool, gpu: bool) -> str:
    if not (at_target and gpu):
        return "no verdict: " + ("not on a GPU" if not gpu else "target N not measured")
    return "PASS" if ok else "FAIL"


def _row_at(rows: list[dict[str, Any]], n: int) -> tuple[dict[str, Any] | None, bool]:
    """The row at N = n, else the largest N measured below it (flagged as not at the target)."""
    exact = [r for r in rows if r["n"] == n]
    if exact:
        return exact[0], True
    below = [r for r in rows if r["n"] < n]
    return (below[-1] if below else None), False


def _missing(rows_all, case: str, impl: str, n: int) -> str:
    for row in rows_all:
        if row["case"] == case and row["impl"] == impl and row["n"] == n:
            return row.get("skipped") or row.get("error") or "not measured"
    return "not in this run"


def acceptance_lines(rows: list[dict[str, Any]], gpu: bool) -> list[str]:
    """The targets (H100/H200), computed from the rows; then the naive baselines over Triton."""
    lines = []
    for case in (cases.AUC_CASE, LAA_CASE):
        lines += _dense_lines(rows, case, gpu)
        lines += _replayed_line(rows, case, HEADLINE_SPEEDUP_N, SMALL_CALL_TARGET_S, gpu)
    for case in sorted({r["case"] for r in rows if r.get("dense_case")}):
        lines += _time_line(rows, case, "mlloss-triton", HEADLINE_MEMORY_N, GROUPED_CALL_TARGET_S, gpu)
        lines += _replayed_line(rows, case, HEADLINE_MEMORY_N, GROUPED_CALL_TARGET_S, gpu)
    lines += _time_line(rows, cases.PDAOM_CASE, "mlloss", HEADLINE_MEMORY_N, PDAOM_CALL_TARGET_S, gpu)
    lines += _replayed_line(rows, cases.PDAOM_CASE, HEADLINE_MEMORY_N, PDAOM_CALL_TARGET_S, gpu)
    return (lines + _naive_lines(rows, gpu) + _recipe_batch_lines(rows) + _accuracy_lines(rows, gpu)
            + _graph_lines(rows) + _tile_lines(rows) + _dense_or_layout_lines(rows))


def _graph_lines(rows: list[dict[str, Any]]) -> list[str]:
    """No target (the targets are of eager calls): each ``mlloss-graph`` row beside the eager call
    of the same case and N, so that a call's host path (their difference) is on record."""
    lines = []
    for graph in (r for r in rows if r["impl"] == "mlloss-graph" and "time_s" in r
                  and not r["case"].startswith((cases.GRAPH_TILES_PREFIX, cases.FACTORED_PREFIX))):
        # the eager call: the Triton tier's row, or the default backend's where the case times that
        # (PDAOM's, hard and soft)
        eager = [r for impl in ("mlloss-triton", "mlloss") for r in _measured(rows, graph["case"], impl)
                 if r["n"] == graph["n"]]
        unchecked = [r for r in _measured(rows, graph["case"], "mlloss-unchecked") if r["n"] == graph["n"]]
        replayed = [r for r in _measured(rows, graph["case"], "mlloss-replay") if r["n"] == graph["n"]]
        beside = f", eager {eager[0]['time_s'] * 1e3:.3g} ms" if eager else ""
        if unchecked:
            beside += f" ({unchecked[0]['time_s'] * 1e3:.3g} ms with validate_args=False)"
        if replayed:
            beside += f", eager with graph replay {replayed[0]['time_s'] * 1e3:.3g} ms"
        back_to_back = [f"{name} {found[0]['back_to_back_s'] * 1e3:.3g} ms"
                        for name, found in (("graph", [graph]), ("eager", eager), ("validate_args=False", unchecked),
                                            ("graph replay", replayed))
                        if found and found[0].get("back_to_back_s") is not None]
        if back_to_back:
            beside += "; per call back to back: " + ", ".join(back_to_back)
        lines.append(f"- {graph['case']} at N={graph['n']:,} in a CUDA graph (no target, no host path): "
                     f"{graph['time_s'] * 1e3:.3g} ms{beside}")
    return lines


def _tile_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Sections 7, 8 and 9, no target: per case and N, the fastest tiles (or settings) of the
    layout kernel against the library's choice (the ``mlloss-layout`` row, or in sections 8 and 9
    the ``mlloss-graph`` row; the twin with the library's tiles shows the run's noise)."""
    lines = []
    prefixes = (cases.TILES_PREFIX, cases.GRAPH_TILES_PREFIX, cases.FACTORED_PREFIX)
    for case in sorted({r["case"] for r in rows if r["case"].startswith(prefixes) and "time_s" in r}):
        graphed = case.startswith((cases.GRAPH_TILES_PREFIX, cases.FACTORED_PREFIX))
        reference = "mlloss-graph" if graphed else "mlloss-layout"
        for n in sorted({r["n"] for r in rows if r["case"] == case and "time_s" in r}):
            measured = [r for r in rows if r["case"] == case and r["n"] == n and "time_s" in r]
            library = [r for r in measured if r["impl"] == reference]
            best = min(measured, key=lambda r: r["time_s"])
            base = f"library's {library[0]['time_s'] * 1e3:.3g} ms" if library else "library's row not measured"
            lines.append(f"- {case} at N={n:,} (no target): fastest {best['impl'].partition('@')[2] or 'library tiles'} "
                         f"{best['time_s'] * 1e3:.3g} ms; {base} ({len(measured)} rows)")
    return lines


def _dense_or_layout_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Section 10, no target: per case and N, the layout and the dense kernels' times, eager and in
    a CUDA graph (the data for ``kernels/dense.py`` MAX_ITEMS)."""
    kinds = (("eager", "mlloss-layout", f"mlloss-triton@{cases.DENSE}"),
             ("in a CUDA graph", f"mlloss-graph@{cases.LAYOUT}", f"mlloss-graph@{cases.DENSE}"))
    lines = []
    for case in sorted({r["case"] for r in rows if r["case"].startswith(cases.DENSE_PREFIX) and "time_s" in r}):
        for n in sorted({r["n"] for r in rows if r["case"] == case and "time_s" in r}):
            times = {r["impl"]: r["time_s"] for r in rows if r["case"] == case and r["n"] == n and "time_s" in r}
            parts = [f"{kind} layout {_ms(times.get(layout))} / dense {_ms(times.get(dense))}"
                     for kind, layout, dense in kinds]
            lines.append(f"- {case} at N={n:,} (no target): " + "; ".join(parts))
    return lines


def _ms(seconds: float | None) -> str:
    return "not measured" if seconds is None else f"{seconds * 1e3:.3g} ms"


def _accuracy_lines(rows: list[dict[str, Any]], gpu: bool) -> list[str]:
    """Section 6: the float32 Triton loss against the same loss of float64 scores at N = 1,048,576
    (the gradient's max relative difference is reported with it)."""
    lines = []
    for case in [c["case"] for c in cases.accuracy_cases()]:
        row, at_target = _row_at(_measured(rows, case, "mlloss-triton"), HEADLINE_MEMORY_N)
        if row is None:
            if any(r["case"] == case for r in rows):
                lines.append(f"- {case}: not measured ({_missing(rows, case, 'mlloss-triton', HEADLINE_MEMORY_N)})")
            continue
        if "value_rel_diff" not in row:  # the float64 row failed: this row became the case's reference
            lines.append(f"- {case}: not measured (the float64 reference row failed: "
                         f"{_missing(rows, case, 'mlloss-triton-f64', HEADLINE_MEMORY_N)})")
            continue
        ok = row["value_rel_diff"] <= ACCURACY_TARGET
        lines.append(f"- {case}, float32 Triton loss vs float64 at N={row['n']:,}: {row['value_rel_diff']:.2g} "
                     f"relative (gradient max {row['grad_rel_diff']:.2g}); target <= {ACCURACY_TARGET:g}: "
                     f"{_verdict(ok, at_target, gpu)}")
    return lines


def _dense_lines(rows: list[dict[str, Any]], case: str, gpu: bool) -> list[str]:
    """Pairs/s and extra memory at N = 1,048,576, and the call's time at N = 16,384."""
    triton = _measured(rows, case, "mlloss-triton")
    if not triton:
        return [f"- {case}: no Triton row measured ({_missing(rows, case, 'mlloss-triton', HEADLINE_MEMORY_N)})"]
    lines = []
    row, at_target = _row_at(triton, HEADLINE_MEMORY_N)
    if row is not None:
        lines.append(
            f"- {case}, Triton throughput at N={row['n']:,}: {row['pairs_per_s']:.3g} valid pairs/s; "
            f"target >= {PAIRS_PER_S_TARGET:.0e}: {_verdict(row['pairs_per_s'] >= PAIRS_PER_S_TARGET, at_target, gpu)}"
        )
        if row["peak_extra_mb"] is not None:
            ok = row["peak_extra_mb"] <= MEMORY_TARGET_MB
            lines.append(f"- {case}, Triton peak extra memory at N={row['n']:,}: {row['peak_extra_mb']:.1f} MB; "
                         f"target <= {MEMORY_TARGET_MB:g} MB: {_verdict(ok, at_target, gpu)}")
    return lines + _time_line(rows, case, "mlloss-triton", HEADLINE_SPEEDUP_N, SMALL_CALL_TARGET_S, gpu)


def _time_line(rows, case: str, impl: str, n: int, target_s: float, gpu: bool) -> list[str]:
    measured = _measured(rows, case, impl)
    row, at_target = _row_at(measured, n)
    if row is None:
        return [f"- {case}, {impl} at N={n:,}: not measured ({_missing(rows, case, impl, n)})"]
    return [f"- {case}, {impl} forward + backward at N={row['n']:,}: {row['time_s'] * 1e3:.3g} ms; "
            f"target <= {target_s * 1e3:g} ms: {_verdict(row['time_s'] <= target_s, at_target, gpu)}"]


def _replayed_line(rows, case: str, n: int, target_s: float, gpu: bool) -> list[str]:
    """The same target for the eager call with graph replay on (``mlloss-replay``), where the run has its rows."""
    if not any(r["case"] == case and r["impl"] == "mlloss-replay" for r in rows):
        return []
    return _time_line(rows, case, "mlloss-replay", n, target_s, gpu)


def _naive_lines(rows: list[dict[str, Any]], gpu: bool) -> list[str]:
    """How much slower a user's naive broadcast is, eager and compiled, at N = 16,384 (LaA), than
    the eager Triton call, and than the same call with graph replay where the run has its rows."""
    lines = []
    for ours, name in (("mlloss-triton", "Triton"), ("mlloss-replay", "Triton with graph replay")):
        if ours == "mlloss-replay" and not any(r["case"] == LAA_CASE and r["impl"] == ours for r in rows):
            continue
        row, at_target = _row_at(_measured(rows, LAA_CASE, ours), HEADLINE_SPEEDUP_N)
        for impl, target in (("naive", 20.0), ("naive-compile", 5.0)):
            label = "naive eager" if impl == "naive" else "naive torch.compile"
            base = [r for r in _measured(rows, LAA_CASE, impl) if row and r["n"] == row["n"]]
            if row is None or not base:
                n = row["n"] if row else HEADLINE_SPEEDUP_N
                missing = _missing(rows, LAA_CASE, impl if row else ours, n)
                lines.append(f"- {label} / {name} at N={n:,}: not measured ({missing})")
                continue
            speedup = base[0]["time_s"] / row["time_s"]
            lines.append(f"- {label} / {name} at N={row['n']:,}: {speedup:.1f}x ({base[0]['time_s'] * 1e3:.3g} ms vs "
                         f"{row['time_s'] * 1e3:.3g} ms); target >= {target:g}x: "
                         f"{_verdict(speedup >= target, at_target, gpu)}")
    return lines


# The library's ways to run a call beside its naive peers at the recipe's batch (``_recipe_batch_lines``).
_LIBRARY_WAYS = (("mlloss-triton", "eager"), ("mlloss-unchecked", "eager with validate_args=False"),
                 ("mlloss-replay", "eager with graph replay"), ("mlloss-compile", "under torch.compile"),
                 ("mlloss-graph", "in a CUDA graph"))


def _recipe_batch_lines(rows: list[dict[str, Any]]) -> list[str]:
    """No target: LaA at the recipe's batch (N = 1,024, as many recommenders train), each way the
    library runs the call beside naive eager and naive ``torch.compile``, with how many times
    faster than the compiled naive code each is (below 1: slower)."""
    times = {r["impl"]: r["time_s"] for r in rows if r["case"] == LAA_CASE and r["n"] == RECIPE_BATCH_N and "time_s" in r}
    ours = [(way, times[impl]) for impl, way in _LIBRARY_WAYS if impl in times]
    if not ours:
        return []
    compiled = times.get("naive-compile")
    parts = [f"{way} {seconds * 1e3:.3g} ms" + (f" ({compiled / seconds:.2g}x)" if compiled else "")
             for way, seconds in ours]
    naive = [f"{name} {times[impl] * 1e3:.3g} ms" for impl, name in (("naive", "naive eager"),
                                                                     ("naive-compile", "naive torch.compile"))
             if impl in times]
    return [f"- {LAA_CASE} at the recipe's batch, N={RECIPE_BATCH_N:,} (no target): " + ", ".join(naive or ["no naive row"])
            + "; mlloss " + ", ".join(parts) + (" (x: naive torch.compile's time over the row's)" if compiled else "")]


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def describe_device(device: str) -> dict[str, Any]:
    """The CPU-side description of ``_measure`` plus the GPU, CUDA and Triton versions."""
    import torch

    described = _measure.device_description()
    described["torch_threads"] = torch.get_num_threads()
    described["device"] = device
    try:
        import triton

        described["triton"] = triton.__version__
    except ImportError:
        described["triton"] = None
    described["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    described["triton_launch"] = os.environ.get("MLLOSS_TRITON_LAUNCH")  # "triton": through Triton's path (kernels/_launch.py)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        described.update(
            gpu_name=torch.cuda.get_device_name(0),
            gpu_memory_gb=round(props.total_memory / GB, 1),
            gpu_sm_count=props.multi_processor_count,
            gpu_capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    else:
        described["gpu_name"] = None
    described["host_speed"] = _measure.host_speed(device)  # what the eager rows' host time is made of
    try:
        described["libauc"] = importlib.metadata.version("libauc")
    except importlib.metadata.PackageNotFoundError:
        described["libauc"] = None
    return described


def write_report(path: str, report: dict[str, Any]) -> None:
    """The JSON at ``path`` and a markdown page beside it (tables in section order, acceptance)."""
    rows = report["results"]
    report["acceptance"] = acceptance_lines(rows, report["device"]["device"] == "cuda")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(report, handle, indent=1)
    device = report["device"]
    name = device.get("gpu_name") or f"{device['cpu_model']} (CPU, Triton interpreter smoke run)"
    parts = [f"# mlloss pairwise benchmark: GPU\n\ndevice: {name}, torch {device['torch']}, triton "
             f"{device.get('triton')}, libauc {device.get('libauc')}, {device['date_utc']}\n\n"
             + (f"host: {_measure.host_speed_words(device['host_speed'])}\n\n" if device.get("host_speed") else "")
             + f"command: `{report['command']}`\n"]
    for section in sorted({r["section"] for r in rows}):
        parts.append(f"\n## {cases.GPU_SECTION_TITLES[section]}\n\n"
                     f"{format_rows([r for r in rows if r['section'] == section])}\n")
    parts.append("\n## Acceptance\n\n" + "\n".join(report["acceptance"]) + "\n")
    with open(os.path.splitext(path)[0] + ".md", "w") as handle:
        handle.write("".join(parts))


def output_path(args, device: dict[str, Any]) -> str:
    slug = device_slug(device["gpu_name"]) if device.get("gpu_name") else "cpu-interpret"
    name = slug + ("-quick" if args.mode != "full" else "") + ".json"
    if args.output is None:
        return os.path.join(RESULTS_DIR, name)
    if os.path.isdir(args.output) or args.output.endswith(os.sep):
        return os.path.join(args.output, name)
    return args.output


def merge(paths: Sequence[str], output: str, command: str) -> None:
    """Combine the rows of several runs (later files win for the same case, N and implementation)."""
    reports = []
    for path in paths:
        with open(path) as handle:
            reports.append(json.load(handle))
    rows: dict[tuple, dict[str, Any]] = {}
    for report in reports:
        for row in report["results"]:
            rows[(row["section"], row["case"], row["n"], row["impl"])] = row
    merged = dict(reports[0], command=command, merged_from=[os.path.abspath(p) for p in paths],
                  results=list(rows.values()))
    write_report(output, merged)
    print("\n".join(merged["acceptance"]))
    print(f"wrote {output}")
