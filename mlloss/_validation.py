"""Argument and input checks of every entry point: the losses, the metrics (``mlloss.metrics``),
the data checks of the loss op (``mlloss.ops.dispatch``) and the kernels' launchers
(``mlloss.kernels``).

Every check raises ``TypeError`` or ``ValueError`` with the argument's name and the offending
value, so that a mistake in a training script points at itself, in one style across the package:
``<name> must <requirement>; got <value>``, or ``; <name>[<index>] = <value>`` for the first bad
entry of a tensor. Checks that only need constructor arguments run in ``__init__``; checks that
need the batch run in ``forward`` (or ``update``). The metrics' checks (at the end) accept what an
evaluation set holds and share the helpers above them.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import sys
import operator
import types
import warnings
from collections.abc import Iterable, Sequence
from typing import Callable, NamedTuple, SupportsIndex, TypeGuard

import torch
from torch import Tensor

from .surrogates import NAMES as SURROGATES  # noqa: F401 -- re-exported: the one table of surrogate names

# Data-check bits: the kernels OR them into one int32 status word that the host reads once.
STATUS_BAD_SCORE = 1
STATUS_BAD_LABEL = 2
STATUS_OVERFLOW = 4
REDUCTIONS = ("mean", "sum")
BACKENDS = ("auto", "torch", "exact", "triton")
PAIR_SETS = ("all", "hardest")
COSTS = ("linear", "uniform")


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def check_int(name: str, value: object, *, minimum: int, requirement: str | None = None) -> int:
    """``value`` as an int: an integer, Python's or NumPy's (not a bool, not a float), >= ``minimum``.
    ``requirement`` replaces the default wording of the message."""
    try:
        integer = operator.index(value) if isinstance(value, SupportsIndex) and not isinstance(value, bool) else None
    except TypeError:
        integer = None
    if integer is None or integer < minimum:
        wanted = requirement or ("an integer" if integer is None else f">= {minimum}")
        raise ValueError(f"{name} must be {wanted}; got {value!r}")
    return integer


def _is_count(value: object) -> bool:
    """An integer (Python's or NumPy's, not a bool) >= 1."""
    try:
        check_int("", value, minimum=1)
    except ValueError:
        return False
    return True


def check_sizes(**sizes: int) -> None:
    """Each of ``sizes`` (a count or a width of a model part) is an integer >= 1."""
    for name, value in sizes.items():
        check_int(name, value, minimum=1)


MAX_LOSS_ITEMS = 2**31 - 1


def check_loss_items(num_items: int) -> None:
    """A pairwise loss's batch (gathered across ranks with ``cross_device``) fits its layout's int32
    positions: a larger one would index past them (a shape check: no host read)."""
    if num_items > MAX_LOSS_ITEMS:
        raise ValueError(
            f"a pairwise loss takes at most 2**31 - 1 = {MAX_LOSS_ITEMS:,} items per call (its pair layout holds "
            f"int32 positions); got {num_items:,} items: split the batch"
        )


def at_least_one(count: int | Tensor) -> int | Tensor:
    """max(count, 1) of an item count, a host int or (with a mask) a device tensor, without a sync:
    the denominator of a mean over the items that count."""
    return count.clamp(min=1) if isinstance(count, Tensor) else max(count, 1)


def sequence_of(name: str, values: object, what: str = "integers") -> list:
    """``values`` (a list, tuple, NumPy array or tensor) as a list. A bare number or a string is named:
    it failed in a loop over it ("'int' object is not iterable"), or read "64" as 6 and 4."""
    try:
        items = list(values) if isinstance(values, Iterable) and not isinstance(values, (str, bytes)) else None
    except TypeError:
        items = None
    if items is None:
        raise ValueError(f"{name} must be a sequence of {what}; got {values!r}")
    return items


def check_widths(name: str, widths: Sequence[int], *, allow_empty: bool = False) -> list[int]:
    """The hidden-layer widths ``name`` of a model part as a list of ints: each >= 1, and at least one
    unless ``allow_empty`` (a task tower may be a single linear layer)."""
    widths = sequence_of(name, widths, "integer widths")
    if (not widths and not allow_empty) or not all(_is_count(w) for w in widths):
        what = "integer widths >= 1" if allow_empty else "one or more integer widths >= 1"
        raise ValueError(f"{name} must be {what}; got {list(widths)}")
    return [int(width) for width in widths]


def check_cardinalities(cardinalities: Sequence[int]) -> list[int]:
    """The numbers of ids of an embedding's fields as a list of ints: at least one field, each >= 1."""
    cardinalities = sequence_of("cardinalities", cardinalities)
    if not cardinalities:
        raise ValueError(f"cardinalities must name at least one field; got {list(cardinalities)}")
    check_sizes(**{f"cardinalities[{f}]": c for f, c in enumerate(cardinalities)})
    return [int(c) for c in cardinalities]


