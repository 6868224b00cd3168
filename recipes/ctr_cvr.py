"""Train a multi-task CTR/CVR model with an mlloss objective (docs/recipe.md).

    python recipes/ctr_cvr.py                          # MMoE, BCE, 5 epochs: ~30 s on 2 CPU cores
    python recipes/ctr_cvr.py --config bce+pdaom         # a named config of recipes/configs/ (or a YAML file)
    python recipes/ctr_cvr.py --accelerator gpu --devices 4 --strategy ddp
    python recipes/ctr_cvr.py --epochs 8 --resume last   # continue from the last complete checkpoint

The recipe wires library parts together (docs/recipe.md): data, sampler and datamodule from
``mlloss.data``, towers from ``mlloss.models``, the objective from ``mlloss.build_loss``, AUC/GAUC
from ``RankingMetrics``, crash-safe checkpoints from ``mlloss.checkpointing`` (its Lightning plugin in
``mlloss.integrations``). Its siblings: ``ctr_cvr_options.py`` (command line, named configs in ``configs/``, the
data, model and strategy they select), ``ctr_cvr_report.py`` (baselines, results.md, curves.png) and
``ctr_cvr_resume.py`` (``--resume``).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:  # the recipe's own modules, beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):  # the help without Lightning's ~7 s
    from ctr_cvr_options import parse_args
    parse_args()  # prints it and exits

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_only
from torch import Tensor, nn

import mlloss
from mlloss.data import GroupDataModule
from mlloss.integrations.lightning import RankingMetrics
from mlloss.integrations.lightning_checkpoints import AtomicCheckpointIO, fault_test_callbacks
from mlloss.integrations.torchrec import dense_parameters
from mlloss.integrations.torchrec_strategy import TorchRecStrategy
from mlloss.models import MultiTaskModel

from ctr_cvr_options import (PER_TASK_LOSSES, RANKING_SCORE_LOSSES, TASKS, build_model, build_strategy,  # noqa: E402
                             check_batches, load_data, parse_args)
from ctr_cvr_resume import (ObjectiveRankStates, OptimizerOptions, check_output_folder, check_resume,  # noqa: E402
                            checkpoint_record, process_states, recorded_options, replace_other_kind_of_checkpoint,
                            restore_rng_states, resume_path)
from ctr_cvr_report import (GAUC_WEIGHTING, baseline_results, describe_data, format_epoch,  # noqa: E402
                            lightning_notices_muted, scorer_results, write_report)


class MultiTaskObjective(nn.Module):
    """The training loss of the (B, 2) or (B, 3) logits for ``--loss`` (docs/recipe.md): per-task
    objectives on each head with the users as groups, summed; a single-ranking-score objective on
    the third head with the (B, 2) labels, plus BCE on the task heads. ``validate_args`` is the
    losses' per-batch value check (a device read per loss call): the recipe checks its data once."""

    def __init__(self, name: str, lam: float | None, cross_device: bool = False, validate_args: bool = True) -> None:
        super().__init__()
        if name not in PER_TASK_LOSSES + RANKING_SCORE_LOSSES:
            raise ValueError(f"--loss must be one of {PER_TASK_LOSSES + RANKING_SCORE_LOSSES}; got {name!r}")
        self.uses_ranking_head = name in RANKING_SCORE_LOSSES
        # users' rows are consecutive in a batch, not across ranks' gathered ones (docs/recipe.md)
        ranking = {"cross_device": True} if cross_device else {"contiguous_groups": True}
        if self.uses_ranking_head:
            self.task_loss = mlloss.build_loss("bce", validate_args=validate_args)
            self.ranking_loss = mlloss.build_loss(name, validate_args=validate_args, **ranking)
            self.lam = 1.0 if lam is None else lam
        else:
            kwargs = {"lam": lam} if lam is not None and name.startswith("bce+") else {}
            self.task_loss = mlloss.build_loss(name, validate_args=validate_args, **kwargs, **(ranking if name != "bce" else {}))

    def forward(self, logits: Tensor, labels: Tensor, users: Tensor, mask: Tensor | None = None) -> Tensor:
        """``mask``: the real rows of a padded batch (``--fixed-batches``); the losses leave out the rest."""
        if not getattr(self.task_loss, "cross_device", False):  # (N, K) tasks in one call (AUCLoss: one per rank)
            total = self.task_loss(logits[:, : len(TASKS)], labels, groups=users, mask=mask)
        else:
            total = sum(self.task_loss(logits[:, t], labels[:, t], groups=users, mask=mask) for t in range(len(TASKS)))
        if self.uses_ranking_head:
            ranking = self.ranking_loss(logits[:, len(TASKS)], labels, groups=users, mask=mask)
            total = torch.add(total, ranking, alpha=self.lam)  # not total + lam * ranking: --compile in docs/recipe.md
        return total


