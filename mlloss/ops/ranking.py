"""One entry point for every pairwise loss: B problems, optional groups, one switch of tier.

A loss is B *problems* over the same items, mixed with weights: AUC is one binary problem (the
level is the label), LoA one binary problem per label (mixed by the a_k), LaA one problem whose
level is the aggregated label ybar. ``pair_loss`` calls the custom op ``mlloss::pair_loss``,
which returns the loss, per-problem statistics and the gradient (computed in the forward pass;
backward only scales it). Being one opaque op, it lets ``torch.compile(fullgraph=True)`` capture
a model step that calls any loss, and labels or groups that change at a fixed N do not
recompile it. Inside, every tier takes the same per-item arguments (scores, levels, groups) and
the same sync-free ``PairLayout``:

* ``"triton"``: the fused kernels of ``mlloss.kernels`` (CUDA tensors, or CPU tensors under
  ``TRITON_INTERPRET=1``): no host synchronisation but the optional data-check read;
* ``"torch"``: the blocked all-pairs path of ``allpairs`` on the dense (group, level) tables
  (the CPU path and the kernels' reference; O(valid pairs) work);
* ``"exact"``: the closed forms of ``closed_form`` (exponential, squared, hinge), O(N log N);
* ``pairs="hardest"``: the max-violation pairs of ``hardest``, O(N), on the tables.

``resolve_tier`` turns the user's ``backend`` into a tier: ``"auto"`` is ``"exact"`` for
surrogates with a closed form, else ``"triton"`` for CUDA tensors and ``"torch"`` on the CPU.

Data checks (``validate=True``): non-finite scores and, for binary problems, labels other than
0/1 (non-finite labels otherwise) set bits of a status word, and so does a loss that is not
finite (an overflowing exponential surrogate); the status is read once, at the end of the
call, and a set bit raises with the offending entry named. That read is the call's only host
synchronisation on the Triton tier; with ``validate=False`` there is none.

Dtypes (one rule, ``fused.accumulation_dtype``): the loss comes back in float32 (float64 for
float64 scores); the gradient in the scores' dtype. The closed forms and hardest pairs compute in
float64, the all-pairs paths in float32 (fp32 accumulation for fp16/bf16/fp32 scores) or float64.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from .. import _validation as check
from .._extras import needs_extra
from . import allpairs, closed_form, hardest
from .fused import accumulation_dtype, register_fused_gradient
from .layout import (
    Levels,
    dense_tables,
    group_pair_cost,
    pair_cost_matrix,
    pair_layout,
    reduction_coefficients,
)

CLOSED_FORMS = ("exponential", "squared", "hinge")
TIERS = ("triton", "torch", "exact")

# Aggregated labels are compared after rounding to this relative resolution, so that weighted sums
# of binary labels that are equal in exact arithmetic (0.1 + 0.2 and 0.3) form one level.
LEVEL_RESOLUTION = 2.0**-40



class PairOptions(NamedTuple):
    """The options that define a pair loss, as the tiers receive them."""

    cost: str
    surrogate: str
    margin: float
    pairs: str
    temperature: float | None
    reduction: str


@dataclass(frozen=True)
class PairLossResult:
    """A loss value with the batch facts worth logging beside it (detached), read lazily."""

    loss: Tensor  # the mixed loss, differentiable
    stats: Tensor  # (3 * B,) float64: the problems' losses, valid pairs, groups with pairs
    partial: bool = False  # the loss covers only this rank's share of the groups (see ``partition``)

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


def resolve_tier(backend: str, surrogate: str, pairs: str, device: torch.device) -> str:
    """The tier that ``backend`` selects for this surrogate and device."""
    if backend == "auto":
        if pairs == "all" and surrogate in CLOSED_FORMS:
            return "exact"
        return "triton" if device.type == "cuda" and _triton_available() else "torch"
    if backend == "exact" and pairs == "hardest":
        return "torch"  # the max-violation pairs are exact and O(N) on the tables
    return backend


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
) -> PairLossResult:
    """The pairwise loss of ``scores`` (N,) for ``labels`` (N, K) and optional int64 ``groups``.

    ``label_weights=None``: every label column is a binary problem, mixed by ``mixing`` (K,)
    float64 (the a_k of LoA; None for ones). ``label_weights`` [w_k]: one problem whose level is
    ``sum_k w_k y_k`` (K > 1 binary columns) or ``w_0 y_0`` (one ordinal column, whole numbers
    unless ``real_levels``): LaA.
    ``partition=(rank, world_size)``, for a batch gathered from every rank: on the "torch"
    all-pairs tier with groups, compute only this rank's groups (contiguous groups of about
    equal sum of n_u^2) with the global normalisers (``partial=True``: the ranks' losses sum to
    the loss); other tiers compute the whole batch.
    """
    tier = resolve_tier(backend, surrogate, pairs, scores.device)
    rank, world_size = partition if partition is not None else (0, 1)
    loss, stats, _ = torch.ops.mlloss.pair_loss(
        scores, labels, groups, mixing, label_weights, cost, surrogate, float(margin), pairs,
        temperature, reduction, tier, validate, real_levels, rank, world_size,
    )
    partial = tier == "torch" and pairs == "all" and groups is not None and world_size > 1
    return PairLossResult(loss, stats, partial)


# --------------------------------------------------------------------------- #
# The op                                                                      #
# --------------------------------------------------------------------------- #
@torch.library.custom_op("mlloss::pair_loss", mutates_args=())
def _pair_loss_op(
    scores: Tensor,
    labels: Tensor,
    groups: Optional[Tensor],
    mixing: Optional[Tensor],
    label_weights: Optional[list[float]],
    cost: str,
    surrogate: str,
    margin: float,
    pairs: str,
    temperature: Optional[float],
    reduction: str,
    tier: str,
    validate: bool,
    real_levels: bool,
    rank: int,
    world_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,))."""
    options = PairOptions(cost, surrogate, margin, pairs, temperature, reduction)
    aggregated = label_weights is not None
    label_rule = _label_rule(labels, aggregated, real_levels)
    on_kernels = tier == "triton" and scores.shape[0] >= 2
    status = None
    if validate and on_kernels:  # fused into the kernels' launches, read at the end
        with needs_extra("triton", 'backend="triton"'):
            from ..kernels.pairwise import check_batch

        status = torch.zeros(1, dtype=torch.int32, device=scores.device)
        check_batch(scores, labels, status, label_rule=label_rule)
    elif validate:  # the PyTorch tiers check first, with tensor operations
        check.raise_for_status(check.data_status(scores, labels, label_rule), scores, labels, label_rule)
    levels = problem_levels(labels, label_weights)
    if on_kernels and pairs == "all":
        with needs_extra("triton", 'backend="triton"'):  # imports triton only when asked for
            from ..kernels.pairwise import pair_loss_and_grad

        result = pair_loss_and_grad(
            scores, levels, pair_layout(levels, groups), mixing=mixing, cost=cost,
            surrogate=surrogate, margin=margin, reduction=reduction, status=status,
        )
    elif on_kernels and not aggregated:  # max-violation pairs of binary problems
        with needs_extra("triton", 'backend="triton"'):
            from ..kernels.hardest import hardest_loss_and_grad

        result = hardest_loss_and_grad(
            scores, levels, pair_layout(levels, groups, tie_scores=scores), mixing=mixing,
            surrogate=surrogate, margin=margin, temperature=temperature, reduction=reduction, status=status,
        )
    else:  # the tables (LaA's max-violation pairs over every pair of levels included)
        owned = (rank, world_size) if world_size > 1 and groups is not None and tier == "torch" else None
        result = _tables_tier(scores, levels, groups, mixing, options, "torch" if on_kernels else tier, owned)
        if validate:
            overflow = check.overflow_status(result[0])
            status = overflow if status is None else status | overflow
    if validate:
        check.raise_for_status(int(status.item()), scores, labels, label_rule)
    return result


