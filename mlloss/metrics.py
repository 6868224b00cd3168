r"""Exact evaluation metrics for pairwise ranking: AUC, GAUC, per-label AUC and multipartite AUC.

The losses in :mod:`mlloss` are surrogates of pair-counting metrics. This module computes those metrics
exactly, as functions of a whole evaluation set and as :class:`torchmetrics.Metric` classes that stream
over batches and synchronise across processes.

Every metric counts ordered pairs :math:`(i, j)` with scores :math:`s_i, s_j` and credits a pair with

.. math::
    h(s_i, s_j) = \mathbb{1}[s_i > s_j] + \tfrac{1}{2}\,\mathbb{1}[s_i = s_j],

so that ties count one half. Counting is done by sorting, never by enumerating pairs: the items are sorted
once by ``(group, score)`` and, for each item, the number of items of a given kind ranked strictly below it
and tied with it in its group is read off a prefix sum. Every function is :math:`O(N \log N)` (the uniform
multipartite cost adds :math:`O(N L)` for :math:`L` distinct levels), exact (pair counts are ``int64``,
real-valued levels are summed in ``float64``) and deterministic on CPU and CUDA: the only reductions are
sorts, integer prefix sums and segmented sums over sorted data (no floating-point atomics).

A metric without a single valid pair is undefined: the functions return ``NaN`` and emit an
:class:`UndefinedMetricWarning` instead of raising. Results are ``float64`` tensors on the input's device.
The streaming metrics do the same when they have seen no samples (``compute`` before any ``update``, after
``reset()``, or after empty batches only): ``NaN`` in their usual output structure, with a warning that says
so. ``forward`` on an empty batch therefore returns that ``NaN`` as the batch value and leaves the items seen
so far as they were.

References:
    Definition 2.1 of the project's loss specification (AUC with ties counted one half), and
    M. Lukasik et al., "Bipartite ranking from multiple labels: on loss versus label aggregation", 2025
    (per-label AUC, DiffAUC, MinAUC, and the multipartite AUC of label aggregation).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

__all__ = [
    "AUC",
    "GroupAUC",
    "MultiLabelAUC",
    "MultipartiteAUC",
    "UndefinedMetricWarning",
    "aggregate_levels",
    "binary_auc",
    "group_auc",
    "multilabel_auc",
    "multipartite_auc",
]

Weighting = Literal["uniform", "size"]
Cost = Literal["linear", "uniform"]
LabelWeights = Union[Tensor, Sequence[float]]

_WEIGHTINGS = ("uniform", "size")
_COSTS = ("linear", "uniform")


class UndefinedMetricWarning(UserWarning):
    """Emitted when a metric has no valid pair (for example only one class) and ``NaN`` is returned."""


# --------------------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------------------


def _require_tensor(x: Any, name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}")


def _require_option(value: str, name: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"`{name}` must be one of {options}, got {value!r}")


def _as_vector(x: Tensor, name: str) -> Tensor:
    """Return ``x`` of shape ``(N,)`` or ``(N, 1)`` as shape ``(N,)``."""
    if x.ndim == 2 and x.shape[1] == 1:
        return x[:, 0]
    if x.ndim != 1:
        raise ValueError(f"`{name}` must have shape (N,) or (N, 1), got {tuple(x.shape)}")
    return x


def _require_length(x: Tensor, name: str, n: int) -> None:
    if x.shape[0] != n:
        raise ValueError(f"`{name}` must have one row per score ({n}), got shape {tuple(x.shape)}")


def _check_scores(scores: Tensor) -> Tensor:
    """Validate scores of shape ``(N,)`` or ``(N, 1)``, real and free of NaN; return them as ``(N,)``."""
    _require_tensor(scores, "scores")
    if scores.dtype.is_complex:
        raise TypeError(f"`scores` must be real, got dtype {scores.dtype}")
    scores = _as_vector(scores, "scores")
    nan = torch.isnan(scores)
    if nan.any():
        raise ValueError(f"`scores` must not contain NaN, found NaN at index {int(nan.nonzero()[0, 0])}")
    return scores


def _check_binary(labels: Tensor, name: str, n: int, *, matrix: bool) -> Tensor:
    """Validate 0/1 labels of length ``n``; return shape ``(N, K)`` if ``matrix`` else ``(N,)``, dtype int64."""
    _require_tensor(labels, name)
    if matrix:
        if labels.ndim == 1:
            labels = labels[:, None]
        elif labels.ndim != 2:
            raise ValueError(f"`{name}` must have shape (N,) or (N, K), got {tuple(labels.shape)}")
    else:
        labels = _as_vector(labels, name)
    _require_length(labels, name, n)
    bad = (labels != 0) & (labels != 1)
    if bad.any():
        raise ValueError(f"`{name}` must be binary (0 or 1), found {labels[bad][0].item()!r}")
    return labels.long()


def _check_groups(groups: Tensor, n: int) -> Tensor:
    """Validate integer group ids of shape ``(N,)`` or ``(N, 1)``; return them as ``(N,)``."""
    _require_tensor(groups, "groups")
    dtype = groups.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise TypeError(f"`groups` must hold integer ids, got dtype {dtype}")
    groups = _as_vector(groups, "groups")
    _require_length(groups, "groups", n)
    return groups


def _require_finite(x: Tensor, name: str) -> None:
    finite = torch.isfinite(x)
    if not finite.all():
        raise ValueError(f"`{name}` must be finite, found {x[~finite][0].item()!r}")


def aggregate_levels(levels: Tensor, label_weights: Optional[LabelWeights] = None) -> Tensor:
    r"""Return the aggregated relevance level :math:`\bar y` of every item, as ``float64`` of shape ``(N,)``.

    Args:
        levels: either ``(N,)`` real-valued ordinal levels, returned as they are, or ``(N, K)`` binary label
            columns, aggregated as :math:`\bar y_i = \sum_k w_k\, y_{ik}` (label aggregation, LaA).
        label_weights: the weights :math:`w` of shape ``(K,)``; all ones when omitted. Only for ``(N, K)`` levels.

    Raises:
        TypeError: if ``levels`` is not a real tensor.
        ValueError: if ``levels`` is not finite, ``(N, K)`` levels are not binary, or ``label_weights`` is given
            for ``(N,)`` levels, has the wrong shape or is not finite.
    """
    _require_tensor(levels, "levels")
    if levels.dtype.is_complex:
        raise TypeError(f"`levels` must be real, got dtype {levels.dtype}")
    if levels.ndim == 1:
        if label_weights is not None:
            raise ValueError("`label_weights` needs `levels` of shape (N, K) (binary label columns), got shape (N,)")
        levels = levels.double()
        _require_finite(levels, "levels")
        return levels
    if levels.ndim != 2:
        raise ValueError(f"`levels` must have shape (N,) or (N, K), got {tuple(levels.shape)}")
    columns = _check_binary(levels, "levels", levels.shape[0], matrix=True).double()
    if label_weights is None:
        return columns.sum(dim=1)
    weights = torch.as_tensor(label_weights, dtype=torch.float64, device=levels.device)
    if weights.shape != (levels.shape[1],):
        raise ValueError(f"`label_weights` must have shape ({levels.shape[1]},), got {tuple(weights.shape)}")
    _require_finite(weights, "label_weights")
    return (columns * weights).sum(dim=1)


# --------------------------------------------------------------------------------------------------------------
# Sorting and segmented counting
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TieBlocks:
    """Items sorted by ``(group, key)``, with their tie blocks and group segments.

    A tie block is a maximal run of sorted items with the same group and the same key. All per-item tensors
    are indexed by sorted position; groups occupy contiguous segments of the sorted order.
    """

    order: Tensor  # (N,) permutation that sorts the items by (group, key)
    block_start: Tensor  # (N,) sorted position of the first item of the item's tie block
    block_stop: Tensor  # (N,) sorted position one past the last item of the item's tie block
    group_start: Tensor  # (N,) sorted position of the first item of the item's group
    group_size: Tensor  # (N,) number of items in the item's group
    counts: Tensor  # (G,) number of items per group, in segment order


def _group_index(groups: Optional[Tensor], n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Map arbitrary integer ids to ``0..G-1``; return ``(ids (N,), counts (G,))``. ``None`` is one group."""
    if groups is None:
        return torch.zeros(n, dtype=torch.long, device=device), torch.tensor([n], device=device)
    _, ids, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    return ids, counts


