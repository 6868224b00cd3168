"""Host time of one eager loss call, with the real kernel launch path, measured without a GPU.

At the batch sizes recommenders train with, an eager forward + backward on a GPU is bound by
the host: on an H100 an ``AUCLoss`` call at N = 16,384 took 0.93 ms of wall time for 0.14 ms of
kernels (``results/nvidia-h100-80gb-hbm3-profile-a98808d.txt``). The host's share is the
library's Python, PyTorch's dispatch of each aten op and the launch of each kernel (Triton's
``JITFunction.run`` binds and specializes the arguments and hashes a cache key; the library's
``kernels._launch`` does that once per specialization and then calls the compiled kernel's
launcher). This tool times all three on the CPU:

* the kernels are Triton's JIT functions compiled for Hopper (``GPUTarget("cuda", 90, 32)``,
  ptxas) on their first launch, as on a GPU, with the library's CUDA launch choices (tiles,
  chunks for 132 multiprocessors, fast math: ``cuda_specializations.cuda_launch_choices``). A
  stand-in driver (``StandInDriver``) loads no binary and its launcher returns at once: every
  launch runs the whole Python launch path and launches nothing;
* the tensors are CPU tensors, so the aten ops compute on the CPU (1,024 items: a few us each)
  and no CUDA launch or allocation is paid. The kernels' outputs keep what their allocation held,
  and the aten ops after a kernel compute on that: a sort after a kernel (the layout of LaA's
  label patterns, ranked by ``kernels.levels``) costs what sorting those bytes costs. Compare a
  change that moves work from aten ops into a kernel on the rows where nothing sorts its output
  (the dense kernels'), or on a GPU.

Each row times ``--calls`` forward + backward calls (after warm-up) in the thread's CPU time,
``validate_args=False`` (a step without host syncs, as under CUDA graphs), and as many with
every kernel launch removed (``launches removed``): their difference is the launch path.
The calls run in blocks, the two kinds alternating, and each figure is the smallest block
median; every row is timed in ``--rounds`` rounds over all rows and its fastest kept: this VM's
speed changes by up to 2x for seconds at a time. The GPU machine's CPU is
another CPU: compare rows within one run, and two versions in alternating processes (``--root``
of a checkout of the other version, as ``bench_cpu_path.py`` takes it; ``--compare``).

Usage::

    python benchmarks/host_time.py [--calls 300] [--rounds 3] [--match AUC] [--replay] [--root DIR] [--output benchmarks/results/host-time.json]
    python benchmarks/host_time.py --compare old-1.json old-2.json --to new-1.json new-2.json --output ab.json

Not under ``TRITON_INTERPRET=1``: the kernels are compiled, not interpreted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("benchmarks/host_time.py compiles the kernels: run it without TRITON_INTERPRET=1")
os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (host_path sets a default of 1)

HERE = os.path.dirname(os.path.abspath(__file__))


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per row (default 300)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times every row this many times, in turn, and keeps each row's fastest (default 3)")
    parser.add_argument("--match", help="only the losses whose name contains this")
    parser.add_argument("--replay", action="store_true",
                        help="also time each row with graph replay on (mlloss.set_graph_replay), replaying a stand-in graph")
    parser.add_argument("--root", default=os.path.dirname(HERE), help="directory to import mlloss from")
    parser.add_argument("--output", default=os.path.join(HERE, "results", "host-time.json"), help="JSON file for the rows")
    parser.add_argument("--compare", nargs="+", metavar="JSON", help="no timing: compare the runs in these files "
                        "(the earlier version's) with those of --to, row by row (each row's smallest time over the runs)")
    parser.add_argument("--to", nargs="+", metavar="JSON", help="with --compare: the later version's runs")
    args = parser.parse_args(argv)
    if args.rounds < 1:  # no round: an empty table, and a JSON of no rows over --output's results
        parser.error(f"--rounds must be >= 1; got {args.rounds}")
    return args


if __name__ == "__main__":
    sys.path.insert(0, _arguments(sys.argv[1:]).root)

import torch  # noqa: E402

NUM_ITEMS = 1024
BLOCKS = 6  # timed blocks of each kind per row


@dataclass
class HostTime:
    loss: str
    grouped: bool
    layout: bool  # the layout kernels forced where the dense small-batch kernels would run
    num_items: int
    replay: bool  # replayed from a captured graph (mlloss.set_graph_replay), launches included in it
    launches: int  # kernel launches per call
    host_us: float  # CPU microseconds of one forward + backward (the smallest block median)
    without_launches_us: float  # the same with every Triton launch removed


def stand_in_driver():
    """A Triton driver for the CUDA target that compiles (ptxas) but loads and launches nothing."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class Utils:
        def load_binary(self, name, kernel, shared, device):
            return object(), 0, 0, 0, 1024  # module, function, registers, spills, max threads

        def get_device_properties(self, device):
            return {"max_shared_mem": 232_448, "multiprocessor_count": 132, "max_num_regs": 65_536, "warpSize": 32}

        def unload_module(self, module):
            pass

    class Launcher:
        def __init__(self, src, metadata):
            pass

        def __call__(self, *args):
            pass

    class StandInDriver(DriverBase):
        utils = Utils()
        launcher_cls = Launcher

        @classmethod
        def is_active(cls):
            return True

        def map_python_to_cpp_type(self, ty):
            return ty

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError("no device to benchmark on")

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_device_interface(self):
            return torch.cuda

    return StandInDriver()


