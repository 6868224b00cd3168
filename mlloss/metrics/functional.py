r"""The metrics as functions of a whole evaluation set: binary AUC, GAUC, per-label AUC, multipartite AUC.

Each returns a ``float64`` tensor computed exactly in :math:`O(N \log N)` by the sorted counting of
``counting``; ``NaN`` with an :class:`UndefinedMetricWarning` when no pair is valid. The streaming versions
are in ``classes``; the package docstring (:mod:`mlloss.metrics`) states the definitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Optional, Union

import torch
from torch import Tensor

from .. import _validation as check
from ..ops.dispatch import rounded_levels
from ..ops.layout import value_ranks
from .counting import (
    UndefinedMetricWarning,
    Weighting,
    centered_rank_sum,
    group_mean,
    pair_count,
    prefix_dominance,
    ratio,
    segment_sum,
    tie_blocks,
    twice_wins,
    warn_if_undefined,
)

__all__ = ["UndefinedMetricWarning", "aggregate_levels", "binary_auc", "group_auc", "multilabel_auc", "multipartite_auc"]

Cost = Literal["linear", "uniform"]
LabelWeights = Union[Tensor, Sequence[float]]

WEIGHTINGS = ("uniform", "size")
COSTS = ("linear", "uniform")


def aggregate_levels(levels: Tensor, label_weights: Optional[LabelWeights] = None) -> Tensor:
    r"""Return the aggregated relevance level :math:`\bar y` of every item, as ``float64`` of shape ``(N,)``.

    The levels ``LaALoss`` ranks by, for the same labels and weights.

    Args:
        levels: ``(N,)`` or ``(N, 1)`` real-valued ordinal levels (a rating, say), returned as they are (times
            the one weight, if given); or ``(N, K)`` binary label columns, :math:`K \ge 2`, aggregated as
            :math:`\bar y_i = \sum_k w_k\, y_{ik}` (label aggregation, LaA) and rounded to
            ``LEVEL_RESOLUTION`` (2^-40) of their own size, so that sums equal in exact arithmetic
            (:math:`0.1 + 0.2` and :math:`0.3`) are one level.
        label_weights: the weights :math:`w > 0` of shape ``(K,)``; all ones when omitted. Not for ``(N,)`` levels.

    Raises:
        TypeError: if ``levels`` is not a real tensor or ``label_weights`` not a sequence of numbers.
        ValueError: if ``levels`` is not finite, ``(N, K)`` levels are not binary, or ``label_weights`` is given
            for ``(N,)`` levels, has the wrong length or is not finite and positive.
    """
    check.require_tensor(levels, "levels")
    if levels.dtype.is_complex:
        raise TypeError(f"levels must be real; got dtype {levels.dtype}")
    if levels.ndim == 1 and label_weights is not None:
        raise ValueError("label_weights needs levels of shape (N, K) (label columns); got levels of shape (N,)")
    if levels.ndim not in (1, 2):
        raise ValueError(f"levels must have shape (N,) or (N, K); got {tuple(levels.shape)}")
    weights = check.check_weights("label_weights", label_weights, strictly_positive=True)
    if weights is not None:
        check.check_weights_length("label_weights", weights, levels.shape[1])
        weights = weights.to(levels.device)
    if levels.ndim == 1 or levels.shape[1] == 1:  # one ordinal column
        levels = levels.reshape(-1).double()
        check.metric_finite(levels, "levels")
        return levels if weights is None else levels * weights[0]
    columns = check.metric_binary(levels, "levels", levels.shape[0], matrix=True).double()
    if weights is None:
        return columns.sum(dim=1)
    return rounded_levels(columns @ weights)


def _auc_per_group(scores: Tensor, labels: Tensor, groups: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    r"""(AUC of every group (rows) and label column (columns), ``float64 (G, K)``, ``NaN`` without both
    classes; the group sizes ``(G,)``).

    :math:`\mathrm{AUC} = \frac{1}{P\,Q} \sum_{i: y_i = 1} \sum_{j: y_j = 0} h(s_i, s_j)`, the Mann-Whitney
    statistic, with :math:`P` positives and :math:`Q` negatives.
    """
    blocks = tie_blocks(scores, groups)
    negatives = 1 - labels
    return ratio(twice_wins(blocks, labels, negatives), 2 * pair_count(blocks, labels, negatives)), blocks.counts


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
    scores = check.metric_scores(scores)
    check.require_scores_device(scores, labels=labels)
    labels = check.metric_binary(labels, "labels", scores.numel(), matrix=False)
    auc = _auc_per_group(scores, labels[:, None], None)[0][0, 0]
    return warn_if_undefined(auc, "AUC is undefined unless `labels` contain both 0 and 1")


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
    check.check_choice("weighting", weighting, WEIGHTINGS)
    scores = check.metric_scores(scores)
    check.require_scores_device(scores, labels=labels, groups=groups)
    labels = check.metric_binary(labels, "labels", scores.numel(), matrix=False)
    per_group, counts = _auc_per_group(scores, labels[:, None], check.metric_groups(groups, scores.numel()))
    per_group = per_group[:, 0]
    return warn_if_undefined(group_mean(per_group, counts, weighting), "GAUC is undefined: no group has both classes")


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
    scores = check.metric_scores(scores)
    check.require_scores_device(scores, labels=labels)
    labels = check.metric_binary(labels, "labels", scores.numel(), matrix=True)
    auc = _auc_per_group(scores, labels, None)[0][0]
    return warn_if_undefined(auc, "AUC of a label is undefined unless its column contains both 0 and 1")


HUGE_LEVEL = 2.0**512  # sums of N^2 level differences stay finite below this magnitude


def _scaled_below_overflow(levels: Tensor) -> Tensor:
    """``levels``, times the power of two that brings their largest magnitude below 1 if it is at least
    ``HUGE_LEVEL``. The linear-cost value does not change with the scale of the levels (nor its float64
    rounding, for a power of two), but its sums of differences of levels near the float64 maximum
    (``1e308`` and ``-1e308``) overflow to ``inf`` and made it ``NaN``."""
    largest = levels.abs().max() if levels.numel() else levels.new_zeros(())
    if largest < HUGE_LEVEL:
        return levels
    return levels * 2.0 ** -int(torch.frexp(largest).exponent)


def _linear_multipartite(scores: Tensor, levels: Tensor, groups: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    r"""Per-group multipartite AUC with cost :math:`c_{ij} = \bar y_i - \bar y_j`, in closed form.

    Split the pairs by score: a pair with :math:`s_i > s_j` earns :math:`(\bar y_i - \bar y_j)^+
    = \frac{1}{2}[(\bar y_i - \bar y_j) + |\bar y_i - \bar y_j|]`, a tied pair earns
    :math:`\frac{1}{2}|\bar y_i - \bar y_j|`. Hence the credit is :math:`\frac{1}{2}(S + D)` and the value
    :math:`\frac{S + D}{2D}`, with :math:`S = \sum_{s_i > s_j} (\bar y_i - \bar y_j)` and
    :math:`D = \sum_{\bar y_i > \bar y_j} (\bar y_i - \bar y_j)` the total cost; both are centred rank sums.

    :math:`|S| \le D` in exact arithmetic, but the two sums add the same levels in different orders (by
    score and by level), so with levels that are not small integers their float64 rounding can leave
    :math:`|S|` a few ulps above :math:`D` (1.0000000000000002 for a perfect ranking). :math:`S` is clamped
    to :math:`[-D, D]`, which keeps every value within :math:`[0, 1]` and changes no value that was inside.
    """
    levels = _scaled_below_overflow(levels)
    by_level = tie_blocks(levels, groups)
    # Both sums are unchanged by a shift of a group's levels; measured from each group's median level
    # they keep their precision for levels far from 0 (1e15 + k) instead of cancelling.
    ordered = levels[by_level.order]
    centred = torch.empty_like(levels)
    centred[by_level.order] = ordered - ordered[by_level.group_start + by_level.group_size // 2]
    by_score = tie_blocks(scores, groups)
    concordance = centered_rank_sum(by_score, centred)
    total_cost = centered_rank_sum(by_level, centred)
    concordance = torch.clamp(concordance, -total_cost, total_cost)
    return ratio(concordance + total_cost, 2 * total_cost), by_score.counts


def _uniform_multipartite(scores: Tensor, levels: Tensor, groups: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Per-group multipartite AUC with unit cost: one level at a time when there are few levels (O(N L)),
    else by dominance counting (O(N log^2 N), whatever L). Both count in ``int64``: the same value."""
    if torch.unique(levels).numel() <= max(scores.numel(), 2).bit_length():
        return _uniform_multipartite_by_level(scores, levels, groups)
    return _uniform_multipartite_by_dominance(scores, levels, groups)