def _tie_blocks(keys: Tensor, ids: Tensor, counts: Tensor) -> _TieBlocks:
    """Sort by ``(ids, keys)`` with two stable sorts (a deterministic permutation) and delimit the tie blocks."""
    order = torch.sort(keys, stable=True).indices
    if counts.numel() > 1:
        order = order[torch.sort(ids[order], stable=True).indices]
    sorted_keys, sorted_ids = keys[order], ids[order]
    n = keys.numel()
    new_block = torch.ones(n, dtype=torch.bool, device=keys.device)
    new_block[1:] = (sorted_keys[1:] != sorted_keys[:-1]) | (sorted_ids[1:] != sorted_ids[:-1])
    starts = new_block.nonzero().squeeze(1)
    stops = torch.cat([starts[1:], starts.new_tensor([n])])
    block = torch.cumsum(new_block, dim=0) - 1
    offsets = torch.cumsum(counts, dim=0) - counts
    return _TieBlocks(order, starts[block], stops[block], offsets[sorted_ids], counts[sorted_ids], counts)


def _segment_sum(values: Tensor, counts: Tensor) -> Tensor:
    """Sum ``values`` (sorted by group, shape ``(N, ...)``) over the group segments of lengths ``counts``.

    Integers are summed exactly through an ``int64`` prefix sum; floats through :func:`torch.segment_reduce`,
    which reduces each segment in a fixed order on CPU and CUDA (no atomics, unlike ``index_add_``).
    """
    if counts.numel() == 0:
        return values.new_zeros((0, *values.shape[1:]))
    if values.is_floating_point():
        return torch.segment_reduce(values, "sum", lengths=counts, axis=0)
    prefix = torch.cat([values.new_zeros((1, *values.shape[1:])), torch.cumsum(values, dim=0)])
    stops = torch.cumsum(counts, dim=0)
    return prefix[stops] - prefix[stops - counts]


