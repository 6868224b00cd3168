"""The dispatcher: one entry point for every pairwise loss, one switch of tier.

A loss is B *problems* over the same items, mixed with weights: AUC is one binary problem (the
level is the label), LoA one binary problem per label (mixed by the a_k), LaA one problem whose
level is the aggregated label ybar. ``pair_loss`` calls the op ``mlloss::pair_loss``, which
returns the loss, per-problem statistics and the gradient (computed in the forward pass;
backward only scales it; in eager mode its implementation runs without the dispatcher, see
``fused.fused_loss_op``). Being one opaque op, it lets
``torch.compile(fullgraph=True)`` capture a model step that calls any loss, and labels or groups
that change at a fixed N do not recompile it. Inside, the op checks the data, turns the labels
into the problems' ``Levels`` (``problem_levels``) and hands the same per-item arguments
(scores, levels, groups or their sync-free ``layout.PairLayout``) to a tier:

* ``"triton"``: the fused kernels of the Triton tier, ``kernels/`` (installed as
  ``mlloss.kernels``): CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``; no host
  synchronisation but the optional data-check read. Binary problems (AUC, LoA, PDAOM without a
  temperature) and LaA of a few binary labels (at most ``kernels.dense.MAX_LEVELS`` levels, all
  pairs) of at most ``kernels.dense.MAX_ITEMS`` items take its dense kernels, which need no
  layout;
* ``"torch"``: the PyTorch tier, ``torch_tier`` (the CPU path and the kernels' reference): the
  blocked all-pairs sums of ``allpairs`` on the sorted cells of the problems, stacked into one
  layout, O(valid pairs);
* ``"exact"``: the same tier with the closed forms of ``closed_form`` (exponential, squared,
  hinge), O(N log N), where they cost less than the blocked sums (``torch_tier._closed_form_pays``); ``pairs="hardest"`` runs ``hardest``'s max-violation pairs, O(N).

``resolve_tier`` turns the user's ``backend`` into a tier: ``"auto"`` is ``"exact"`` for
surrogates with a closed form, else ``"triton"`` for CUDA tensors and ``"torch"`` on the CPU;
on CUDA, batches of at most ``kernels.dense.MAX_ITEMS`` items take ``"triton"`` whatever the
surrogate (the closed forms' tables read sizes on the host, the kernels never wait, and at that
size the pairs cost less than the closed forms' sorts).

Data checks (``validate=True``, ``mlloss._validation``): non-finite scores and, for binary
problems, labels other than 0/1 (non-finite labels otherwise) set bits of a status word, and so
does a loss that is not finite (an overflowing exponential surrogate); the status is read once,
at the end of the call, and a set bit raises with the offending entry named. That read is the
call's only host synchronisation on the Triton tier; with ``validate=False`` there is none.

Dtypes (one rule, ``fused.accumulation_dtype``): the loss comes back in float32 (float64 for
float64 scores); the gradient in the scores' dtype. The closed forms and hardest pairs compute in
float64, the all-pairs paths in float32 (fp32 accumulation for fp16/bf16/fp32 scores) or float64.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, overload

import torch
from torch import Tensor

from .. import _validation as check
from .._extras import needs_extra
from . import replay, torch_tier
from .closed_form import CLOSED_FORMS as _CLOSED_FORM_TABLE
from .fused import accumulation_dtype, fused_loss_op
from .layout import Levels, PairLayout, pair_layout, run_ordinals
from .torch_tier import PairOptions

CLOSED_FORMS = tuple(_CLOSED_FORM_TABLE)  # the surrogates with an all-pairs closed form
TIERS = ("triton", "torch", "exact")

# Aggregated labels are compared after rounding each to this resolution relative to its own size
# (40 significant bits of float64's 52), so that weighted sums of binary labels that are equal in
# exact arithmetic (0.1 + 0.2 and 0.3) form one level.
LEVEL_RESOLUTION = 2.0**-40
_DROPPED_BITS = 52 + math.frexp(LEVEL_RESOLUTION)[1] - 1  # 12: the float64 fraction bits rounded away


@dataclass(frozen=True)
class PairStats:
    """The batch facts of a pairwise loss call worth logging (detached), read lazily."""

    stats: Tensor  # (3 * B,) float64: the problems' losses, valid pairs, groups with pairs

    @property
    def num_problems(self) -> int:
        return self.stats.shape[0] // 3

    @property
    def problem_losses(self) -> Tensor:
        """(B,) each problem's loss (LoA: the L_k, unweighted)."""
        return self.stats[: self.num_problems]

    @property
    def valid_pairs(self) -> Tensor:
        """(B,) valid pairs (item pairs; level pairs for pairs="hardest")."""
        return self.stats[self.num_problems : 2 * self.num_problems]

    @property
    def groups_with_pairs(self) -> Tensor:
        """(B,) groups that contributed to the reduction."""
        return self.stats[2 * self.num_problems :]