def check_field_ids(ids: Tensor, cardinalities: Sequence[int], name: str, field_names: Sequence[str] = ()) -> None:
    """Column f of the (N, F) ``ids`` holds ids of field f's table: values in
    ``[0, cardinalities[f])``. Reads the host (one min and one max per column): for data checked
    once, or for CPU batches."""
    if not len(ids):
        return
    for f, (low, high) in enumerate(zip(ids.amin(0).tolist(), ids.amax(0).tolist())):
        if low < 0 or high >= cardinalities[f]:
            label = f" ({field_names[f]!r})" if field_names else ""
            raise ValueError(f"{name}[:, {f}]{label} must be in [0, {cardinalities[f]}); got {low if low < 0 else high}")


def check_one_device(*tensors: Tensor) -> torch.device:
    """The one device of ``tensors``; raises if they are on several."""
    device = tensors[0].device
    for tensor in tensors[1:]:
        if tensor.device != device:
            raise ValueError(f"all inputs must be on one device; got {device} and {tensor.device}")
    return device


def _is_real_number(value: object) -> TypeGuard[numbers.Real]:
    """A Python or NumPy real number (``np.float32(0.5)``, ``np.int64(3)``), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_finite_number(name: str, value: object, *, above: float | None = None, requirement: str | None = None) -> float:
    """``value`` as a float: a finite real number (not a bool), and ``> above`` if given.
    ``requirement`` replaces the default wording of the message."""
    if (
        not _is_real_number(value)
        or not math.isfinite(value)
        or (above is not None and value <= above)
    ):
        wanted = requirement or ("a finite number" if above is None else f"a finite number > {above:g}")
        raise ValueError(f"{name} must be {wanted}; got {value!r}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """``value``, which must be a bool (not 0 / 1, not a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {value!r}")
    return value


def check_str(name: str, value: object) -> str:
    """``value``, which must be a str (a key, a prefix of logged names)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str; got {value!r}")
    return value


def check_margin(margin: object) -> float:
    return check_finite_number("margin", margin)


def check_temperature(temperature: object, pairs: str) -> float | None:
    if temperature is None:
        return None
    if pairs != "hardest":
        raise ValueError(
            f"temperature={temperature!r} softens the hardest pair and needs pairs='hardest'; "
            f"got pairs={pairs!r}"
        )
    temperature = check_finite_number("temperature", temperature, above=0, requirement="a positive finite number or None")
    if temperature < sys.float_info.min:  # subnormal: 1 / temperature and s / temperature overflow
        raise ValueError(f"temperature must be at least {sys.float_info.min:g} (a normal float64); got {temperature!r}")
    return temperature


def check_lam(lam: object) -> float | tuple[float, ...]:
    values = lam if isinstance(lam, (list, tuple)) else [lam]
    checked = []
    for value in values or [None]:  # an empty sequence weighs no task
        if not _is_real_number(value) or not 0 <= float(value) < math.inf:
            raise ValueError(f"lam must be a finite number >= 0 or a non-empty sequence of them; got {lam!r}")
        checked.append(float(value))
    return tuple(checked) if isinstance(lam, (list, tuple)) else checked[0]


def check_weights(name: str, weights: object, *, strictly_positive: bool) -> Tensor | None:
    """Validate a per-label weight vector given at construction (its length is checked per batch)."""
    if weights is None:
        return None
    if isinstance(weights, str):
        raise ValueError(f"{name} must be a sequence of numbers or None; got {weights!r}")
    if isinstance(weights, Tensor) and weights.is_meta:
        raise ValueError(f"{name} must hold values; got a meta tensor {weights!r}: pass a list of numbers")
    if isinstance(weights, Tensor) and weights.requires_grad:
        # The losses hold their weights as constants and never differentiate them: a Parameter
        # would silently stay unlearned (and a graph node held by the module breaks deepcopy).
        raise TypeError(
            f"{name} must be constants (the loss does not differentiate them); got a tensor that requires grad, "
            f"{weights.tolist()}: pass {name}.detach() for fixed values"
        )
    # Numbers go to the default device, except the meta device (a model built under
    # ``torch.device("meta")``), where the checks below could not read them: the CPU then.
    device = "cpu" if torch.get_default_device().type == "meta" else None
    try:
        # Its own dtype (a bool?); the values read in float64 (1e-320 is no float32). A tensor is
        # copied: the module's constants must not change with the caller's tensor.
        given = torch.as_tensor(weights, device=device)
        if isinstance(weights, Tensor):
            tensor = given.to(torch.float64, copy=True)
        else:
            tensor = torch.as_tensor(weights, dtype=torch.float64, device=device)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} must be a sequence of numbers; got {weights!r}") from error
    if given.dim() != 1 or given.dtype == torch.bool:
        raise TypeError(f"{name} must be a sequence of numbers, one per label; got {weights!r}")
    if tensor.numel() == 0:
        raise ValueError(f"{name} must not be empty; got {weights!r}")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite; got {tensor.tolist()}")
    bad = tensor <= 0 if strictly_positive else tensor < 0
    if bad.any():
        bound = "> 0" if strictly_positive else ">= 0"
        raise ValueError(f"{name} must all be {bound}; got {tensor.tolist()}")
    return tensor


def require_label_names(name: str, names: object) -> tuple[str, ...]:
    """``check_label_names`` where the names are required (None is refused)."""
    checked = check_label_names(name, names)
    if checked is None:
        raise TypeError(f"{name} must be a sequence of names, one per label column; got None")
    return checked


def check_label_names(name: str, names: object) -> tuple[str, ...] | None:
    """One name per label column, or None: a sequence, not one string (which would name a label
    per character), of distinct names (they key the parts' and metrics' entries)."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of names, one per label column, not one string; got {names!r}")
    wanted = f"{name} must be a sequence of names, one per label column; got {names!r}"
    if not isinstance(names, Iterable):
        raise TypeError(wanted)
    try:
        checked = tuple(str(label) for label in names)
    except TypeError as error:  # a 0-d tensor or array
        raise TypeError(wanted) from error
    if not checked:
        raise ValueError(f"{name} must not be empty; got {names!r}")
    if len(set(checked)) != len(checked):
        raise ValueError(f"{name} must be distinct (they name the entries of parts and metrics); got {list(checked)}")
    return checked


