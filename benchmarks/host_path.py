"""Host path of one loss call, measured without a GPU: aten ops and host synchronisations.

A CUDA step that waits for the host, or issues an op per tensor expression, leaves the GPU idle
between small kernels: at the batch sizes recommenders train with, the launches and the waits,
not the pair kernel, set the time of a call. This tool runs one forward + backward of each loss
on the Triton backend under a ``TorchDispatchMode`` that sees every aten op the call issues (on
any device: under ``TRITON_INTERPRET=1`` the kernels themselves run on the CPU and are not aten
ops) and counts

* ops: every aten op the call dispatches (kernels, allocations, views alike);
* syncs: ops that need a value on the host, or whose output shape depends on the data, and so
  make the host wait for the device on CUDA: ``_local_scalar_dense`` (``.item()``, ``int(t)``,
  ``bool(t)``), ``nonzero``, ``unique*``, ``masked_select``, boolean-mask indexing,
  ``repeat_interleave`` without ``output_size``, ``bincount``, ``segment_reduce`` without
  ``unsafe``, ``equal``/``is_nonzero``, and copies from a CUDA tensor to the CPU.

``--memory N`` also measures the peak of the bytes a call allocates at N items (the scores'
gradient included), with ``torch.profiler``'s memory events on the CPU and every kernel launch
skipped: the same tensors a CUDA call allocates, except the scratch space of CUDA's sorts. So it
also gives the peak while a sort runs (its outputs and what is live beside them), to which a
CUDA sort adds its scratch (for N keys: an int64 iota and CUB's alternate key and index
buffers, about 20 bytes per key).

Usage::

    TRITON_INTERPRET=1 python benchmarks/host_path.py [--memory 1048576] [--recipe-steps] [--output benchmarks/results/host-path.json]

``--recipe-steps`` also counts one training step of ``recipes/ctr_cvr.py`` per loss (docs/recipe.md).

The host's time per call (the library's Python, PyTorch's dispatch and Triton's launch path):
``benchmarks/host_time.py``.

``tests/test_host_path.py`` asserts the budgets on the same counts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch
from torch.utils._python_dispatch import _disable_current_modes

import mlloss
from op_count import OpCounter

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "host-path.json")


@dataclass
class CallCount:
    loss: str
    grouped: bool
    validate: bool
    ops: int
    syncs: int
    op_names: dict[str, int] = field(default_factory=dict)
    sync_names: list[str] = field(default_factory=list)
    masked: bool = False  # a mask leaves out every fourth item (a fixed-size batch's fillers)
    layout: bool = False  # the layout kernels forced where the dense small-batch kernels would run
    replay: bool = False  # replayed from its captured graph (mlloss.set_graph_replay; a stand-in graph here)


# Every loss on the Triton backend; PDAOM is the max-violation loss.
LOSSES: dict[str, Callable[[bool], torch.nn.Module]] = {
    "AUCLoss": lambda validate: mlloss.AUCLoss(backend="triton", validate_args=validate),
    "LaALoss": lambda validate: mlloss.LaALoss(backend="triton", validate_args=validate),
    "LoALoss": lambda validate: mlloss.LoALoss(backend="triton", validate_args=validate),
    "LoALoss(balanced)": lambda validate: mlloss.LoALoss("balanced", backend="triton", validate_args=validate),
    "PDAOMLoss": lambda validate: mlloss.PDAOMLoss(backend="triton", validate_args=validate),
    "LaALoss(hardest)": lambda validate: mlloss.LaALoss(pairs="hardest", backend="triton", validate_args=validate),
    "LaALoss(soft hardest)": lambda validate: mlloss.LaALoss(
        pairs="hardest", temperature=0.5, backend="triton", validate_args=validate
    ),
    # LaA of one ordinal column (graded relevance 0-2): its levels known only from the data
    "LaALoss(graded)": lambda validate: mlloss.LaALoss(backend="triton", validate_args=validate),
    "LaALoss(graded hardest)": lambda validate: mlloss.LaALoss(pairs="hardest", backend="triton", validate_args=validate),
    # a two-task model's heads in one call: (N, 2) scores, a label column each (AUCLoss.task_columns)
    "AUCLoss(2 task columns)": lambda validate: mlloss.AUCLoss(backend="triton", validate_args=validate),
    "PDAOMLoss(2 task columns)": lambda validate: mlloss.PDAOMLoss(backend="triton", validate_args=validate),
    # a user-grouped batch (each user's items consecutive), said so: the layout sorts no ids
    "AUCLoss(contiguous groups)": lambda validate: mlloss.AUCLoss(
        backend="triton", validate_args=validate, contiguous_groups=True),
    "LaALoss(contiguous groups)": lambda validate: mlloss.LaALoss(
        backend="triton", validate_args=validate, contiguous_groups=True),
}
# The cross-entropy, and the objectives that add a ranking term to it, on a two-task model's (N, 2)
# logits (what recipes/ctr_cvr.py trains with). bce+auc and bce+pdaom are one op (ops.bce_ranking),
# whose two data checks are read in one host read. A mask costs the cross-entropy more than the
# dense kernels: it fills the left-out rows and weighs the others (tests/test_host_path.py).
OBJECTIVES: dict[str, Callable[[bool], torch.nn.Module]] = {
    "BCELoss(2 task columns)": lambda validate: mlloss.BCELoss(validate_args=validate),
    "bce+auc(2 task columns)": lambda validate: mlloss.build_loss("bce+auc", backend="triton", validate_args=validate),
    "bce+pdaom(2 task columns)": lambda validate: mlloss.build_loss(
        "bce+pdaom", backend="triton", validate_args=validate),
}
BUILDERS = {**LOSSES, **OBJECTIVES}
SINGLE_LABEL = {"AUCLoss", "PDAOMLoss", "AUCLoss(contiguous groups)"}
GRADED = {"LaALoss(graded)", "LaALoss(graded hardest)"}
TASK_COLUMNS = {"AUCLoss(2 task columns)", "PDAOMLoss(2 task columns)"}
CONTIGUOUS = {"AUCLoss(contiguous groups)", "LaALoss(contiguous groups)"}
# On the dense kernels up to 2,048 items (LaA: its 2 binary columns make 3 levels).
DENSE_LOSSES = ("AUCLoss", "PDAOMLoss", "LoALoss", "LoALoss(balanced)", "LaALoss", *sorted(TASK_COLUMNS),
                *sorted(CONTIGUOUS))


def loss_labels(name: str, labels: torch.Tensor) -> torch.Tensor:
    """What loss ``name`` takes of a batch's two binary label columns: the first (AUC, PDAOM),
    their sum as one graded column, or both."""
    if name in SINGLE_LABEL:
        return labels[:, 0]
    return labels.sum(dim=1, keepdim=True) if name in GRADED else labels


def loss_scores(name: str, scores: torch.Tensor) -> torch.Tensor:
    """What loss ``name`` takes of a batch's scores: two task columns (the second the first
    reversed), or the scores as they are."""
    return torch.stack([scores, scores.flip(0)], dim=1) if name in TASK_COLUMNS or name in OBJECTIVES else scores


def loss_groups(name: str, groups: torch.Tensor | None) -> torch.Tensor | None:
    """The batch's group ids, or for a loss told ``contiguous_groups=True`` the same ids in runs
    (each group's items consecutive, the runs in descending id order: not sorted ascending)."""
    if groups is None or name not in CONTIGUOUS:
        return groups
    return torch.sort(groups, descending=True, stable=True).values


def batch(num_items: int = 64, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(num_items, generator=generator)
    labels = torch.randint(0, 2, (num_items, 2), generator=generator).to(torch.float32)
    groups = torch.randint(0, 6, (num_items,), generator=generator) * 11
    return scores, labels, groups


@contextlib.contextmanager
def _kernels_skipped():
    """Kernel launches do nothing (their outputs keep whatever the allocation held)."""
    from triton.runtime.interpreter import GridExecutor

    launch = GridExecutor.__call__
    GridExecutor.__call__ = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        GridExecutor.__call__ = launch


def peak_memory(name: str, *, grouped: bool, num_items: int, users: int = 20_000) -> tuple[int, int]:
    """(peak bytes allocated above the inputs during one forward + backward, the largest of what
    is live while a sort runs: its outputs and the tensors live beside them) with the kernels
    skipped. On CUDA a sort adds scratch space on top of the second (an int64 iota and CUB's
    buffers)."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(num_items, generator=generator).requires_grad_(True)
    labels = loss_labels(name, torch.randint(0, 2, (num_items, 2), generator=generator).to(torch.float32)).contiguous()
    groups = torch.randint(0, users, (num_items,), generator=generator) if grouped else None
    groups, loss = loss_groups(name, groups), BUILDERS[name](False)
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )
    with _kernels_skipped(), profiler:
        loss(scores, labels, groups).backward()
    # The profiler's memory timeline (what export_memory_timeline draws): CREATE / DESTROY per
    # allocation, in ns since the epoch; the ops' time ranges are in us since the trace started.
    start_ns = profiler.profiler.kineto_results.trace_start_ns()
    sorts = [(start_ns + 1000 * e.time_range.start, start_ns + 1000 * e.time_range.end)
             for e in profiler.events() if e.name == "aten::sort"]
    timeline = sorted(profiler._memory_profile().timeline, key=lambda event: event[0])
    live = peak = 0
    live_at = []  # (time, live bytes after the event)
    for time_ns, action, _, size in timeline:
        if action.name == "CREATE":
            live += size
        elif action.name == "DESTROY":
            live -= size
        peak = max(peak, live)
        live_at.append((time_ns, live))
    # At a sort: what is live when it starts, plus its outputs (the allocations it makes that
    # outlive it; a CPU sort's own temporaries are left out, CUDA's differ).
    peak_in_sorts = 0
    for begin, end in sorts:
        before = next((bytes_ for time_ns, bytes_ in reversed(live_at) if time_ns < begin), 0)
        outputs = {}  # allocation -> bytes, of those the sort makes and does not free
        for time_ns, action, key, size in timeline:
            if begin <= time_ns <= end and action.name == "CREATE":
                outputs[key] = size
            elif begin <= time_ns <= end and action.name == "DESTROY":
                outputs.pop(key, None)
        peak_in_sorts = max(peak_in_sorts, before + sum(outputs.values()))
    return peak, peak_in_sorts


@contextlib.contextmanager
def kernels_uncounted():
    """Under TRITON_INTERPRET=1 a kernel launch runs numpy code that moves data through torch
    tensors; on CUDA a launch issues no aten op. Count neither."""
    from triton.runtime.interpreter import GridExecutor

    launch = GridExecutor.__call__

    def uncounted(self, *args, **kwargs):
        with _disable_current_modes():
            return launch(self, *args, **kwargs)

    GridExecutor.__call__ = uncounted
    try:
        yield
    finally:
        GridExecutor.__call__ = launch


@contextlib.contextmanager
def dense_kernels_off():
    """The Triton tier's layout kernels at every N (kernels/dense.py takes none)."""
    from mlloss.kernels import dense

    limits, dense.MAX_ITEMS, dense.MAX_RUN_ITEMS = (dense.MAX_ITEMS, dense.MAX_RUN_ITEMS), 0, 0
    try:
        yield
    finally:
        dense.MAX_ITEMS, dense.MAX_RUN_ITEMS = limits


def count_call(name: str, *, grouped: bool, validate: bool, masked: bool = False, layout: bool = False,
               replay: bool = False, num_items: int = 64) -> CallCount:
    """Ops and syncs of one forward + backward of loss ``name`` (after one warm-up call), with
    ``masked`` every fourth item left out by ``mask=``; ``layout``: with the dense small-batch
    kernels off, as a batch of more than ``kernels.dense.MAX_ITEMS`` items runs; ``replay``: with
    graph replay on, a call that replays its graph (after the call that runs as it is and the one
    that captures it), a stand-in for a CUDA graph that launches nothing (what a replayed call
    issues besides the graph: the copies in and out, the autograd formula)."""
    from mlloss.ops.replay import stand_in_on_cpu

    scores, labels, groups = batch(num_items)
    scores, labels = loss_scores(name, scores), loss_labels(name, labels)
    loss = BUILDERS[name](validate)
    groups = loss_groups(name, groups) if grouped else None
    options = {"mask": torch.arange(num_items) % 4 != 3} if masked else {}
    warm_up = 2 if replay else 1  # the first call compiles the kernels; with replay the second captures
    with stand_in_on_cpu(rerun=False) if replay else contextlib.nullcontext():
        for call in range(warm_up + 1):
            counted = call == warm_up
            x = scores.clone().requires_grad_(True)
            counter = OpCounter()
            with kernels_uncounted(), dense_kernels_off() if layout else contextlib.nullcontext(), \
                    counter if counted else contextlib.nullcontext():
                loss(x, labels, groups, **options).backward()
    return CallCount(
        name, grouped, validate, len(counter.ops), len(counter.syncs),
        dict(collections.Counter(counter.ops)), counter.syncs, masked, layout, replay,
    )


def all_counts() -> list[CallCount]:
    calls = [(name, grouped, masked, False) for name in LOSSES
             for grouped, masked in ((False, False), (True, False), (True, True))]
    calls += [(name, grouped, False, True) for name in DENSE_LOSSES for grouped in (False, True)]
    counts = [
        count_call(name, grouped=grouped, validate=validate, masked=masked, layout=layout)
        for name, grouped, masked, layout in calls
        for validate in (True, False)
    ]
    counts += [count_call(name, grouped=grouped, validate=validate, masked=masked) for name in OBJECTIVES
               for grouped, masked in ((False, False), (True, False), (True, True)) for validate in (True, False)]
    return counts + [
        count_call(name, grouped=grouped, validate=validate, masked=masked, replay=True)
        for name in LOSSES for grouped, masked in ((False, False), (True, False), (True, True))
        for validate in (True, False)
    ]


RECIPE_LOSSES = ("bce", "bce+pdaom", "bce+auc", "laa")


def recipe_step_counts(batch_size: int = 1024) -> list[dict]:
    """The aten ops of one training step of recipes/ctr_cvr.py (forward, objective, backward,
    Adam, the loss summed on the device) for each of ``RECIPE_LOSSES``, on a batch of the recipe's
    default synthetic log, exact (a batch of whole users) and padded (``--fixed-batches``: a mask):
    the second step (Adam's state exists), the pairwise terms on the Triton tier with their kernel
    launches uncounted, the data checks off (as the recipe trains)."""
    import bench_recipe  # the step as bench_recipe.py counts it (step_ops); it puts recipes/ on the path
    import ctr_cvr
    from mlloss.data import SyntheticConfig, TensorBatches, generate_impressions, split_by_time

    args = ctr_cvr.parse_args([])
    train = split_by_time(generate_impressions(SyntheticConfig()))[0]
    rows = []
    for fixed_size in (False, True):
        batch = next(iter(TensorBatches(train.columns(), batch_size, group_key="user", fixed_size=fixed_size)))
        for loss in RECIPE_LOSSES:
            torch.manual_seed(0)
            objective = ctr_cvr.MultiTaskObjective(loss, None, validate_args=False)
            for module in objective.modules():
                if hasattr(module, "backend"):
                    module.backend = "triton"
            model = ctr_cvr.build_model(args, train, len(ctr_cvr.TASKS) + objective.uses_ranking_head)
            module = ctr_cvr.CtrCvrModule(model, objective, args.lr, args.weight_decay)
            optimizer = module.configure_optimizers()
            for _ in range(2):
                with kernels_uncounted():
                    counts = bench_recipe.step_ops(module, optimizer, batch)
            rows.append({"loss": loss, "fixed_batches": fixed_size, "rows": int(batch["labels"].shape[0]), **counts})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=RESULTS, help="JSON file for the counts")
    parser.add_argument("--verbose", action="store_true", help="print every op of every call")
    parser.add_argument("--memory", type=int, metavar="N", help="also the peak bytes of a call at N items")
    parser.add_argument("--recipe-steps", action="store_true",
                        help="also the ops of one training step of recipes/ctr_cvr.py per loss")
    options = parser.parse_args(argv)
    if options.memory is not None and options.memory < 1:  # 0 was silently no measurement; below, a
        # RuntimeError making the batch after every call had been counted (half a minute), nothing written
        parser.error(f"--memory must be >= 1 (items); got {options.memory}")
    counts = all_counts()
    print(f"{'loss':<24} {'kernels':>8} {'groups':>6} {'mask':>6} {'checks':>6} {'aten ops':>9} {'syncs':>6}")
    for row in counts:
        dense = not row.layout and (row.loss in DENSE_LOSSES or row.loss in OBJECTIVES)
        kernels = "replayed" if row.replay else "dense" if dense else "layout"
        print(f"{row.loss:<24} {kernels:>8} {str(row.grouped):>6} {str(row.masked):>6} {str(row.validate):>6} "
              f"{row.ops:>9} {row.syncs:>6}")
        if options.verbose:
            print("    ", row.op_names, row.sync_names)
    memory = []
    if options.memory:
        print(f"\npeak bytes allocated by one forward + backward at N = {options.memory:,} (kernels skipped)")
        for name in ("AUCLoss", "LaALoss", "PDAOMLoss"):
            for grouped in (False, True):
                peak, in_sorts = peak_memory(name, grouped=grouped, num_items=options.memory)
                memory.append({"loss": name, "grouped": grouped, "num_items": options.memory, "peak_bytes": peak,
                               "peak_bytes_in_sorts": in_sorts})
                print(f"{name:<20} {'groups' if grouped else 'no groups':>9} {peak / 2**20:8.1f} MB"
                      f"   in its sorts {in_sorts / 2**20:5.1f} MB + CUDA's sort scratch")
    steps = recipe_step_counts() if options.recipe_steps else []
    if steps:
        print("\nrecipes/ctr_cvr.py, one training step (the second) at batch 1,024: aten ops that run a kernel")
        for row in steps:
            print(f"{row['loss']:<10} {'padded' if row['fixed_batches'] else 'exact':>6} {row['rows']:>5} rows "
                  f"{row['kernel_ops']:>4} kernel ops {row['syncing_ops']:>2} syncs")
    os.makedirs(os.path.dirname(options.output), exist_ok=True)
    with open(options.output, "w") as handle:
        json.dump(
            {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
             "calls": [asdict(r) for r in counts], "memory": memory, "recipe_steps": steps},
            handle,
            indent=1,
        )
    print(f"wrote {options.output}")


if __name__ == "__main__":
    main()