@dataclass(frozen=True)
class PairLossResult(PairStats):
    """A loss value with its batch facts."""

    loss: Tensor  # the mixed loss, differentiable
    partial: bool = False  # the loss covers only this rank's share of the groups (see ``partition``)


def resolve_tier(backend: str, surrogate: str, pairs: str, device: torch.device, num_items: int | None = None,
                 contiguous_groups: bool = False) -> str:
    """The tier that ``backend`` selects for this surrogate and device (and batch size, which
    ``"auto"`` reads on CUDA; ``contiguous_groups``: the batch has groups, in runs)."""
    if backend == "auto":
        on_kernels = device.type == "cuda" and _triton_available()
        if pairs == "all" and surrogate in CLOSED_FORMS and not (on_kernels and _small(num_items, contiguous_groups)):
            return "exact"
        return "triton" if on_kernels else "torch"
    if backend == "exact" and pairs == "hardest":
        return "torch"  # the max-violation pairs are exact and O(N) on the tables
    return backend


def _small(num_items: int | None, contiguous_groups: bool = False) -> bool:
    """A batch that the dense kernels take (``kernels.dense.MAX_ITEMS``, ``MAX_RUN_ITEMS`` for
    groups in runs); triton is importable."""
    from ..kernels.dense import MAX_ITEMS, MAX_RUN_ITEMS

    return num_items is not None and num_items <= (MAX_RUN_ITEMS if contiguous_groups else MAX_ITEMS)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pair_loss(
    scores: Tensor,
    labels: Tensor,
    groups: Tensor | None,
    mask: Tensor | None = None,
    *,
    mixing: Tensor | None,
    label_weights: list[float] | None,
    cost: str,
    surrogate: str,
    margin: float,
    pairs: str,
    temperature: float | None,
    reduction: str,
    backend: str,
    validate: bool,
    real_levels: bool = False,
    partition: tuple[int, int] | None = None,
    contiguous_groups: bool = False,
) -> PairLossResult:
    """The pairwise loss of ``scores`` (N,) for ``labels`` (N, K) and optional integer ``groups``,
    over the items of the optional (N,) bool ``mask`` (the others, whatever they hold, form no
    pair and get a zero gradient).

    ``label_weights=None``: every label column is a binary problem, mixed by ``mixing`` (K,)
    float64 (the a_k of LoA; None for ones). ``label_weights`` [w_k]: one problem whose level is
    ``sum_k w_k y_k`` (K > 1 binary columns) or ``w_0 y_0`` (one ordinal column, whole numbers
    unless ``real_levels``): LaA.
    Score columns: ``scores`` (N, K) with K binary label columns (``label_weights=None``), problem
    k on its own scores ``scores[:, k]`` (a multi-task model's task heads, one label column each)
    with the same groups and mask, in one call: the loss is ``sum_k mixing_k L_k(scores[:, k])``,
    the gradient (N, K).
    ``partition=(rank, world_size)``, for a batch gathered from every rank: on the "torch"
    all-pairs tier with groups, compute only this rank's groups (contiguous groups of about
    equal sum of n_u^2) with the global normalisers (``partial=True``: the ranks' losses sum to
    the loss); other tiers compute the whole batch. ``contiguous_groups``: a group is a run of
    consecutive equal ids (``layout.run_ordinals``), which the layout keeps in place instead of
    sorting the ids. The batch's size is checked by the caller
    (``losses._PairwiseLoss._checked_batch``: at most ``_validation.MAX_LOSS_ITEMS`` items).
    """
    if scores.dim() == 2 and (label_weights is not None or tuple(labels.shape) != tuple(scores.shape)):
        raise ValueError(f"score columns (scores of shape (N, K)) take K binary label columns of the same shape; got "
                         f"scores {tuple(scores.shape)}, labels {tuple(labels.shape)}"
                         + (", aggregated labels (LaA)" if label_weights is not None else ""))
    flags, values = pair_flags(scores, groups, cost=cost, surrogate=surrogate, margin=margin, pairs=pairs,
                               temperature=temperature, reduction=reduction, backend=backend, validate=validate,
                               real_levels=real_levels, partition=partition, contiguous_groups=contiguous_groups)
    loss, stats, _ = _pair_loss_fused(scores, labels, groups, mask, mixing, label_weights, flags, values)
    # Traced by torch.compile, the function itself: Dynamo skips an lru_cache (and warns that it does).
    decode = _decoded.__wrapped__ if torch.compiler.is_compiling() else _decoded
    _, tier, _, _, _, world_size, _ = decode(tuple(flags), tuple(values))
    partial = splits_pair_work(tier, pairs, groups, world_size)
    return PairLossResult(stats=stats, loss=loss, partial=partial)