class CtrCvrModule(pl.LightningModule):
    """Trains ``model`` with ``objective``, one optimizer step per batch written out in
    ``training_step``, ``steps_per_call`` of them per call (manual optimization, docs/recipe.md);
    its ``RankingMetrics`` callbacks evaluate the task heads (and the ranking head) on the
    validation and test batches. The training loss is summed on the device and read once per epoch."""

    train_loss_sum: Tensor  # buffers (registered in __init__)
    masked_samples: Tensor

    def __init__(
        self, model: MultiTaskModel, objective: MultiTaskObjective, lr: float, weight_decay: float,
        run_options: dict[str, Any] | None = None, compile_mode: str | None = None, steps_per_call: int = 8,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.steps_per_call = steps_per_call
        self.model = model
        self.objective = objective
        self.lr, self.weight_decay = lr, weight_decay
        self.run_options = run_options or {}  # recorded in checkpoints (checkpoint_record)
        self.compile_mode = compile_mode  # not self.compile: nn.Module.compile is a method
        self.register_buffer("train_loss_sum", torch.zeros((), dtype=torch.float64), persistent=False)
        self.epoch_counts = {"steps": 0, "samples": 0}  # a dict: no nn.Module.__setattr__ per step
        self.register_buffer("masked_samples", torch.zeros((), dtype=torch.int64), persistent=False)  # padded batches' real rows
        heads = {"model": "heads", "model:rank": "rank"} if objective.uses_ranking_head else {"model": "heads"}
        self.metrics = {scorer: RankingMetrics(TASKS, prefix=f"val/{scorer}/", test_prefix=f"test/{scorer}/",
                                               score_key=key, groups_key="user", group_weighting=GAUC_WEIGHTING,
                                               print_report=False) for scorer, key in heads.items()}
        self.history: list[dict[str, float]] = []
        self.eval_results: dict[str, float] = {}
        self._epoch_start = self._train_end = time.perf_counter()
        self._train_loss, self._train_samples = float("nan"), 0

    def configure_callbacks(self) -> list[pl.Callback]:
        return [c for c in self.metrics.values() if c not in self.trainer.callbacks]  # test() asks again

    def configure_model(self) -> None:
        """Shard the embedding tables under ``TorchRecStrategy``; with ``--compile``, compile the
        model (evaluation; in place: checkpoints keep their keys with or without --compile) and
        the training step's model and objective as one graph, whose batch size may vary unless
        the batches are padded to one (``--fixed-batches``: a static graph); once: fit and test
        both call this. Evaluation batches come in many sizes: no CUDA graphs for them."""
        strategy = self.trainer.strategy
        if isinstance(strategy, TorchRecStrategy) and strategy.sharded_model is None:
            self.model = strategy.shard(self.model)
        if self.compile_mode and getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile(dynamic=True, mode=None if self.compile_mode == "reduce-overhead" else self.compile_mode)
            fixed = getattr(self.trainer.datamodule, "fixed_size", False)
            self.batch_loss = torch.compile(self.batch_loss, dynamic=not fixed, mode=self.compile_mode)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.model(batch["sparse"], batch["dense"])

    def batch_loss(self, batch: dict[str, Tensor], logits: Tensor | None = None) -> Tensor:
        """The objective of the model's ``logits`` on ``batch``, by default computed here (then
        compiled as one graph with ``--compile``)."""
        return self.objective(self(batch) if logits is None else logits, batch["labels"], batch["user"], batch.get("mask"))

    def training_step(self, dataloader_iter: Iterator) -> None:
        """Up to ``steps_per_call`` optimizer steps, one per batch, taken from Lightning's iterator:
        Lightning's per-call work (its loop, hooks and bookkeeping: ~0.5 ms of a CPU core) is paid
        once for all of them. Callbacks' ``on_train_batch_*`` hooks run once per call."""
        optimizer, profile = self.optimizers(), self.trainer.profiler.profile  # regions: benchmarks/bench_recipe.py
        for batch, _, _ in itertools.islice(dataloader_iter, self.steps_per_call):
            if self.compile_mode:  # one graph: its time is the forward's
                with profile("ctr_cvr.forward"):
                    loss = self.batch_loss(batch)
            else:
                with profile("ctr_cvr.forward"):
                    logits = self(batch)
                with profile("ctr_cvr.loss"):
                    loss = self.batch_loss(batch, logits)
            with profile("ctr_cvr.backward"):
                self.manual_backward(loss)
            with profile("ctr_cvr.optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            self.train_loss_sum.add_(loss.detach())
            self.epoch_counts["steps"] += 1
            if "mask" in batch:  # a padded batch: its real rows, counted on the device
                self.masked_samples.add_(batch["mask"].sum())
            else:
                self.epoch_counts["samples"] += batch["labels"].shape[0]

    def epoch_samples(self) -> Tensor:
        """Impressions trained on this epoch so far, as a device tensor (no sync: read it once)."""
        return self.masked_samples + self.epoch_counts["samples"]

    def on_train_epoch_start(self) -> None:
        self._epoch_start = time.perf_counter()
        self.epoch_counts.update(steps=0, samples=0)
        self.train_loss_sum.zero_()
        self.masked_samples.zero_()

    def on_validation_epoch_start(self) -> None:
        """Right after the epoch's last training batch: its time, and its loss read (once) and checked."""
        self._train_end = time.perf_counter()
        steps = max(self.epoch_counts["steps"], 1)
        self._train_loss = float(self.trainer.strategy.reduce(self.train_loss_sum, reduce_op="mean")) / steps
        # Ranks run equal numbers of steps, not of rows: the epoch's impressions are the sum of theirs.
        self._train_samples = int(self.trainer.strategy.reduce(self.epoch_samples(), reduce_op="sum"))
        if not math.isfinite(self._train_loss):  # the losses' per-batch checks are off (validate_args=False)
            raise FloatingPointError(f"the training loss of epoch {self.current_epoch + 1} is {self._train_loss}: a "
                                     "batch gave a non-finite loss (check the data's dense features and --lr)")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        logits = self(batch)
        outputs = {"heads": logits[:, : len(TASKS)], "labels": batch["labels"], "user": batch["user"]}
        if self.objective.uses_ranking_head:
            outputs["rank"] = logits[:, len(TASKS)]
        return outputs

    test_step = validation_step

    def on_validation_epoch_end(self) -> None:
        samples, train_seconds = self._train_samples, self._train_end - self._epoch_start  # samples: of all ranks
        row = {"epoch": self.current_epoch + 1, "train_loss": self._train_loss, "train_samples": samples,
               "seconds": time.perf_counter() - self._epoch_start, "train_seconds": train_seconds,
               "train_samples_per_s": samples / train_seconds if train_seconds > 0 else float("nan"), **scorer_results(self.metrics)}
        self.history.append(row)
        self.print(format_epoch(row))

    def on_test_epoch_end(self) -> None:
        self.eval_results = scorer_results(self.metrics)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["ctr_cvr"] = {"history": self.history, **process_states(self.objective),
                                 **checkpoint_record(self.trainer, self.run_options)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("ctr_cvr")
        if saved is None:
            raise KeyError("this checkpoint was not written by recipes/ctr_cvr.py (no 'ctr_cvr' entry)")
        self.history = list(saved["history"])
        restore_rng_states(saved)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Sharded tables are trained by the fused sparse optimizer (mlloss.integrations.torchrec); the rest here.
        dense = [parameter for _, parameter in dense_parameters(self)]
        fused = all(p.device.type in ("cpu", "cuda") for p in dense)  # one kernel for all parameters
        return torch.optim.Adam(dense, lr=self.lr, weight_decay=self.weight_decay, fused=fused)


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the recipe; returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    threads, replaying = torch.get_num_threads(), mlloss.graph_replay_enabled()
    torch.set_num_threads(args.cpu_threads)
    mlloss.set_graph_replay(args.graph_replay or replaying)
    try:
        with lightning_notices_muted():
            return run(args)
    finally:
        torch.set_num_threads(threads)
        mlloss.set_graph_replay(replaying)


def run(args: argparse.Namespace) -> dict:
    """Load or generate the data, train, evaluate and write the report of ``main``."""
    start = time.perf_counter()
    pl.seed_everything(args.seed, verbose=False)
    # Folders the run cannot write are refused before the data load: --checkpoint-dir (resume_path), --output-dir.
    ckpt_path = resume_path(args)
    check_output_folder("--output-dir", args.output_dir, "results.json, results.md and curves.png go into a folder")
    (train, val, test), data_info = load_data(args)
    objective = MultiTaskObjective(args.loss, args.lam, args.cross_device, validate_args=False)
    model = build_model(args, train, len(TASKS) + objective.uses_ranking_head)
    module = CtrCvrModule(model, objective, args.lr, args.weight_decay, run_options=recorded_options(args),
                          compile_mode=args.compile, steps_per_call=args.steps_per_call)
    callbacks = [] if args.no_checkpoint else [ModelCheckpoint(dirpath=args.checkpoint_dir, filename="last",
                                                               save_top_k=1, enable_version_counter=False)]
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes, strategy=build_strategy(args),
        max_epochs=args.epochs, use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,  # see GroupDataModule
        num_sanity_val_steps=0, logger=False,
        callbacks=[*callbacks, OptimizerOptions(args.lr, args.weight_decay), ObjectiveRankStates(), *fault_test_callbacks()],
        plugins=[AtomicCheckpointIO()],  # write to a temporary file, fsync, rename (docs/checkpoints.md)
        enable_checkpointing=not args.no_checkpoint, enable_progress_bar=args.progress_bar, enable_model_summary=False,
    )
    check_batches((train, val, test), args, trainer.world_size)
    if ckpt_path is not None:
        check_resume(args, ckpt_path, trainer)
    replace_other_kind_of_checkpoint(args, trainer)
    dictatorship = mlloss.label_dictatorship(train.labels, label_names=TASKS)
    rank_zero_only(print)(f"{describe_data(train, val, test)}\n\nLabel dictatorship of the training labels:\n{dictatorship}")
    datamodule = GroupDataModule(train.columns(), val.columns(), test.columns(), batch_size=args.batch_size,
                                 group_key="user", seed=args.seed, fixed_size=args.fixed_batches)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    trainer.test(module, datamodule=datamodule, verbose=False)

    if not module.history:  # check_batches rules out the known causes; a callback may still stop fit early
        raise RuntimeError(f"training ended before its first validation epoch (global step {trainer.global_step}): "
                           "there are no validation results to report")
    results = {
        "val": {**{k: v for k, v in module.history[-1].items() if "/" in k}, **baseline_results(train, val)},
        "test": {**module.eval_results, **baseline_results(train, test)},
    }
    report = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "data": data_info | {"sizes": {"train": len(train), "val": len(val), "test": len(test)}},
        "label_dictatorship": dictatorship.as_dict(),
        "history": module.history,
        "results": results,
        "runtime_s": time.perf_counter() - start,
    }
    if trainer.is_global_zero:
        write_report(report, args.output_dir)
    return report


if __name__ == "__main__":
    main()