def _uniform_multipartite_by_dominance(
    scores: Tensor, levels: Tensor, groups: Optional[Tensor]
) -> tuple[Tensor, Tensor]:
    r"""The unit-cost multipartite AUC of many levels (real-valued ones, all distinct, say).

    Sorted by ``(group, level)``, the items an item outranks in level are the positions
    :math:`[\text{group start}, \text{tie block start})` before it; twice its credit is
    :math:`F_< + F_\le`, the numbers of items in that range of smaller and of not greater score, which
    :func:`prefix_dominance` counts for all items at once from the score ranks (``below``: the number of
    smaller scores; :math:`s_q < s_p` iff :math:`\text{below}_q < \text{below}_p`, :math:`s_q \le s_p` iff
    :math:`\text{below}_q < \text{below}_p + 1`).
    """
    by_level = tie_blocks(levels, groups)
    below = value_ranks(scores)[by_level.order]  # items of smaller score
    starts, stops = by_level.group_start, by_level.block_start
    queries = prefix_dominance(below, torch.cat([stops, stops, starts, starts]),
                               torch.cat([below, below + 1, below, below + 1])).view(4, -1)
    twice_credit = queries[0] + queries[1] - queries[2] - queries[3]
    wins = segment_sum(twice_credit, by_level.counts)
    pairs = segment_sum(stops - starts, by_level.counts)
    return ratio(wins, 2 * pairs), by_level.counts