def pair_flags(
    scores: Tensor,
    groups: Tensor | None,
    *,
    cost: str = "uniform",
    surrogate: str,
    margin: float,
    pairs: str,
    temperature: float | None,
    reduction: str,
    backend: str,
    validate: bool,
    real_levels: bool = False,
    partition: tuple[int, int] | None = None,
    contiguous_groups: bool = False,
) -> tuple[list[int], list[float]]:
    """The op's host options (``flags``, ``values``: see "The op" below) for ``pair_loss``'s
    arguments, the tier resolved for these scores and groups."""
    tier = resolve_tier(backend, surrogate, pairs, scores.device, scores.shape[0],
                        contiguous_groups=contiguous_groups and groups is not None)
    rank, world_size = partition if partition is not None else (0, 1)
    flags = [_CODES[cost], _CODES[surrogate], _CODES[pairs], _CODES[reduction], _CODES[tier],
             int(validate), int(real_levels), rank, world_size, int(contiguous_groups)]
    return flags, [float(margin), NO_TEMPERATURE if temperature is None else float(temperature)]


# --------------------------------------------------------------------------- #
# The op                                                                      #
# --------------------------------------------------------------------------- #
# The op's host options travel as two short lists, ``flags`` (choices by index, switches, the
# partition) and ``values`` (margin, temperature), decoded once per distinct set (``_decoded``).
# (Through ``torch.library.custom_op`` their count mattered: its wrapper's ``fill_defaults``
# took about 175 us per call at 16 arguments and 20 us at 7. Eager calls no longer pass through
# the operator: ``fused.fused_loss_op``.)
_CHOICES = (check.COSTS, check.SURROGATES, check.PAIR_SETS, check.REDUCTIONS, TIERS)
_CODES = {name: code for choices in _CHOICES for code, name in enumerate(choices)}
assert len(_CODES) == sum(map(len, _CHOICES)), "a name in two choice tables would be coded twice"
NO_TEMPERATURE = -1.0  # temperatures are > 0


@functools.lru_cache(maxsize=256)
def _decoded(flags: tuple[int, ...], values: tuple[float, ...]) -> tuple[PairOptions, str, bool, bool, int, int, bool]:
    """(the pair options, tier, validate, real_levels, rank, world_size, contiguous_groups) from the
    op's ``flags`` and ``values``."""
    cost, surrogate, pairs, reduction, tier = (choices[code] for choices, code in zip(_CHOICES, flags))
    margin, temperature = values
    options = PairOptions(cost, surrogate, margin, pairs, None if temperature == NO_TEMPERATURE else temperature,
                          reduction)
    return options, tier, bool(flags[5]), bool(flags[6]), flags[7], flags[8], bool(flags[9])


