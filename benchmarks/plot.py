"""Plot a benchmark JSON written by bench_pairwise.py: time and peak memory against N, per case.

    python benchmarks/plot.py benchmarks/results/cpu-2core.json      # writes cpu-2core.png beside it

One row of panels per all-pairs case (sections 1, 2 and 4), time (left) and peak extra memory
(right), log-log, one line per implementation; skipped or failed measurements are left out.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SWEEP_SECTIONS = (1, 2, 4)  # sections that sweep N; section 3 is one size
COLOURS = {"mlloss": "tab:orange", "libauc": "tab:blue", "libauc-loop": "tab:blue", "naive": "tab:green"}


def load_sweeps(path: Path) -> tuple[str, dict[str, dict[str, list[tuple[int, float, float]]]]]:
    """(device description, {case: {implementation: [(N, time ms, peak MB), ...]}})."""
    data = json.loads(path.read_text())
    device = data["device"]
    description = (
        f"{device['cpu_model']}, {device['torch_threads']} threads, torch {device['torch']}, "
        f"libauc {device.get('libauc', '-')}, {device['date_utc'][:10]}"
    )
    sweeps: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for row in data["results"]:
        if row.get("section") in SWEEP_SECTIONS and row.get("time_s") is not None:
            sweeps[row["case"]][row["impl"]].append((row["n"], 1000 * row["time_s"], row["peak_extra_mb"]))
    return description, sweeps


def plot(path: Path, output: Path) -> None:
    device, sweeps = load_sweeps(path)
    if not sweeps:
        raise ValueError(f"{path} holds no timed rows of sections {SWEEP_SECTIONS}")
    fig, axes = plt.subplots(len(sweeps), 2, figsize=(10, 3.2 * len(sweeps)), squeeze=False)
    for (case, implementations), (time_ax, memory_ax) in zip(sweeps.items(), axes):
        for impl, points in sorted(implementations.items()):
            sizes, times, peaks = zip(*sorted(points))
            style = dict(marker="o", ms=3, label=impl, color=COLOURS.get(impl))
            time_ax.plot(sizes, times, **style)
            memory_ax.plot(sizes, [max(peak, 1.0) for peak in peaks], **style)
        time_ax.set(xscale="log", yscale="log", xlabel="N", ylabel="fwd+bwd ms", title=case)
        memory_ax.set(xscale="log", yscale="log", xlabel="N", ylabel="peak extra MB (min 1)", title=case)
        time_ax.legend(fontsize=8)
    fig.suptitle(device, fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="JSON written by bench_pairwise.py")
    parser.add_argument("--output", type=Path, help="PNG path (default: beside the JSON)")
    args = parser.parse_args(argv)
    output = args.output or args.results.with_suffix(".png")
    plot(args.results, output)
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
