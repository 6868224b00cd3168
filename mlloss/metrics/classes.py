r"""The streaming metrics: :class:`torchmetrics.Metric` classes that keep every batch and compute exactly.

Each class concatenates its batches (``dist_reduce_fx="cat"``, so processes synchronise by
construction) and calls its function of ``functional`` at :meth:`compute`; without samples it returns
``NaN`` in its usual output structure with an :class:`UndefinedMetricWarning` (see :mod:`mlloss.metrics`).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from .. import _validation as check
from .counting import UndefinedMetricWarning, Weighting
from .functional import (
    COSTS,
    WEIGHTINGS,
    Cost,
    LabelWeights,
    aggregate_levels,
    binary_auc,
    group_auc,
    multilabel_auc,
    multipartite_auc,
)

__all__ = ["AUC", "GroupAUC", "MultiLabelAUC", "MultipartiteAUC"]


class _PairMetric(Metric):
    """Common base: concatenation states, exact computation at :meth:`compute`, ``NaN`` without samples."""

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    scores: list[Tensor]

    def _add_cat_states(self, *names: str) -> None:
        for name in names:
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self._cat_states = (*getattr(self, "_cat_states", ()), *names)

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Optional[Any] = None) -> None:
        # A process that saw no batch holds empty lists, which torchmetrics gathers as a 1-D float32
        # tensor: beside uint8 labels, int64 groups or (N, K) labels of the other processes the
        # all-gather fails (gloo aborts the job). Such a process takes empty tensors of the dtype
        # and trailing shape the others hold (one gather of those descriptions first).
        group = process_group or self.process_group
        layouts = {name: (str(batches[0].dtype), tuple(batches[0].shape[1:])) if batches else None
                   for name in self._cat_states if isinstance(batches := getattr(self, name), list)}
        gathered: list[Any] = [None] * torch.distributed.get_world_size(group)
        torch.distributed.all_gather_object(gathered, layouts, group=group)
        for name, layout in layouts.items():
            found = next((other[name] for other in gathered if other.get(name) is not None), None)
            if layout is None and found is not None:
                dtype = getattr(torch, found[0].removeprefix("torch."))
                getattr(self, name).append(torch.empty((0, *found[1]), dtype=dtype, device=self.device))
        if dist_sync_fn is None:
            super()._sync_dist(process_group=process_group)
        else:
            super()._sync_dist(dist_sync_fn, process_group)

    def _has_no_samples(self) -> bool:
        """Whether no item has been seen: no update since construction or ``reset()``, or empty batches only.

        ``scores`` is a list of batches, or one tensor once torchmetrics has gathered it across processes.
        """
        if isinstance(self.scores, Tensor):
            return self.scores.numel() == 0
        return all(batch.numel() == 0 for batch in self.scores)

    def _nan(self, *shape: int) -> Tensor:
        return torch.full(shape, float("nan"), dtype=torch.float64, device=self.device)

    def _no_samples_value(self) -> Any:
        """The output of :meth:`compute` without samples: ``NaN`` of the usual structure (a scalar here)."""
        return self._nan()

    def _undefined_without_samples(self) -> Any:
        warnings.warn(
            f"{type(self).__name__} has seen no samples (compute before any update, after reset() or after "
            "empty batches only); returning NaN.",
            UndefinedMetricWarning,
            stacklevel=3,
        )
        return self._no_samples_value()


class AUC(_PairMetric):
    r"""Exact binary AUC (:func:`binary_auc`) over everything seen by :meth:`update`, ties counted one half.

    Scores and labels are kept (``dist_reduce_fx="cat"``) and the AUC is computed exactly at :meth:`compute`,
    after gathering all processes.

    As input to ``forward`` and ``update``: ``scores`` of shape ``(N,)`` or ``(N, 1)`` and 0/1 ``labels`` of
    shape ``(N,)`` or ``(N, 1)``.

    As output of ``forward`` and ``compute``: a ``float64`` scalar tensor, ``NaN`` (with an
    :class:`UndefinedMetricWarning`) unless both classes were seen (so also without samples).

    Example:
        >>> metric = AUC()
        >>> metric.update(torch.tensor([0.9, 0.5]), torch.tensor([1, 1]))
        >>> metric.update(torch.tensor([0.5, 0.1]), torch.tensor([0, 0]))
        >>> metric.compute()
        tensor(0.8750, dtype=torch.float64)
    """

    labels: list[Tensor]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_cat_states("scores", "labels")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        """Validate a batch and keep it."""
        scores = check.metric_scores(scores)
        labels = check.metric_binary(labels, "labels", scores.numel(), matrix=False)
        self.scores.append(scores.detach())
        self.labels.append(labels.to(torch.uint8))

    def compute(self) -> Tensor:
        """Return the AUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        return binary_auc(dim_zero_cat(self.scores), dim_zero_cat(self.labels))