def _pair_loss_op(
    scores: Tensor,
    labels: Tensor,
    groups: Optional[Tensor],
    mask: Optional[Tensor],
    mixing: Optional[Tensor],
    label_weights: Optional[list[float]],
    flags: list[int],
    values: list[float],
) -> tuple[Tensor, Tensor, Tensor]:
    """(loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,), or
    (N, B) for score columns)."""
    return _pair_loss(scores, labels, groups, mask, mixing, label_weights, flags, values, replayable=False)


def _pair_loss_eager(*inputs) -> tuple[Tensor, Tensor, Tensor]:
    """``_pair_loss_op`` of an eager call: replayed from a CUDA graph when ``replay`` is on."""
    return _pair_loss(*inputs, replayable=True)


def _pair_loss(scores, labels, groups, mask, mixing, label_weights, flags, values, *, replayable: bool,
               first_check: check.PendingCheck | None = None):
    """``_pair_loss_op``. ``first_check``: another op's data check on the same batch (the
    cross-entropy's, ``bce_ranking``), finished before this op's status is acted on; on the Triton
    tier with the checks on both are read in one host read."""
    options, tier, validate, real_levels, rank, world_size, contiguous = _decoded(tuple(flags), tuple(values))
    label_rule = _label_rule(labels, label_weights is not None, real_levels)
    if first_check is not None and not (validate and tier == "triton" and scores.shape[0] >= 2):
        first_check.run()
        first_check = None
    if tier != "triton" or scores.shape[0] < 2:
        if contiguous and groups is not None:
            groups = run_ordinals(groups)
        return _torch_tier_loss(scores, labels, groups, mask, mixing, label_weights, options, tier, validate,
                                label_rule, (rank, world_size))
    tensors = (scores, labels, groups, mask, mixing)
    host = (None if label_weights is None else tuple(label_weights), tuple(flags), tuple(values))
    if replayable and replay.replaying(scores):  # from the call's CUDA graph, once captured (``replay``)
        loss, stats, grad, status = replay.run(_kernel_work, tensors, host, keep=3)
    else:
        loss, stats, grad, status = _kernel_work(*tensors, *host)
    if status is not None:  # validate
        if first_check is None:
            code = int(status.item())
        else:  # one read: the status (small bits, exact in any float dtype) and the other check's values
            code, *first_values = torch.cat([status, first_check.values]).tolist()
            first_check.finish(first_values)
        _raise_for(int(code), scores, labels, groups, mask, label_rule)
    return loss, stats, grad


