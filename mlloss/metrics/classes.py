r"""The streaming metrics: :class:`torchmetrics.Metric` classes that keep every batch and compute exactly.

Each class concatenates its batches (``dist_reduce_fx="cat"``, so processes synchronise by
construction) and calls its function of ``functional`` at :meth:`compute`; without samples it returns
``NaN`` in its usual output structure with an :class:`UndefinedMetricWarning` (see :mod:`mlloss.metrics`).

The states hold the validated inputs only (scores, 0/1 labels as ``uint8``, group ids as ``int64``, ordinal
levels as ``float64``); every option (``weighting``, ``cost``, ``label_weights``) is applied at
:meth:`compute`. Two metrics fed the same batches thus hold equal states whatever their options, which is
what ``torchmetrics.MetricCollection``'s compute groups assume when they let such metrics share one state.

Each batch is kept as a tensor of its own: where the validated input would share memory with the caller's
tensor (a float score vector, int64 group ids), it is copied. A caller may therefore refill one buffer in
place between batches (fixed-size batches, a CUDA graph's static output) without changing the items kept.
Likewise ``load_state_dict`` gives each state a list of its own: later batches never reach the state dict
it was loaded from. At :meth:`compute` the batches are concatenated in the dtype the processes gather them
in (float64 where integer scores meet float ones), so that batches of different dtypes keep their values;
int64 scores beyond 2^53 in magnitude beside floating ones, which float64 would round, are refused.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Optional, Union

import torch
from torch import Tensor
from torchmetrics import Metric

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


def _own(kept: Tensor, given: Tensor) -> Tensor:
    """``kept`` (the validated ``given``) detached, and copied if it shares ``given``'s memory."""
    kept = kept.detach()
    return kept.clone() if kept.untyped_storage().data_ptr() == given.untyped_storage().data_ptr() else kept


Layout = tuple[torch.dtype, tuple[int, ...]]  # a state's dtype and the trailing shape of its rows


def _layout(batches: list[Tensor]) -> Optional[Layout]:
    """The layout of a list state's batches (the dtype they concatenate to); ``None`` without batches."""
    if not batches:
        return None
    return _common_dtype([batch.dtype for batch in batches]), tuple(batches[0].shape[1:])


def _common_dtype(dtypes: list[torch.dtype]) -> torch.dtype:
    """The dtype every process casts a state to before the all-gather: torch's promotion (fp16 and fp32
    scores give fp32, which holds both exactly), but float64 where integers meet floats (int64 scores beside
    fp32 ones would promote to fp32 and round the integers above 2^24; float64 holds them up to 2^53:
    :func:`_exactly`), and int32 for int16 (int8 beside uint8 promote to it), which neither gloo nor NCCL
    gathers."""
    common = functools.reduce(torch.promote_types, dtypes)
    if common.is_floating_point and not all(dtype.is_floating_point for dtype in dtypes):
        return torch.promote_types(common, torch.float64)
    return torch.int32 if common == torch.int16 else common


_EXACT_IN_FLOAT64 = 2**53  # every integer of at most this magnitude is a float64


def _fits_float64(batches: list[Tensor]) -> bool:
    """Whether every value of the int64 batches is a float64 (a host read per such batch)."""
    return not any(bool(((batch > _EXACT_IN_FLOAT64) | (batch < -_EXACT_IN_FLOAT64)).any())
                   for batch in batches if batch.dtype == torch.int64)


def _too_wide(name: str) -> ValueError:
    return ValueError(f"int64 {name} beyond 2^53 in magnitude cannot be compared exactly with the floating-point "
                      f"{name} of other batches (float64 would round them into ties); pass every batch in one dtype")


def _exactly(batches: list[Tensor], dtype: torch.dtype, name: str) -> list[Tensor]:
    """``batches`` cast to ``dtype``, refusing int64 values that a floating ``dtype`` would round."""
    if dtype.is_floating_point and not _fits_float64(batches):
        raise _too_wide(name)
    return [batch.to(dtype) for batch in batches]


def _batches(state: Union[list[Tensor], Tensor]) -> list[Tensor]:
    """A list state's batches: the list, or the one tensor torchmetrics gathered it into."""
    return state if isinstance(state, list) else [state]