def _twice_wins(blocks: _TieBlocks, positive: Tensor, negative: Tensor) -> Tensor:
    r"""Per group and column, :math:`2 \sum_{i \in \text{pos}, j \in \text{neg}} h(s_i, s_j)` as ``int64 (G, K)``.

    With :math:`C` the prefix count of negatives in sorted order, an item at sorted position :math:`p` has
    :math:`C[\text{start}] - C[\text{group start}]` negatives strictly below it and
    :math:`C[\text{stop}] - C[\text{start}]` tied with it, so twice its credit is
    :math:`C[\text{start}] + C[\text{stop}] - 2\,C[\text{group start}]`.

    Args:
        blocks: the items sorted by ``(group, score)``.
        positive: ``(N, K)`` int64 0/1 indicators of the left member of a pair, in item order.
        negative: ``(N, K)`` int64 0/1 indicators of the right member of a pair, in item order.
    """
    positive, negative = positive[blocks.order], negative[blocks.order]
    prefix = torch.cat([negative.new_zeros((1, negative.shape[1])), torch.cumsum(negative, dim=0)])
    twice_below = prefix[blocks.block_start] + prefix[blocks.block_stop] - 2 * prefix[blocks.group_start]
    return _segment_sum(positive * twice_below, blocks.counts)


