"""Train a multi-task CTR/CVR model on synthetic Ali-CCP-like data with an mlloss objective.

    python recipes/ctr_cvr.py                          # MMoE, BCE, 5 epochs: ~30 s on 2 CPU cores
    python recipes/ctr_cvr.py --model ple --loss bce+pdaom --lambda 10
    python recipes/ctr_cvr.py --loss loa --esmm
    python recipes/ctr_cvr.py --data ali-ccp           # the sample in recipes/data/ali-ccp-sample
    python recipes/ctr_cvr.py --accelerator gpu --devices 4 --strategy ddp
    python recipes/ctr_cvr.py --accelerator cpu --devices 2 --sharding table_wise   # TorchRec DMP
    python recipes/ctr_cvr.py --epochs 8 --resume last   # continue from the last checkpoint
    python recipes/ctr_cvr.py --config run.yaml          # options from a YAML/JSON file

Data (``--data``): the built-in synthetic generator (default; it knows the true click and
purchase probabilities, reported as an "oracle" row), or the Ali-CCP and AliExpress CSV
layouts (``mlloss.data.load_ali_ccp`` / ``load_aliexpress``; AliExpress groups are searches) in
``--data-dir``, by default the tiny MIT-licensed samples shipped in ``recipes/data/`` (see their
README files).

Embeddings (``--embedding``, ``--sharding``): plain ``torch.nn.Embedding`` tables, or TorchRec
``EmbeddingBagCollection`` tables fed a ``KeyedJaggedTensor`` (``mlloss.sharding``, needs the
torchrec extra). ``--sharding table_wise|column_wise|data_parallel`` shards the tables with
``DistributedModelParallel`` through ``mlloss.sharding.TorchRecStrategy``: DMP is built in
``configure_model``, the tables train with a fused sparse optimizer (``--sparse-optimizer``,
``--sparse-lr``) and the rest with Adam, and checkpoints are ``torch.distributed.checkpoint``
directories.

Checkpoints: every epoch writes ``<checkpoint-dir>/last.ckpt`` (a file, or a directory under
``--sharding``); ``--resume last`` (or a path) continues from it with the same data order, so
that the continued run equals an uninterrupted one. A checkpoint records the sharding, strategy
and number of processes that wrote it, and ``--resume`` refuses, naming the options, a run that
differs in any of them (the layout of the saved state and the data order depend on them). A new
run (no ``--resume``) replaces a ``last.ckpt`` of the other kind (file or directory).

Every epoch prints the validation AUC and GAUC (AUC per user, averaged with weights equal to
the users' numbers of impressions, over users with both classes) of click and purchase. At
the end the validation and test results, next to an item-popularity baseline and an oracle
(the generator's true probabilities), are printed as a markdown table and written to
``<output-dir>/results.json`` and ``<output-dir>/results.md``, and the curves to
``<output-dir>/curves.png`` (if matplotlib is installed). At the start the label-dictatorship
report of the training labels says which label would dominate a loss-aggregation (LoA) ranking
score; with a ranking head, every epoch also reports its per-label AUCs, DiffAUC (max - min)
and MinAUC. Each epoch's training throughput (impressions per second over all ranks) is kept
in the history.

Tasks and objectives. The model has a click head (pCTR) and a purchase head (P(purchase |
impression), or with ``--esmm`` pCTCVR = pCTR * pCVR), both trained on all impressions.
The ``--loss`` names map to ``mlloss.build_loss`` in two ways:

* per-task objectives (``bce``, ``bce+auc``, ``bce+pdaom``, ``auc``, ``pdaom``) are applied to
  each head with its own label, with the user ids as groups, and summed over the two tasks;
  ``--lambda`` is passed as ``lam`` to the ``bce+X`` combinations;
* single-ranking-score objectives (``laa``, ``loa``, ``balanced-loa``) need one score ranked
  against both labels: the model gets a third, dedicated ranking head whose logit is passed
  with the (B, 2) labels (click, purchase). BCE stays on the click and purchase heads so that
  the model still predicts probabilities; the total is BCE + lambda * ranking loss
  (lambda defaults to 1). The ranking head's AUCs are reported in the row ``model:rank``.
  ``--cross-device`` takes the ranking pairs across all DDP ranks (``cross_device=True``).

Batches keep users together (``mlloss.data.GroupBatchSampler``, docs/sampler.md): every epoch
shuffles the users and packs whole users into batches of at most ``--batch-size`` impressions (a
user with more is split into batch-size pieces), so per-user (GAUC) pairs exist. Under DDP the
batches are dealt round-robin to the ranks; training drops the last few that would leave the ranks
uneven, evaluation keeps every impression and gives a rank left short an empty batch.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torchmetrics
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities import rank_zero_only
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, Sampler

import mlloss
from mlloss.data import (
    GroupBatchSampler,
    ImpressionData,
    SyntheticConfig,
    generate_impressions,
    load_ali_ccp,
    load_aliexpress,
    split_by_time,
)
from mlloss.metrics import UndefinedMetricWarning, binary_auc, group_auc, multipartite_auc
from mlloss.sharding import SHARDING_TYPES, SPARSE_OPTIMIZERS, TorchRecStrategy, dense_parameters
from mlloss.towers import CGC, PLE, DotInteraction, FieldEmbedding, MMoE, MultiTaskModel, SharedBottom

TASKS = ("click", "purchase")
PER_TASK_LOSSES = ("bce", "bce+auc", "bce+pdaom", "auc", "pdaom")
RANKING_SCORE_LOSSES = ("laa", "loa", "balanced-loa")
MODELS = ("mmoe", "ple", "cgc", "shared-bottom")
DATA_SOURCES = ("synthetic", "ali-ccp", "aliexpress")
SAMPLE_DATA = Path(__file__).resolve().parent / "data"  # small MIT-licensed samples, with their README and LICENSE
DEFAULT_DATA_DIRS = {"ali-ccp": SAMPLE_DATA / "ali-ccp-sample", "aliexpress": SAMPLE_DATA / "aliexpress-sample"}
SHARDINGS = ("none", *SHARDING_TYPES)


# --------------------------------------------------------------------------- data


class ImpressionBatches(Dataset):
    """Map-style dataset whose items are whole batches: ``dataset[index_tensor]``."""

    def __init__(self, data: ImpressionData) -> None:
        self.data = data
        self.labels = data.labels

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: Tensor) -> dict[str, Tensor]:
        d = self.data
        return {"sparse": d.sparse[index], "dense": d.dense[index], "labels": self.labels[index], "user": d.user[index]}


class UserBlockBatchSampler(Sampler[Tensor]):
    """Index tensors of the batches of :class:`~mlloss.data.GroupBatchSampler` over the users, in
    the recipe's two regimes: ``even_shards`` (DDP training) drops the last batches so that every
    rank runs the same number of steps; otherwise (evaluation) every impression is kept and a rank
    left short gets an empty batch, because a sharded embedding's forward is a collective that
    every rank must join."""

    def __init__(
        self,
        users: Tensor,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        even_shards: bool = False,
    ) -> None:
        self.batches = GroupBatchSampler(users, batch_size, shuffle=shuffle, seed=seed, drop_last=even_shards,
                                         pad="empty", num_replicas=world_size, rank=rank)

    def set_epoch(self, epoch: int) -> None:
        """Change the user order (Lightning calls this at every training epoch)."""
        self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Tensor]:
        return (torch.tensor(batch, dtype=torch.long) for batch in self.batches)


class ImpressionDataModule(pl.LightningDataModule):
    """Train/val/test dataloaders over user-block batches, sharded by the trainer's rank.

    The number of user-block batches changes by a few between epochs (it depends on the packing),
    and Lightning reads a dataloader's length when it loads it: the trainer reloads the dataloaders
    every epoch (``reload_dataloaders_every_n_epochs=1``) and the training sampler is created at the
    current epoch, so that the length is the epoch's own."""

    def __init__(
        self, train: ImpressionData, val: ImpressionData, test: ImpressionData, batch_size: int, seed: int
    ) -> None:
        super().__init__()
        self.splits = {"train": train, "val": val, "test": test}
        self.batch_size = batch_size
        self.seed = seed

    def _loader(self, split: str) -> DataLoader:
        rank, world = (self.trainer.global_rank, self.trainer.world_size) if self.trainer else (0, 1)
        training = split == "train"
        sampler = UserBlockBatchSampler(
            self.splits[split].user, self.batch_size, shuffle=training, seed=self.seed,
            rank=rank, world_size=world, even_shards=training,
        )
        sampler.set_epoch(self.trainer.current_epoch if self.trainer else 0)
        return DataLoader(ImpressionBatches(self.splits[split]), sampler=sampler, batch_size=None)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