class GroupAUC(_PairMetric):
    r"""Group AUC (GAUC, :func:`group_auc`) over everything seen by :meth:`update`.

    Items of different batches (and processes) with the same group id belong to the same group.

    As input to ``forward`` and ``update``: ``scores``, 0/1 ``labels`` and integer ``groups``, each of shape
    ``(N,)`` or ``(N, 1)``.

    As output of ``forward`` and ``compute``: a ``float64`` scalar tensor, ``NaN`` (with an
    :class:`UndefinedMetricWarning`) if no group has both classes (so also without samples).

    Args:
        weighting: ``"uniform"`` (default, every valid group counts once) or ``"size"`` (groups weighted by
            their number of items).
        kwargs: Additional keyword arguments of :class:`torchmetrics.Metric`.
    """

    labels: list[Tensor]
    groups: list[Tensor]

    def __init__(self, weighting: Weighting = "uniform", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        check.check_choice("weighting", weighting, WEIGHTINGS)
        self.weighting = weighting
        self._add_cat_states("scores", "labels", "groups")

    def update(self, scores: Tensor, labels: Tensor, groups: Tensor) -> None:
        """Validate a batch and keep it."""
        scores = check.metric_scores(scores)
        labels = check.metric_binary(labels, "labels", scores.numel(), matrix=False)
        self.groups.append(check.metric_groups(groups, scores.numel()))
        self.scores.append(scores.detach())
        self.labels.append(labels.to(torch.uint8))

    def compute(self) -> Tensor:
        """Return the GAUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        return group_auc(
            dim_zero_cat(self.scores), dim_zero_cat(self.labels), dim_zero_cat(self.groups), self.weighting
        )


class MultiLabelAUC(_PairMetric):
    r"""Per-label AUC of one score against :math:`K` binary labels, with DiffAUC and MinAUC.

    As input to ``forward`` and ``update``: ``scores`` of shape ``(N,)`` or ``(N, 1)`` and 0/1 ``labels`` of
    shape ``(N, K)`` (or ``(N,)`` when ``num_labels == 1``).

    As output of ``forward`` and ``compute``: a ``dict`` of ``float64`` tensors

    - ``"per_label_auc"``: shape ``(K,)``, :math:`\mathrm{AUC}_k` (:func:`multilabel_auc`); torchmetrics
      squeezes it to a scalar when :math:`K = 1`;
    - ``"diff_auc"``: scalar, :math:`\max_k \mathrm{AUC}_k - \min_k \mathrm{AUC}_k`;
    - ``"min_auc"``: scalar, :math:`\min_k \mathrm{AUC}_k`.

    If some label has only one class its AUC is ``NaN`` (with an :class:`UndefinedMetricWarning`), and so are
    ``diff_auc`` and ``min_auc``: they are not silently computed over a subset of the labels. Without samples
    every entry is ``NaN``, ``per_label_auc`` still of shape ``(K,)``.

    Args:
        num_labels: the number of label columns :math:`K`.
        kwargs: Additional keyword arguments of :class:`torchmetrics.Metric`.
    """

    labels: list[Tensor]

    def __init__(self, num_labels: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(f"num_labels must be a positive integer; got {num_labels!r}")
        self.num_labels = num_labels
        self._add_cat_states("scores", "labels")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        """Validate a batch and keep it."""
        scores = check.metric_scores(scores)
        labels = check.metric_binary(labels, "labels", scores.numel(), matrix=True)
        if labels.shape[1] != self.num_labels:
            raise ValueError(f"labels must have {self.num_labels} columns (num_labels); got {labels.shape[1]}")
        self.scores.append(scores.detach())
        self.labels.append(labels.to(torch.uint8))

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"per_label_auc", "diff_auc", "min_auc"}`` over all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        per_label = multilabel_auc(dim_zero_cat(self.scores), dim_zero_cat(self.labels))
        return {"per_label_auc": per_label, "diff_auc": per_label.max() - per_label.min(), "min_auc": per_label.min()}

    def _no_samples_value(self) -> dict[str, Tensor]:
        return {"per_label_auc": self._nan(self.num_labels), "diff_auc": self._nan(), "min_auc": self._nan()}


class MultipartiteAUC(_PairMetric):
    r"""Cost-weighted multipartite AUC (:func:`multipartite_auc`) over everything seen by :meth:`update`.

    ``(N, K)`` binary label columns are aggregated into levels :math:`\bar y = \sum_k w_k y_k` on ``update``
    (only :math:`\bar y` is kept).

    As input to ``forward`` and ``update``: ``scores`` of shape ``(N,)`` or ``(N, 1)``, ``levels`` of shape
    ``(N,)`` or ``(N, 1)`` (real ordinal levels) or ``(N, K)`` (binary label columns, the same K in every
    batch), and, if ``grouped``, integer ``groups`` of shape ``(N,)`` or ``(N, 1)``.

    As output of ``forward`` and ``compute``: a ``float64`` scalar tensor, ``NaN`` (with an
    :class:`UndefinedMetricWarning`) if no pair of distinct levels (in any group) was seen (so also without
    samples).

    Args:
        cost: ``"linear"`` (default, :math:`c_{ij} = \bar y_i - \bar y_j`) or ``"uniform"`` (:math:`c_{ij} = 1`).
        label_weights: weights :math:`w` of shape ``(K,)`` for ``(N, K)`` levels; all ones when omitted.
        grouped: whether ``update`` takes ``groups``; the value is then the mean over groups.
        weighting: group weighting, ``"uniform"`` (default) or ``"size"``; used when ``grouped``.
        kwargs: Additional keyword arguments of :class:`torchmetrics.Metric`.
    """

    levels: list[Tensor]
    groups: list[Tensor]

    def __init__(
        self,
        cost: Cost = "linear",
        label_weights: Optional[LabelWeights] = None,
        grouped: bool = False,
        weighting: Weighting = "uniform",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check.check_choice("cost", cost, COSTS)
        check.check_choice("weighting", weighting, WEIGHTINGS)
        check.check_weights("label_weights", label_weights, strictly_positive=True)
        self.cost = cost
        self.label_weights = label_weights
        self.grouped = check.check_bool("grouped", grouped)
        self.weighting = weighting
        self._add_cat_states("scores", "levels", "groups")
        self._columns: Optional[int] = None  # label columns of the batches since construction or reset()

    def reset(self) -> None:
        super().reset()
        self._columns = None

    def update(self, scores: Tensor, levels: Tensor, groups: Optional[Tensor] = None) -> None:
        """Validate a batch, aggregate its levels and keep it."""
        if self.grouped != (groups is not None):
            raise ValueError(f"groups must be given if and only if grouped=True; got grouped={self.grouped} and "
                             f"groups={'None' if groups is None else 'a tensor'}")
        scores = check.metric_scores(scores)
        levels = check.require_tensor(levels, "levels")
        columns = levels.shape[1] if levels.ndim == 2 else 1
        if self._columns is not None and columns != self._columns:
            raise ValueError(f"levels must keep their layout across batches: {self._columns} column(s) before, "
                             f"got shape {tuple(levels.shape)}")
        levels = aggregate_levels(levels, self.label_weights)
        check.metric_length(levels, "levels", scores.numel())
        self._columns = columns
        if groups is not None:
            self.groups.append(check.metric_groups(groups, scores.numel()))
        self.scores.append(scores.detach())
        self.levels.append(levels)

    def compute(self) -> Tensor:
        """Return the multipartite AUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        groups = dim_zero_cat(self.groups) if self.grouped else None
        return multipartite_auc(
            dim_zero_cat(self.scores), dim_zero_cat(self.levels), groups, self.cost, weighting=self.weighting
        )