def _pair_count(blocks: _TieBlocks, positive: Tensor, negative: Tensor) -> Tensor:
    """Per group and column, the number of (positive, negative) pairs, as ``int64 (G, K)``."""
    return _segment_sum(positive[blocks.order], blocks.counts) * _segment_sum(negative[blocks.order], blocks.counts)


def _centered_rank_sum(blocks: _TieBlocks, values: Tensor) -> Tensor:
    r"""Per group, :math:`\sum_i v_i\,(2 r_i - n_g - 1)` with :math:`r_i` the 1-based mid-rank of the key.

    This equals :math:`\sum_{i, j:\, key_i > key_j} (v_i - v_j)` over the pairs of the group, because the
    item at mid-rank :math:`r_i` has :math:`r_i - (t_i + 1)/2` items strictly below it and
    :math:`n_g - r_i - (t_i - 1)/2` strictly above it (:math:`t_i` its tie block size).
    """
    twice_rank_centered = blocks.block_start + blocks.block_stop - 2 * blocks.group_start - blocks.group_size
    return _segment_sum(values[blocks.order] * twice_rank_centered, blocks.counts)


def _ratio(numerator: Tensor, denominator: Tensor) -> Tensor:
    """``numerator / denominator`` in float64, ``NaN`` where the denominator (a pair count or cost) is zero."""
    nan = torch.full_like(numerator, float("nan"), dtype=torch.float64)
    return torch.where(denominator > 0, numerator.double() / denominator.double(), nan)


def _group_mean(values: Tensor, counts: Tensor, weighting: Weighting) -> Tensor:
    """Mean of the per-group ``values`` over groups where they are defined, uniform or weighted by size."""
    defined = ~torch.isnan(values)
    weights = (torch.ones_like(values) if weighting == "uniform" else counts.double()) * defined
    total = weights.sum()
    return torch.where(total > 0, (weights * values.nan_to_num()).sum() / total, torch.nan)


def _warn_if_undefined(value: Tensor, message: str) -> Tensor:
    if torch.isnan(value).any():
        warnings.warn(f"{message}; returning NaN.", UndefinedMetricWarning, stacklevel=3)
    return value


# --------------------------------------------------------------------------------------------------------------
# Functional metrics
# --------------------------------------------------------------------------------------------------------------


def _auc_per_group(scores: Tensor, labels: Tensor, ids: Tensor, counts: Tensor) -> Tensor:
    r"""AUC of every group (rows) and label column (columns), ``float64 (G, K)``, ``NaN`` without both classes.

    :math:`\mathrm{AUC} = \frac{1}{P\,Q} \sum_{i: y_i = 1} \sum_{j: y_j = 0} h(s_i, s_j)`, the Mann-Whitney
    statistic, with :math:`P` positives and :math:`Q` negatives.
    """
    blocks = _tie_blocks(scores, ids, counts)
    negatives = 1 - labels
    return _ratio(_twice_wins(blocks, labels, negatives), 2 * _pair_count(blocks, labels, negatives))


def binary_auc(scores: Tensor, labels: Tensor) -> Tensor:
    r"""Exact area under the ROC curve, ties counted one half (Definition 2.1).

    .. math::
        \mathrm{AUC} = \frac{1}{|\mathcal P|} \sum_{(i, j) \in \mathcal P}
            \mathbb{1}[s_i > s_j] + \tfrac{1}{2}\,\mathbb{1}[s_i = s_j],
        \qquad \mathcal P = \{(i, j) : y_i = 1,\ y_j = 0\}.

    Args:
        scores: real scores of shape ``(N,)`` or ``(N, 1)``, without NaN (infinities are allowed).
        labels: 0/1 labels (bool, integer or float) of shape ``(N,)`` or ``(N, 1)``.

    Returns:
        A ``float64`` scalar tensor; ``NaN``, with an :class:`UndefinedMetricWarning`, unless ``labels``
        contain both classes.

    Raises:
        TypeError: if an input is not a tensor or ``scores`` are complex.
        ValueError: on a shape or length mismatch, NaN ``scores`` or labels outside ``{0, 1}``.

    Example:
        >>> binary_auc(torch.tensor([0.9, 0.5, 0.5, 0.1]), torch.tensor([1, 1, 0, 0]))
        tensor(0.8750, dtype=torch.float64)
    """
    scores = _check_scores(scores)
    labels = _check_binary(labels, "labels", scores.numel(), matrix=False)
    ids, counts = _group_index(None, scores.numel(), scores.device)
    auc = _auc_per_group(scores, labels[:, None], ids, counts)[0, 0]
    return _warn_if_undefined(auc, "AUC is undefined unless `labels` contain both 0 and 1")


