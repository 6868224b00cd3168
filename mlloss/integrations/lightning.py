r"""PyTorch Lightning integration: a callback that logs exact ranking metrics at validation.

Importing this module needs ``pytorch_lightning`` (the ``lightning`` extra); the core of
:mod:`mlloss` does not. Its siblings in :mod:`mlloss.integrations`: the Lightning side of
crash-safe checkpoints (``lightning_checkpoints.py``), TorchRec's tables (``torchrec.py``) and the
Lightning strategy that shards them (``torchrec_strategy.py``). The losses themselves need nothing
from Lightning: put ``LaALoss()`` (or any other loss) in a ``LightningModule`` and call it in
``training_step``; with ``cross_device=True`` the pairs are taken across the ranks of a DDP job
(``docs/lightning.md``).

:class:`RankingMetrics` collects the validation predictions of every rank, and at the end of each
validation epoch logs, computed once over the whole validation set:

- ``{prefix}auc/<label>``: the AUC of the score against each label (:func:`mlloss.metrics.multilabel_auc`);
- ``{prefix}gauc/<label>``: the group AUC (GAUC, per user) of each label, when groups are given
  (:func:`mlloss.metrics.group_auc`);
- ``{prefix}diff_auc`` and ``{prefix}min_auc``: max - min and min of the per-label AUCs;
- ``{prefix}multipartite_auc``: the multipartite AUC of the aggregated label, the metric LaA targets
  (:func:`mlloss.metrics.multipartite_auc`, linear cost);
- ``{prefix}dictatorship/...``: :meth:`mlloss.DictatorshipReport.as_dict` of the validation labels
  (priors, LoA effective weights and shares per label, ``dominance_ratio``), with the name of the
  dominant label logged as ``dominant_index`` (its position in ``label_names``) and the full report
  printed on rank zero;
- ``{prefix}num_items``: the number of validation items counted over all ranks (the size of the
  validation set when each item is seen once: the items a ``DistributedSampler`` repeats to even out
  the ranks are left out).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Optional, cast

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DistributedSampler

from .._extras import needs_extra
from .._validation import (
    check_bool,
    check_choice,
    check_str,
    check_weights,
    first_entry,
    require_integer_ids,
    require_label_names,
    signed_scores,
)
from ..diagnostics import DictatorshipReport, label_dictatorship
from ..evaluation import ranking_metrics
from ..metrics.classes import _concatenated, _own, _PairMetric
from ..metrics.functional import WEIGHTINGS, Weighting

with needs_extra("lightning", "mlloss.integrations.lightning"):
    import pytorch_lightning as pl
    from pytorch_lightning.utilities import CombinedLoader
    from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

__all__ = ["RankingMetrics"]


class _Predictions(_PairMetric):
    """The (scores, labels, groups) seen by :meth:`update`; :meth:`compute` returns them concatenated
    over every process (``dist_reduce_fx="cat"``), in rank order. The gather is that of the streaming
    metrics (:class:`mlloss.metrics.AUC`'s): every process first agrees on each state's dtype and
    row shape, so that a rank that saw no batch (or no groups) takes part with an empty tensor of the
    right layout (torchmetrics alone gathers an empty float32 vector beside float64 scores, and gloo
    aborts the job), and a layout that differs between ranks raises the same error on every rank."""

    scores: list[Tensor]
    labels: list[Tensor]
    groups: list[Tensor]
    _display_name = "RankingMetrics"  # in the errors: the class users know

    def __init__(self) -> None:
        super().__init__()
        self._add_cat_states("scores", "labels", "groups")

    def update(self, scores: Tensor, labels: Tensor, groups: Optional[Tensor]) -> None:
        self.scores.append(scores)
        self.labels.append(labels)
        if groups is not None:
            self.groups.append(groups)

    def compute(self) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        # torchmetrics' compute wrapper makes an output of one element a 0-dim tensor: the caller
        # reshapes them (RankingMetrics.compute).
        scores, labels = _concatenated(self.scores), _concatenated(self.labels, "labels")
        # Without groups the state is [] in one process, or one empty tensor after a sync.
        groups = _concatenated(self.groups, "groups") if len(self.groups) > 0 else None
        if groups is None or groups.numel() == 0:
            return scores, labels, None
        if groups.numel() != scores.shape[0]:
            raise ValueError("RankingMetrics: either every validation batch, on every rank, has groups or none has")
        return scores, labels, groups.long()


def _padding_sampler(loader: Any) -> Optional[DistributedSampler]:
    """The ``DistributedSampler`` of ``loader`` when it repeats items to even out the ranks (Lightning's
    default for validation and test under DDP), else None. Only a sampler whose items reach the step
    in its own order, in batches of the DataLoader's ``BatchSampler``, counts: there the repeated items
    are known by position. A padding sampler behind another batch sampler gets a warning."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    padding = [candidate for candidate in (sampler, inner) if isinstance(candidate, DistributedSampler)
               and not candidate.drop_last and candidate.total_size > _dataset_length(candidate)]
    if not padding:
        return None
    if padding[0] is sampler and type(batch_sampler) is BatchSampler:
        return sampler
    rank_zero_warn(f"RankingMetrics: a validation/test DataLoader's {type(padding[0]).__name__} repeats "
                   f"{padding[0].total_size - _dataset_length(padding[0])} items to even out the ranks, behind a "
                   f"{type(batch_sampler).__name__} that may reorder them, so the metrics count the repeated "
                   "items; shard the data yourself (Trainer(use_distributed_sampler=False)): docs/lightning.md")
    return None


