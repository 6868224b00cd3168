"""Throughput of recipes/ctr_cvr.py's training step, split into where the time goes.

For each loss (``bce``, ``bce+pdaom``, ``bce+auc``, ``laa``) and batch size, the recipe's own
model, objective, LightningModule and ``mlloss.data.GroupDataModule`` train on the recipe's
default synthetic log for ``--warmup`` steps and then ``--steps`` measured steps (no validation),
twice:

* **throughput**: no profiler; impressions per second over the measured steps (wall clock, the
  device synchronised at both ends);
* **split**: a profiler that times Lightning's data regions and the recipe's four
  (``ctr_cvr.forward``, ``ctr_cvr.loss``, ``ctr_cvr.backward``, ``ctr_cvr.optimizer``: the
  recipe's training step is written out, manual optimization), synchronising the device around
  each region on CUDA, so the parts add up; per step, in ms:

  - data: fetching the batch (``train_dataloader_next``) and moving it (``batch_to_device``);
  - forward, loss, backward: the model, the objective, ``manual_backward``;
  - optimizer: Adam's step and ``zero_grad``;
  - other: the profiled step minus all of the above: Lightning's loop and hooks, the recipe's
    bookkeeping, and the profiler's own cost of timing every region (so it overstates them).

* **framework overhead**: what Lightning and the recipe's module cost per step around that work,
  measured without a profiler as the difference of two median step times over the same batches:
  the recipe's ``CtrCvrModule`` under ``pl.Trainer`` against a plain PyTorch loop (forward,
  objective, backward, the same fused Adam), each reading its clocks (a device sync) once per
  ``--steps-per-call`` steps, as the recipe's training step runs them. Both use a stand-in model (one linear layer over the
  dense features; the recipe's objective), so that the model's own time, and its noise, do not
  swamp a fraction of a millisecond; the overhead does not depend on the model. ``--rounds``
  paired rounds; the median difference is reported, with the smallest and largest.

The data path alone is measured too: one epoch of ``TensorBatches`` (the recipe's batches: the
epoch's rows gathered once, batches sliced on the device) against a ``DataLoader`` over a
per-row ``Dataset`` with the same ``GroupBatchSampler`` (a ``__getitem__`` per impression, then
``default_collate``), in impressions per second of batch assembly.

Usage::

    python benchmarks/bench_recipe.py [--device cpu|cuda] [--batch-sizes 1024 8192] [--steps 100]
        [--output benchmarks/results/recipe-<device>.json]

Prints a table and writes JSON and Markdown next to each other, rewritten after every row so that a
run stopped by a time limit keeps what it measured. ``--rounds 0`` leaves out the framework overhead
(its stand-in model is never compiled: a ``--compile`` run would repeat the plain run's figures).
Numbers from one machine, one run: compare rows of the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))
sys.path.insert(0, str(ROOT / "benchmarks"))  # op_count, also when this file is loaded by path

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.profilers import Profiler  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

import ctr_cvr  # noqa: E402
from ctr_cvr_options import COMPILE_MODES  # noqa: E402
import mlloss  # noqa: E402
from mlloss.data import GroupBatchSampler, GroupDataModule, TensorBatches  # noqa: E402
from _measure import device_name, host_speed, host_speed_words, source_provenance  # noqa: E402
from op_count import OpCounter  # noqa: E402

LOSSES = ("bce", "bce+pdaom", "bce+auc", "laa")
PARTS = ("data", "forward", "loss", "backward", "optimizer", "other")


class SplitProfiler(Profiler):
    """Adds up the time of each profiled region while ``recording``; synchronises the device
    around every region on CUDA, so that a region's time is its own work."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.recording = False
        self.started: dict[str, float] = {}
        self.totals: dict[str, float] = {}

    def start(self, action_name: str) -> None:
        if self.recording:
            self.sync()
            self.started[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        start = self.started.pop(action_name, None)
        if start is not None:
            self.sync()
            self.totals[action_name] = self.totals.get(action_name, 0.0) + time.perf_counter() - start

    def summary(self) -> str:
        return ""

    def total(self, suffix: str) -> float:
        """Seconds of the regions whose name ends with ``suffix``."""
        return sum(seconds for name, seconds in self.totals.items() if name.endswith(suffix))


class Window(pl.Callback):
    """Times the optimizer steps after the first ``warmup``: from the end of the first training-step
    call that reaches ``warmup`` steps to the end of the last call (a call runs up to the recipe's
    ``steps_per_call`` steps). Counts the steps (``global_step``) and the impressions in between
    (the module's per-epoch sample count, carried over epochs: device tensors, read once at the end)."""

    def __init__(self, warmup: int, profiler: SplitProfiler | None, device: torch.device) -> None:
        self.warmup, self.profiler, self.device = warmup, profiler, device
        self.start = self.end = 0.0
        self.steps = self.items = 0
        self._first_step = self._first_items = self._earlier_epochs = 0
        self._started = False

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._earlier_epochs = self._earlier_epochs + pl_module.epoch_samples()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step < self.warmup:
            return
        now = _now(self.device)[0]
        items = self._earlier_epochs + pl_module.epoch_samples()  # a device tensor: no sync
        if not self._started:
            self._started, self.start, self._first_step, self._first_items = True, now, step, items
            if self.profiler is not None:
                self.profiler.recording = True
        else:
            self.end, self.steps, self.items = now, step - self._first_step, items - self._first_items


def _trainer(device: torch.device, steps: int, callbacks: list[pl.Callback], profiler: Profiler | None) -> pl.Trainer:
    return pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_steps=steps,
        limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        reload_dataloaders_every_n_epochs=1, callbacks=callbacks, profiler=profiler,
    )