def _concatenated(state: Union[list[Tensor], Tensor], name: str = "scores") -> Tensor:
    """A list state's batches as one tensor, in the dtype the processes gather them in (:func:`_common_dtype`).

    ``torch.cat`` alone promotes int64 scores beside fp16 ones to fp16 (rounding them above 2048, and
    above 65504 to ``inf``) and beside fp32 ones to fp32 (rounding them above 2^24): ties the items did
    not have.
    """
    batches = _batches(state)
    return torch.cat(_exactly(batches, _common_dtype([batch.dtype for batch in batches]), name))


def _rows(trailing: tuple[int, ...]) -> str:
    """A state's shape as the errors print it: ``(N,)``, ``(N, 3)``."""
    return f"({', '.join(['N', *map(str, trailing)])}{',' if not trailing else ''})"


class _PairMetric(Metric):
    """Common base: concatenation states, exact computation at :meth:`compute`, ``NaN`` without samples."""

    is_differentiable: bool = False
    higher_is_better: bool = True
    full_state_update: bool = False
    plot_lower_bound: float = 0.0
    plot_upper_bound: float = 1.0

    scores: list[Tensor]

    @property
    def _display_name(self) -> str:
        """The name the errors give the metric (a subclass inside another public class names that one)."""
        return type(self).__name__

    def _add_cat_states(self, *names: str) -> None:
        for name in names:
            self.add_state(name, default=[], dist_reduce_fx="cat")
        self._cat_states = (*getattr(self, "_cat_states", ()), *names)

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Optional[Any] = None) -> None:
        # torchmetrics all-gathers each state as one tensor per process, which must agree in dtype and
        # trailing shape: otherwise the gather fails and gloo aborts the job. Two cases give processes
        # different dtypes: a process that saw no batch (its empty lists are gathered as 1-D float32,
        # beside uint8 labels, int64 groups or (N, K) labels) and scores of different dtypes (fp16 on
        # one process, fp32 on another). One gather of every process's (dtype, trailing shape) per
        # state comes first; each process then casts its batches to the common dtype (a copy only
        # where its dtype differs) or, without batches, takes an empty tensor of it. Trailing shapes
        # that differ (2 label columns here, 3 there) are refused on every process alike.
        # int64 batches that meet floating ones are checked as at compute (_exactly), on every process
        # alike: each says whether it holds int64 batches, and only then are their values read.
        group = process_group or self.process_group
        world = torch.distributed.get_world_size(group)
        layouts = {name: (_layout(batches), any(batch.dtype == torch.int64 for batch in batches))
                   for name in self._cat_states if isinstance(batches := getattr(self, name), list)}
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, layouts, group=group)
        for name, (layout, _) in layouts.items():
            common = self._common_layout(name, [other[name][0] for other in gathered])
            if common is None:  # no process saw a batch
                continue
            dtype, trailing = common
            batches = getattr(self, name)
            if dtype.is_floating_point and any(other[name][1] for other in gathered):
                fits: list[Any] = [None] * world
                torch.distributed.all_gather_object(fits, _fits_float64(batches), group=group)
                if not all(fits):
                    raise _too_wide(name)
            if layout is None:
                setattr(self, name, [torch.empty((0, *trailing), dtype=dtype, device=self.device)])
            elif any(batch.dtype != dtype for batch in batches):
                setattr(self, name, [batch.to(dtype) for batch in batches])
        if dist_sync_fn is None:
            super()._sync_dist(process_group=process_group)
        else:
            super()._sync_dist(dist_sync_fn, process_group)

    def _common_layout(self, name: str, layouts: list[Optional[Layout]]) -> Optional[Layout]:
        """The layout state ``name`` takes on every process, from each process's own (``layouts[rank]``)."""
        found = [(rank, layout) for rank, layout in enumerate(layouts) if layout is not None]
        if not found:
            return None
        first, (_, trailing) = found[0]
        for rank, (_, other) in found:
            if other != trailing:
                raise ValueError(f"{self._display_name} needs {name} of one layout on every process; got shape "
                                 f"{_rows(trailing)} on rank {first} and {_rows(other)} on rank {rank}")
        return _common_dtype([dtype for _, (dtype, _) in found]), trailing

    def merge_state(self, incoming_state: Union[dict[str, Any], Metric]) -> None:
        """Add another metric's batches (an instance of this class, or its ``metric_state``, gathered across
        processes or not) to this one's, as :meth:`torchmetrics.Metric.merge_state` does, after checking that
        they can join: the same layout per state (label columns) and a row of each state this metric keeps
        per score."""
        if isinstance(incoming_state, type(self)):
            incoming_state = incoming_state.metric_state
        if isinstance(incoming_state, dict):
            self._check_mergeable(incoming_state)
            # A state gathered across processes is one tensor, which torchmetrics' merge cannot join to a
            # list of batches (nor a list to it): both sides are taken as lists of batches.
            incoming_state = {name: list(_batches(state)) if name in self._cat_states else state
                              for name, state in incoming_state.items()}
            self._as_lists_of_batches()
        super().merge_state(incoming_state)  # refuses other types and other classes

    def _as_lists_of_batches(self) -> None:
        """Make every state a list of batches of its own (a gathered state is one tensor)."""
        for name in self._cat_states:
            if isinstance(state := getattr(self, name), Tensor):
                setattr(self, name, [state])

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # torchmetrics sets each state to the very list the state dict holds: the updates that follow
        # would append to the caller's checkpoint, and so to every metric loaded from it later. Each
        # state gets a list of its own; a state saved gathered (one tensor) becomes a list of one batch,
        # which update can append to. ``state_dict`` is load_state_dict's own copy of the caller's.
        for name in self._cat_states:
            if prefix + name in state_dict:
                state_dict[prefix + name] = list(_batches(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_mergeable(self, states: dict[str, Any]) -> None:
        metric = self._display_name
        incoming = {name: _batches(states[name]) for name in self._cat_states if name in states}
        if "scores" not in incoming:
            return
        num_scores = sum(batch.shape[0] for batch in incoming["scores"])
        for name, batches in incoming.items():
            rows = sum(batch.shape[0] for batch in batches)
            expected = num_scores if name in self._kept_per_score() else 0
            if rows != expected:
                raise ValueError(f"{metric}.merge_state: the incoming state holds {rows} rows of {name} for "
                                 f"{num_scores} scores; this metric keeps {'one per score' if expected else 'none'}")
            mine, theirs = _layout(_batches(getattr(self, name))), _layout(batches)
            if mine is not None and theirs is not None and mine[1] != theirs[1]:
                raise ValueError(f"{metric}.merge_state: {name} of shape {_rows(theirs[1])} cannot join the kept "
                                 f"{name} of shape {_rows(mine[1])}")

    def _kept_per_score(self) -> tuple[str, ...]:
        """The states that hold a row per score (the others stay empty)."""
        return self._cat_states

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
            f"{self._display_name} has seen no samples (compute before any update, after reset() or after "
            "empty batches only); returning NaN.",
            UndefinedMetricWarning,
            stacklevel=check.callers_level(),
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
        valid_scores = check.metric_scores(scores, same_values=True)
        check.require_scores_device(valid_scores, labels=labels)
        valid_labels = check.metric_binary(labels, "labels", valid_scores.numel(), matrix=False)
        self.scores.append(_own(valid_scores, scores))
        self.labels.append(_own(valid_labels.to(torch.uint8), labels))

    def compute(self) -> Tensor:
        """Return the AUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        return binary_auc(_concatenated(self.scores), _concatenated(self.labels))


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
        valid_scores = check.metric_scores(scores, same_values=True)
        check.require_scores_device(valid_scores, labels=labels, groups=groups)
        valid_labels = check.metric_binary(labels, "labels", valid_scores.numel(), matrix=False)
        valid_groups = check.metric_groups(groups, valid_scores.numel())
        self.scores.append(_own(valid_scores, scores))
        self.labels.append(_own(valid_labels.to(torch.uint8), labels))
        self.groups.append(_own(valid_groups, groups))

    def compute(self) -> Tensor:
        """Return the GAUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        return group_auc(
            _concatenated(self.scores), _concatenated(self.labels), _concatenated(self.groups), self.weighting
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
        self.num_labels = check.check_int("num_labels", num_labels, minimum=1, requirement="a positive integer")
        self._add_cat_states("scores", "labels")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        """Validate a batch and keep it."""
        valid_scores = check.metric_scores(scores, same_values=True)
        check.require_scores_device(valid_scores, labels=labels)
        valid_labels = check.metric_binary(labels, "labels", valid_scores.numel(), matrix=True)
        if valid_labels.shape[1] != self.num_labels:
            raise ValueError(f"labels must have {self.num_labels} columns (num_labels); got {valid_labels.shape[1]}")
        self.scores.append(_own(valid_scores, scores))
        self.labels.append(_own(valid_labels.to(torch.uint8), labels))

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"per_label_auc", "diff_auc", "min_auc"}`` over all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        per_label = multilabel_auc(_concatenated(self.scores), _concatenated(self.labels))
        return {"per_label_auc": per_label, "diff_auc": per_label.max() - per_label.min(), "min_auc": per_label.min()}

    def _check_mergeable(self, states: dict[str, Any]) -> None:
        super()._check_mergeable(states)
        for batch in _batches(states.get("labels", [])):
            if batch.ndim != 2 or batch.shape[1] != self.num_labels:
                raise ValueError(f"MultiLabelAUC.merge_state: labels of shape {tuple(batch.shape)} in the incoming "
                                 f"state; this metric has num_labels={self.num_labels}")

    def _no_samples_value(self) -> dict[str, Tensor]:
        return {"per_label_auc": self._nan(self.num_labels), "diff_auc": self._nan(), "min_auc": self._nan()}


class MultipartiteAUC(_PairMetric):
    r"""Cost-weighted multipartite AUC (:func:`multipartite_auc`) over everything seen by :meth:`update`.

    ``(N, K)`` binary label columns are kept as they are (``uint8``) and aggregated into levels
    :math:`\bar y = \sum_k w_k y_k` at :meth:`compute`, so that the state does not depend on the weights
    (see the module docstring); ordinal levels are kept as ``float64``.

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

    def _check_layout(self, levels: Tensor) -> None:
        """Refuse ``levels`` whose number of label columns differs from the levels kept so far.

        The layout is read off the state itself (``(N,)`` ordinal levels or ``(N, K)`` label columns), so it
        holds after ``load_state_dict`` and ``merge_state`` as after ``update``.
        """
        check.require_tensor(levels, "levels")
        batches = self.levels  # a list of batches, or one tensor once gathered across processes
        if isinstance(batches, list):
            if not batches:
                return
            kept = batches[0]
        else:
            kept = batches
        if levels.ndim not in (1, 2):  # refused by the validation of update
            return
        columns = levels.shape[1] if levels.ndim == 2 else 1
        kept_columns = kept.shape[1] if kept.ndim == 2 else 1
        if columns != kept_columns:
            raise ValueError(f"levels must keep their layout across batches: {kept_columns} column(s) before, "
                             f"got shape {tuple(levels.shape)}")

    def _kept_per_score(self) -> tuple[str, ...]:
        return ("scores", "levels", "groups") if self.grouped else ("scores", "levels")

    def forward(self, scores: Tensor, levels: Tensor, groups: Optional[Tensor] = None) -> Tensor:
        """Keep the batch and return its multipartite AUC (see :meth:`torchmetrics.Metric.forward`).

        torchmetrics' ``forward`` sets the state aside and updates an empty one with the batch, where
        :meth:`update` would find no earlier batch to check the label layout against: the check runs here.
        """
        self._check_layout(levels)
        return super().forward(scores, levels, groups)

    def update(self, scores: Tensor, levels: Tensor, groups: Optional[Tensor] = None) -> None:
        """Validate a batch and keep it (label columns as ``uint8``, weighted at :meth:`compute`)."""
        if self.grouped != (groups is not None):
            raise ValueError(f"groups must be given if and only if grouped=True; got grouped={self.grouped} and "
                             f"groups={'None' if groups is None else 'a tensor'}")
        valid_scores = check.metric_scores(scores, same_values=True)
        check.require_scores_device(valid_scores, levels=levels, groups=groups)
        aggregated = aggregate_levels(levels, self.label_weights)  # validates the levels and the weights
        check.metric_length(aggregated, "levels", valid_scores.numel())
        self._check_layout(levels)
        if levels.ndim == 2 and levels.shape[1] > 1:
            kept_levels = levels.to(torch.uint8)  # binary, as aggregate_levels checked
        else:
            kept_levels = levels.reshape(-1).to(torch.float64)  # one ordinal column; its weight, if any, at compute
        if groups is not None:
            self.groups.append(_own(check.metric_groups(groups, valid_scores.numel()), groups))
        self.scores.append(_own(valid_scores, scores))
        self.levels.append(_own(kept_levels, levels))

    def compute(self) -> Tensor:
        """Return the multipartite AUC of all items seen."""
        if self._has_no_samples():
            return self._undefined_without_samples()
        groups = _concatenated(self.groups) if self.grouped else None
        levels = _concatenated(self.levels)
        if levels.ndim == 1 and self.label_weights is not None:  # (N, 1) levels given with their one weight
            levels = levels[:, None]
        return multipartite_auc(
            _concatenated(self.scores), levels, groups, self.cost, self.label_weights, self.weighting
        )