def _real_items(sampler: DistributedSampler) -> int:
    """How many of this rank's ``sampler.num_samples`` items are not repeats: the rank's j-th item is
    item ``rank + j * num_replicas`` of the padded epoch, a repeat from ``len(dataset)`` on."""
    return max(0, -(-(_dataset_length(sampler) - sampler.rank) // sampler.num_replicas))


def _dataset_length(sampler: DistributedSampler) -> int:
    """The length of a ``DistributedSampler``'s dataset (one it can shard has a length)."""
    return len(cast(Sized, sampler.dataset))


class RankingMetrics(pl.Callback):
    """Log per-label AUC, GAUC, DiffAUC, MinAUC, the multipartite AUC and the label-dictatorship
    report of the validation predictions, once per validation epoch.

    Contract: the LightningModule's ``validation_step`` (and ``test_step``) returns a mapping with

    - ``outputs[score_key]``: scores of shape ``(N,)`` or ``(N, 1)``, one score ranked against every
      label (a ranking head), or ``(N, K)``, column k the score of label k (a multi-task model's
      heads; then no multipartite AUC); logits or probabilities: the metrics only use their order;
    - ``outputs[labels_key]``: 0/1 labels of shape ``(N, K)``, ``K = len(label_names)`` (or ``(N,)``
      when ``K == 1``);
    - ``outputs[groups_key]``, optional: integer group (user) ids of shape ``(N,)``. Give them in
      every batch or in none. Without them, GAUC is not logged.

    N is the number of items of the batch, one row each, in the batch's order.

    Other keys (a validation loss, say) are ignored. The callback keeps the detached predictions of
    the epoch (O(N) numbers per rank) in a ``torchmetrics`` metric that, at the end of the epoch,
    gathers every rank's predictions, so each rank computes the metrics of the whole validation set
    and logs them with ``sync_dist=False`` (they are equal on every rank already; Lightning's
    "sync_dist=True is recommended" warning for these names is silenced). All validation dataloaders
    of an epoch are pooled. Nothing is logged during the sanity check. A metric without a valid pair
    (a label with one class) is NaN, with an ``UndefinedMetricWarning``.

    ``test_step`` outputs are evaluated the same way at the end of ``trainer.test`` and logged
    with ``test_prefix``. The metrics are computed by :func:`mlloss.evaluation.ranking_metrics`
    (the function the recipes use for their baselines).

    Under DDP the items that Lightning's default ``DistributedSampler`` repeats to even out the
    ranks (the last item of some ranks, unless the set's size is a multiple of the number of ranks)
    are left out, so that every item counts once; a padding ``DistributedSampler`` behind a batch
    sampler of another class gets a warning instead. ``{prefix}num_items`` shows what was counted.
    Every rank must run at least one validation batch. See ``docs/lightning.md``.

    Args:
        label_names: one name per label column, used in the logged names.
        label_weights: the LaA label weights ``w_k`` of the multipartite AUC (default all ones).
        loa_weights: the LoA mixing weights ``a_k`` of the dictatorship report (default all ones).
        prefix: prepended to every logged name at validation.
        test_prefix: prepended to every logged name at test.
        score_key, labels_key, groups_key: the keys of the ``validation_step`` outputs.
        group_weighting: GAUC over groups, ``"uniform"`` (default) or ``"size"`` (by items).
        print_report: print the dictatorship report on rank zero after each validation epoch.
        loss_attribute: the LightningModule's attribute holding its training loss. When that loss
            has ``parts["valid_pairs"]`` (every mlloss loss), the callback adds them up over each
            training epoch (on the device: no host synchronisation per step) and logs
            ``train/valid_pairs_per_item`` and ``train/valid_pairs_per_batch`` at the epoch's end,
            warning once when a loss over all valid pairs saw fewer of them than items, which may
            mean that the batches split the users (``mlloss.data.GroupBatchSampler`` keeps them
            together) or only that a label has few positives per batch or per user. A
            max-violation loss (``pairs="hardest"``: PDAOM, ``"bce+pdaom"``) counts one pair per
            group and level pair, fewer than its items however it is batched: it gets no warning.

    Attributes:
        report: the :class:`mlloss.DictatorshipReport` of the last evaluation epoch (or ``None``).
        results: ``{logged name: float}`` of the last evaluation epoch (read once, at its end).
    """

    def __init__(
        self,
        label_names: Sequence[str],
        *,
        label_weights: Optional[Sequence[float]] = None,
        loa_weights: Optional[Sequence[float]] = None,
        prefix: str = "val/",
        test_prefix: str = "test/",
        score_key: str = "scores",
        labels_key: str = "labels",
        groups_key: str = "groups",
        group_weighting: Weighting = "uniform",
        print_report: bool = True,
        loss_attribute: str = "loss",
    ) -> None:
        super().__init__()
        names = require_label_names("label_names", label_names)
        check_choice("group_weighting", group_weighting, WEIGHTINGS)
        for name, value in (("prefix", prefix), ("test_prefix", test_prefix), ("score_key", score_key),
                            ("labels_key", labels_key), ("groups_key", groups_key), ("loss_attribute", loss_attribute)):
            check_str(name, value)
        check_bool("print_report", print_report)
        self.label_names = names
        for name, weights, positive in (("label_weights", label_weights, True), ("loa_weights", loa_weights, False)):
            checked = check_weights(name, weights, strictly_positive=positive)
            if checked is not None and checked.numel() != len(self.label_names):
                raise ValueError(f"{name} must have one entry per label name ({len(self.label_names)}); "
                                 f"got {name}={checked.tolist()}")
        self.label_weights = label_weights
        self.loa_weights = loa_weights
        self.prefix = prefix
        self.test_prefix = test_prefix
        self.results: dict[str, float] = {}
        self.keys = (score_key, labels_key, groups_key)
        self.group_weighting = group_weighting
        self.print_report = print_report
        self.report: Optional[DictatorshipReport] = None
        self._predictions = _Predictions()
        self.loss_attribute = loss_attribute
        self._pairs_seen: Optional[Tensor] = None  # valid pairs of the training epoch, on the device
        self._items_seen: int | Tensor = 0
        self._batches_seen = 0
        self._all_pairs = True  # whether the training loss sums over every valid pair (not the hardest)
        self._warned_starved = False
        self._padding: list[Optional[DistributedSampler]] = []  # per dataloader: its sampler if it repeats items
        self._rows_seen: list[int] = []  # per dataloader: rows of this epoch so far, on this rank

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # The values are global already; Lightning would still recommend sync_dist=True for each.
        for prefix in (self.prefix, self.test_prefix):
            warnings.filterwarnings("ignore", message=rf"It is recommended to use `self.log\('{re.escape(prefix)}")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pairs_seen, self._items_seen, self._batches_seen = None, 0, 0

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = getattr(pl_module, self.loss_attribute, None)
        parts = getattr(loss, "parts", None)
        if not parts or "valid_pairs" not in parts:
            return
        pairs = parts["valid_pairs"].to(torch.float64)
        self._pairs_seen = pairs if self._pairs_seen is None else self._pairs_seen + pairs
        # an int, or with a mask a 0-dim tensor on the device: added as it is, no read per step
        self._items_seen = self._items_seen + getattr(loss, "num_items", 0)
        self._batches_seen += 1
        self._all_pairs = _sums_all_pairs(loss)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pairs_seen is None:
            return
        items = torch.as_tensor(self._items_seen, dtype=torch.float64, device=self._pairs_seen.device)
        per_item = self._pairs_seen / items.clamp(min=1)
        pl_module.log("train/valid_pairs_per_item", per_item, sync_dist=True)
        pl_module.log("train/valid_pairs_per_batch", self._pairs_seen / self._batches_seen, sync_dist=True)
        if self._warned_starved or not self._all_pairs:
            return
        per_item_value, items_value = torch.stack([per_item, items]).tolist()  # one read per epoch
        if items_value and per_item_value < 1.0:
            self._warned_starved = True
            rank_zero_warn(
                f"the training loss saw {per_item_value:.2f} valid pairs per item this epoch: a grouped loss "
                f"has pairs only inside a group, so check that each user's items come in one batch "
                f"(mlloss.data.GroupBatchSampler keeps users together); a label with few positives per "
                f"batch (or per user) also gives few pairs"
            )

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start_epoch(pl_module, trainer.val_dataloaders)

    def _start_epoch(self, pl_module: pl.LightningModule, dataloaders: Any) -> None:
        """Empty the predictions, and find the samplers that repeat items under DDP, per dataloader."""
        self._predictions.reset()
        self._predictions.to(pl_module.device)
        loaders = [] if dataloaders is None else CombinedLoader(dataloaders, "sequential").flattened
        self._padding = [_padding_sampler(loader) for loader in loaders]
        self._rows_seen = [0] * len(loaders)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        scores, labels, groups = self._batch(outputs)
        kept = self._not_repeated(dataloader_idx, scores.shape[0])
        if kept < scores.shape[0]:  # slices: no host synchronisation
            scores, labels = scores[:kept], labels[:kept]
            groups = None if groups is None else groups[:kept]
        self._predictions.update(scores, labels, groups)

    def _not_repeated(self, dataloader_idx: int, rows: int) -> int:
        """How many of the ``rows`` of this batch (the first ones) are not items that the dataloader's
        ``DistributedSampler`` repeated: the repeats are the last items of a rank's epoch."""
        sampler = self._padding[dataloader_idx] if dataloader_idx < len(self._padding) else None
        if sampler is None:
            return rows
        first = self._rows_seen[dataloader_idx]
        self._rows_seen[dataloader_idx] = first + rows
        if first + rows > sampler.num_samples:
            raise ValueError(
                f"RankingMetrics: dataloader {dataloader_idx} gives this rank {sampler.num_samples} items "
                f"(its DistributedSampler repeats some to even out the ranks) but the steps returned "
                f"{first + rows} rows: to drop the repeats, the outputs must hold one row per item of the "
                f"batch, in its order")
        return min(rows, max(0, _real_items(sampler) - first))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log_epoch(pl_module, self.prefix, "validation")
        self._predictions.reset()

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start_epoch(pl_module, trainer.test_dataloaders)

    on_test_batch_end = on_validation_batch_end  # the same contract for test_step outputs

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_epoch(pl_module, self.test_prefix, "test")
        self._predictions.reset()

    def _log_epoch(self, pl_module: pl.LightningModule, prefix: str, stage: str) -> None:
        values = self.compute(prefix)
        for name, value in values.items():
            pl_module.log(name, value, sync_dist=False)
        self.results = {name: float(value) for name, value in values.items()}  # one read per epoch
        if self.print_report and self.report is not None:
            rank_zero_info(f"Label dictatorship on the {stage} labels:\n{self.report}")

    def compute(self, prefix: Optional[str] = None) -> dict[str, Tensor]:
        """The metrics of the predictions collected so far, gathered over every rank (a collective:
        call it on every rank), as float64 scalars named as logged (with ``prefix``, default the
        validation prefix)."""
        scores, labels, groups = self._predictions.compute()
        num_labels = len(self.label_names)
        labels = labels.reshape(-1, num_labels)  # an evaluation of one item comes back 0-dim (torchmetrics)
        scores = scores.reshape(labels.shape[0], -1).squeeze(1) if scores.numel() else scores
        groups = None if groups is None else groups.reshape(-1)
        values: dict[str, Any] = {"num_items": scores.shape[0]}
        values |= ranking_metrics(scores, labels, groups, label_names=self.label_names,
                                  group_weighting=self.group_weighting, label_weights=self.label_weights)
        # No item, no priors: the report is left out (the metrics above are NaN, with their warnings).
        self.report = label_dictatorship(labels, self.loa_weights, label_names=self.label_names) if len(labels) else None
        for key, value in ({} if self.report is None else self.report.as_dict()).items():
            if key == "dominant":
                key, value = "dominant_index", self.label_names.index(str(value))
            values[f"dictatorship/{key}"] = value
        prefix = self.prefix if prefix is None else prefix
        return {
            prefix + key: torch.as_tensor(value, dtype=torch.float64, device=scores.device).reshape(())
            for key, value in values.items()
        }

    def _batch(self, outputs: Any) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """Detached copies (scores (N,) or (N, K) float64 or integer, labels (N, K) uint8, groups (N,) int64 or
        None) of one batch."""
        score_key, labels_key, groups_key = self.keys
        if not isinstance(outputs, Mapping) or score_key not in outputs or labels_key not in outputs:
            raise TypeError(
                f"RankingMetrics needs validation_step to return a mapping with {score_key!r} and "
                f"{labels_key!r} (and optionally {groups_key!r}); got {type(outputs).__name__}"
                + (f" with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else "")
            )
        given_scores = torch.as_tensor(outputs[score_key])
        scores = given_scores.detach()
        num_labels = len(self.label_names)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if not (scores.ndim == 1 or (scores.ndim == 2 and scores.shape[1] == num_labels)):
            raise ValueError(f"outputs[{score_key!r}] must have shape (N,), (N, 1) or (N, K) with K = {num_labels} "
                             f"(one column per label); got {tuple(scores.shape)}")
        if scores.ndim == 2 and num_labels > 1 and self.label_weights is not None:
            raise ValueError(f"label_weights weigh the labels of one ranking score (the multipartite AUC); got "
                             f"outputs[{score_key!r}] of shape {tuple(scores.shape)}, a score per label")
        num_items = scores.shape[0]
        given_labels = torch.as_tensor(outputs[labels_key])
        labels = given_labels.detach()
        if labels.ndim == 1 and num_labels == 1:
            labels = labels[:, None]
        if labels.shape != (num_items, num_labels):
            raise ValueError(
                f"outputs[{labels_key!r}] must have shape (N, K) = ({num_items}, {num_labels}) for "
                f"label_names={self.label_names}; got {tuple(labels.shape)}"
            )
        bad = (labels != 0) & (labels != 1)
        if bool(bad.any()):
            name = f"outputs[{labels_key!r}]"
            raise ValueError(f"{name} must be binary (0 or 1); {first_entry(name, labels, bad)}")
        groups = given_groups = outputs.get(groups_key)
        if groups is not None:
            given_groups = torch.as_tensor(groups)
            groups = given_groups.detach().reshape(-1)
            require_integer_ids(groups, f"outputs[{groups_key!r}]")
            if groups.shape[0] != num_items:
                raise ValueError(f"outputs[{groups_key!r}] must hold one id per item ({num_items}); "
                                 f"got {groups.shape[0]}")
            groups = _own(groups.long(), given_groups)
        # float64 holds bf16/fp16/fp32 scores exactly, so the metrics see the model's own order;
        # integer scores stay integers. Each batch is kept as a tensor of its own (``_own``): a step
        # may return one buffer refilled in place (a CUDA graph's static output).
        if scores.is_floating_point():
            scores = scores.to(torch.float64)
        else:
            scores = signed_scores(scores, f"outputs[{score_key!r}]", same_values=True)
        return _own(scores, given_scores), _own(labels.to(torch.uint8), given_labels), groups


def _sums_all_pairs(loss: Any) -> bool:
    """Whether a training loss averages over every valid pair, so that fewer valid pairs than
    items mean split users; ``bce+<name>`` holds its pairwise term as ``ranking``."""
    return getattr(getattr(loss, "ranking", loss), "pairs", "all") != "hardest"
