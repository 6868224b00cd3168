r"""Exact evaluation metrics for pairwise ranking: AUC, GAUC, per-label AUC and multipartite AUC.

The losses in :mod:`mlloss` are surrogates of pair-counting metrics. This package computes those metrics
exactly, as functions of a whole evaluation set and as :class:`torchmetrics.Metric` classes that stream
over batches and synchronise across processes.

Every metric counts ordered pairs :math:`(i, j)` with scores :math:`s_i, s_j` and credits a pair with

.. math::
    h(s_i, s_j) = \mathbb{1}[s_i > s_j] + \tfrac{1}{2}\,\mathbb{1}[s_i = s_j],

so that ties count one half. Counting is done by sorting, never by enumerating pairs: the items are sorted
once by ``(group, score)`` and, for each item, the number of items of a given kind ranked strictly below it
and tied with it in its group is read off a prefix sum. Every function is :math:`O(N \log N)` (the uniform
multipartite cost takes :math:`O(N L)` for :math:`L` distinct levels, and :math:`O(N \log^2 N)` once
:math:`L` exceeds :math:`\log_2 N`), exact (pair counts are ``int64``, and a value is their float64
quotient, the correctly rounded fraction up to :math:`2^{52}` pairs in a group, about 6.7e7 positives
against as many negatives, and within two ulps above;
real-valued levels are summed in ``float64``, so the linear multipartite cost of non-integer levels is exact
up to float64 rounding, and kept within :math:`[0, 1]`) and deterministic on CPU and CUDA: the only
reductions are sorts, integer prefix sums and segmented sums over sorted data (no floating-point atomics).

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

The package, torchmetrics' split: ``functional`` (the metrics as functions of a whole evaluation set),
``classes`` (the streaming :class:`torchmetrics.Metric` classes, which call the functions at ``compute``),
``counting`` (the sorted tie blocks and segmented counts they share, from integer sorts and linear
passes: :func:`mlloss.ops.layout.value_ranks`, :func:`mlloss.ops.layout.run_bounds`). Inputs are
checked by :mod:`mlloss._validation`.

The classes are imported on first use: ``torchmetrics.Metric`` imports matplotlib (for its ``plot``)
when it is installed, which the functions do not need.
"""

from .counting import UndefinedMetricWarning
from .functional import aggregate_levels, binary_auc, group_auc, multilabel_auc, multipartite_auc

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

_CLASSES = ("AUC", "GroupAUC", "MultiLabelAUC", "MultipartiteAUC")


def __getattr__(name: str):
    if name in _CLASSES:  # imports torchmetrics (and with it matplotlib) when first asked for
        from . import classes

        return getattr(classes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