def check_weights_length(name: str, weights: Tensor, num_labels: int) -> None:
    if weights.numel() != num_labels:
        raise ValueError(
            f"{name} has {weights.numel()} entries but labels have {num_labels} columns; "
            f"got {name}={weights.tolist()}"
        )


def require_tensor(value: object, name: str) -> Tensor:
    """``value`` if it is a tensor."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(value).__name__}")
    return value


def as_vector(values: Tensor, name: str) -> Tensor:
    """``values`` of shape (N,) or (N, 1) as shape (N,)."""
    if values.dim() == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.dim() != 1:
        raise ValueError(f"{name} must have shape (N,) or (N, 1); got {tuple(values.shape)}")
    return values


def require_integer_ids(groups: Tensor, name: str, *, takes_mask: bool = False) -> None:
    """Raise unless ``groups`` holds integer ids; ``takes_mask``: the caller has a ``mask=``, which
    the error then points a bool tensor to."""
    if groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool:
        # a bool tensor here is most often a mask passed positionally, in the place of the groups
        hint = " (a bool mask of the items that count goes in mask=)" if groups.dtype == torch.bool and takes_mask else ""
        raise TypeError(f"{name} must hold integer ids; got dtype {groups.dtype}{hint}")


def require_scores_device(scores: Tensor, **tensors: object) -> None:
    """Raise unless each given tensor (labels=, groups=, mask=) is on the scores' device, naming it
    (what is not a tensor is left to the input's own checks)."""
    for name, tensor in tensors.items():
        if isinstance(tensor, Tensor) and tensor.device != scores.device:
            raise ValueError(f"{name} must be on the scores' device ({scores.device}); got {tensor.device}")


def floating_scores(scores: object) -> Tensor:
    """``scores`` if it is a floating-point tensor (of any shape)."""
    scores = require_tensor(scores, "scores")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor; got dtype {scores.dtype}")
    return scores


def scores_vector(scores: object, *, finite: bool = True) -> Tensor:
    """Scores as a floating vector of shape (N,); accepts (N,) or (N, 1). With ``finite`` the
    values are checked too (a host read); the losses check them in their data check instead."""
    scores = as_vector(floating_scores(scores), "scores")
    if finite:
        _require_finite_scores(scores)
    return scores


def is_score_matrix(scores: object) -> bool:
    """Whether ``scores`` is a tensor of shape (N, K), K > 1: a loss's task columns."""
    return isinstance(scores, Tensor) and scores.dim() == 2 and scores.shape[1] > 1


def score_matrix(scores: object) -> Tensor:
    """Scores of shape (N, K), floating (task columns); values are checked by the loss's data check."""
    scores = floating_scores(scores)
    if scores.dim() != 2:
        raise ValueError(f"task columns take scores of shape (N, K); got {tuple(scores.shape)}")
    return scores


def _require_finite_scores(scores: Tensor) -> None:
    finite = torch.isfinite(scores)
    if not bool(finite.all()):  # scores[i], or scores[i, k] for task columns
        raise ValueError(f"scores must be finite; {first_entry('scores', scores, ~finite)}")


def label_columns(labels: object, num_items: int | None) -> Tensor:
    """Labels as a matrix (N, K) of their own dtype, a view when possible; accepts (N,) or (N, K)
    bool, int or float. With ``num_items`` the number of rows must match it. Shapes only: the
    values are checked by ``label_matrix`` or by a loss's data check."""
    labels = require_tensor(labels, "labels")
    if labels.is_complex():
        raise TypeError(f"labels must be bool, integer or float; got dtype {labels.dtype}")
    if labels.dim() == 1:
        labels = labels[:, None]
    if labels.dim() != 2:
        raise ValueError(f"labels must have shape (N,) or (N, K); got {tuple(labels.shape)}")
    if num_items is not None and labels.shape[0] != num_items:
        raise ValueError(
            f"labels have {labels.shape[0]} rows but scores have {num_items} items; "
            f"got labels of shape {tuple(labels.shape)}"
        )
    if labels.shape[1] == 0:
        raise ValueError(f"labels must have at least one column; got shape {tuple(labels.shape)}")
    return labels


def label_matrix(labels: object, num_items: int | None) -> Tensor:
    """Labels as a finite float64 matrix (N, K); accepts (N,) or (N, K) bool, int or float."""
    labels = label_columns(labels, num_items).to(torch.float64)
    _require_finite_labels(labels)
    return labels


def _require_finite_labels(labels: Tensor) -> None:
    finite = torch.isfinite(labels)
    if not bool(finite.all()):
        raise ValueError(f"labels must be finite; {_label_entry(labels, ~finite)}")


def _label_entry(labels: Tensor, bad: Tensor) -> str:
    """``first_entry`` of the (N, K) labels as the caller indexes the labels given: 'labels[i] = v'
    for one column ((N,) or (N, 1)), 'labels[i, k] = v' for several."""
    if labels.shape[1] == 1:
        labels, bad = labels[:, 0], bad[:, 0]
    return first_entry("labels", labels, bad)


def raise_for_bad_batch(scores: Tensor, labels: Tensor, label_rule: str) -> None:
    """Raise the error a failed data check stands for, naming the first offending entry.

    The slow path of a loss's data check (``mlloss.ops.dispatch``): it runs only once the fused
    check has found something. ``label_rule``: see LABEL_RULES.
    """
    _require_finite_scores(scores)
    labels = labels.to(torch.float64)
    _require_finite_labels(labels)
    if label_rule in ("binary", "summed-binary"):
        check_binary(labels, "labels with several columns" if label_rule == "summed-binary" else "labels")
    elif label_rule == "integer":
        fractional = labels != torch.round(labels)
        if bool(fractional.any()):
            raise ValueError(
                f"a single label column must hold whole numbers (0/1, or ordinal levels such as 0..4 "
                f"ratings); {_label_entry(labels, fractional)}. For a real-valued "
                f"label pass LaALoss(real_levels=True); for probabilities from a model, these are "
                f"scores, not labels"
            )


def check_binary(labels: Tensor, what: str = "labels") -> Tensor:
    """Raise unless every entry is 0 or 1; ``labels`` is the (N, K) float64 matrix."""
    bad = (labels != 0) & (labels != 1)
    if bool(bad.any()):
        raise ValueError(f"{what} must be binary (0/1); {_label_entry(labels, bad)}")
    return labels


def require_single_column(labels: Tensor, loss_name: str) -> None:
    if labels.shape[1] != 1:
        raise ValueError(
            f"{loss_name} takes one binary label column; got labels with {labels.shape[1]} columns "
            f"(use LoALoss or LaALoss for several labels)"
        )


# Group ids that fit 32 bits stay 32-bit (``group_vector``): the layout sorts the ids, and a radix
# sort passes over every bit of its keys (CUDA's sort takes 4 passes over int32 keys, 8 over int64).
_NARROW_IDS = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32)