def _kernel_work(
    scores: Tensor,
    labels: Tensor,
    groups: Tensor | None,
    mask: Tensor | None,
    mixing: Tensor | None,
    label_weights: tuple[float, ...] | None,
    flags: tuple[int, ...],
    values: tuple[float, ...],
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The Triton tier's part of ``_pair_loss_op``: (loss, stats, grad, the data-check status or
    None with the checks off), computed on the device without a host read (what a CUDA graph
    captures: ``replay``)."""
    options, _, validate, real_levels, _, _, contiguous = _decoded(flags, values)
    cost, surrogate, margin, pairs, temperature, reduction = options
    aggregated = label_weights is not None
    score_columns = scores.dim() == 2  # (N, B): problem b on scores[:, b], as a (B, N) row of its own
    # the kernels index flat memory: a strided view (a task's column of (N, K) scores, an expanded
    # group id) is copied; a contiguous tensor is passed as it is (no op)
    scores = (scores.t() if score_columns else scores).contiguous()
    groups, mask, mixing = (None if t is None else t.contiguous() for t in (groups, mask, mixing))
    num_items = scores.shape[-1]
    # Small batches of binary problems (AUC, PDAOM, a bce+ ranking term, LoA) and of LaA's few
    # label patterns (an ordinal column's levels only the data tell): every pair in registers, no
    # layout, and the mask read by the kernels; the other paths get the masked items set apart.
    # Contiguous groups bound each row's pairs by its run: larger batches take the dense kernels too.
    contiguous = contiguous and groups is not None
    dense = pairs == "all" or (temperature is None and not aggregated)
    if dense:
        with needs_extra("triton", 'backend="triton"'):
            from ..kernels import dense as dense_kernels
        dense = num_items <= (dense_kernels.MAX_RUN_ITEMS if contiguous else dense_kernels.MAX_ITEMS) and (
            label_weights is None or 2 < _pattern_levels(labels, label_weights) <= dense_kernels.MAX_LEVELS
        )
    if mask is not None and not dense:
        # the masked items' group of their own breaks the runs: the runs' ordinals rank the real
        # items' groups (no sort of the ids), and the layout sorts the groups, as without runs
        scores, labels, groups = without_masked(scores, labels, run_ordinals(groups) if contiguous and groups is not None else groups, mask,
                                                score_rows=score_columns, ranked=contiguous)
        mask, contiguous = None, False
    status = None
    patterns = aggregated and _ranks_patterns(labels)  # LaA's binary columns, ranked by one launch
    if validate:  # fused into the kernels' launches, read after the call
        status = torch.zeros(1, dtype=torch.int32, device=scores.device)
        if aggregated and not patterns:  # an ordinal column
            with needs_extra("triton", 'backend="triton"'):
                from ..kernels.pairwise import check_batch

            check_batch(scores, labels, status, label_rule=_label_rule(labels, aggregated, real_levels), mask=mask)
    # Binary label columns the kernels read as the caller passed them (a transposed view, no int32
    # copy), making the data check in the same launch: the dense kernels, and the counting layout
    # (all pairs and max-violation pairs of binary problems read no rank after it); LaA's binary
    # columns in the launch that ranks their patterns.
    if aggregated:
        levels = problem_levels(labels, label_weights, on_kernels=True,
                                check=(scores, status, mask) if patterns and status is not None else None)
    else:
        levels = Levels(labels.t(), 2, None)
    kernel_check = (scores, status) if status is not None and not aggregated else None
    if dense:
        result = dense_kernels.dense_loss_and_grad(
            scores, levels.rank, groups, mask, mixing=mixing, surrogate=surrogate, margin=margin,
            hardest=pairs == "hardest", reduction=reduction, status=status,
            values=levels.values if aggregated else None, linear=cost == "linear", check=kernel_check is not None,
            score_columns=score_columns, contiguous_groups=contiguous,
        )
    else:  # the layout of (group, level) cells, then all pairs or max-violation pairs
        with needs_extra("triton", 'backend="triton"'):  # imports triton only when asked for
            from ..kernels.hardest import hardest_loss_and_grad
            from ..kernels.pairwise import pair_loss_and_grad

        layout = kernel_layout(levels, groups, check=kernel_check,
                               score_columns=score_columns, contiguous_groups=contiguous)
        if pairs == "all":
            result = pair_loss_and_grad(
                scores, levels, layout, mixing=mixing, cost=cost, surrogate=surrogate, margin=margin,
                reduction=reduction, status=status, score_columns=score_columns,
            )
        else:  # max-violation pairs, hard or soft: of binary problems, and of LaA's levels (its
            # label patterns or an ordinal column) by a walk over each group's cells
            result = hardest_loss_and_grad(
                scores, levels, layout, mixing=mixing, surrogate=surrogate, margin=margin,
                temperature=temperature, reduction=reduction, status=status, cost=cost, score_columns=score_columns,
            )
    if status is not None:  # validate
        status = _with_narrow_gradient(status, scores, result[2])
    return (*result, status)


def _torch_tier_loss(scores, labels, groups, mask, mixing, label_weights, options, tier, validate, label_rule,
                     partition) -> tuple[Tensor, Tensor, Tensor]:
    """The PyTorch tiers' part of ``_pair_loss_op``: the closed forms, or the blocked all-pairs
    sums and their tables, with the data checked first by tensor operations."""
    # decided on the caller's groups (a mask gives ungrouped items a group of their own below)
    owned = partition if splits_pair_work(tier, options.pairs, groups, partition[1]) else None
    if mask is not None:
        scores, labels, groups = without_masked(scores, labels, groups, mask)
    if validate:
        check.raise_for_status(check.data_status(scores, labels, label_rule), scores, labels, label_rule)
    levels = problem_levels(labels, label_weights)
    result = torch_tier.pair_loss_and_grad(scores, levels, groups, mixing=mixing, options=options,
                                           exact=tier == "exact", owned=owned)
    if validate:  # the loss read on the host: this tier reads it anyway (its sizes), one read, no tensor ops
        status = 0 if math.isfinite(result[0]) else check.STATUS_OVERFLOW
        _raise_for(int(_with_narrow_gradient(status, scores, result[2])), scores, labels, groups, None, label_rule)
    return result


@overload
def _with_narrow_gradient(status: Tensor, scores: Tensor, grad: Tensor) -> Tensor: ...


@overload
def _with_narrow_gradient(status: int, scores: Tensor, grad: Tensor) -> Tensor | int: ...


def _with_narrow_gradient(status: Tensor | int, scores: Tensor, grad: Tensor) -> Tensor | int:
    """``status`` (a tensor, or an int read on the host) with the overflow bit also set where
    the gradient, computed in float32 for float16 scores, overflows float16, the dtype it goes
    back in."""
    if torch.finfo(scores.dtype).max >= torch.finfo(grad.dtype).max:
        return status
    return status | check.overflow_status(grad.to(scores.dtype).sum(dtype=torch.float32))


def _raise_for(code: int, scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None,
               label_rule: str) -> None:
    """Raise the error of a set status ``code``, naming an offending entry among the items that count."""
    if code and mask is not None:
        scores, labels, _ = without_masked(scores, labels, groups, mask)
    check.raise_for_status(code, scores, labels, label_rule)


def kernel_layout(levels: Levels, groups: Tensor | None, *, check: tuple[Tensor, Tensor] | None = None,
                  score_columns: bool = False, contiguous_groups: bool = False) -> PairLayout:
    """The Triton tier's ``PairLayout``: for at most ``kernels.levels.COUNTING_LEVELS`` levels a
    counting sort inside each group (two launches, three past ``kernels.levels.SCAN_BLOCKS``
    blocks of positions, after one sort of the group ids if there are groups), else
    ``layout.pair_layout``'s sorts and binary searches; the same layout. ``check`` (binary label
    columns as passed: two levels) makes the data check in the counting launch (``score_columns``:
    of (B, N) scores, a row per problem). ``contiguous_groups``: the groups are the runs of equal
    ids, which the counting layout keeps in place (no sort of the ids)."""
    from ..kernels.levels import COUNTING_LEVELS, counting_layout

    if levels.num_ranks <= COUNTING_LEVELS:
        return counting_layout(levels, groups, check=check, score_columns=score_columns,
                               contiguous_groups=contiguous_groups)
    assert check is None, "binary columns as passed take the counting layout, where their data check runs"
    return pair_layout(levels, run_ordinals(groups) if contiguous_groups and groups is not None else groups)


def without_masked(scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor, *,
                   score_rows: bool = False, ranked: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The batch with the items outside ``mask`` in a group of their own, all at one level: they
    form no valid pair, so no loss term, normaliser or gradient sees them (loss spec, "Groups":
    groups without a valid pair drop out of the reduction). Their scores and labels, which may be
    anything (a fixed-size batch's filler rows), become 0, so the data check passes them and no
    sum over a cell meets a NaN; the gradient of a masked score is exactly 0.

    With groups, an item's group becomes its group's rank among the N sorted ids (< N; ``ranked``:
    the groups are such ranks already, at most N, as ``layout.run_ordinals`` gives, and are
    taken as they are) and a masked item's N + 1, which no real group can take; without, the real
    items are group 0 and the masked ones group 1. The new groups are int32 (ranks ``ranked`` are
    kept in their dtype): the layout's sort of them does half the work of int64 ids' (a radix sort
    passes over every bit). Sync-free and shape-static, like the layout. (The dense kernels read the
    mask instead.)"""
    dropped = ~mask
    if groups is None:
        groups = dropped.to(torch.int32)
    else:
        groups = (groups.masked_fill(dropped, mask.shape[0] + 1) if ranked
                  else torch.searchsorted(torch.sort(groups).values, groups, out_int32=True)
                  .masked_fill_(dropped, mask.shape[0] + 1))
    # score columns: (N, B) scores, or the kernels' (B, N) rows (``score_rows``)
    dropped_scores = dropped[:, None] if scores.dim() == 2 and not score_rows else dropped
    return scores.masked_fill(dropped_scores, 0), labels.masked_fill(dropped[:, None], 0), groups