@_pair_loss_op.register_fake
def _pair_loss_fake(scores, labels, groups, mixing, label_weights, *args):
    num_problems = 1 if label_weights is not None else labels.shape[1]
    return (
        scores.new_empty((), dtype=accumulation_dtype(scores)),
        scores.new_empty(3 * num_problems, dtype=torch.float64),
        scores.new_empty(scores.shape, dtype=accumulation_dtype(scores)),
    )


register_fused_gradient(_pair_loss_op)


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


def problem_levels(labels: Tensor, label_weights: list[float] | None) -> Levels:
    """The problems' levels as ranks into a value table (see ``layout.Levels``).

    * label columns (``label_weights=None``): one problem per column, the 0/1 label its rank;
    * several aggregated binary columns: the pattern sum_k 2^k y_k indexes host-computed tables of
      its level's rank and value (levels equal in exact arithmetic, 0.1 + 0.2 and 0.3, are one);
    * one aggregated column (an ordinal label): its rank is the number of smaller values.
    """
    if label_weights is None:
        # (K, N) contiguous: the kernels index problems by rows.
        return Levels(labels.t().to(torch.int32, memory_format=torch.contiguous_format), 2, None)
    num_labels = labels.shape[1]
    if 1 < num_labels <= MAX_PATTERN_COLUMNS:
        powers, rank_table, values = _pattern_tables(tuple(label_weights), labels.device)
        # The mask keeps labels other than 0/1 (reported by the data check) from indexing out of range.
        pattern = (labels.to(torch.float64) @ powers).to(torch.int64).bitwise_and_(rank_table.numel() - 1)
        return Levels(rank_table[pattern][None], values.shape[1], values)
    if num_labels == 1:
        level = labels[:, 0].to(torch.float64) * label_weights[0]
    else:
        level = _rounded_levels(labels.to(torch.float64) @ labels.new_tensor(label_weights, dtype=torch.float64), label_weights)
    ordered = torch.sort(level).values
    return Levels(torch.searchsorted(ordered, level, out_int32=level.numel() < 2**31)[None], level.numel(), ordered[None])