def group_ids(groups: object, num_items: int) -> Tensor | None:
    """Group ids checked (integer ids, one per item) and viewed as a vector (N,), in their own
    dtype and layout, or None: what ``group_vector`` converts, and what a loss that ignores the
    groups (``BCELoss``) checks."""
    if groups is None:
        return None
    if not isinstance(groups, Tensor):
        raise TypeError(f"groups must be a torch.Tensor of integer ids or None; got {type(groups).__name__}")
    require_integer_ids(groups, "groups", takes_mask=True)
    if groups.dim() == 2 and groups.shape[1] == 1:
        groups = groups[:, 0]
    if groups.dim() != 1:
        raise ValueError(f"groups must have shape (N,); got {tuple(groups.shape)}")
    if groups.shape[0] != num_items:
        raise ValueError(f"groups have {groups.shape[0]} entries but scores have {num_items} items")
    return groups


def group_vector(groups: object, num_items: int) -> Tensor | None:
    """Group ids as a vector (N,), or None; ids need not be sorted or contiguous. Ids of at most 32
    bits (int32, int16, uint16, int8, uint8) become int32, the others (int64, uint32, uint64) int64:
    the same groups either way, and the sort of 32-bit ids does half the work."""
    groups = group_ids(groups, num_items)
    if groups is None:
        return None
    dtype = torch.int32 if groups.dtype in _NARROW_IDS else torch.int64
    return groups.to(dtype).contiguous()  # a strided view (an expanded id) is copied once here


