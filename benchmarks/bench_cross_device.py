"""Cross-device pairwise loss on W CPU processes (gloo): each rank computing its share of the
groups' pairs (the default) against every rank computing the whole gathered batch.

    python benchmarks/bench_cross_device.py                 # W = 2, N = 8192 per rank, users of ~50
    python benchmarks/bench_cross_device.py --world 2 --per-rank 4096 --steps 5

For each setting, every rank runs forward + backward of ``LaALoss(cross_device=True)`` (logistic,
two labels, user groups) on its local batch; the time is the slowest rank's median over ``--steps``
steps after a warm-up, one thread per rank. The losses and local gradients of the two settings are
compared (they must agree to float32 rounding). Writes ``results/cross-device-cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _measure  # noqa: E402


def local_batch(rank: int, per_rank: int, group_size: int):
    gen = torch.Generator().manual_seed(100 + rank)
    scores = torch.randn(per_rank, generator=gen)
    labels = (torch.rand(per_rank, 2, generator=gen) < torch.tensor([0.5, 0.1])).float()
    # users of ~group_size items; about half of each user's items sit on another rank
    groups = torch.randint(0, 2 * per_rank // group_size, (per_rank,), generator=gen)
    return scores, labels, groups


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import mlloss
    import mlloss.distributed as md

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    scores, labels, groups = local_batch(rank, args.per_rank, args.group_size)
    loss = mlloss.LaALoss(cross_device=True)
    results = {}
    for split in (True, False):
        md.SPLIT_PAIR_WORK = split
        times = []
        for step in range(args.steps + 1):
            x = scores.clone().requires_grad_(True)
            dist.barrier()
            start = time.perf_counter()
            value = loss(x, labels, groups)
            value.backward()
            elapsed = torch.tensor(time.perf_counter() - start, dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            if step:
                times.append(float(elapsed))
        results[split] = {"median_s": statistics.median(times), "loss": float(value.detach()), "grad": x.grad.clone()}
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--per-rank", type=int, default=8192)
    parser.add_argument("--group-size", type=int, default=50)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "results", "cross-device-cpu.json"))
    args = parser.parse_args(argv)
    # Checked here: in the spawned ranks a bad value is a ZeroDivisionError (--group-size 0), an
    # empty median (--steps 0) or an empty range of users, and --world 0 spawns nothing to read back.
    for name in ("world", "per_rank", "group_size", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.group_size > 2 * args.per_rank:  # users are drawn from 2 * per_rank // group_size ids
        parser.error(f"--group-size must be at most twice --per-rank ({args.per_rank}), or no user is left; "
                     f"got {args.group_size}")
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(worker, args=(args.world, free_port(), args, out), nprocs=args.world, join=True)
        ranks = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(args.world)]
    split, whole = ranks[0][True], ranks[0][False]
    grad_diff = max(float((r[True]["grad"] - r[False]["grad"]).abs().max() / r[False]["grad"].abs().max())
                    for r in ranks)
    device = _measure.device_description()
    device["torch_threads"] = 1  # in each rank: the workers set it (the parent's own count ran nothing)
    record = {
        "device": device,
        **_measure.source_provenance(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "load_average": open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None,
        "config": vars(args) | {"output": None},
        "split_median_s": split["median_s"],
        "whole_median_s": whole["median_s"],
        "speedup": whole["median_s"] / split["median_s"],
        "loss_split": split["loss"],
        "loss_whole": whole["loss"],
        "grad_max_rel_diff": grad_diff,
    }
    print(f"LaALoss(cross_device=True), {args.world} ranks x {args.per_rank} items, users of ~{args.group_size}: "
          f"split {split['median_s'] * 1e3:.1f} ms, whole {whole['median_s'] * 1e3:.1f} ms per step "
          f"(x{record['speedup']:.2f}); loss {split['loss']:.6f} vs {whole['loss']:.6f}, "
          f"grad max rel diff {grad_diff:.1e}")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