def group_auc(scores: Tensor, labels: Tensor, groups: Tensor, weighting: Weighting = "uniform") -> Tensor:
    r"""Group AUC (GAUC): the mean of the per-group AUC over the groups that contain both classes.

    .. math::
        \mathrm{GAUC} = \frac{\sum_{g \in \mathcal G} w_g\, \mathrm{AUC}_g}{\sum_{g \in \mathcal G} w_g},
        \qquad \mathcal G = \{g : P_g > 0,\ Q_g > 0\},

    with :math:`\mathrm{AUC}_g` the :func:`binary_auc` of the items of group :math:`g` and :math:`w_g = 1`
    (``weighting="uniform"``) or :math:`w_g = n_g`, the number of items of the group (``weighting="size"``).

    Args:
        scores: real scores of shape ``(N,)`` or ``(N, 1)``, without NaN.
        labels: 0/1 labels of shape ``(N,)`` or ``(N, 1)``.
        groups: integer group ids (for example user ids) of shape ``(N,)`` or ``(N, 1)``; any values, in any order.
        weighting: ``"uniform"`` (default) or ``"size"``.

    Returns:
        A ``float64`` scalar tensor; ``NaN``, with an :class:`UndefinedMetricWarning`, if no group has both classes.

    Raises:
        TypeError: if an input is not a tensor, ``scores`` are complex or ``groups`` are not integers.
        ValueError: on a shape or length mismatch, NaN ``scores``, labels outside ``{0, 1}`` or an unknown
            ``weighting``.
    """
    _require_option(weighting, "weighting", _WEIGHTINGS)
    scores = _check_scores(scores)
    labels = _check_binary(labels, "labels", scores.numel(), matrix=False)
    ids, counts = _group_index(_check_groups(groups, scores.numel()), scores.numel(), scores.device)
    per_group = _auc_per_group(scores, labels[:, None], ids, counts)[:, 0]
    return _warn_if_undefined(_group_mean(per_group, counts, weighting), "GAUC is undefined: no group has both classes")


def multilabel_auc(scores: Tensor, labels: Tensor) -> Tensor:
    r"""Per-label AUC of one score against each of :math:`K` binary label columns.

    :math:`\mathrm{AUC}_k` is the :func:`binary_auc` of ``scores`` against ``labels[:, k]``. Summaries used by
    Lukasik et al. (2025) are :math:`\mathrm{DiffAUC} = \max_k \mathrm{AUC}_k - \min_k \mathrm{AUC}_k` and
    :math:`\mathrm{MinAUC} = \min_k \mathrm{AUC}_k` (see :class:`MultiLabelAUC`).

    Args:
        scores: real scores of shape ``(N,)`` or ``(N, 1)``, without NaN.
        labels: 0/1 labels of shape ``(N, K)``, or ``(N,)`` for :math:`K = 1`.

    Returns:
        A ``float64`` tensor of shape ``(K,)``; entry ``k`` is ``NaN``, with an :class:`UndefinedMetricWarning`,
        unless column ``k`` contains both classes.

    Raises:
        TypeError: if an input is not a tensor or ``scores`` are complex.
        ValueError: on a shape or length mismatch, NaN ``scores`` or labels outside ``{0, 1}``.
    """
    scores = _check_scores(scores)
    labels = _check_binary(labels, "labels", scores.numel(), matrix=True)
    ids, counts = _group_index(None, scores.numel(), scores.device)
    auc = _auc_per_group(scores, labels, ids, counts)[0]
    return _warn_if_undefined(auc, "AUC of a label is undefined unless its column contains both 0 and 1")


