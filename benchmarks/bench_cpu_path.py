"""The PyTorch tier on the CPU: one forward + backward per loss, timed and counted.

Cases: AUCLoss, LaALoss (two binary columns, summed), LoALoss("balanced"), PDAOMLoss and
``build_loss("bce+pdaom")``, at N = 1,024 / 8,192 / 65,536, without groups and with about 20
items per group (``--group-size``; the recipe's users have about 50; ``--grouping`` for one of
the two), on ``backend="torch"``
(the blocked all-pairs sum, logistic surrogate; PDAOM's max-violation pairs) and
``backend="auto"`` with a closed-form surrogate (exponential; AUCLoss also squared and hinge).
Per case it records

* the median wall and process CPU time of ``repeats`` calls (after a warm-up call); the machine
  may be shared, so the load average is recorded before and after, and the spread (min / max);
* the aten ops and the ops that would wait for a device on CUDA, per call (``op_count.OpCounter``);
* the naive PyTorch broadcast (every (positive, negative) pair, masked to a group), eager and
  under ``torch.compile`` on the CPU, for AUCLoss with the logistic surrogate where its (P, N)
  table fits (``--naive-max``).

It imports ``mlloss`` from ``--root`` (default: this checkout), so that two versions of the
library can be timed in alternating processes (``--root`` of a copy with the old files), which
pairs the measurements in time on a shared machine.

Usage::

    python benchmarks/bench_cpu_path.py [--root DIR] [--sizes 1024 8192] [--repeats 5] [--group-size 20] \
        [--grouping both|grouped|ungrouped] [--group-dtype int64|int32] [--output /tmp/helpers/cpuperf/cpu-path.json] [--naive]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def losses():
    """name -> (factory, label kind: one 0/1 column, two (LaA's and LoA's labels), or two task
    columns, each with its own scores). Defined before the arguments are read (``--cases`` is
    checked against the names): the factories look ``mlloss`` up when called."""
    exp = {"surrogate": "exponential"}
    return {
        "AUCLoss/torch": (lambda: mlloss.AUCLoss(backend="torch"), "binary"),
        "LaALoss/torch": (lambda: mlloss.LaALoss(backend="torch"), "multi"),
        "LoALoss(balanced)/torch": (lambda: mlloss.LoALoss("balanced", backend="torch"), "multi"),
        "PDAOMLoss/torch": (lambda: mlloss.PDAOMLoss(backend="torch"), "binary"),
        "bce+pdaom/torch": (lambda: mlloss.build_loss("bce+pdaom", backend="torch"), "binary"),
        "bce+pdaom[2 tasks]/torch": (lambda: mlloss.build_loss("bce+pdaom", backend="torch"), "columns"),
        "bce+auc[2 tasks]/torch": (lambda: mlloss.build_loss("bce+auc", backend="torch"), "columns"),
        "LoALoss/torch": (lambda: mlloss.LoALoss(backend="torch"), "multi"),
        "AUCLoss[exp]/auto": (lambda: mlloss.AUCLoss(backend="auto", **exp), "binary"),
        "AUCLoss[squared]/auto": (lambda: mlloss.AUCLoss(backend="auto", surrogate="squared"), "binary"),
        "AUCLoss[hinge]/auto": (lambda: mlloss.AUCLoss(backend="auto", surrogate="hinge"), "binary"),
        "LaALoss[exp]/auto": (lambda: mlloss.LaALoss(backend="auto", **exp), "multi"),
        "LoALoss(balanced)[exp]/auto": (lambda: mlloss.LoALoss("balanced", backend="auto", **exp), "multi"),
        "PDAOMLoss/auto": (lambda: mlloss.PDAOMLoss(backend="auto"), "binary"),
        "bce+pdaom/auto": (lambda: mlloss.build_loss("bce+pdaom", backend="auto"), "binary"),
    }


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.dirname(HERE), help="directory to import mlloss from")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192, 65536])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=20, help="items per group, on average (default 20)")
    parser.add_argument("--grouping", choices=["both", "grouped", "ungrouped"], default="both",
                        help="batches with groups, without, or both (default)")
    parser.add_argument("--group-dtype", choices=["int64", "int32"], default="int64",
                        help="the group ids' dtype (default int64; int32 ids are sorted in half the radix passes)")
    parser.add_argument("--cases", nargs="*", default=None, help="only the cases whose name contains one of these")
    parser.add_argument("--naive", action="store_true", help="also the naive broadcast, eager and compiled")
    parser.add_argument("--naive-max", type=int, default=8192)
    parser.add_argument("--no-count", action="store_true", help="skip the op counts")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:  # no timed call: statistics.median([]) after the first case's warm-up
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    if args.group_size < 1:  # 0: a ZeroDivisionError making the first grouped batch; below: one group of all
        parser.error(f"--group-size must be >= 1; got {args.group_size}")
    names = list(losses())
    unknown = [part for part in args.cases or () if not any(part in name for name in names)]
    if unknown:  # a filter that selects nothing ran nothing and wrote no row, silently
        parser.error(f"no case name contains --cases {' '.join(map(repr, unknown))}; the cases: {', '.join(names)}")
    return args


ARGS = _arguments(sys.argv[1:])
sys.path.insert(0, ARGS.root)
sys.path.insert(1, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mlloss  # noqa: E402
from op_count import OpCounter  # noqa: E402


GROUPINGS = {"both": (False, True), "grouped": (True,), "ungrouped": (False,)}


def batch(num_items: int, grouped: bool, kind: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_items, generator=generator)
    labels = torch.randint(0, 2, (num_items, 2), generator=generator).to(torch.float32)
    if kind == "binary":
        labels = labels[:, 0].contiguous()
    elif kind == "columns":  # (N, 2) scores, a task head each
        scores = torch.stack([scores, torch.randn(num_items, generator=generator)], 1)
    groups = (torch.randint(0, max(1, num_items // ARGS.group_size), (num_items,), generator=generator)
              .to(getattr(torch, ARGS.group_dtype)) if grouped else None)
    return scores, labels, groups


def one_call(loss, scores, labels, groups):
    x = scores.clone().requires_grad_(True)
    loss(x, labels, groups).backward()
    return x.grad


def timed(step, repeats: int) -> dict:
    step()  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
            "wall_min_s": min(walls), "wall_max_s": max(walls)}


def counted(step) -> dict:
    with OpCounter() as counter:
        step()
    return {"ops": len(counter.ops), "syncs": len(counter.syncs)}


def naive_auc(scores, labels, groups):
    """Mean logistic loss over every (positive, negative) pair of a group, by broadcasting."""
    positive, negative = labels > 0, labels == 0
    differences = scores[positive][:, None] - scores[negative][None, :]
    terms = F.softplus(-differences)
    if groups is None:
        return terms.mean()
    same = groups[positive][:, None] == groups[negative][None, :]
    group_ids = groups[positive][:, None].expand_as(same)
    per_group = torch.zeros(int(groups.max()) + 1).index_add_(0, group_ids[same], terms[same])
    counts = torch.zeros_like(per_group).index_add_(0, group_ids[same], torch.ones_like(terms[same]))
    has_pairs = counts > 0
    return (per_group[has_pairs] / counts[has_pairs]).mean()


def naive_auc_fixed(scores, labels, groups):
    """The same as ``naive_auc`` with fixed shapes (compile-friendly): (N, N) masks, no boolean indexing."""
    differences = scores[:, None] - scores[None, :]
    valid = (labels[:, None] > 0) & (labels[None, :] == 0)
    if groups is not None:
        valid = valid & (groups[:, None] == groups[None, :])
    terms = torch.where(valid, F.softplus(-differences), 0.0)
    if groups is None:
        return terms.sum() / valid.sum()
    per_group = torch.zeros(scores.shape[0], dtype=scores.dtype).index_add_(0, groups, terms.sum(1))
    counts = torch.zeros(scores.shape[0], dtype=scores.dtype).index_add_(0, groups, valid.sum(1).to(scores.dtype))
    has_pairs = counts > 0
    return torch.where(has_pairs, per_group / counts.clamp(min=1), 0.0).sum() / has_pairs.sum()


def load() -> list[float]:
    return list(os.getloadavg())


def main() -> None:
    torch.set_num_threads(ARGS.threads)
    records = []
    cases = losses()
    for name, (factory, kind) in cases.items():
        if ARGS.cases and not any(part in name for part in ARGS.cases):
            continue
        for num_items in ARGS.sizes:
            for grouped in GROUPINGS[ARGS.grouping]:
                scores, labels, groups = batch(num_items, grouped, kind)
                loss = factory()

                def step(loss=loss, scores=scores, labels=labels, groups=groups):
                    return one_call(loss, scores, labels, groups)

                before = load()
                record = {"case": name, "n": num_items, "grouped": grouped, **timed(step, ARGS.repeats)}
                if not ARGS.no_count:
                    record.update(counted(step))
                record["load_before"], record["load_after"] = before, load()
                records.append(record)
                print(json.dumps(record), flush=True)
    if ARGS.naive:
        compiled = torch.compile(naive_auc_fixed, dynamic=False)
        for num_items in [n for n in ARGS.sizes if n <= ARGS.naive_max]:
            for grouped in GROUPINGS[ARGS.grouping]:
                scores, labels, groups = batch(num_items, grouped, "binary")
                for label, function in (("naive-broadcast", naive_auc), ("naive-broadcast-fixed", naive_auc_fixed),
                                        ("naive-broadcast-fixed/compiled", compiled)):
                    def step(function=function, scores=scores, labels=labels, groups=groups):
                        x = scores.clone().requires_grad_(True)
                        function(x, labels, groups).backward()
                        return x.grad

                    before = load()
                    record = {"case": label, "n": num_items, "grouped": grouped, **timed(step, ARGS.repeats)}
                    record["load_before"], record["load_after"] = before, load()
                    records.append(record)
                    print(json.dumps(record), flush=True)
    if ARGS.output:
        os.makedirs(os.path.dirname(os.path.abspath(ARGS.output)), exist_ok=True)
        with open(ARGS.output, "w") as handle:
            json.dump({"root": ARGS.root, "threads": ARGS.threads, "group_size": ARGS.group_size, "group_dtype": ARGS.group_dtype, "torch": torch.__version__,
                       "records": records}, handle, indent=1)


if __name__ == "__main__":
    main()