def _rounded_levels(aggregated: Tensor, label_weights) -> Tensor:
    resolution = sum(label_weights) * LEVEL_RESOLUTION
    return torch.round(aggregated / resolution) * resolution


@functools.lru_cache(maxsize=64)
def _pattern_tables(label_weights: tuple[float, ...], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(2^k for each column, the rank of each label pattern's level, the (1, L) level values),
    on ``device``; computed once per weights and device."""
    num_labels = len(label_weights)
    patterns = torch.arange(2**num_labels)
    bits = (patterns[:, None] >> torch.arange(num_labels)) & 1
    sums = _rounded_levels(bits.to(torch.float64) @ torch.tensor(label_weights, dtype=torch.float64), label_weights)
    values, rank = torch.unique(sums, return_inverse=True)
    powers = 2.0 ** torch.arange(num_labels, dtype=torch.float64)
    return powers.to(device), rank.to(torch.int32).to(device), values[None].to(device)


# --------------------------------------------------------------------------- #
# The PyTorch tiers: dense (group, level) tables per problem                   #
# --------------------------------------------------------------------------- #
def _tables_tier(
    scores: Tensor,
    levels: Levels,
    groups: Tensor | None,
    mixing: Tensor | None,
    options: PairOptions,
    tier: str,
    owned: tuple[int, int] | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every problem on its dense tables (host-synchronising), mixed, with the gradient."""
    output_dtype = accumulation_dtype(scores)
    num_problems, num_items = levels.rank.shape
    stats = torch.zeros((3, num_problems), dtype=torch.float64, device=scores.device)
    grad = torch.zeros(num_items, dtype=output_dtype, device=scores.device)
    loss = torch.zeros((), dtype=torch.float64, device=scores.device)
    if num_items < 2:  # no pair at all
        return loss.to(output_dtype), stats.flatten(), grad
    layout = pair_layout(levels, groups)
    for problem in range(num_problems):
        tables = dense_tables(layout, levels, problem)
        problem_loss, problem_grad, valid_pairs, groups_with_pairs = _problem_on_tables(
            scores, tables, options, tier, owned
        )
        weight = 1.0 if mixing is None else mixing[problem]
        loss = loss + weight * problem_loss.to(torch.float64)
        grad[tables.order] += (weight * problem_grad).to(output_dtype)
        stats[:, problem] = torch.stack([problem_loss.to(torch.float64), valid_pairs, groups_with_pairs.to(torch.float64)])
    return loss.to(output_dtype), stats.flatten(), grad


def _problem_on_tables(scores: Tensor, tables, options: PairOptions, tier: str, owned):
    """(loss, gradient in the tables' order, valid pairs, groups with pairs) of one problem."""
    cost, surrogate, margin, pairs, temperature, reduction = options
    cost_matrix = pair_cost_matrix(tables.level_values, cost).to(scores.device)
    if pairs == "hardest":
        loss, groups_with_pairs, grad = hardest.hardest_pair_loss_and_grad(
            scores.to(torch.float64)[tables.order], tables, cost_matrix, surrogate, margin, reduction, temperature
        )
        present = tables.counts > 0
        level_pairs = group_pair_cost(present, (cost_matrix > 0).to(torch.float64)).sum()
        return loss, grad, level_pairs, groups_with_pairs

    group_cost = group_pair_cost(tables.counts, cost_matrix)
    valid_pairs = group_pair_cost(tables.counts, (cost_matrix > 0).to(torch.float64)).sum()
    groups_with_pairs = (group_cost > 0).sum()
    coefficients = reduction_coefficients(group_cost, reduction)
    if tier == "exact":
        ordered = scores.to(torch.float64)[tables.order]
        closed = {
            "exponential": lambda: closed_form.exponential_all_pairs_loss_and_grad(ordered, tables, cost_matrix, coefficients),
            "squared": lambda: closed_form.squared_all_pairs_loss_and_grad(ordered, tables, cost_matrix, coefficients, margin),
            "hinge": lambda: closed_form.hinge_all_pairs_loss_and_grad(ordered, tables, cost_matrix, coefficients, margin),
        }
        loss, grad = closed[surrogate]()
        return loss, grad, valid_pairs, groups_with_pairs
    if owned is not None:  # this rank's share of the groups; the others' coefficients are 0
        coefficients = torch.where(_owned_groups(tables.group_sizes, *owned), coefficients, 0.0)
    ordered = scores.to(accumulation_dtype(scores))[tables.order]
    loss, grad = allpairs.all_pairs_loss_and_grad(ordered, tables, cost_matrix, coefficients, surrogate, margin)
    return loss, grad, valid_pairs, groups_with_pairs


def _owned_groups(group_sizes: Tensor, rank: int, world_size: int) -> Tensor:
    """(G,) bool: the groups of ``rank`` when consecutive groups are split into ``world_size``
    runs of about equal work (sum of n_u^2); every rank computes the same split."""
    work = group_sizes.to(torch.float64) ** 2
    done_before = torch.cumsum(work, 0) - work
    owner = torch.floor((done_before + work / 2) * world_size / work.sum()).clamp(max=world_size - 1)
    return owner == rank
