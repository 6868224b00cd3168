"""Which exact path is faster on the CPU: a closed form or the blocked sum over the valid pairs?

``backend="auto"`` (and ``"exact"``) on the CPU computes a pair loss with a surrogate that has a
closed form (exponential, squared, hinge) either by that closed form (O(N log N) or O(N + G L^2))
or by the blocked sum over every valid pair (O(valid pairs)); ``torch_tier._closed_form_pays``
chooses from the sizes. This sweep times both paths, forced, on the same inputs (one forward +
backward, the min of ``--repeats`` calls after a warm-up), for each surrogate, label kind
(binary AUC labels at priors 0.1 and 0.5, LaA of two binary labels, a label of ``--levels``
distinct values) and user size (``--group-sizes``; 0: no groups), and prints the choice that
``_closed_form_pays`` makes beside the faster path. Cases whose blocked sum would pass
``--max-pairs`` valid pairs are timed on the closed form only. The two paths' losses are compared
(``value_rel_diff``: both are exact, they differ by rounding: the blocked sum evaluates the
pair terms of float32 scores in float32, a closed form works in float64).

Usage::

    python benchmarks/closed_form_choice.py [--sizes 262144] [--group-sizes 0 5 20 50 200 1000] \
        [--surrogates hinge exponential squared] [--output benchmarks/results/closed-form-choice.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import mlloss  # noqa: E402
from mlloss.ops import torch_tier  # noqa: E402

LABELS = ("auc p0.1", "auc p0.5", "laa 2 labels", "levels")


def batch(num_items: int, group_size: int, labels: str, num_levels: int, seed: int = 0):
    """(scores, labels, groups or None, loss factory) for one case."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_items, generator=generator)
    groups = None
    if group_size:
        groups = torch.randint(0, 2**40, (max(1, num_items // group_size),), generator=generator)
        groups = groups[torch.randint(0, groups.numel(), (num_items,), generator=generator)]
    if labels.startswith("auc"):
        prior = float(labels.split("p")[1])
        target = (torch.rand(num_items, generator=generator) < prior).float()
        return scores, target, groups, lambda **kw: mlloss.AUCLoss(**kw)
    if labels == "laa 2 labels":
        target = (torch.rand(num_items, 2, generator=generator) < torch.tensor([0.5, 0.1])).float()
        return scores, target, groups, lambda **kw: mlloss.LaALoss(**kw)
    target = torch.randint(0, num_levels, (num_items,), generator=generator).double()
    return scores, target, groups, lambda **kw: mlloss.LaALoss(real_levels=True, **kw)


def valid_pairs(loss, scores, labels, groups) -> float:
    loss(scores, labels, groups)
    return float(loss.parts["valid_pairs"])


def timed(loss, scores, labels, groups, repeats: int) -> tuple[float, float]:
    """(the best of ``repeats`` forward + backward times after a warm-up, the loss)."""
    def step():
        x = scores.clone().requires_grad_(True)
        value = loss(x, labels, groups)
        value.backward()
        return float(value)

    value = step()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best, value


def run_case(args, num_items, group_size, labels, surrogate) -> dict:
    scores, target, groups, factory = batch(num_items, group_size, labels, args.levels)
    loss = factory(surrogate=surrogate, backend="exact")
    choice = []
    decide = torch_tier._closed_form_pays

    def recording(*a):
        choice.append(decide(*a))
        return choice[-1]

    torch_tier._closed_form_pays = recording
    try:
        pairs = valid_pairs(loss, scores, target, groups)
        row = {"n": num_items, "group_size": group_size, "labels": labels, "surrogate": surrogate,
               "valid_pairs": pairs, "auto_picks_closed_form": all(choice)}
        torch_tier._closed_form_pays = lambda *a: True
        seconds, closed_value = timed(loss, scores, target, groups, args.repeats)
        row["closed_form_ms"], row["blocked_sum_ms"], row["value_rel_diff"] = 1e3 * seconds, None, None
        if pairs <= args.max_pairs:
            torch_tier._closed_form_pays = lambda *a: False
            seconds, blocked_value = timed(loss, scores, target, groups, args.repeats)
            row["blocked_sum_ms"] = 1e3 * seconds
            row["value_rel_diff"] = abs(closed_value - blocked_value) / max(abs(blocked_value), 1e-300)
    finally:
        torch_tier._closed_form_pays = decide
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[262_144])
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[0, 5, 20, 50, 200, 1000])
    parser.add_argument("--labels", nargs="+", choices=LABELS, default=list(LABELS))
    parser.add_argument("--levels", type=int, default=16, help="distinct values of the 'levels' label (default 16)")
    parser.add_argument("--surrogates", nargs="+", default=["hinge", "exponential", "squared"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-pairs", type=float, default=4e9, help="skip the blocked sum beyond this many valid pairs")
    parser.add_argument("--output", default=None, help="JSON file for the rows (and a .md beside it)")
    args = parser.parse_args(argv)
    if args.repeats < 1:  # no timed call: both paths at inf ms, the time lost nan
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    if min(args.group_sizes) < 0:  # 0: no groups; below, every item silently in one user
        parser.error(f"--group-sizes must be >= 0 (each value; 0: no groups); got {args.group_sizes}")
    if "levels" in args.labels and args.levels < 2:  # 0: a RuntimeError after the other labels' cases; 1: no pair
        parser.error(f"--levels must be >= 2 (one level has no pair); got {args.levels}")
    torch.set_num_threads(args.threads)
    rows = []
    header = f"{'n':>8} {'users':>5} {'labels':13} {'surrogate':11} {'pairs':>9} {'closed ms':>9} {'blocked ms':>10} {'auto':7} faster"
    print(header)
    for num_items in args.sizes:
        for group_size in args.group_sizes:
            for labels in args.labels:
                for surrogate in args.surrogates:
                    row = run_case(args, num_items, group_size, labels, surrogate)
                    closed, blocked = row["closed_form_ms"], row["blocked_sum_ms"]
                    row["faster"] = "closed" if blocked is None or closed <= blocked else "blocked"
                    auto = "closed" if row["auto_picks_closed_form"] else "blocked"
                    row["line"] = (f"{num_items:>8} {group_size or '-':>5} {labels:13} {surrogate:11} {row['valid_pairs']:9.2e} "
                                   f"{closed:9.1f} {'-' if blocked is None else f'{blocked:.1f}':>10} {auto:7} {row['faster']}"
                                   + ("" if auto == row["faster"] else "  <- auto's choice is the slower path"))
                    print(row["line"], flush=True)
                    rows.append(row)
    worst = max((r["value_rel_diff"] for r in rows if r["value_rel_diff"] is not None), default=0.0)
    print(f"closed form and blocked sum agree within {worst:.1e} relative (the loss, every timed case)")
    wrong = [r for r in rows if r["faster"] != ("closed" if r["auto_picks_closed_form"] else "blocked")]
    cost = sum(abs(r["closed_form_ms"] - r["blocked_sum_ms"]) for r in wrong if r["blocked_sum_ms"] is not None)
    print(f"auto picks the slower path in {len(wrong)} of {len(rows)} cases (time lost: {cost:.0f} ms in all)")
    if args.output:
        git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True, cwd=HERE).stdout.strip()  # noqa: E731
        commit = git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--", "../mlloss") else "")
        meta = {"commit": commit, "torch": torch.__version__, "threads": args.threads, "machine": platform.machine(),
                "cpus": os.cpu_count(), "command": shlex.join(["python", "benchmarks/closed_form_choice.py", *(argv or sys.argv[1:])])}
        with open(args.output, "w") as handle:
            json.dump({"meta": meta, "rows": rows}, handle, indent=1)
        with open(os.path.splitext(args.output)[0] + ".md", "w") as handle:
            handle.write(f"# Closed form or blocked sum (CPU, {args.threads} threads, torch {torch.__version__}, {commit})\n\n")
            handle.write(f"`{meta['command']}`\n\n```\n{header}\n")
            handle.writelines(r["line"] + "\n" for r in rows)
            handle.write(f"```\n\nauto picks the slower path in {len(wrong)} of {len(rows)} cases ({cost:.0f} ms lost in all); "
                         f"the two paths' losses agree within {worst:.1e} relative\n")


if __name__ == "__main__":
    main()