def splits_pair_work(tier: str, pairs: str, groups: Tensor | None, world_size: int) -> bool:
    """Whether each rank computes only its share of a gathered batch's groups (``pair_loss``'s
    ``partition``): the PyTorch tier's blocked sums over all pairs, with groups to split."""
    return tier == "torch" and pairs == "all" and groups is not None and world_size > 1


def _pair_loss_fake(scores, labels, groups, mask, mixing, label_weights, *args):
    num_problems = 1 if label_weights is not None else labels.shape[1]
    return (
        scores.new_empty((), dtype=accumulation_dtype(scores)),
        scores.new_empty(3 * num_problems, dtype=torch.float64),
        scores.new_empty(scores.shape, dtype=accumulation_dtype(scores)),  # (N, B) for score columns
    )


_pair_loss_fused = fused_loss_op(_pair_loss_op, _pair_loss_fake, eager=_pair_loss_eager)


# --------------------------------------------------------------------------- #
# Problems and data checks                                                    #
# --------------------------------------------------------------------------- #
def _label_rule(labels: Tensor, aggregated: bool, real_levels: bool) -> str:
    """What the data check requires of the labels (``_validation.LABEL_RULES``)."""
    if not aggregated:
        return "binary"
    if labels.shape[1] > 1:
        return "summed-binary"
    return "real" if real_levels else "integer"

