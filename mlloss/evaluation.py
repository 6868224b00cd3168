"""The ranking report of a model's scores on a labelled split: one function, used by the
:class:`mlloss.integrations.lightning.RankingMetrics` callback and by the recipes (their baselines
too), so that every AUC and GAUC the project reports is computed the same way.

:func:`ranking_metrics` takes either one score ranked against every label (a ranking head, LaA/LoA)
or one score column per label (a multi-task model's heads, click and purchase), and returns
float64 scalars named ``auc/<label>``, ``gauc/<label>`` (with groups), ``diff_auc``, ``min_auc``
and, for one score, ``multipartite_auc``. The metric functions are those of :mod:`mlloss.metrics`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Optional

import torch
from torch import Tensor

from mlloss._validation import callers_level, check_choice, require_label_names, require_tensor
from mlloss.metrics import UndefinedMetricWarning, binary_auc, group_auc, multilabel_auc, multipartite_auc
from mlloss.metrics.functional import WEIGHTINGS, Weighting

__all__ = ["ranking_metrics"]


def ranking_metrics(
    scores: Tensor,
    labels: Tensor,
    groups: Optional[Tensor] = None,
    *,
    label_names: Sequence[str],
    group_weighting: Weighting = "uniform",
    label_weights: Optional[Sequence[float]] = None,
    quiet: bool = False,
) -> dict[str, Tensor]:
    """AUC and GAUC of ``scores`` against each of the K label columns, with their summaries.

    Args:
        scores: ``(N,)`` (or ``(N, 1)``): one score ranked against every label; or ``(N, K)``: column
            k is the score of label k (a task head each).
        labels: 0/1 labels ``(N, K)``, ``K = len(label_names)`` (``(N,)`` when K = 1).
        groups: optional ``(N,)`` integer group (user) ids; without them no GAUC.
        label_names: one name per label column, used in the keys.
        group_weighting: GAUC's mean over groups, ``"uniform"`` or ``"size"`` (by items):
            :func:`mlloss.metrics.group_auc`.
        label_weights: the LaA label weights of the multipartite AUC (one score only).
        quiet: silence the :class:`~mlloss.metrics.UndefinedMetricWarning` that names the metrics left
            undefined (NaN either way: a label with one class, no group with both).

    Returns:
        ``{"auc/<label>", "gauc/<label>", "diff_auc", "min_auc"[, "multipartite_auc"]: float64 scalar}``;
        DiffAUC and MinAUC are max - min and min of the per-label AUCs (NaN if one is NaN).
    """
    check_choice("group_weighting", group_weighting, WEIGHTINGS)  # also without groups: a typo is not ignored
    names = require_label_names("label_names", label_names)
    scores = require_tensor(scores, "scores")
    labels = require_tensor(labels, "labels")
    if labels.dim() > 2 or scores.dim() > 2:
        raise ValueError(f"scores and labels must be (N,) or (N, K); got scores {tuple(scores.shape)} and "
                         f"labels {tuple(labels.shape)}")
    labels = labels.reshape(-1, 1) if labels.dim() < 2 else labels
    if labels.shape[1] != len(names):
        raise ValueError(f"labels must have one column per name of label_names={names}; got shape {tuple(labels.shape)}")
    if scores.dim() == 2 and scores.shape[1] == 1:
        scores = scores[:, 0]
    per_task = scores.dim() == 2
    if per_task and scores.shape != labels.shape:
        raise ValueError(f"scores must be (N,) or (N, K) = {tuple(labels.shape)} (one column per label); "
                         f"got {tuple(scores.shape)}")
    if per_task and label_weights is not None:
        raise ValueError(f"label_weights weigh the labels of one score's multipartite AUC; got label_weights="
                         f"{list(label_weights)} with one score per label (scores {tuple(scores.shape)})")
    out: dict[str, Tensor] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedMetricWarning)  # one warning below, naming the metrics
        if per_task:
            per_label = torch.stack([binary_auc(scores[:, k], labels[:, k]) for k in range(len(names))])
        else:
            per_label = multilabel_auc(scores, labels)
        for k, name in enumerate(names):
            out[f"auc/{name}"] = per_label[k]
            if groups is not None:
                column = scores[:, k] if per_task else scores
                out[f"gauc/{name}"] = group_auc(column, labels[:, k], groups, group_weighting)
        out["diff_auc"] = per_label.max() - per_label.min()
        out["min_auc"] = per_label.min()
        if not per_task:
            out["multipartite_auc"] = multipartite_auc(scores, labels, label_weights=label_weights)
    undefined = [] if quiet else [key for key, value in out.items()
                                  if key not in ("diff_auc", "min_auc") and torch.isnan(value)]
    if undefined:
        warnings.warn(f"{', '.join(undefined)} undefined: a label's AUC needs both 0 and 1 among the items, its GAUC "
                      "a group with both; returning NaN.", UndefinedMetricWarning, stacklevel=callers_level())
    return out
