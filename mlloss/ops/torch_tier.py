"""The PyTorch tier of ``mlloss::pair_loss``: the problems on their sorted cells, stacked (``layout.dense_tables``).

The dispatcher (``dispatch``) sends a call here for ``backend="torch"`` and ``"exact"`` (and
``"auto"`` on the CPU), and for a ``"triton"`` call of fewer than two items (no pair: the Triton
tier, ``kernels/`` or ``mlloss.kernels``, has a kernel for every other). This tier is also the
reference the kernels are tested against (``tests/test_tiers.py``). It builds the tables of
``layout.dense_tables`` (reading sizes on the host), every problem stacked into one (a label
column's problem, or a task column's, is a run of groups of its own), and runs one of three paths
on them, which return each group's loss:

* ``allpairs``: the blocked exact sum over every valid pair, any surrogate, O(valid pairs);
* ``closed_form``: the O(N log N) closed forms (exponential, squared, hinge) for ``exact``;
* ``hardest``: the max-violation pairs (``pairs="hardest"``), O(N).

It returns what the Triton tier returns: (loss, per-problem statistics, gradient), mixed over
the problems, in the dtype of ``fused.accumulation_dtype``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from . import allpairs, hardest
from .closed_form import CLOSED_FORMS, TERM_TABLE_ELEMENTS
from .fused import accumulation_dtype
from .layout import (
    MAX_GROUP_LEVEL_CELLS,
    LevelCosts,
    Levels,
    OrdinalLayout,
    dense_tables,
    group_coefficients,
    group_pair_costs,
)


# The CPU's time for each exact path, in nanoseconds per unit of work (a 2-core VM, torch 2.13),
# fitted to ``benchmarks/closed_form_choice.py`` at 262,144 items in users of 5 to 1,000 items and
# without users, and at 64 to 4,096 items (results/closed-form-choice-*.md): the blocked sum pays per
# item and per valid pair; a closed form per item and per entry of its (group, level) tables, the
# hinge form also per item and lower level and, for its tensor operations, per lower level.
BLOCKED_SUM_NS = {"item": 140, "pair": 18}
CLOSED_FORM_NS = {
    "hinge": {"item": 93, "item and lower level": 75, "group and level": 136, "lower level": 550_000},
    "exponential": {"item": 110, "group and level pair": 42},
    "squared": {"item": 100, "group and own level": 173},
}


# The problems of a call (LoA's labels, task columns) are stacked into one layout of at most this
# many items (``layout.dense_tables``; a problem of more items is one layout): stacking saves each
# further problem's fixed cost (``bce+auc`` of two task columns at 1,024 items: 268 -> 169 aten ops a
# call, 0.8x the time; results/cpu-path-ab-stacked-problems.md), which larger problems do not
# notice, and its tables grow with the items stacked.
STACKED_ITEMS = 1 << 20


class PairOptions(NamedTuple):
    """The options that define a pair loss, as the tiers receive them."""

    cost: str
    surrogate: str
    margin: float
    pairs: str
    temperature: float | None
    reduction: str


def pair_loss_and_grad(
    scores: Tensor,
    levels: Levels,
    groups: Tensor | None,
    *,
    mixing: Tensor | None,
    options: PairOptions,
    exact: bool,
    owned: tuple[int, int] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Every problem on the stacked dense tables (host-synchronising), mixed, with the gradient:
    (loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,)), the
    contract of the Triton tier's ``pair_loss_and_grad``. ``exact``: the closed forms for
    ``pairs="all"`` (the "exact" tier); ``owned=(rank, world_size)``: only that rank's share of
    the groups, with the global normalisers (``dispatch.pair_loss``'s ``partition``).
    Score columns: ``scores`` (N, B), problem b on ``scores[:, b]``; the gradient (N, B) then, each
    problem's own in its column."""
    output_dtype = accumulation_dtype(scores)
    num_problems, num_items = levels.rank.shape
    score_columns = scores.dim() == 2
    if num_items < 2:  # no pair at all
        grads = torch.zeros((num_items, num_problems if score_columns else 1), dtype=output_dtype, device=scores.device)
        stats = torch.zeros(3 * num_problems, dtype=torch.float64, device=scores.device)
        return torch.zeros((), dtype=output_dtype, device=scores.device), stats, grads if score_columns else grads[:, 0]
    # problems stacked into one layout (``layout.dense_tables``), at most STACKED_ITEMS items at a time
    per_pass = max(1, STACKED_ITEMS // num_items)
    passes = [_stacked_problems(scores[:, first : first + per_pass] if score_columns else scores,
                                Levels(levels.rank[first : first + per_pass], levels.num_ranks, levels.values),
                                groups, options, exact, owned)
              for first in range(0, num_problems, per_pass)]
    losses, valid_pairs, groups_with_pairs, grads = (
        torch.cat(values) if len(values) > 1 else values[0] for values in zip(*passes))
    if mixing is None:
        loss = losses.sum()
    else:  # a problem of weight 0 adds nothing, also when its own terms overflow (0 * inf = NaN)
        used = mixing != 0
        loss = torch.where(used, mixing * losses, 0.0).sum()
        grads = torch.where(used[:, None], mixing.to(grads.dtype)[:, None] * grads, 0.0)
    stats = torch.cat([losses, valid_pairs, groups_with_pairs])
    # score columns: each problem's gradient in its column; one set of scores: their sum
    grad = grads.t().contiguous() if score_columns else grads.sum(0) if num_problems > 1 else grads[0]
    return loss.to(output_dtype), stats, grad.to(output_dtype)


def _stacked_problems(scores: Tensor, levels: Levels, groups: Tensor | None, options: PairOptions, exact: bool,
                      owned) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(each problem's loss, valid pairs, groups with pairs (B,) float64, gradient (B, N)) of the
    problems of ``levels``, stacked into one layout."""
    num_problems = levels.num_problems
    tables = dense_tables(levels, groups)
    losses, grad, valid_pairs, groups_with_pairs = _problems_on_tables(
        stacked_scores(scores, num_problems), tables, options, exact, owned)
    # back in stacked input order: the order is a permutation, each position written once (a
    # gather and an indexed add took 6x as long: 34 against 6 ms at 10^6 items)
    grads = tables.problem_rows(grad.new_empty(grad.numel()).index_copy_(0, tables.order, grad))
    return losses, valid_pairs, groups_with_pairs, grads


def stacked_scores(scores: Tensor, num_problems: int) -> Tensor:
    """(B N,) the scores of the stacked problems (``layout.dense_tables``): problem b's at b N + i,
    its column of score columns (N, B), else the one set of scores (N,) again."""
    if scores.dim() == 2:
        return scores.t().reshape(-1)
    return scores.repeat(num_problems) if num_problems > 1 else scores


def _problems_on_tables(scores: Tensor, tables: OrdinalLayout, options: PairOptions, exact: bool, owned):
    """(each problem's loss, the gradient in the tables' order, each problem's valid pairs and
    groups with pairs; (B,) float64 each) of the stacked problems, reduced: ``"mean"`` divides
    each problem's loss and gradient by its groups with a pair (weight 1 each) after the path."""
    losses, grad, valid_pairs, groups_with_pairs = _paths_on_tables(scores, tables, options, exact, owned)
    if options.reduction == "mean":
        counted = groups_with_pairs.clamp(min=1)
        losses = losses / counted
        counted = counted.to(grad.dtype)
        grad = grad / counted if tables.num_problems == 1 else (tables.problem_rows(grad) / counted[:, None]).view(-1)
    return losses, grad, valid_pairs, groups_with_pairs


def _paths_on_tables(scores: Tensor, tables: OrdinalLayout, options: PairOptions, exact: bool, owned):
    """``_problems_on_tables`` before the reduction: each problem's summed group losses."""
    cost, surrogate, margin, pairs, temperature, _ = options
    costs = LevelCosts.of(tables.level_values.to(scores.device), cost)
    if pairs == "hardest":
        # the hard extremes are exact in the scores' own precision; the soft ones need float64
        dtype = accumulation_dtype(scores) if temperature is None else torch.float64
        group_losses, grad = hardest.hardest_pair_loss_and_grad(
            _in_table_order(scores, tables, dtype), tables, costs, surrogate, margin, temperature
        )
        level_pairs = tables.level_pairs.to(torch.float64)
        groups_with_pairs = tables.per_problem(level_pairs.clamp(max=1))  # the groups with a level pair
        return tables.per_problem(group_losses), grad, tables.per_problem(level_pairs), groups_with_pairs

    group_cost, group_pairs = group_pair_costs(tables, costs.linear)  # each group's own levels
    valid_pairs = tables.per_problem(group_pairs)
    coefficients, groups_with_pairs = group_coefficients(group_cost, tables)
    if exact and _closed_form_pays(surrogate, tables, float(valid_pairs.sum())):
        ordered = _in_table_order(scores, tables, torch.float64)
        group_losses, grad = CLOSED_FORMS[surrogate](ordered, tables, costs, coefficients, margin)
    else:
        if owned is not None:  # this rank's share of the groups; the others' coefficients are 0
            # (a group without a valid pair costs nothing: a mask's fillers, one group of their own)
            work = torch.where(group_pairs > 0, tables.group_sizes.to(torch.float64) ** 2, 0.0)
            coefficients = torch.where(_owned_groups(work, *owned), coefficients, 0.0)
        ordered = _in_table_order(scores, tables, accumulation_dtype(scores))
        group_losses, grad = allpairs.all_pairs_loss_and_grad(ordered, tables, costs, coefficients, surrogate, margin,
                                                              left_out=owned is not None)
    return tables.per_problem(group_losses.to(torch.float64)), grad, valid_pairs, groups_with_pairs


def _in_table_order(scores: Tensor, tables: OrdinalLayout, dtype: torch.dtype) -> Tensor:
    """The scores in the tables' order, in ``dtype`` (gathered before the conversion: at 10^6
    float32 scores 5 against 25 ms)."""
    return scores.index_select(0, tables.order).to(dtype)


def _closed_form_pays(surrogate: str, tables: OrdinalLayout, valid_pairs: float) -> bool:
    """Whether the closed form of ``surrogate`` is the cheaper exact path for these tables: its
    ``closed_form_cost`` against the blocked sum's (``BLOCKED_SUM_NS``), which grows with the
    valid pairs. In users of a few items the blocked sum is the cheaper (the closed forms' tables
    cost per group), and with a level per few items (a real-valued label) by far: for 16,384
    items at as many levels the hinge form took 72 s, the blocked sum about 1 s."""
    cost = closed_form_cost(surrogate, tables)
    num_items = tables.order.numel()
    return cost is not None and cost <= BLOCKED_SUM_NS["item"] * num_items + BLOCKED_SUM_NS["pair"] * valid_pairs


def closed_form_cost(surrogate: str, tables: OrdinalLayout) -> float | None:
    """The closed form's time on the CPU in nanoseconds by ``CLOSED_FORM_NS``, or None where its
    tables would pass ``MAX_GROUP_LEVEL_CELLS`` or ``TERM_TABLE_ELEMENTS`` (never built). The
    squared form works on each group's own cells (N + G K, K the most cells of a group), the
    hinge form merges the items with every lower level (L N), the exponential one forms each
    group's (L, L) table of log-costs (G L^2)."""
    num_levels, num_items, num_groups = tables.num_levels, tables.order.numel(), tables.num_groups
    costs = CLOSED_FORM_NS[surrogate]
    if surrogate == "squared":
        cells = num_groups * int(tables.cells_per_group.max())
        if num_items + cells > MAX_GROUP_LEVEL_CELLS:
            return None
        return costs["item"] * num_items + costs["group and own level"] * cells
    if num_groups * num_levels > MAX_GROUP_LEVEL_CELLS:  # the other closed forms work on (G, L) tables
        return None
    if surrogate == "hinge":
        return (costs["item"] * num_items + costs["group and level"] * num_groups * num_levels
                + (costs["item and lower level"] * num_items + costs["lower level"]) * (num_levels - 1))
    if num_levels**2 > TERM_TABLE_ELEMENTS:
        return None
    return costs["item"] * num_items + costs["group and level pair"] * num_groups * num_levels**2


def _owned_groups(work: Tensor, rank: int, world_size: int) -> Tensor:
    """(G,) bool: the groups of ``rank`` when consecutive groups are split into ``world_size``
    runs of about equal ``work`` ((G,) float64: n_u^2, or 0 for a group without a valid pair);
    every rank computes the same split, and every group has one owner."""
    done_before = torch.cumsum(work, 0) - work
    owner = torch.floor((done_before + work / 2) * world_size / work.sum().clamp(min=1)).clamp(max=world_size - 1)
    return owner == rank