# LaA with up to this many binary columns ranks its 2^K label patterns through host tables.
MAX_PATTERN_COLUMNS = 12


def _ranks_patterns(labels: Tensor) -> bool:
    """Whether LaA's (N, K) labels are ranked by their pattern of K binary columns (``problem_levels``)."""
    return 1 < labels.shape[1] <= MAX_PATTERN_COLUMNS


def problem_levels(labels: Tensor, label_weights: Sequence[float] | None, *, on_kernels: bool = False,
                   check: tuple[Tensor, Tensor, Tensor | None] | None = None) -> Levels:
    """The problems' levels as ranks into a value table (see ``layout.Levels``).

    * label columns (``label_weights=None``): one problem per column, the 0/1 label its rank;
    * several aggregated binary columns: the pattern sum_k 2^k y_k indexes host-computed tables of
      its level's rank and value (levels equal in exact arithmetic, 0.1 + 0.2 and 0.3, are one);
      ``on_kernels``: ranked by one Triton launch (``kernels.levels``) instead of five ops, which
      with ``check`` (scores, status, mask) also makes the batch's data check;
    * one aggregated column (an ordinal label): its rank is the number of smaller values.
    """
    if check is not None and not (on_kernels and label_weights is not None and _ranks_patterns(labels)):
        raise ValueError("problem_levels makes the data check only when a launch ranks label patterns")
    if label_weights is None:
        # (K, N) contiguous: the kernels index problems by rows. (``to`` returns int32 labels as
        # they are, a transposed view: ``contiguous`` copies them then, and is a no-op otherwise.)
        return Levels(labels.t().to(torch.int32, memory_format=torch.contiguous_format).contiguous(), 2, None)
    num_labels = labels.shape[1]
    if _ranks_patterns(labels):
        powers, rank_table, values = _pattern_tables(tuple(label_weights), labels.device)
        if on_kernels:
            from ..kernels.levels import pattern_ranks

            return Levels(pattern_ranks(labels, rank_table, check), values.shape[1], values)
        # The mask keeps labels other than 0/1 (reported by the data check) from indexing out of range.
        pattern = (labels.to(torch.float64) @ powers).to(torch.int64).bitwise_and_(rank_table.numel() - 1)
        return Levels(rank_table[pattern][None], values.shape[1], values)
    # The level as one (1, N) row: the problem's row of ranks, and its sorted values, as they come.
    if num_labels == 1:  # the column's transposed view; LaA's default weight 1 leaves it as it is
        level = labels.t().to(torch.float64).contiguous()  # (a float64 column of a wider tensor: copied)
        if label_weights[0] != 1:
            level = level * label_weights[0]
    else:
        level = rounded_levels(labels.to(torch.float64) @ labels.new_tensor(label_weights, dtype=torch.float64))[None]
    ordered = torch.sort(level).values
    rank = torch.searchsorted(ordered, level, out_int32=level.numel() < 2**31)
    # The values as they are: each tier measures a group's from its own levels (the PyTorch tier
    # from its middle level, the kernels from its lowest: ``kernels.pairwise.position_values``),
    # so that a group of levels 0.01 and 0.02 beside others near 1e14 keeps its pair.
    return Levels(rank, level.numel(), ordered)