def mask_vector(mask: object, scores: Tensor) -> Tensor | None:
    """The (N,) bool mask of the items that count (True), or None; on the scores' device."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a bool torch.Tensor (True for the items that count) or None; got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True for the items that count); got dtype {mask.dtype}")
    if mask.dim() == 2 and mask.shape[1] == 1:
        mask = mask[:, 0]
    if mask.dim() != 1 or mask.shape[0] != scores.shape[0]:
        raise ValueError(f"mask must have shape ({scores.shape[0]},), one entry per item; got {tuple(mask.shape)}")
    require_scores_device(scores, mask=mask)
    return mask


# What a loss requires of its labels: 0/1 values (binary label columns, or several columns summed
# by LaA), whole numbers (a single ordinal column: 0/1 or levels such as 0..4 ratings) or any
# finite values (real-valued levels).
LABEL_RULES = ("binary", "summed-binary", "integer", "real")


def label_violations(labels: Tensor, label_rule: str) -> Tensor | None:
    """How many labels break ``label_rule`` (see LABEL_RULES; non-finite labels always do), as a
    0-dim tensor on the labels' device, or None where none can (bool labels; integer labels and a
    rule other than "binary"). One tensor operation and a count."""
    if labels.dtype == torch.bool:
        return None
    if label_rule in ("binary", "summed-binary"):
        # y - y^2 is 0 exactly at 0 and 1: also in floating point (fl(y^2) = y only there), and
        # for integer labels modulo 2^bits (y and y - 1 are coprime); NaN for NaN and inf
        bad = torch.addcmul(labels, labels, labels, value=-1)
    elif not labels.is_floating_point():
        return None
    elif label_rule == "integer":
        bad = torch.frac(labels)  # exact; NaN for NaN and inf
    else:
        bad = labels - labels  # NaN for NaN and inf
    return bad.count_nonzero()


def batch_check_values(scores: Tensor, labels: Tensor, label_rule: str) -> Tensor:
    """What a data check reads of a batch, as one tensor on its device, read in one go:
    [min score, max score] and, unless the labels cannot break ``label_rule``, the count of those
    that do (``label_violations``). A NaN score makes min and max NaN, so both are finite exactly
    when every score is, and lie in [0, 1] exactly when every score does. No scores: 0 and 0."""
    extremes = list(torch.aminmax(scores)) if scores.numel() else [scores.new_zeros(())] * 2
    bad = label_violations(labels, label_rule)
    return torch.stack(extremes if bad is None else [*extremes, bad])  # promotes the count


def status_of(values: Sequence[float]) -> int:
    """The data-check bits of ``batch_check_values`` read on the host (``data_status``, and the
    cross-entropy's check)."""
    low, high, *bad = values
    status = 0 if math.isfinite(low) and math.isfinite(high) else STATUS_BAD_SCORE
    return status | (STATUS_BAD_LABEL if bad and bad[0] else 0)


def data_status(scores: Tensor, labels: Tensor, label_rule: str) -> int:
    """The data-check bits of a batch (one host read): non-finite scores, and labels that break
    ``label_rule`` (see LABEL_RULES) or are not finite."""
    return status_of(batch_check_values(scores, labels, label_rule).tolist())


def overflow_status(loss: Tensor) -> Tensor:
    """STATUS_OVERFLOW where the loss is not finite, as an int32 tensor (no host read)."""
    return torch.where(torch.isfinite(loss), 0, STATUS_OVERFLOW).to(torch.int32)


def raise_for_status(status: int, scores: Tensor, labels: Tensor, label_rule: str) -> None:
    """Raise the error that a status word stands for: the offending entry for bad data, and
    the one overflow contract of every loss path for a non-finite loss."""
    if status & (STATUS_BAD_SCORE | STATUS_BAD_LABEL):
        raise_for_bad_batch(scores, labels, label_rule)
    if status & STATUS_OVERFLOW:
        raise OverflowError(
            "the pairwise loss is not finite in the scores' dtype. The causes: the exponential surrogate's "
            "exp overflows for a valid pair with s_j - s_i above about 88 (float32) or 709 (float64); the squared "
            "surrogate's square past |s_j - s_i| of about 1e19 in float32; float16 scores keep a float32 loss but "
            "an item's gradient, returned in float16, must stay below 65504; LoALoss weights near the dtype's "
            "largest number overflow the weighted sum of the labels' terms. Use float64 scores, a surrogate of "
            "linear growth ('logistic', 'hinge'), or scale the scores (or weights) down."
        )


# Below this many values a batch of logits that all lie in [0, 1] is no evidence of probabilities.
MIN_VALUES_FOR_PROBABILITY_WARNING = 16
# Nor is one batch: a fresh model's small logits can all lie in [0, 1] for a batch or two (the
# default PDAOM recipe's first batch did), probabilities lie there in every batch. The warning
# waits for this many such batches in a row (counted per process).
PROBABILITY_WARNING_BATCHES = 8
_probability_like_batches = 0


class PendingCheck(NamedTuple):
    """A data check made on the device and waiting for its host read: ``values`` to read, and
    ``finish`` the host's part given what was read (it raises or warns). A caller with a read of
    its own to make reads both in one (``ops.bce_ranking``); ``run`` reads them alone."""

    values: Tensor
    finish: Callable[[Sequence[float]], None]

    def run(self) -> None:
        self.finish(self.values.tolist())


def cross_entropy_check(scores: Tensor, labels: Tensor, *, probabilities: bool, mask: Tensor | None = None) -> PendingCheck:
    """The data check of the cross-entropy: 0/1 labels, and finite logits or probabilities in
    [0, 1], read in one host read (``batch_check_values``: 2 to 4 tensor operations). Logits that
    all lie in [0, 1] in ``PROBABILITY_WARNING_BATCHES`` batches in a row look like probabilities:
    a warning (once per process, Python's default filter) says how to declare them. With a
    ``mask``, the rows it leaves out must hold zeros (the op's fill) and do not count for the
    warning."""
    values = batch_check_values(scores, labels, "binary")
    return PendingCheck(values, functools.partial(_finish_cross_entropy_check, scores=scores, labels=labels,
                                                  probabilities=probabilities, mask=mask))


def _finish_cross_entropy_check(values: Sequence[float], *, scores: Tensor, labels: Tensor, probabilities: bool,
                                mask: Tensor | None) -> None:
    global _probability_like_batches
    status, (low, high) = status_of(values), values[:2]
    if status & STATUS_BAD_LABEL:  # the slow path names the first bad label
        labels = labels.to(torch.float64)
        _require_finite_labels(labels)
        check_binary(labels)
    # (a mask's filler rows are 0, which changes neither answer; the slow paths name an entry)
    in_unit_interval = low >= 0 and high <= 1  # False for NaN
    if probabilities:
        if not in_unit_interval:
            outside = ~((scores >= 0) & (scores <= 1))  # NaN is outside
            raise ValueError(
                f"scores must be probabilities in [0, 1] (inputs='probabilities'); {first_entry('scores', scores, outside)}"
            )
        return
    if status & STATUS_BAD_SCORE:
        _require_finite_scores(scores)
    looks_like_probabilities = in_unit_interval and (  # the mask read only then
        scores.numel() if mask is None else int(mask.sum()) * scores.shape[1]) >= MIN_VALUES_FOR_PROBABILITY_WARNING
    _probability_like_batches = _probability_like_batches + 1 if looks_like_probabilities else 0
    if _probability_like_batches == PROBABILITY_WARNING_BATCHES:
        warnings.warn(
            f"every logit of the last {PROBABILITY_WARNING_BATCHES} batches lies in [0, 1]: if the model's heads end in "
            "a sigmoid these are probabilities, and the cross-entropy would treat them as logits; declare them "
            "with inputs='probabilities' (e.g. build_loss('bce+pdaom', inputs='probabilities'))",
            UserWarning,
            stacklevel=callers_level(),
        )


# The frames of this package, of torch (a module's __call__, autograd's apply) and of the frameworks
# that call the metrics (torchmetrics' wrapped compute, Lightning's loops): a warning about the
# user's data names the line outside them that passed it (a metric's, the trainer.fit call).
_FRAMEWORKS = ("torchmetrics", "pytorch_lightning", "lightning", "lightning_fabric")


@functools.lru_cache(maxsize=1)
def _library_files() -> tuple[str, ...]:
    import importlib.util

    folders = [os.path.dirname(os.path.abspath(path)) for path in (__file__, torch.__file__ or "")]
    for name in _FRAMEWORKS:  # located, not imported
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folders += [os.path.abspath(folder) for folder in spec.submodule_search_locations]
    return tuple(folder + os.sep for folder in folders)


def callers_level() -> int:
    """The ``stacklevel`` that makes a warning issued by the calling function name the first frame
    outside mlloss, torch and the frameworks that call it: the caller's line whatever path the
    call took inside them."""
    library = _library_files()
    frame: types.FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(library):
        frame, level = frame.f_back, level + 1
    return level


def first_entry(name: str, values: Tensor, bad: Tensor) -> str:
    """'name[i] = v' (or 'name[i, k] = v') for the first True entry of ``bad``."""
    index = tuple((bad.nonzero()[0]).tolist())
    return f"{name}[{', '.join(map(str, index))}] = {values[index].item()}"


# --------------------------------------------------------------------------- #
# The metrics' inputs (mlloss.metrics)                                         #
# --------------------------------------------------------------------------- #
# The metrics accept what an evaluation set holds: integer or float scores (infinities allowed,
# NaN not), 0/1 labels of any dtype, (N,) real levels or (N, K) binary columns.


def metric_scores(scores: object, *, same_values: bool = False) -> Tensor:
    """Scores of shape (N,) or (N, 1), real and free of NaN, as (N,) (``signed_scores``)."""
    scores = require_tensor(scores, "scores")
    if scores.dtype.is_complex:
        raise TypeError(f"scores must be real; got dtype {scores.dtype}")
    scores = signed_scores(as_vector(scores, "scores"), "scores", same_values=same_values)
    nan = torch.isnan(scores)
    if nan.any():
        raise ValueError(f"scores must not contain NaN; {first_entry('scores', scores, nan)}")
    return scores


def signed_scores(scores: Tensor, name: str, *, same_values: bool = False) -> Tensor:
    """Scores of an unsigned integer dtype wider than a byte as int64 in the same order (torch sorts
    them but cannot search them, nor gather them across processes); other scores as they are.
    uint64 scores have their top bit flipped (0 .. 2^64 - 1 onto -2^63 .. 2^63 - 1), or with
    ``same_values`` (batches that other batches, of any dtype, are compared with: the streaming
    metrics) keep their values and must be below 2^63."""
    if scores.dtype in (torch.uint16, torch.uint32):
        return scores.to(torch.int64)
    if scores.dtype == torch.uint64 and not same_values:
        return scores.view(torch.int64) ^ torch.iinfo(torch.int64).min
    if scores.dtype == torch.uint64:
        wide = scores.view(torch.int64) < 0
        if wide.any():
            raise ValueError(f"uint64 {name} of a streaming metric must be below 2^63 (its batches are compared "
                             f"as int64 with batches of any dtype; the functions of mlloss.metrics take them all); "
                             f"{first_entry(name, scores, wide)}")
        return scores.view(torch.int64)
    return scores


def metric_length(values: Tensor, name: str, num_items: int) -> None:
    if values.shape[0] != num_items:
        raise ValueError(f"{name} must have one row per score ({num_items}); got shape {tuple(values.shape)}")


def metric_binary(labels: object, name: str, num_items: int, *, matrix: bool) -> Tensor:
    """0/1 labels of ``num_items`` rows, as int64 (N, K) if ``matrix`` else (N,)."""
    labels = require_tensor(labels, name)
    if matrix:
        if labels.ndim == 1:
            labels = labels[:, None]
        elif labels.ndim != 2:
            raise ValueError(f"{name} must have shape (N,) or (N, K); got {tuple(labels.shape)}")
    else:
        labels = as_vector(labels, name)
    metric_length(labels, name, num_items)
    bad = (labels != 0) & (labels != 1)
    if bad.any():
        raise ValueError(f"{name} must be binary (0 or 1); {first_entry(name, labels, bad)}")
    return labels.long()


def metric_groups(groups: object, num_items: int) -> Tensor:
    """Integer group ids of shape (N,) or (N, 1), as an int64 vector (N,) (the ids the losses take,
    ``group_vector``: unsigned ids, e.g. hashed user ids, too; a uint64 id over 2^63 wraps to a
    distinct one). The metrics keep the ids of a whole evaluation in one dtype: int64."""
    groups = require_tensor(groups, "groups")
    require_integer_ids(groups, "groups")
    groups = as_vector(groups, "groups")
    metric_length(groups, "groups", num_items)
    return groups.to(torch.int64)


def metric_finite(values: Tensor, name: str) -> None:
    finite = torch.isfinite(values)
    if not finite.all():
        raise ValueError(f"{name} must be finite; {first_entry(name, values, ~finite)}")