# --------------------------------------------------------------------------- metrics


def ranking_metrics(scores: Tensor, labels: Tensor, users: Tensor) -> dict[str, float]:
    """AUC and GAUC (impression-weighted) of ``scores`` (N,) or (N, 2) (one column per task)
    for click and purchase; NaN where a metric is undefined (no positive, say)."""
    columns = scores.unsqueeze(1).expand(-1, len(TASKS)) if scores.dim() == 1 else scores
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        for t, task in enumerate(TASKS):
            out[f"{task}_auc"] = float(binary_auc(columns[:, t], labels[:, t]))
            out[f"{task}_gauc"] = float(group_auc(columns[:, t], labels[:, t], users, weighting="size"))
    return out


def ranking_score_metrics(scores: Tensor, labels: Tensor, users: Tensor) -> dict[str, float]:
    """:func:`ranking_metrics` of one ranking score, plus its DiffAUC (max - min of the
    per-label AUCs), MinAUC and the multipartite AUC of click + purchase (what LaA targets)."""
    out = ranking_metrics(scores, labels, users)
    per_label = torch.tensor([out[f"{task}_auc"] for task in TASKS])  # NaN where a label is one-class
    out["diff_auc"] = float(per_label.max() - per_label.min())  # NaN propagates
    out["min_auc"] = float(per_label.min())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)
        out["multipartite_auc"] = float(multipartite_auc(scores, labels))
    return out