@contextlib.contextmanager
def compiled_cuda_launches():
    """Inside: kernel launches go through their launch path to the stand-in driver, with the
    library's CUDA launch choices, on CPU tensors. The driver stays installed afterwards (a
    machine without a GPU has no other to go back to)."""
    from triton.runtime import driver

    from cuda_specializations import cuda_launch_choices

    driver.set_active(stand_in_driver())
    with cuda_launch_choices(validate_device=lambda *tensors: None):
        yield


def _launch_entry():
    """(class, attribute) of the method every kernel launch goes through: the library's
    ``Launcher.launch``, or Triton's ``JITFunction.run`` in versions before ``kernels/_launch.py``
    (``--root`` of an older checkout)."""
    try:
        from mlloss.kernels._launch import Launcher
    except ImportError:
        from triton.runtime.jit import JITFunction

        return JITFunction, "run"
    return Launcher, "launch"


@contextlib.contextmanager
def launches_removed():
    """Inside: a kernel launch returns before the library's and Triton's launch paths."""
    owner, name = _launch_entry()
    launch = getattr(owner, name)
    setattr(owner, name, lambda self, *args, **kwargs: None)
    try:
        yield
    finally:
        setattr(owner, name, launch)


@contextlib.contextmanager
def counting_launches():
    """Yields a one-element list that counts the kernel launches made inside."""
    owner, name = _launch_entry()
    launch, count = getattr(owner, name), [0]

    def counted(self, *args, **kwargs):
        count[0] += 1
        return launch(self, *args, **kwargs)

    setattr(owner, name, counted)
    try:
        yield count
    finally:
        setattr(owner, name, launch)