def _uniform_multipartite_by_level(
    scores: Tensor, levels: Tensor, groups: Optional[Tensor]
) -> tuple[Tensor, Tensor]:
    """The unit-cost multipartite AUC of few levels: each level against all lower levels, one level at a time."""
    blocks = tie_blocks(scores, groups)
    wins = torch.zeros(blocks.counts.numel(), 1, dtype=torch.long, device=scores.device)
    pairs = torch.zeros_like(wins)
    for level in torch.unique(levels)[1:]:
        upper, lower = (levels == level).long()[:, None], (levels < level).long()[:, None]
        wins += twice_wins(blocks, upper, lower)
        pairs += pair_count(blocks, upper, lower)
    return ratio(wins, 2 * pairs)[:, 0], blocks.counts


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

    Cost: :math:`O(N \log N)` for the linear cost; the uniform cost takes :math:`O(N L)` for :math:`L` distinct
    levels up to :math:`\log_2 N` (one prefix sum per level) and :math:`O(N \log^2 N)` for more (real-valued
    levels, all distinct, say), by dominance counting.

    Exactness: the uniform cost counts pairs in ``int64`` and is exact; so is the linear cost for integer
    levels (of moderate size). With other real levels the linear cost is exact up to float64 rounding of
    its level sums, and always within :math:`[0, 1]` (1 for a perfect ranking, 0 for a reversed one).

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
    check.check_choice("cost", cost, COSTS)
    check.check_choice("weighting", weighting, WEIGHTINGS)
    scores = check.metric_scores(scores)
    check.require_scores_device(scores, levels=levels, groups=groups)
    levels = aggregate_levels(levels, label_weights)
    check.metric_length(levels, "levels", scores.numel())
    if groups is not None:
        groups = check.metric_groups(groups, scores.numel())
    per_group, counts = (_linear_multipartite if cost == "linear" else _uniform_multipartite)(scores, levels, groups)
    return warn_if_undefined(
        group_mean(per_group, counts, weighting), "multipartite AUC is undefined: no pair of distinct levels"
    )