class ScoreCollector(torchmetrics.Metric):
    """Accumulates (scores, labels, users) over an epoch; gathered across ranks under DDP."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        for name in ("scores", "labels", "users"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, scores: Tensor, labels: Tensor, users: Tensor) -> None:
        self.scores.append(scores.detach().float())
        self.labels.append(labels.float())
        self.users.append(users)

    def compute(self) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(torchmetrics.utilities.dim_zero_cat(getattr(self, n)).cpu() for n in ("scores", "labels", "users"))


# --------------------------------------------------------------------------- model and objective


def build_model(args: argparse.Namespace, data: ImpressionData, num_heads: int) -> MultiTaskModel:
    """The tower selected by ``args.model`` over the concatenated field embeddings (with
    their pairwise dot products unless ``--interaction none``) and the dense features."""
    if args.embedding == "torchrec":
        from mlloss.sharding import TorchRecEmbedding

        embedding = TorchRecEmbedding(data.cardinalities, args.embedding_dim, data.field_names)
    else:
        embedding = FieldEmbedding(data.cardinalities, args.embedding_dim)
    interaction = DotInteraction(len(data.cardinalities), args.embedding_dim) if args.interaction == "dot" else None
    input_dim = (interaction or embedding).output_dim + data.dense.shape[1]
    expert_hidden, tower_hidden = tuple(args.expert_hidden), tuple(args.tower_hidden)
    if args.model == "mmoe":
        backbone = MMoE(input_dim, num_heads, args.num_experts, expert_hidden, tower_hidden, args.dropout)
    elif args.model == "cgc":
        backbone = CGC(input_dim, num_heads, args.num_task_experts, args.num_shared_experts,
                       expert_hidden, tower_hidden, args.dropout)
    elif args.model == "ple":
        backbone = PLE(input_dim, num_heads, args.num_levels, args.num_task_experts, args.num_shared_experts,
                       expert_hidden, tower_hidden, args.dropout)
    elif args.model == "shared-bottom":
        backbone = SharedBottom(input_dim, num_heads, expert_hidden, tower_hidden, args.dropout)
    else:
        raise ValueError(f"--model must be one of {MODELS}, got {args.model!r}")
    return MultiTaskModel(embedding, backbone, interaction, esmm=args.esmm)


class MultiTaskObjective(nn.Module):
    """The training loss of the (B, 2) or (B, 3) logits for ``--loss`` (see module docstring)."""

    def __init__(self, name: str, lam: float | None, cross_device: bool = False) -> None:
        super().__init__()
        if name not in PER_TASK_LOSSES + RANKING_SCORE_LOSSES:
            raise ValueError(f"--loss must be one of {PER_TASK_LOSSES + RANKING_SCORE_LOSSES}, got {name!r}")
        self.uses_ranking_head = name in RANKING_SCORE_LOSSES
        ranking = {"cross_device": True} if cross_device else {}
        if self.uses_ranking_head:
            self.task_loss = mlloss.build_loss("bce")
            self.ranking_loss = mlloss.build_loss(name, **ranking)
            self.lam = 1.0 if lam is None else lam
        else:
            kwargs = {"lam": lam} if lam is not None and name.startswith("bce+") else {}
            self.task_loss = mlloss.build_loss(name, **kwargs, **(ranking if name != "bce" else {}))

    def forward(self, logits: Tensor, labels: Tensor, users: Tensor) -> Tensor:
        total = sum(self.task_loss(logits[:, t], labels[:, t], groups=users) for t in range(len(TASKS)))
        if self.uses_ranking_head:
            total = total + self.lam * self.ranking_loss(logits[:, len(TASKS)], labels, groups=users)
        return total


class CtrCvrModule(pl.LightningModule):
    """Trains ``model`` with ``objective``; collects validation/test scores for AUC/GAUC."""

    def __init__(
        self, model: MultiTaskModel, objective: MultiTaskObjective, lr: float, weight_decay: float,
        run_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.objective = objective
        self.lr = lr
        self.weight_decay = weight_decay
        self.run_options = run_options or {}  # recorded in checkpoints (checkpoint_layout)
        self.train_loss = torchmetrics.MeanMetric()
        self.collector = ScoreCollector()
        self.history: list[dict[str, float]] = []
        self.eval_results: dict[str, float] = {}
        self._epoch_start = self._train_end = time.perf_counter()
        self._epoch_samples = 0

    def configure_model(self) -> None:
        """Under ``TorchRecStrategy``, shard the embedding tables (once: fit and test both call this)."""
        strategy = self.trainer.strategy
        if isinstance(strategy, TorchRecStrategy) and strategy.sharded_model is None:
            self.model = strategy.shard(self.model)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.model(batch["sparse"], batch["dense"])

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.objective(self(batch), batch["labels"], batch["user"])
        self.train_loss.update(loss.detach())
        self._epoch_samples += batch["labels"].shape[0]
        return loss

    def on_train_epoch_start(self) -> None:
        self._epoch_start = self._train_end = time.perf_counter()
        self._epoch_samples = 0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._train_end = time.perf_counter()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.collector.update(self(batch), batch["labels"], batch["user"])

    test_step = validation_step

    def _evaluate(self) -> dict[str, float]:
        scores, labels, users = self.collector.compute()
        self.collector.reset()
        logits_per_task = scores[:, : len(TASKS)]
        results = {f"model/{k}": v for k, v in ranking_metrics(logits_per_task, labels, users).items()}
        if self.objective.uses_ranking_head:
            rank = ranking_score_metrics(scores[:, len(TASKS)], labels, users)
            results |= {f"model:rank/{k}": v for k, v in rank.items()}
        return results

    def on_validation_epoch_end(self) -> None:
        results = self._evaluate()
        train_loss = float(self.train_loss.compute())
        self.train_loss.reset()
        train_seconds = self._train_end - self._epoch_start
        samples = self._epoch_samples * self.trainer.world_size  # ranks run equal shards
        row = {"epoch": self.current_epoch + 1, "train_loss": train_loss,
               "seconds": time.perf_counter() - self._epoch_start, "train_seconds": train_seconds,
               "train_samples_per_s": samples / train_seconds if train_seconds > 0 else float("nan"), **results}
        self.history.append(row)
        self.log_dict({f"val/{k}": v for k, v in results.items()}, sync_dist=True)  # equal on all ranks
        self.print(_format_epoch(row))

    def on_test_epoch_end(self) -> None:
        self.eval_results = self._evaluate()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["ctr_cvr"] = {"history": self.history, "torch_rng_state": torch.get_rng_state(),
                                 "written_with": checkpoint_layout(self.trainer, self.run_options)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("ctr_cvr")
        if saved is None:
            raise KeyError("this checkpoint was not written by recipes/ctr_cvr.py (no 'ctr_cvr' entry)")
        self.history = list(saved["history"])
        torch.set_rng_state(saved["torch_rng_state"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Sharded tables are trained by the fused sparse optimizer (mlloss.sharding); the rest here.
        dense = [parameter for _, parameter in dense_parameters(self)]
        return torch.optim.Adam(dense, lr=self.lr, weight_decay=self.weight_decay)


# --------------------------------------------------------------------------- reporting


def baseline_results(train: ImpressionData, split: ImpressionData) -> dict[str, float]:
    """AUC/GAUC of item popularity (training impressions of the item), when the data names an
    item field, and of the true probabilities, when the data knows them (synthetic data)."""
    results = {}
    if train.item_field is not None:
        item = train.field_names.index(train.item_field)
        popularity = torch.bincount(train.sparse[:, item], minlength=train.cardinalities[item]).float()
        pop = ranking_metrics(popularity[split.sparse[:, item]], split.labels, split.user)
        results |= {f"popularity/{k}": v for k, v in pop.items()}
    if split.p_click is not None and split.p_purchase is not None:
        oracle = ranking_metrics(torch.stack([split.p_click, split.p_purchase], 1), split.labels, split.user)
        results |= {f"oracle/{k}": v for k, v in oracle.items()}
    return results


def _format_epoch(row: dict[str, float]) -> str:
    parts = [f"epoch {row['epoch']:>2}", f"loss {row['train_loss']:.4f}", f"{row['seconds']:.1f}s",
             f"{row['train_samples_per_s']:,.0f} imp/s"]
    for task in TASKS:
        parts.append(f"val {task} AUC {row[f'model/{task}_auc']:.4f} GAUC {row[f'model/{task}_gauc']:.4f}")
    if "model:rank/diff_auc" in row:
        parts.append(f"rank head AUC {row['model:rank/click_auc']:.4f}/{row['model:rank/purchase_auc']:.4f} "
                     f"Diff {row['model:rank/diff_auc']:.4f} Min {row['model:rank/min_auc']:.4f}")
    return " | ".join(parts)


def plot_curves(history: Sequence[dict[str, float]], path: Path) -> bool:
    """Training loss and validation AUC/GAUC per task against the epoch, saved as a PNG;
    False (and nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    epochs = [row["epoch"] for row in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), constrained_layout=True)
    axes[0].plot(epochs, [row["train_loss"] for row in history], marker="o")
    axes[0].set(title="training loss", xlabel="epoch")
    for ax, metric in zip(axes[1:], ("auc", "gauc")):
        for task in TASKS:
            ax.plot(epochs, [row[f"model/{task}_{metric}"] for row in history], marker="o", label=f"{task} head")
            if f"model:rank/{task}_{metric}" in history[0]:
                ax.plot(epochs, [row[f"model:rank/{task}_{metric}"] for row in history], marker="s",
                        linestyle="--", label=f"ranking head vs {task}")
        ax.set(title=f"validation {metric.upper()}", xlabel="epoch")
        ax.legend(fontsize=8)
    for ax in axes:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """One row per (split, scorer), columns AUC/GAUC of click and purchase."""
    metrics = [f"{task}_{m}" for task in TASKS for m in ("auc", "gauc")]
    lines = ["| split | scorer | " + " | ".join(metrics) + " |", "|" + "---|" * (len(metrics) + 2)]
    for split, flat in results.items():
        scorers = dict.fromkeys(key.split("/")[0] for key in flat)
        for scorer in scorers:
            values = " | ".join(f"{flat[f'{scorer}/{m}']:.4f}" for m in metrics)
            lines.append(f"| {split} | {scorer} | {values} |")
    for split, flat in results.items():
        if "model:rank/diff_auc" in flat:
            lines.append(f"\n{split}, ranking head: DiffAUC {flat['model:rank/diff_auc']:.4f}, "
                         f"MinAUC {flat['model:rank/min_auc']:.4f}, "
                         f"multipartite AUC {flat['model:rank/multipartite_auc']:.4f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--config", type=Path, default=None,
                   help="YAML or JSON file of option values, keyed by long option name (loss: laa, batch-size: "
                        "512, expert-hidden: [64, 32], esmm: true); options on the command line override it")
    p.add_argument("--model", choices=MODELS, default="mmoe", help="multi-task tower")
    p.add_argument("--loss", choices=PER_TASK_LOSSES + RANKING_SCORE_LOSSES, default="bce",
                   help="objective name passed to mlloss.build_loss")
    p.add_argument("--lambda", dest="lam", type=float, default=None, metavar="LAMBDA",
                   help="weight of the ranking term: 'lam' of bce+X losses (library default if unset), "
                        "or the ranking-head weight of laa/loa/balanced-loa (1 if unset)")
    p.add_argument("--esmm", action="store_true", help="purchase head = pCTR * pCVR (ESMM)")
    p.add_argument("--epochs", type=int, default=5, help="passes over the training split")
    p.add_argument("--batch-size", type=int, default=1024, help="most impressions per batch (per device); users are kept whole")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=1e-4, help="Adam L2 penalty (curbs id-embedding overfitting)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the training")
    p.add_argument("--cross-device", action="store_true",
                   help="under DDP, take the ranking loss's pairs across all ranks (cross_device=True)")
    g = p.add_argument_group("data")
    g.add_argument("--data", choices=DATA_SOURCES, default="synthetic",
                   help="synthetic Ali-CCP-like log, or an Ali-CCP / AliExpress CSV directory")
    g.add_argument("--data-dir", type=Path, default=None,
                   help="directory of the *train*/*val*/*test* CSV files (default: the samples in recipes/data/)")
    g = p.add_argument_group("synthetic data")
    g.add_argument("--num-users", type=int, default=SyntheticConfig.num_users, help="users in the log")
    g.add_argument("--num-items", type=int, default=SyntheticConfig.num_items, help="items (Zipf popularity)")
    g.add_argument("--mean-impressions", type=float, default=SyntheticConfig.mean_impressions,
                   help="mean number of impressions per user")
    g.add_argument("--click-rate", type=float, default=SyntheticConfig.click_rate, help="clicks per impression")
    g.add_argument("--purchase-rate", type=float, default=SyntheticConfig.purchase_rate,
                   help="purchases per impression")
    g = p.add_argument_group("architecture")
    g.add_argument("--embedding-dim", type=int, default=16, help="dimension of every field embedding")
    g.add_argument("--interaction", choices=("dot", "none"), default="dot",
                   help="append the pairwise dot products of the field embeddings (FM/DLRM style)")
    g.add_argument("--expert-hidden", type=int, nargs="+", default=[64, 32],
                   help="widths of expert MLPs (of the bottom MLP for shared-bottom)")
    g.add_argument("--tower-hidden", type=int, nargs="+", default=[16], help="hidden widths of each task tower")
    g.add_argument("--num-experts", type=int, default=4, help="MMoE experts")
    g.add_argument("--num-task-experts", type=int, default=2, help="CGC/PLE experts per task")
    g.add_argument("--num-shared-experts", type=int, default=2, help="CGC/PLE shared experts")
    g.add_argument("--num-levels", type=int, default=2, help="PLE extraction levels")
    g.add_argument("--dropout", type=float, default=0.0, help="dropout after hidden layers")
    g.add_argument("--embedding", choices=("plain", "torchrec"), default="plain",
                   help="torch.nn.Embedding tables, or a TorchRec EmbeddingBagCollection fed a KeyedJaggedTensor")
    g = p.add_argument_group("TorchRec sharding (needs the torchrec extra)")
    g.add_argument("--sharding", choices=SHARDINGS, default="none",
                   help="shard the tables with DistributedModelParallel (implies --embedding torchrec)")
    g.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default="rowwise_adagrad",
                   help="fused optimizer of sharded tables (adam only on CUDA)")
    g.add_argument("--sparse-lr", type=float, default=0.05, help="learning rate of the sparse optimizer")
    g = p.add_argument_group("hardware and output")
    g.add_argument("--accelerator", default="auto", help="Lightning accelerator: auto, cpu, gpu")
    g.add_argument("--devices", default="1", help="number of devices, or 'auto'")
    g.add_argument("--num-nodes", type=int, default=1, help="machines of a multi-node job (Lightning's num_nodes)")
    g.add_argument("--strategy", default="auto", help="Lightning strategy, e.g. ddp")
    g.add_argument("--cpu-threads", type=int, default=1,
                   help="torch intra-op threads per process: these small models run fastest on one, "
                        "which also keeps DDP ranks from oversubscribing the cores")
    g.add_argument("--output-dir", type=Path, default=Path("runs/ctr_cvr"),
                   help="where results.json, results.md and curves.png go")
    g.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="where last.ckpt is written every epoch (default: <output-dir>/checkpoints)")
    g.add_argument("--no-checkpoint", action="store_true", help="write no checkpoints")
    g.add_argument("--resume", default=None, metavar="PATH",
                   help="continue training from a checkpoint: a path, or 'last' for <checkpoint-dir>/last.ckpt")
    g.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True,
                   help="show Lightning's progress bar")
    argv = list(sys.argv[1:] if argv is None else argv)
    config = p.parse_known_args(argv)[0].config
    args = p.parse_args(config_argv(config, p) + argv if config is not None else argv)
    args.devices = args.devices if args.devices == "auto" else int(args.devices)
    for name in ("epochs", "batch_size", "num_users", "num_items", "embedding_dim", "cpu_threads", "num_nodes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.lam is not None and not (args.loss.startswith("bce+") or args.loss in RANKING_SCORE_LOSSES):
        p.error(f"--lambda weighs a ranking term, which --loss {args.loss} does not have")
    if args.cross_device and args.loss == "bce":
        p.error("--cross-device applies to a ranking loss, which --loss bce does not have")
    if args.sharding != "none":
        if args.strategy not in ("auto", "ddp"):
            p.error(f"--sharding uses its own strategy (TorchRec DMP); drop --strategy {args.strategy}")
        args.embedding = "torchrec"
    if not args.sparse_lr > 0:
        p.error(f"--sparse-lr must be > 0, got {args.sparse_lr}")
    if args.data == "synthetic" and args.data_dir is not None:
        p.error("--data-dir needs --data ali-ccp or --data aliexpress")
    if args.data != "synthetic" and args.data_dir is None:
        args.data_dir = DEFAULT_DATA_DIRS[args.data]
    if args.checkpoint_dir is None:
        args.checkpoint_dir = args.output_dir / "checkpoints"
    if args.resume is not None and args.no_checkpoint:
        p.error("--resume continues a checkpointed run; drop --no-checkpoint")
    return args


def config_argv(path: Path, parser: argparse.ArgumentParser) -> list[str]:
    """The options of a YAML/JSON config file as command-line tokens, so that argparse checks
    them like typed options (types, choices) and later command-line options override them."""
    import yaml  # a dependency of pytorch-lightning; JSON is YAML too

    if not path.is_file():
        parser.error(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        parser.error(f"--config {path}: not valid YAML/JSON ({error})")
    if not isinstance(values, dict):
        parser.error(f"--config {path}: expected a mapping of option names to values, got {type(values).__name__}")
    tokens: list[str] = []
    for key, value in values.items():
        option = "--" + str(key).replace("_", "-")
        action = parser._option_string_actions.get(option)
        if action is None or option in ("--config", "--help"):
            parser.error(f"--config {path}: unknown option {key!r}")
        if isinstance(action, argparse.BooleanOptionalAction):
            tokens.append(option if value else "--no-" + option[2:])
        elif action.nargs == 0:  # store_true flags
            if not isinstance(value, bool):
                parser.error(f"--config {path}: {key} is a flag and takes true or false, got {value!r}")
            tokens += [option] if value else []
        elif isinstance(value, list):
            tokens += [option, *map(str, value)]
        else:
            tokens += [option, str(value)]
    return tokens


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the recipe; returns the dictionary also written to ``results.json``."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.cpu_threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict:
    """Load or generate the data, train, evaluate and write the report of ``main``."""
    start = time.perf_counter()
    pl.seed_everything(args.seed, verbose=False)
    (train, val, test), data_info = load_data(args)
    objective = MultiTaskObjective(args.loss, args.lam, args.cross_device)
    model = build_model(args, train, len(TASKS) + objective.uses_ranking_head)
    module = CtrCvrModule(model, objective, args.lr, args.weight_decay, run_options=layout_options(args))
    ckpt_path = resume_path(args)
    callbacks = [] if args.no_checkpoint else [
        ModelCheckpoint(dirpath=args.checkpoint_dir, filename="last", save_top_k=1, enable_version_counter=False)
    ]
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes, strategy=build_strategy(args),
        max_epochs=args.epochs,
        use_distributed_sampler=False, reload_dataloaders_every_n_epochs=1,  # see ImpressionDataModule
        num_sanity_val_steps=0, logger=False, callbacks=callbacks,
        enable_checkpointing=not args.no_checkpoint, enable_progress_bar=args.progress_bar,
        enable_model_summary=False,
    )
    if ckpt_path is not None:
        check_resume(args, ckpt_path, trainer)
    replace_other_kind_of_checkpoint(args, trainer)
    dictatorship = mlloss.label_dictatorship(train.labels, label_names=TASKS)
    _print_rank_zero(f"{_describe_data(train, val, test)}\n\nLabel dictatorship of the training labels:\n{dictatorship}")
    datamodule = ImpressionDataModule(train, val, test, args.batch_size, args.seed)
    with warnings.catch_warnings():
        # Lightning 2.6 calls a pytree API that torch >= 2.10 deprecates; the message is noise here.
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        trainer.test(module, datamodule=datamodule, verbose=False)

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
        table = markdown_table(results)
        print("\n" + table)
        args.output_dir.mkdir(parents=True, exist_ok=True)
        (args.output_dir / "results.json").write_text(json.dumps(report, indent=2, allow_nan=True))
        (args.output_dir / "results.md").write_text(table + "\n")
        written = ["results.json", "results.md"]
        if plot_curves(module.history, args.output_dir / "curves.png"):
            written.append("curves.png")
        else:
            print("(curves.png skipped: pip install matplotlib to draw it)")
        print(f"\nwrote {', '.join(str(args.output_dir / name) for name in written)} ({report['runtime_s']:.0f}s)")
    return report


def load_data(args: argparse.Namespace) -> tuple[tuple[ImpressionData, ImpressionData, ImpressionData], dict]:
    """The (train, val, test) splits of ``--data`` and a description of their source."""
    if args.data == "ali-ccp":
        return load_ali_ccp(args.data_dir), {"source": "ali-ccp", "directory": str(args.data_dir)}
    if args.data == "aliexpress":
        return load_aliexpress(args.data_dir, seed=args.seed), {"source": "aliexpress", "directory": str(args.data_dir)}
    config = SyntheticConfig(
        num_users=args.num_users, num_items=args.num_items, mean_impressions=args.mean_impressions,
        click_rate=args.click_rate, purchase_rate=args.purchase_rate, seed=args.seed,
    )
    return split_by_time(generate_impressions(config)), {"source": "synthetic", **asdict(config)}


def build_strategy(args: argparse.Namespace) -> str | pl.strategies.Strategy:
    """``--strategy``, or with ``--sharding`` the TorchRec DMP strategy (gloo on the CPU)."""
    if args.sharding == "none":
        return args.strategy
    backend = "gloo" if args.accelerator == "cpu" or not torch.cuda.is_available() else "nccl"
    return TorchRecStrategy(args.sharding, args.sparse_optimizer, args.sparse_lr, process_group_backend=backend)


def resume_path(args: argparse.Namespace) -> Path | None:
    """The checkpoint ``--resume`` names, which must exist."""
    if args.resume is None:
        return None
    path = args.checkpoint_dir / "last.ckpt" if args.resume == "last" else Path(args.resume)
    if not path.exists():
        raise FileNotFoundError(f"--resume {args.resume}: no checkpoint at {path}")
    return path


# Strategies whose checkpoints differ only by --sharding (a file, or TorchRec's directory): compared as one.
PLAIN_STRATEGIES = ("SingleDeviceStrategy", "DDPStrategy", "TorchRecStrategy")


def layout_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command-line options that fix a checkpoint's layout and the data order of a run."""
    return {"--sharding": args.sharding, "--strategy": args.strategy, "--devices": args.devices,
            "--num-nodes": args.num_nodes}


def checkpoint_layout(trainer: pl.Trainer, options: dict[str, Any]) -> dict[str, Any]:
    """What a run's checkpoints depend on: the sharding of the tables (the saved state's layout),
    the strategy (its checkpoint format) and the number of processes (the shards, and the batches
    dealt to each rank); ``options`` are the command-line values behind them. Recorded in every
    checkpoint, compared by :func:`check_resume`."""
    strategy = trainer.strategy
    return {"sharding": strategy.sharding if isinstance(strategy, TorchRecStrategy) else "none",
            "strategy": type(strategy).__name__, "world_size": trainer.world_size, "options": dict(options)}


def saved_layout(path: Path, resume: str) -> dict[str, Any]:
    """The :func:`checkpoint_layout` recorded in the checkpoint at ``path`` (a file, or under
    ``--sharding`` a directory with ``meta.pt``); what the checkpoint's kind tells, with None for
    the unknown values, when it was written before the recipe recorded it."""
    if path.is_dir():
        meta = path / "meta.pt"  # TorchRecStrategy: everything but the tensors of the shards
        if not meta.is_file():
            raise FileNotFoundError(f"--resume {resume}: {path} is a directory without meta.pt, not a checkpoint "
                                    "of this recipe (under --sharding a checkpoint is a directory with meta.pt)")
        checkpoint, unrecorded = torch.load(meta, map_location="cpu", weights_only=False), {"sharding": None}
    else:
        checkpoint, unrecorded = torch.load(path, map_location="cpu", weights_only=False), {"sharding": "none"}
    recorded = checkpoint.get("ctr_cvr", {}).get("written_with") if isinstance(checkpoint, dict) else None
    return recorded or {**unrecorded, "strategy": None, "world_size": None, "options": {}}


def check_resume(args: argparse.Namespace, path: Path, trainer: pl.Trainer) -> None:
    """Raise ValueError, naming the options and both values, when the checkpoint at ``path`` was
    written with another sharding, strategy or number of processes than this run has: checked
    before Lightning loads it, which would end in a raw IsADirectoryError (a sharded directory
    read as a file), a state-dict mismatch, or a run that continues with another data order."""
    saved, here = saved_layout(path, args.resume), checkpoint_layout(trainer, layout_options(args))
    differ = []
    if saved["sharding"] is None:  # a sharded checkpoint directory that did not record its --sharding
        if here["sharding"] == "none":
            differ.append("--sharding")
    elif saved["sharding"] != here["sharding"]:
        differ.append("--sharding")
    if saved["strategy"] is not None and _strategy_kind(saved["strategy"]) != _strategy_kind(here["strategy"]):
        differ.append("--strategy")
    if saved["world_size"] is not None and saved["world_size"] != here["world_size"]:
        differ.append("the number of processes (--devices x --num-nodes)")
    if not differ:
        return
    same = " ".join(f"{option} {value}" for option, value in saved["options"].items()) or \
        "the --sharding, --strategy, --devices and --num-nodes of the run that wrote it"
    what = differ[0] if len(differ) == 1 else ", ".join(differ[:-1]) + " and " + differ[-1]
    raise ValueError(
        f"--resume {args.resume}: the checkpoint {path} was written with {_describe_layout(saved)}; this run has "
        f"{_describe_layout(here)}. A checkpoint resumes only with the sharding, strategy and number of processes "
        f"that wrote it, and {what} {'differs' if len(differ) == 1 else 'differ'}: resume with {same}, or start "
        "a new run with another --output-dir (or --checkpoint-dir)"
    )


def _strategy_kind(name: str) -> str:
    return "plain" if name in PLAIN_STRATEGIES else name


def _describe_layout(layout: dict[str, Any]) -> str:
    if layout["strategy"] is None:  # written before the recipe recorded the layout: only its kind is known
        if layout["sharding"] is None:
            return "some --sharding (a checkpoint directory that predates the record of these options)"
        return f"--sharding {layout['sharding']} (a checkpoint file that predates the record of these options)"
    n = layout["world_size"]
    strategy = layout["options"].get("--strategy")
    strategy = layout["strategy"] if strategy is None else f"{strategy}: {layout['strategy']}"
    return f"--sharding {layout['sharding']} on {n} process{'es' if n != 1 else ''} (--strategy {strategy})"


def replace_other_kind_of_checkpoint(args: argparse.Namespace, trainer: pl.Trainer) -> None:
    """Remove the sharded checkpoint directory ``<checkpoint-dir>/last.ckpt`` of an earlier run
    before a run without --sharding writes its checkpoint file there (Lightning would put the file
    inside the directory and leave the old checkpoint in place); ``TorchRecStrategy`` replaces a
    checkpoint file by its directory itself. A resumed run has the same kind (``check_resume``)."""
    last = args.checkpoint_dir / "last.ckpt"
    if args.no_checkpoint or args.sharding != "none" or not trainer.is_global_zero or not last.is_dir():
        return
    shutil.rmtree(last)
    print(f"removed {last}, the sharded checkpoint of an earlier run: this run (--sharding none) writes its own there")


def _describe_data(*splits: ImpressionData) -> str:
    rows = []
    for name, d in zip(("train", "val", "test"), splits):
        rows.append(f"{name}: {len(d)} impressions, {len(d.user.unique())} users, "
                    f"click {d.click.mean():.4f}, purchase {d.purchase.mean():.4f}")
    return "\n".join(rows)


@rank_zero_only
def _print_rank_zero(text: str) -> None:
    print(text)


if __name__ == "__main__":
    main()