def _pattern_levels(labels: Tensor, label_weights: Sequence[float]) -> int:
    """How many levels LaA's aggregated label can take when it is ranked through the pattern
    tables (several binary columns, ``problem_levels``); 0 for an ordinal column or too many
    columns, whose levels are known only from the data."""
    if not _ranks_patterns(labels):
        return 0
    return _pattern_tables(tuple(label_weights), labels.device)[2].shape[1]


def rounded_levels(aggregated: Tensor) -> Tensor:
    """Weighted sums of binary labels (float64, >= 0) rounded to nearest at ``LEVEL_RESOLUTION`` of
    their own size (the low 12 fraction bits cleared, a carry going into the exponent): the levels
    of LaA's aggregated label, for the losses and the metrics alike. Each level keeps its relative
    precision whatever the other weights (a level of 1e-13 beside weights near 1e12 is not 0), and
    sums the grid holds (1.5, 3.25, any weight of at most 40 significant bits) stay exact."""
    half = 1 << (_DROPPED_BITS - 1)
    bits = aggregated.contiguous().view(torch.int64)
    return ((bits + half) & -(1 << _DROPPED_BITS)).view(torch.float64)


@functools.lru_cache(maxsize=64)
def _pattern_tables(label_weights: tuple[float, ...], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(2^k for each column, the rank of each label pattern's level, the (1, L) level values),
    on ``device``; computed once per weights and device."""
    num_labels = len(label_weights)
    patterns = torch.arange(2**num_labels)
    bits = (patterns[:, None] >> torch.arange(num_labels)) & 1
    sums = rounded_levels(bits.to(torch.float64) @ torch.tensor(label_weights, dtype=torch.float64))
    values, rank = torch.unique(sums, return_inverse=True)
    powers = 2.0 ** torch.arange(num_labels, dtype=torch.float64)
    powers, rank, values = cached_on_device(
        (powers, rank.to(torch.int32), values[None]), device,
        built_by="LaALoss over several label columns builds its level tables on its first call for each label weights "
                 "and device")
    return powers, rank, values


def cached_on_device(tensors: tuple[Tensor, ...], device: torch.device, *, built_by: str) -> tuple[Tensor, ...]:
    """Copies of CPU ``tensors`` on ``device`` for a cache that outlives the call (``built_by``: what
    builds them and when, for the error inside a CUDA graph's capture). On CUDA another
    thread allocates them, on the caller's stream: torch.compile(mode="reduce-overhead") allocates
    what the calling thread creates during a CUDA graph's warm-up run from the graph's private pool,
    and requires every live tensor there to be an output of the graph (a cache filled inside
    raised "Detected 3 tensor(s) in the cudagraph pool not tracked as outputs" on an H100)."""
    if device.type != "cuda":
        return tuple(t.to(device) for t in tensors)
    with torch.cuda.device(device):
        stream, capturing = torch.cuda.current_stream(), torch.cuda.is_current_stream_capturing()
    if capturing:
        raise RuntimeError(
            f"{built_by}, which copies them to the GPU: make that call (a warm-up step) before capturing a CUDA graph"
        )

    def copy() -> tuple[Tensor, ...]:
        with torch.cuda.stream(stream):
            return tuple(t.to(device) for t in tensors)  # from pageable memory: done when it returns

    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(copy).result()
