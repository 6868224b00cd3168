"""Plot a benchmark JSON written by bench_pairwise.py or bench_gpu.py: time and peak memory against N.

    python benchmarks/plot.py benchmarks/results/cpu-2core.json      # writes cpu-2core.png beside it
    python benchmarks/plot.py benchmarks/results/nvidia-h100-80gb-hbm3.json

One row of panels per case measured at more than one N (the all-pairs sweeps; the closed forms
are one size), time (left) and peak extra memory (right), log-log, one line per implementation;
skipped or failed measurements are left out.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {
    "mlloss": "tab:orange", "mlloss-triton": "tab:orange", "mlloss-torch": "tab:red",
    "libauc": "tab:blue", "libauc-loop": "tab:blue", "naive": "tab:green", "naive-compile": "tab:olive",
}


def describe(device: dict) -> str:
    """One line naming the machine: the GPU (bench_gpu.py) or the CPU and its threads."""
    hardware = device.get("gpu_name") or f"{device['cpu_model']}, {device['torch_threads']} threads"
    return f"{hardware}, torch {device['torch']}, libauc {device.get('libauc', '-')}, {device['date_utc'][:10]}"


def load_sweeps(path: Path) -> tuple[str, dict[str, dict[str, list[tuple[int, float, float | None]]]]]:
    """(device description, {case: {implementation: [(N, time ms, peak MB), ...]}}) for the cases
    measured at more than one N."""
    data = json.loads(path.read_text())
    cases: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in data["results"]:
        if row.get("time_s") is not None:
            cases[row["case"]][row["impl"]].append((row["n"], 1000 * row["time_s"], row.get("peak_extra_mb")))
    sweeps = {
        case: implementations for case, implementations in cases.items()
        if len({n for points in implementations.values() for n, _, _ in points}) > 1
    }
    return describe(data["device"]), sweeps


def plot(path: Path, output: Path) -> None:
    device, sweeps = load_sweeps(path)
    if not sweeps:
        raise ValueError(f"{path} holds no case timed at more than one N")
    fig, axes = plt.subplots(len(sweeps), 2, figsize=(10, 3.2 * len(sweeps)), squeeze=False)
    for (case, implementations), (time_ax, memory_ax) in zip(sweeps.items(), axes):
        for impl, points in sorted(implementations.items()):
            sizes, times, peaks = zip(*sorted(points))
            style = dict(marker="o", ms=3, label=impl, color=COLOURS.get(impl))
            time_ax.plot(sizes, times, **style)
            measured = [(n, max(peak, 1.0)) for n, peak in zip(sizes, peaks) if peak is not None]
            if measured:
                memory_ax.plot(*zip(*measured), **style)
        time_ax.set(xscale="log", yscale="log", xlabel="N", ylabel="fwd+bwd ms", title=case)
        memory_ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak extra MB (min 1)", title=case)
        time_ax.legend(fontsize=8)
    fig.suptitle(device, fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="JSON written by bench_pairwise.py or bench_gpu.py")
    parser.add_argument("--output", type=Path, help="PNG path (default: beside the JSON)")
    args = parser.parse_args(argv)
    output = args.output or args.results.with_suffix(".png")
    plot(args.results, output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