def _linear_multipartite(scores: Tensor, levels: Tensor, ids: Tensor, counts: Tensor) -> Tensor:
    r"""Per-group multipartite AUC with cost :math:`c_{ij} = \bar y_i - \bar y_j`, in closed form.

    Split the pairs by score: a pair with :math:`s_i > s_j` earns :math:`(\bar y_i - \bar y_j)^+
    = \frac{1}{2}[(\bar y_i - \bar y_j) + |\bar y_i - \bar y_j|]`, a tied pair earns
    :math:`\frac{1}{2}|\bar y_i - \bar y_j|`. Hence the credit is :math:`\frac{1}{2}(S + D)` and the value
    :math:`\frac{S + D}{2D}`, with :math:`S = \sum_{s_i > s_j} (\bar y_i - \bar y_j)` and
    :math:`D = \sum_{\bar y_i > \bar y_j} (\bar y_i - \bar y_j)` the total cost; both are centred rank sums.
    """
    concordance = _centered_rank_sum(_tie_blocks(scores, ids, counts), levels)
    total_cost = _centered_rank_sum(_tie_blocks(levels, ids, counts), levels)
    return _ratio(concordance + total_cost, 2 * total_cost)


def _uniform_multipartite(scores: Tensor, levels: Tensor, ids: Tensor, counts: Tensor) -> Tensor:
    """Per-group multipartite AUC with unit cost: each level against all lower levels, one level at a time."""
    blocks = _tie_blocks(scores, ids, counts)
    twice_wins = torch.zeros(counts.numel(), 1, dtype=torch.long, device=scores.device)
    pairs = torch.zeros_like(twice_wins)
    for level in torch.unique(levels)[1:]:
        upper, lower = (levels == level).long()[:, None], (levels < level).long()[:, None]
        twice_wins += _twice_wins(blocks, upper, lower)
        pairs += _pair_count(blocks, upper, lower)
    return _ratio(twice_wins, 2 * pairs)[:, 0]


