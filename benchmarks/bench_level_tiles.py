"""CPU benchmark of the PyTorch tier's two ways through a large group: rectangles or masked tiles.

``mlloss/ops/allpairs.py`` computes the pairs of a group of more than ``MAX_LISTED_GROUP`` items
either as one unmasked rectangle per pair of levels (exactly the valid pairs, a few tensor
operations each) or as square tiles of the triangle of its level-sorted items, masked to the
pairs of distinct levels (about twice the pairs, each several times dearer). Which one a group gets
is ``RECTANGLE_PAIRS``: tiles once (level pairs) x RECTANGLE_PAIRS > n^2. This script times both on
one group of N items at C equally common levels (``LaALoss(backend="torch")``, an ordinal column,
float32, forward + backward, the min of 3 calls after a warm-up, one thread) with
(level pairs) x RECTANGLE_PAIRS / n^2, above 1 where the library picks the tiles.

Usage::

    python benchmarks/bench_level_tiles.py [--output benchmarks/results/level-tiles-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

import mlloss
from mlloss.ops import allpairs

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "level-tiles-cpu.json")
PATHS = {"rectangles": 0, "tiles": 1 << 40}  # RECTANGLE_PAIRS that forces each path


def time_call(num_items: int, num_levels: int, path: str) -> tuple[float, float]:
    """(seconds, loss) of one forward + backward with ``path`` forced."""
    chosen, allpairs.RECTANGLE_PAIRS = allpairs.RECTANGLE_PAIRS, PATHS[path]
    try:
        gen = torch.Generator().manual_seed(num_levels)
        scores = torch.randn(num_items, generator=gen, requires_grad=True)
        levels = (torch.arange(num_items) % num_levels).float()
        loss = mlloss.LaALoss(backend="torch", validate_args=False)
        loss(scores, levels).backward()  # warm-up
        best = float("inf")
        for _ in range(3):
            scores.grad = None
            start = time.perf_counter()
            value = loss(scores, levels)
            value.backward()
            best = min(best, time.perf_counter() - start)
        return best, value.item()
    finally:
        allpairs.RECTANGLE_PAIRS = chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'N':>6} {'levels':>6} {'rectangles ms':>14} {'tiles ms':>9} {'pairs x R / n^2':>16}  picked")
    for num_items in (1024, 4096):
        for num_levels in (2, 8, 16, 32, 64, 128):
            (rectangles, value), (tiles, tiled_value) = (time_call(num_items, num_levels, p) for p in PATHS)
            ratio = num_levels * (num_levels - 1) // 2 * allpairs.RECTANGLE_PAIRS / num_items**2
            row = {"num_items": num_items, "num_levels": num_levels, "rectangles_ms": rectangles * 1e3,
                   "tiles_ms": tiles * 1e3, "level_pairs_x_rectangle_pairs_over_n2": ratio,
                   "picked": "tiles" if ratio > 1 else "rectangles",
                   "value_rel_diff": abs(value - tiled_value) / abs(value)}
            rows.append(row)
            print(f"{num_items:>6} {num_levels:>6} {row['rectangles_ms']:>14.1f} {row['tiles_ms']:>9.1f} "
                  f"{ratio:>16.2f}  {row['picked']}")
    with open(args.output, "w") as f:
        json.dump({"device": f"CPU ({platform.processor() or platform.machine()}), 1 thread",
                   "torch": torch.__version__, "rectangle_pairs": allpairs.RECTANGLE_PAIRS, "rows": rows}, f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
