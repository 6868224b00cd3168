"""CPU time of the exact ranking metrics (``mlloss.metrics.functional``) on one evaluation set.

``binary_auc`` (no groups) and ``group_auc`` (GAUC over users of about ``--group-size`` items)
of N normal scores with 0/1 labels at ``--prior``: the best of ``--repeats`` calls after one
warm-up, per size. It imports ``mlloss`` from ``--root`` (default: this checkout), so that two
versions of the library can be timed in alternating processes (``--root`` of a copy with the old
files, as ``bench_cpu_path.py`` does).

Usage::

    python benchmarks/bench_metrics.py [--root DIR] [--sizes 65536 1048576] [--threads 2] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(HERE), help="directory to import mlloss from")
    parser.add_argument("--sizes", type=int, nargs="+", default=[65_536, 1_048_576])
    parser.add_argument("--group-size", type=int, default=50, help="items per user for group_auc (default 50)")
    parser.add_argument("--prior", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=None, help="JSON file for the rows")
    args = parser.parse_args(argv)
    if args.repeats < 1:  # no timed call: every row's time the initial inf
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    if args.group_size < 1:  # 0: a ZeroDivisionError; below: every item in one user, silently
        parser.error(f"--group-size must be >= 1; got {args.group_size}")
    sys.path.insert(0, args.root)
    import torch

    from mlloss.metrics import functional

    torch.set_num_threads(args.threads)
    rows = []
    for num_items in args.sizes:
        generator = torch.Generator().manual_seed(0)
        scores = torch.randn(num_items, generator=generator)
        labels = (torch.rand(num_items, generator=generator) < args.prior).long()
        groups = torch.randint(0, max(1, num_items // args.group_size), (num_items,), generator=generator)
        calls = {"binary_auc": lambda: functional.binary_auc(scores, labels),
                 "group_auc": lambda: functional.group_auc(scores, labels, groups)}
        for name, call in calls.items():
            value = float(call())
            best = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - start)
            row = {"metric": name, "n": num_items, "ms": 1e3 * best, "value": value}
            print(f"{name:10s} N = {num_items:>9,}: {row['ms']:8.1f} ms  (value {value:.6f})", flush=True)
            rows.append(row)
    if args.output:
        meta = {"root": os.path.abspath(args.root), "threads": args.threads, "torch": torch.__version__,
                "mlloss": os.path.dirname(functional.__file__)}
        with open(args.output, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