def train(args: argparse.Namespace, loss: str, batch_size: int, data, profile: bool) -> dict:
    """One timed training run of the recipe's module; the split when ``profile``."""
    device = torch.device(args.device)
    recipe_args = ctr_cvr.parse_args(["--loss", loss, "--batch-size", str(batch_size), "--no-checkpoint"])
    pl.seed_everything(0, verbose=False)
    train_split, _, _ = data
    objective = ctr_cvr.MultiTaskObjective(loss, None, validate_args=False)  # as the recipe trains
    model = ctr_cvr.build_model(recipe_args, train_split, len(ctr_cvr.TASKS) + objective.uses_ranking_head)
    module = ctr_cvr.CtrCvrModule(model, objective, recipe_args.lr, recipe_args.weight_decay, compile_mode=args.compile,
                                  steps_per_call=args.steps_per_call)
    profiler = SplitProfiler(device) if profile else None
    window = Window(args.warmup, profiler, device)
    trainer = _trainer(device, args.warmup + args.steps, [window], profiler)
    datamodule = GroupDataModule(train_split.columns(), batch_size=batch_size, group_key="user", seed=0,
                                 fixed_size=args.fixed_batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=datamodule)
    seconds = window.end - window.start
    impressions = int(window.items)
    row = {"loss": loss, "batch_size": batch_size, "steps": window.steps, "impressions": impressions,
           "step_ms": 1e3 * seconds / window.steps, "impressions_per_s": impressions / seconds}
    if not profile:  # compiled, the step's kernels are Inductor's, not aten ops
        module.to(device)  # Lightning's teardown moved the module and the optimizer's state to the CPU
        for state in trainer.optimizers[0].state.values():
            state.update({key: value.to(device) for key, value in state.items() if torch.is_tensor(value)})
        batch = module.transfer_batch_to_device(next(iter(datamodule.train_dataloader())), device, 0)
        row.update(step_ops(module, trainer.optimizers[0], batch) if not args.compile
                   else {"kernel_ops": None, "syncing_ops": None})
    if profile:
        p = profiler
        parts = {
            "data": p.total("train_dataloader_next") + p.total(".batch_to_device"),
            **{part: p.total(f"ctr_cvr.{part}") for part in ("forward", "loss", "backward", "optimizer")},
        }
        parts["other"] = seconds - sum(parts.values())
        row["split_ms"] = {name: 1e3 * value / window.steps for name, value in parts.items()}
    return row