def multipartite_auc(
    scores: Tensor,
    levels: Tensor,
    groups: Optional[Tensor] = None,
    cost: Cost = "linear",
    label_weights: Optional[LabelWeights] = None,
    weighting: Weighting = "uniform",
) -> Tensor:
    r"""Cost-weighted multipartite AUC over graded relevance levels (the metric of label aggregation, LaA).

    .. math::
        \mathrm{AUC}_c = \frac{\sum_{(i, j) \in \mathcal P} c_{ij}\,
            \left(\mathbb{1}[s_i > s_j] + \tfrac{1}{2}\,\mathbb{1}[s_i = s_j]\right)}
            {\sum_{(i, j) \in \mathcal P} c_{ij}},
        \qquad \mathcal P = \{(i, j) : \bar y_i > \bar y_j\},

    with :math:`c_{ij} = \bar y_i - \bar y_j` (``cost="linear"``) or :math:`c_{ij} = 1` (``cost="uniform"``).
    With 0/1 levels both costs give :func:`binary_auc`. With ``groups`` the value is the mean of the per-group
    values over groups with at least one pair, weighted as in :func:`group_auc`.

    Cost: :math:`O(N \log N)` for the linear cost; the uniform cost adds :math:`O(N L)` for :math:`L` distinct
    levels (one prefix sum per level).

    Args:
        scores: real scores of shape ``(N,)`` or ``(N, 1)``, without NaN.
        levels: ``(N,)`` finite real-valued ordinal levels :math:`\bar y`, or ``(N, K)`` binary label columns
            aggregated by :func:`aggregate_levels` as :math:`\bar y_i = \sum_k w_k\, y_{ik}`.
        groups: optional integer group ids of shape ``(N,)`` or ``(N, 1)``.
        cost: ``"linear"`` (default) or ``"uniform"``.
        label_weights: weights :math:`w` of shape ``(K,)`` for ``(N, K)`` levels; all ones when omitted.
        weighting: group weighting, ``"uniform"`` (default) or ``"size"`` (items per group); used with ``groups``.

    Returns:
        A ``float64`` scalar tensor; ``NaN``, with an :class:`UndefinedMetricWarning`, if all levels (of every
        group) are equal.

    Raises:
        TypeError: if an input is not a tensor, ``scores`` or ``levels`` are complex, or ``groups`` are not integers.
        ValueError: on a shape or length mismatch, NaN ``scores``, non-finite ``levels``, non-binary ``(N, K)``
            levels, bad ``label_weights``, or an unknown ``cost`` or ``weighting``.
    """
    _require_option(cost, "cost", _COSTS)
    _require_option(weighting, "weighting", _WEIGHTINGS)
    scores = _check_scores(scores)
    levels = aggregate_levels(levels, label_weights)
    _require_length(levels, "levels", scores.numel())
    if groups is not None:
        groups = _check_groups(groups, scores.numel())
    ids, counts = _group_index(groups, scores.numel(), scores.device)
    per_group = (_linear_multipartite if cost == "linear" else _uniform_multipartite)(scores, levels, ids, counts)
    return _warn_if_undefined(
        _group_mean(per_group, counts, weighting), "multipartite AUC is undefined: no pair of distinct levels"
    )


# --------------------------------------------------------------------------------------------------------------
# Streaming metrics
# --------------------------------------------------------------------------------------------------------------


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
        scores = _check_scores(scores)
        self.scores.append(scores.detach())
        self.labels.append(_check_binary(labels, "labels", scores.numel(), matrix=False).to(torch.uint8))

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
        _require_option(weighting, "weighting", _WEIGHTINGS)
        self.weighting = weighting
        self._add_cat_states("scores", "labels", "groups")

    def update(self, scores: Tensor, labels: Tensor, groups: Tensor) -> None:
        """Validate a batch and keep it."""
        scores = _check_scores(scores)
        labels = _check_binary(labels, "labels", scores.numel(), matrix=False)
        self.groups.append(_check_groups(groups, scores.numel()).long())
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
            raise ValueError(f"`num_labels` must be a positive integer, got {num_labels!r}")
        self.num_labels = num_labels
        self._add_cat_states("scores", "labels")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        """Validate a batch and keep it."""
        scores = _check_scores(scores)
        labels = _check_binary(labels, "labels", scores.numel(), matrix=True)
        if labels.shape[1] != self.num_labels:
            raise ValueError(f"`labels` must have {self.num_labels} columns (num_labels), got {labels.shape[1]}")
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
    ``(N,)`` (real ordinal levels) or ``(N, K)`` (binary label columns), and, if ``grouped``, integer ``groups``
    of shape ``(N,)`` or ``(N, 1)``.

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
        _require_option(cost, "cost", _COSTS)
        _require_option(weighting, "weighting", _WEIGHTINGS)
        self.cost = cost
        self.label_weights = label_weights
        self.grouped = grouped
        self.weighting = weighting
        self._add_cat_states("scores", "levels", "groups")

    def update(self, scores: Tensor, levels: Tensor, groups: Optional[Tensor] = None) -> None:
        """Validate a batch, aggregate its levels and keep it."""
        if self.grouped != (groups is not None):
            raise ValueError(f"`groups` must be given if and only if grouped=True (grouped={self.grouped})")
        scores = _check_scores(scores)
        levels = aggregate_levels(levels, self.label_weights)
        _require_length(levels, "levels", scores.numel())
        if groups is not None:
            self.groups.append(_check_groups(groups, scores.numel()).long())
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
