"""The data check of a batch as one fused launch: non-finite scores, labels that break the label
rule (``mlloss._validation.LABEL_RULES``). Its status bits are OR-ed into the call's one int32 status
word, which ``mlloss.ops.dispatch`` reads once at the end of the call. (Binary label columns on the
dense kernels, or over all pairs on the layout kernels, get the same check in a launch the call
makes anyway: ``dense.dense_loss_and_grad``'s and ``levels.counting_layout``'s ``check``; so do
LaA's summed binary columns, in the launch that ranks their patterns: ``levels.pattern_ranks``.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
from ._common import cdiv, validate_device
from ._launch import launcher

__all__ = ["check_batch", "report_binary_check", "report_check"]


@triton.jit
def _non_finite(x):
    return (x != x) | (tl.abs(x) == float("inf"))


@triton.jit
def _report(status_ptr, bad_score, bad_label, BAD_SCORE: tl.constexpr, BAD_LABEL: tl.constexpr):
    """OR a block's status bits (any bad score, any bad label) into ``status``."""
    status = tl.where(tl.max(bad_score.to(tl.int32)) > 0, BAD_SCORE, 0)
    tl.atomic_or(status_ptr, status | tl.where(tl.max(bad_label.to(tl.int32)) > 0, BAD_LABEL, 0))


@triton.jit
def report_check(status_ptr, scores, bad_labels, mask, BAD_SCORE: tl.constexpr, BAD_LABEL: tl.constexpr):
    """The data check of a block whose labels the caller has tested (``bad_labels``: the items with a
    label that breaks the rule): a non-finite score or a bad label among ``mask``, OR-ed into
    ``status``. BAD_SCORE, BAD_LABEL: ``mlloss._validation``'s bits."""
    _report(status_ptr, mask & _non_finite(scores), mask & bad_labels, BAD_SCORE, BAD_LABEL)


@triton.jit
def report_binary_check(status_ptr, scores, labels, mask, BAD_SCORE: tl.constexpr, BAD_LABEL: tl.constexpr):
    """The data check of a block under the binary rule (a non-finite score, a label other than
    0/1, among ``mask``), OR-ed into ``status``: for the kernels that read the scores and labels
    anyway (``dense``, ``levels``)."""
    report_check(status_ptr, scores, (labels != 0) & (labels != 1), mask, BAD_SCORE, BAD_LABEL)


# --------------------------------------------------------------------------- #
# Data check: non-finite scores, non-binary (or non-finite) labels             #
# --------------------------------------------------------------------------- #
@triton.jit(  # sizes and alignments not specialized: see _common.py
    do_not_specialize=("N",),
    do_not_specialize_on_alignment=("scores_ptr", "labels_ptr", "keep_ptr"),
)
def _check_batch_kernel(
    scores_ptr, labels_ptr, keep_ptr, status_ptr, N, K, label_stride_n, label_stride_k,
    MASKED: tl.constexpr, LABEL_RULE: tl.constexpr, BLOCK: tl.constexpr, BAD_SCORE: tl.constexpr,
    BAD_LABEL: tl.constexpr,
):
    """Grid (item blocks,): OR the status bits of this block's items (those of ``keep`` if
    MASKED) into ``status``."""
    items = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = items < N
    if MASKED:
        mask &= tl.load(keep_ptr + items, mask=mask, other=0) != 0
    s = tl.load(scores_ptr + items, mask=mask, other=0.0)
    bad_score = mask & _non_finite(s)
    bad_label = tl.zeros([BLOCK], dtype=tl.int1)
    for k in range(K):
        label = tl.load(labels_ptr + items * label_stride_n + k * label_stride_k, mask=mask, other=0)
        if LABEL_RULE == 0:  # 0/1
            bad_label |= mask & (label != 0) & (label != 1)
        elif LABEL_RULE == 1:  # whole numbers (NaN and inf are not)
            bad_label |= mask & (_non_finite(label) | (label != tl.floor(label.to(tl.float64))))
        else:  # finite
            bad_label |= mask & _non_finite(label)
    _report(status_ptr, bad_score, bad_label, BAD_SCORE, BAD_LABEL)


_LABEL_RULES = {"binary": 0, "summed-binary": 0, "integer": 1, "real": 2}


def check_batch(
    scores: torch.Tensor, labels: torch.Tensor, status: torch.Tensor, *, label_rule: str,
    mask: torch.Tensor | None = None,
) -> None:
    """OR the data-check bits of (scores (N,), labels (N, K)) into ``status`` (one int32), over
    the items of the optional (N,) bool ``mask``; ``label_rule``: see
    ``mlloss._validation.LABEL_RULES``."""
    validate_device(scores, labels, status, mask)  # the call's first launch
    n, k = labels.shape
    block = 1024
    launcher(_check_batch_kernel)[(max(cdiv(n, block), 1),)](
        scores, labels, mask if mask is not None else scores, status, n, k, labels.stride(0), labels.stride(1),
        MASKED=mask is not None, LABEL_RULE=_LABEL_RULES[label_rule], BLOCK=block, BAD_SCORE=STATUS_BAD_SCORE,
        BAD_LABEL=STATUS_BAD_LABEL,
    )