def step_ops(module: ctr_cvr.CtrCvrModule, optimizer: torch.optim.Optimizer, batch: dict) -> dict[str, int]:
    """The aten ops of one more optimizer step of the trained module, as the recipe takes it: those
    that run a kernel (on CUDA each is a launch at least) and those that wait for the device."""
    with OpCounter() as counter:
        loss = module.batch_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        module.train_loss_sum.add_(loss.detach())
    return {"kernel_ops": len(counter.kernels), "syncing_ops": len(counter.syncs)}


class StandIn(nn.Module):
    """The framework-overhead runs' model: one linear layer from the dense features to the heads."""

    def __init__(self, dense_dim: int, heads: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dense_dim, heads)

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.linear(dense)


class StepTimes(pl.Callback):
    """The clocks and the optimizer step count at the end of every training-step call (:func:`_now`)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.times = device, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append((*_now(self.device), trainer.global_step))


def _now(device: torch.device) -> tuple[float, float]:
    """(wall clock, this thread's CPU time), the device synchronised first on CUDA. The CPU time
    leaves out the time the thread waits for a core, so it holds on a machine that runs other work."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter(), time.thread_time()


def _median_step_ms(times: list[tuple[float, float, int]], warmup: int) -> dict[str, float]:
    """Median wall and CPU milliseconds per optimizer step between consecutive records (wall, cpu,
    steps so far) after ``warmup`` steps; a record may cover several steps."""
    later = [record for record in times if record[2] >= warmup]
    if len(later) < 2:
        raise ValueError(f"--steps must cover at least two training-step calls after --warmup (a call takes up to "
                         f"--steps-per-call steps); got {len(later)} call(s)")
    return {clock: 1e3 * statistics.median((b[i] - a[i]) / (b[2] - a[2]) for a, b in zip(later, later[1:]))
            for i, clock in enumerate(("wall", "cpu"))}


def framework_overhead(args: argparse.Namespace, batch_size: int, data) -> dict:
    """Median step time of the recipe's ``CtrCvrModule`` under ``pl.Trainer`` minus that of a plain
    loop doing the same work on the same batches, both with the ``StandIn`` model (module docstring)."""
    device, train_split = torch.device(args.device), data[0]
    steps = args.warmup + args.steps

    def module() -> ctr_cvr.CtrCvrModule:
        pl.seed_everything(0, verbose=False)
        objective = ctr_cvr.MultiTaskObjective("bce", None, validate_args=False)
        return ctr_cvr.CtrCvrModule(StandIn(train_split.dense.shape[1], len(ctr_cvr.TASKS)), objective, 1e-3, 0.0,
                                    steps_per_call=args.steps_per_call)

    def lightning() -> dict[str, float]:
        clock = StepTimes(device)
        trainer = _trainer(device, steps, [clock], profiler=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(module(), datamodule=GroupDataModule(train_split.columns(), batch_size=batch_size,
                                                             group_key="user", seed=0))
        return _median_step_ms(clock.times, args.warmup)

    def plain() -> dict[str, float]:
        model = module().to(device)
        optimizer = model.configure_optimizers()  # the recipe's optimizer (fused Adam)
        batches = TensorBatches(train_split.columns(), batch_size, group_key="user", seed=0, drop_last=True,
                                pad="empty", device=device)
        times: list[tuple[float, float, int]] = []
        done = 0
        for epoch in range(steps):
            batches.set_epoch(epoch)
            for batch in batches:
                loss = model.objective(model(batch), batch["labels"], batch["user"])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done += 1
                # read the clocks (a device sync) as often as the Lightning run does: once per
                # training-step call of steps_per_call steps, not after every step
                if done % args.steps_per_call == 0 or done == steps:
                    times.append((*_now(device), done))
                if done == steps:
                    return _median_step_ms(times, args.warmup)
        raise AssertionError("unreachable: the epochs hold enough steps")

    plain(), lightning()  # a first round of each, not counted (first-call costs)
    rounds = [(lightning(), plain()) for _ in range(args.rounds)]
    row = {"batch_size": batch_size, "rounds": args.rounds}
    for clock in ("cpu", "wall"):
        differences = sorted(a[clock] - b[clock] for a, b in rounds)
        fastest = min(a[clock] for a, _ in rounds) - min(b[clock] for _, b in rounds)  # noise only adds time
        row[clock] = {"framework_ms": statistics.median(differences), "smallest_ms": differences[0],
                      "largest_ms": differences[-1], "fastest_rounds_ms": fastest,
                      "lightning_step_ms": statistics.median(a[clock] for a, _ in rounds),
                      "plain_step_ms": statistics.median(b[clock] for _, b in rounds)}
    return row


class PerRow(Dataset):
    """The common user path: a ``__getitem__`` per impression, batches made by ``default_collate``."""

    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["user"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {name: value[i] for name, value in self.columns.items()}


def data_path(train_split, batch_size: int, device: torch.device) -> dict:
    """Impressions per second of batch assembly alone: TensorBatches vs a per-row DataLoader."""
    columns = train_split.columns()
    n = len(train_split)

    def one_epoch(batches) -> float:
        start = time.perf_counter()
        count = sum(batch["user"].shape[0] for batch in batches)
        if device.type == "cuda":
            torch.cuda.synchronize()
        assert count == n
        return n / (time.perf_counter() - start)

    tensor_batches = TensorBatches(columns, batch_size, group_key="user", device=device)
    tensor_batches.set_epoch(1)
    list(tensor_batches)  # warm-up (first-call costs)
    rates = []
    for epoch in range(2, 5):  # each epoch gathers its rows anew
        tensor_batches.set_epoch(epoch)
        rates.append(one_epoch(tensor_batches))
    loader = DataLoader(PerRow(columns), batch_sampler=GroupBatchSampler(columns["user"], batch_size))
    per_row = one_epoch(loader)
    return {"batch_size": batch_size, "tensor_batches_impressions_per_s": max(rates),
            "per_row_dataloader_impressions_per_s": per_row}


def cudagraph_counters() -> dict[str, int]:
    """Inductor's CUDA-graph counters so far in this process: ``cudagraph_skips`` (compiled graphs
    it runs without CUDA graphs: a CPU tensor, a mutated input, ...; the reason goes to the
    ``cudagraphs`` log, ``TORCH_LOGS=cudagraphs``), ``cudagraph_partitions`` (graphs it split
    around work it cannot capture, each part a CUDA graph of its own) and
    ``cudagraph_recorded_non_static_inputs`` (inputs copied into a graph's buffers at each replay)."""
    from torch._dynamo.utils import counters

    return {key: value for key, value in counters["inductor"].items() if key.startswith("cudagraph")}


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def markdown(result: dict) -> str:
    version = f"mlloss {(result.get('mlloss_commit') or 'unknown')[:7]}" + (
        " with edited library files" if result.get("library_dirty_files") else "")
    lines = [f"# recipes/ctr_cvr.py training step ({result['device']})", "",
             f"{result.get('date', 'undated')}, {version}, "
             f"torch {result['torch']}, {result['train_impressions']:,} training impressions, "
             f"{result['steps']} measured steps after {result['warmup']} warm-up steps, "
             f"{result['steps_per_call']} steps per call of the training step"
             + (", `--fixed-batches` (padded to the batch size; impressions count the real rows)"
                if result.get("fixed_batches") else "")
             + (f", `--compile {result['compile']}` (the forward column holds the loss: one graph)."
                if result.get("compile") else "."), ""]
    if result.get("host_speed"):  # what a host-bound step's time is made of, on this machine
        lines += [f"Host: {host_speed_words(result['host_speed'])}.", ""]
    lines += ["| loss | batch | impressions/s | step ms | " + " | ".join(f"{p} ms" for p in PARTS)
             + " | vs bce | kernel ops | syncing ops |",
             "|---|---:|---:|---:|" + "---:|" * (len(PARTS) + 3)]
    for row in result["training"]:
        # "-" where this run has no bce row at the batch size (--losses without bce, or stopped early)
        bce = next((r for r in result["training"] if r["loss"] == "bce" and r["batch_size"] == row["batch_size"]), None)
        split = " | ".join(f"{row['split_ms'][p]:.3f}" for p in PARTS)
        versus = "-" if bce is None else f"{row['impressions_per_s'] / bce['impressions_per_s']:.2f}"
        lines.append(f"| {row['loss']} | {row['batch_size']} | {row['impressions_per_s']:,.0f} | {row['step_ms']:.2f} | "
                     f"{split} | {versus} | {_or_dash(row['kernel_ops'])} | {_or_dash(row['syncing_ops'])} |")
    if any("cudagraph_counters" in row for row in result["training"]):
        lines += ["", "Inductor's CUDA-graph counters of each row's two runs (`cudagraph_counters`: none means no "
                  "graph skipped or split): " + "; ".join(
                      f"{row['loss']} {row['batch_size']}: {row.get('cudagraph_counters') or 'none'}"
                      for row in result["training"]) + "."]
    lines += ["", "`other`: the profiled step minus the parts (Lightning, the recipe's bookkeeping and the profiler's "
              "own cost of timing each region). `kernel ops`, `syncing ops`: aten ops of one step (forward, loss, "
              "backward, Adam) that run a kernel, and that would wait for a GPU, on this device's path (on the CPU "
              "the pairwise losses take the PyTorch tier, which reads the host freely; benchmarks/op_count.py).", "",
              "Framework overhead per step: Lightning and the recipe's module around the same work (stand-in model), "
              "the median difference of paired rounds; `cpu` is the training thread's CPU time (robust to other work on "
              "the machine), `wall` the wall clock:", "",
              "| batch | clock | framework ms | smallest | largest | Lightning step ms | plain loop step ms |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for row in result["framework"]:
        for clock in ("cpu", "wall"):
            r = row[clock]
            lines.append(f"| {row['batch_size']} | {clock} | {r['framework_ms']:.3f} | {r['smallest_ms']:.3f} | "
                         f"{r['largest_ms']:.3f} | {r['lightning_step_ms']:.3f} | {r['plain_step_ms']:.3f} |")
    lines += ["", "Batch assembly alone (impressions/s):", "", "| batch | TensorBatches | per-row DataLoader | ratio |",
              "|---:|---:|---:|---:|"]
    for row in result["data_path"]:
        t, d = row["tensor_batches_impressions_per_s"], row["per_row_dataloader_impressions_per_s"]
        lines.append(f"| {row['batch_size']} | {t:,.0f} | {d:,.0f} | {t / d:.0f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1024, 8192])
    parser.add_argument("--steps", type=int, default=100, help="measured steps per run")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the measurement")
    parser.add_argument("--num-users", type=int, default=None, help="users of the synthetic log (recipe default)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the recipe's default: 1)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="paired rounds of the framework-overhead runs (0: leave them out)")
    parser.add_argument("--steps-per-call", type=int, default=ctr_cvr.parse_args([]).steps_per_call,
                        help="the recipe's --steps-per-call (optimizer steps per call of its training step)")
    parser.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES,
                        metavar="MODE", help="the recipe's --compile [MODE]")
    parser.add_argument("--fixed-batches", action="store_true", help="the recipe's --fixed-batches (padded, one shape)")
    parser.add_argument("--graph-replay", action="store_true",
                        help="the recipe's --graph-replay (the losses' calls replayed from CUDA graphs)")
    parser.add_argument("--output", type=Path, default=None, help="JSON path (default results/recipe-<device>.json)")
    args = parser.parse_args(argv)
    if args.rounds < 0:
        parser.error(f"--rounds must be >= 0 (0: no framework-overhead runs); got {args.rounds}")
    if args.steps_per_call < 1 or args.warmup < 0:
        parser.error(f"--steps-per-call must be >= 1 and --warmup >= 0; got {args.steps_per_call} and {args.warmup}")
    if args.steps < args.steps_per_call:
        # the window runs from the end of the call that reaches --warmup steps to the end of the last
        # call: with fewer steps than a call makes, both can be the same call and nothing is timed
        parser.error(f"--steps must be at least --steps-per-call ({args.steps_per_call}): the timed window "
                     f"spans whole calls of the training step; got --steps {args.steps}")
    torch.set_num_threads(args.threads)
    mlloss.set_graph_replay(args.graph_replay)
    device = torch.device(args.device)
    if args.compile:
        # One graph of the recipe's step per (loss, batch size) in this process (the modules share the
        # step's code); past dynamo's recompile limit (8) later rows would silently run eagerly.
        config, graphs = torch._dynamo.config, 2 * len(args.losses) * len(args.batch_sizes)
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
        setattr(config, limit, max(getattr(config, limit), graphs))
    output = args.output or ROOT / "benchmarks" / "results" / f"recipe-{'cuda' if device.type == 'cuda' else 'cpu'}.json"
    data_argv = [] if args.num_users is None else ["--num-users", str(args.num_users)]
    data, _ = ctr_cvr.load_data(ctr_cvr.parse_args(data_argv))
    provenance = source_provenance(str(ROOT))
    result = {"device": device_name(device), "torch": torch.__version__, "host_speed": host_speed(device.type),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "mlloss_commit": provenance["git_commit"], "library_dirty_files": provenance["library_dirty_files"],
              "train_impressions": len(data[0]),
              "steps": args.steps, "warmup": args.warmup, "compile": args.compile, "steps_per_call": args.steps_per_call,
              "fixed_batches": args.fixed_batches, "graph_replay": args.graph_replay,
              "data_path": [data_path(data[0], b, device) for b in args.batch_sizes], "training": [],
              "framework": []}
    write(result, output)
    overhead_batch_sizes = args.batch_sizes if args.rounds else []  # --rounds 0: no framework-overhead runs
    for batch_size in overhead_batch_sizes:
        result["framework"].append(row := framework_overhead(args, batch_size, data))
        write(result, output)
        for clock, r in ((c, row[c]) for c in ("cpu", "wall")):
            print(f"framework overhead, batch {batch_size:>5}, {clock:>4} time: {r['framework_ms']:.3f} ms/step (rounds "
                  f"{r['smallest_ms']:.3f} to {r['largest_ms']:.3f}; Lightning step {r['lightning_step_ms']:.3f} ms, "
                  f"plain loop {r['plain_step_ms']:.3f} ms)", flush=True)
    for batch_size in args.batch_sizes:
        for loss in args.losses:
            before = cudagraph_counters()
            row = train(args, loss, batch_size, data, profile=False)
            row["split_ms"] = train(args, loss, batch_size, data, profile=True)["split_ms"]
            if args.compile and device.type == "cuda":  # the CPU has no CUDA graphs to count
                row["cudagraph_counters"] = {k: v - before.get(k, 0) for k, v in cudagraph_counters().items()
                                             if v != before.get(k, 0)}
            result["training"].append(row)
            write(result, output)
            split = " ".join(f"{p} {row['split_ms'][p]:.3f}" for p in PARTS)
            print(f"{loss:>10} batch {batch_size:>5}: {row['impressions_per_s']:>12,.0f} imp/s, "
                  f"{row['step_ms']:.2f} ms/step ({split} ms)", flush=True)
    print("\n" + markdown(result))
    print(f"wrote {output} and {output.with_suffix('.md')}")
    return result


def write(result: dict, output: Path) -> None:
    """The JSON at ``output`` and its Markdown beside it, each replaced whole (a run stopped while
    writing leaves the previous version)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    for path, text in ((output, json.dumps(result, indent=2)), (output.with_suffix(".md"), markdown(result))):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        partial.replace(path)


if __name__ == "__main__":
    main()