def _median_us(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.thread_time()
        call()
        times.append(time.thread_time() - start)
    return 1e6 * statistics.median(times)


def _alternating_us(call, calls: int, blocks: int = BLOCKS) -> tuple[float, float]:
    """(with launches, launches removed): the smallest of ``blocks`` medians of ``calls / blocks``
    calls each, the two kinds of block alternating. This VM's speed changes for seconds at a time
    (up to 2x): the least disturbed block of each kind is the estimate."""
    size = max(calls // blocks, 1)
    with_launches, without = [], []
    for _ in range(blocks):
        with_launches.append(_median_us(call, size))
        with launches_removed():
            without.append(_median_us(call, size))
    return min(with_launches), min(without)


def host_time(name: str, *, grouped: bool, layout: bool, calls: int, num_items: int = NUM_ITEMS,
              replay: bool = False) -> HostTime:
    """One row: loss ``name`` of ``host_path.LOSSES`` on ``host_path.batch(num_items)``; ``replay``:
    with graph replay on, each call replaying its graph, which stands in for a CUDA graph here and
    launches nothing (``mlloss.ops.replay.stand_in_on_cpu(rerun=False)``): the host path of a
    replayed call (the copies into the graph's inputs and out of its outputs, the library's Python)."""
    import host_path

    scores, labels, groups = host_path.batch(num_items)
    scores, labels = host_path.loss_scores(name, scores), host_path.loss_labels(name, labels)
    loss = host_path.BUILDERS[name](False)
    groups = host_path.loss_groups(name, groups) if grouped else None

    def call():
        x = scores.clone().requires_grad_(True)
        loss(x, labels, groups).backward()

    with contextlib.ExitStack() as context:
        context.enter_context(compiled_cuda_launches())
        if layout:
            context.enter_context(host_path.dense_kernels_off())
        if replay:
            from mlloss.ops.replay import stand_in_on_cpu

            context.enter_context(stand_in_on_cpu(rerun=False))
            call()  # runs as it is, compiling the kernels; the next call captures
            call()
        with counting_launches() as launched:
            call()  # compiles every kernel the call launches (a replay launches none)
        for _ in range(50):
            call()
        with_launches, without = _alternating_us(call, calls)
    return HostTime(name, grouped, layout, num_items, replay, launched[0], with_launches, without)


def cases(match: str | None, replay: bool = False) -> list[tuple[str, bool, bool, bool]]:
    """(loss, grouped, layout, replay): every loss with and without groups, and the dense kernels'
    losses on the layout kernels they replace; with ``replay`` each of these replayed too."""
    import host_path

    rows = [(name, grouped, False) for name in host_path.BUILDERS for grouped in (False, True)]
    rows += [(name, grouped, True) for name in host_path.DENSE_LOSSES for grouped in (False, True)]
    rows = [(*row, replayed) for row in rows for replayed in ((False, True) if replay else (False,))]
    return [row for row in rows if match is None or match in row[0]]


def main(argv: list[str] | None = None) -> None:
    options = _arguments(argv)
    if options.compare:
        compare(options.compare, options.to or [], options.output)
        return
    selected = cases(options.match, options.replay)
    if not selected:  # timed nothing, and wrote a JSON of no rows over --output's results
        raise SystemExit(f"--match {options.match!r}: no loss name contains it; the losses: "
                         f"{', '.join(dict.fromkeys(row[0] for row in cases(None)))}")
    torch.set_num_threads(1)
    rows = []
    for _ in range(options.rounds):  # the VM's slow spells last seconds: each row's fastest round
        timed = [host_time(name, grouped=grouped, layout=layout, calls=options.calls, replay=replay)
                 for name, grouped, layout, replay in selected]
        rows = timed if not rows else [min(a, b, key=lambda row: row.host_us) for a, b in zip(rows, timed)]
    _print_rows(rows)
    import _measure
    import mlloss

    root = os.path.dirname(os.path.dirname(os.path.abspath(mlloss.__file__)))
    result = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__, "triton": _triton_version(),
              "mlloss_root": root, **_measure.source_provenance(root), "rows": [asdict(row) for row in rows]}
    os.makedirs(os.path.dirname(os.path.abspath(options.output)), exist_ok=True)
    with open(options.output, "w") as handle:
        json.dump(result, handle, indent=1)
    print(f"wrote {options.output}")


def compare(before: list[str], after: list[str], output: str) -> None:
    """Row by row, the smallest host time over the runs of each version (files of this tool, run
    in alternating processes), and their ratio; printed, and written to ``output`` (JSON) and
    beside it as Markdown."""
    if not after:
        raise SystemExit("--compare needs --to: the later version's runs")

    def fastest(paths):
        runs = [json.load(open(path)) for path in paths]
        rows = {}
        for run in runs:
            for row in run["rows"]:
                key = (row["loss"], row["grouped"], row["layout"], row.get("replay", False))
                if key not in rows or row["host_us"] < rows[key]["host_us"]:
                    rows[key] = row
        first = runs[0]
        commit = first.get("git_commit")
        return rows, (commit[:10] if commit else first["mlloss_root"]) + (" with edits" if first.get("library_dirty_files") else "")

    old, old_root = fastest(before)
    new, new_root = fastest(after)
    table = ["| loss | groups | kernels | launches | before us | after us | after / before |",
             "|---|---|---|---:|---:|---:|---:|"]
    ratios = []
    for key, row in new.items():
        if key in old:
            ratio = row["host_us"] / old[key]["host_us"]
            ratios.append(ratio)
            table.append(f"| {row['loss']} | {row['grouped']} | {_kernels(_row(row))} | {row['launches']} | "
                         f"{old[key]['host_us']:.0f} | {row['host_us']:.0f} | {ratio:.2f} |")
    if not ratios:  # min() of no ratio: a bare ValueError
        raise SystemExit(f"--compare and --to share no row (loss, groups, kernels, replay): {len(old)} rows before, "
                         f"{len(new)} after; compare runs of the same --match and --replay")
    summary = (f"{len(before)} runs of {old_root} (before) and {len(after)} of {new_root} (after), each row's "
               f"smallest host time; after / before {min(ratios):.2f}-{max(ratios):.2f}, median "
               f"{statistics.median(ratios):.2f}")
    print(summary)
    print("\n".join(table))
    result = {"command": " ".join(["python", *sys.argv]), "summary": summary, "before": before, "after": after,
              "rows": [{"loss": k[0], "grouped": k[1], "layout": k[2], "replay": k[3], "before_us": old[k]["host_us"],
                        "after_us": new[k]["host_us"], "launches": new[k]["launches"]} for k in new if k in old]}
    with open(output, "w") as handle:
        json.dump(result, handle, indent=1)
    with open(os.path.splitext(output)[0] + ".md", "w") as handle:
        handle.write(f"# Host time of one forward + backward, two versions (benchmarks/host_time.py)\n\n"
                     f"Command: `{result['command']}`\n\n{summary}.\n\n" + "\n".join(table) + "\n")
    print(f"wrote {output}")


def _triton_version() -> str:
    import triton

    return triton.__version__


def _row(fields: dict) -> HostTime:
    """A row of this tool's JSON (files written before the ``replay`` field included)."""
    return HostTime(**{"replay": False, **fields})


def _kernels(row: HostTime) -> str:
    import host_path

    dense = row.loss in host_path.DENSE_LOSSES or row.loss in host_path.OBJECTIVES
    kernels = "dense" if dense and not row.layout else "layout"
    return kernels + (" replayed" if row.replay else "")


def _print_rows(rows: list[HostTime]) -> None:
    print(f"host time of one forward + backward at N = {NUM_ITEMS:,}, checks off, CPU tensors, the launch path "
          "to a stand-in driver (us, thread CPU time)")
    print(f"{'loss':<24} {'groups':>6} {'kernels':>15} {'launches':>8} {'host us':>8} {'launches removed':>17} "
          f"{'per launch':>10}")
    for row in rows:
        per_launch = (row.host_us - row.without_launches_us) / max(row.launches, 1)
        print(f"{row.loss:<24} {str(row.grouped):>6} {_kernels(row):>15} {row.launches:>8} "
              f"{row.host_us:8.0f} {row.without_launches_us:17.0f} {per_launch:10.1f}")


if __name__ == "__main__":
    main()
