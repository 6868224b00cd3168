"""The PyTorch tier of ``mlloss::pair_loss``: every problem on its sorted cells (``layout.dense_tables``).

The dispatcher (``dispatch``) sends a call here for ``backend="torch"`` and ``"exact"`` (and
``"auto"`` on the CPU), and for a ``"triton"`` call of fewer than two items (no pair: the Triton
tier, ``kernels/`` or ``mlloss.kernels``, has a kernel for every other). This tier is also the
reference the kernels are tested against (``tests/test_tiers.py``). Per problem it builds the tables of
``layout.dense_tables`` (reading sizes on the host) and runs one of its three paths:

* ``allpairs``: the blocked exact sum over every valid pair, any surrogate, O(valid pairs);
* ``closed_form``: the O(N log N) closed forms (exponential, squared, hinge) for ``exact``;
* ``hardest``: the max-violation pairs (``pairs="hardest"``), O(N).

It returns what the Triton tier returns: (loss, per-problem statistics, gradient), mixed over
the problems, in the dtype of ``fused.accumulation_dtype``.
"""

from __future__ import annotations

import math
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
    group_pair_costs,
    reduction_coefficients,
)


# How much more work than the blocked sum over the valid pairs a closed form may take (see
# ``_closed_form_pays``).
CLOSED_FORM_WORK = 8


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
    """Every problem on its dense tables (host-synchronising), mixed, with the gradient:
    (loss (), stats (3 * B,) float64 [losses, valid pairs, groups with pairs], grad (N,)), the
    contract of the Triton tier's ``pair_loss_and_grad``. ``exact``: the closed forms for
    ``pairs="all"`` (the "exact" tier); ``owned=(rank, world_size)``: only that rank's share of
    the groups, with the global normalisers (``dispatch.pair_loss``'s ``partition``).
    Score columns: ``scores`` (N, B), problem b on ``scores[:, b]``; the gradient (N, B) then, each
    problem's own in its column."""
    output_dtype = accumulation_dtype(scores)
    num_problems, num_items = levels.rank.shape
    score_columns = scores.dim() == 2
    stats = torch.zeros((3, num_problems), dtype=torch.float64, device=scores.device)
    grads = torch.zeros((num_items, num_problems if score_columns else 1), dtype=output_dtype, device=scores.device)
    loss = torch.zeros((), dtype=torch.float64, device=scores.device)
    if num_items >= 2:  # else no pair at all
        for problem in range(num_problems):
            tables = dense_tables(levels, groups, problem)
            problem_loss, problem_grad, valid_pairs, groups_with_pairs = _problem_on_tables(
                scores[:, problem] if score_columns else scores, tables, options, exact, owned
            )
            grad = grads[:, problem if score_columns else 0]
            if mixing is None:
                loss = loss + problem_loss.to(torch.float64)
                grad[tables.order] += problem_grad.to(output_dtype)
            else:  # a problem of weight 0 adds nothing, also when its own terms overflow (0 * inf = NaN)
                weight = mixing[problem]
                loss = loss + torch.where(weight != 0, weight * problem_loss.to(torch.float64), 0.0)
                grad[tables.order] += torch.where(weight != 0, weight * problem_grad, 0.0).to(output_dtype)
            stats[:, problem] = torch.stack([problem_loss.to(torch.float64), valid_pairs,
                                             groups_with_pairs.to(torch.float64)])
    return loss.to(output_dtype), stats.flatten(), grads if score_columns else grads[:, 0]


def _problem_on_tables(scores: Tensor, tables: OrdinalLayout, options: PairOptions, exact: bool, owned):
    """(loss, gradient in the tables' order, valid pairs, groups with pairs) of one problem."""
    cost, surrogate, margin, pairs, temperature, reduction = options
    costs = LevelCosts.of(tables.level_values.to(scores.device), cost)
    if pairs == "hardest":
        loss, groups_with_pairs, grad = hardest.hardest_pair_loss_and_grad(
            scores.to(torch.float64)[tables.order], tables, costs, surrogate, margin, reduction, temperature
        )
        cells = tables.cells_per_group.to(torch.float64)
        level_pairs = (cells * (cells - 1) / 2).sum()  # the pairs of a group's distinct levels
        return loss, grad, level_pairs, groups_with_pairs

    group_cost, group_pairs = group_pair_costs(tables, costs.linear)  # each group's own levels
    valid_pairs = group_pairs.sum()
    groups_with_pairs = (group_cost > 0).sum()
    coefficients = reduction_coefficients(group_cost, reduction)
    if exact and _closed_form_pays(surrogate, tables):
        ordered = scores.to(torch.float64)[tables.order]
        loss, grad = CLOSED_FORMS[surrogate](ordered, tables, costs, coefficients, margin)
        return loss, grad, valid_pairs, groups_with_pairs
    if owned is not None:  # this rank's share of the groups; the others' coefficients are 0
        # (a group without a valid pair costs nothing: a mask's fillers, one group of their own)
        work = torch.where(group_pairs > 0, tables.group_sizes.to(torch.float64) ** 2, 0.0)
        coefficients = torch.where(_owned_groups(work, *owned), coefficients, 0.0)
    ordered = scores.to(accumulation_dtype(scores))[tables.order]
    loss, grad = allpairs.all_pairs_loss_and_grad(ordered, tables, costs, coefficients, surrogate, margin)
    return loss, grad, valid_pairs, groups_with_pairs


def _closed_form_pays(surrogate: str, tables: OrdinalLayout) -> bool:
    """Whether the closed form of ``surrogate`` is the cheaper exact path for these tables. Its
    work grows with the levels: each works on (G, L) tables over every level of the batch (the
    squared form's whole work, N + G L), the hinge form merges the items with every lower level
    (L N log N), the exponential one forms each group's (L, L) table of log-costs (G L^2, and
    L^2 memory); the blocked sum grows with the pairs (sum_u n_u^2 / 2). A real-valued label in
    many groups made the squared form's tables quadratic in the batch (6-9 s for 3,000 items in
    pairs) and refused 20,000 items in 10,000 groups. With a level per few
    items (a real-valued label) the blocked sum wins: for 16,384 items at as many levels the
    hinge form took 72 s on the CPU, the blocked sum about 1 s. The closed form is kept unless
    it needs ``CLOSED_FORM_WORK`` times the pairs' work (the hinge form's constants are lower:
    at 1M items in 20,000 groups it takes 0.6 s, the blocked sum 1.0 s)."""
    num_levels, num_items, num_groups = tables.num_levels, tables.order.numel(), tables.num_groups
    pair_work = float((tables.group_sizes.to(torch.float64) ** 2).sum()) / 2
    if surrogate == "squared":  # O(N + G K) on each group's own cells
        work = num_items + num_groups * int(tables.cells_per_group.max())
        return work <= CLOSED_FORM_WORK * pair_work and work <= MAX_GROUP_LEVEL_CELLS
    if num_groups * num_levels > MAX_GROUP_LEVEL_CELLS:  # the other closed forms work on (G, L) tables
        return False
    if surrogate == "hinge":
        work = (num_levels - 1) * num_items * max(1.0, math.log2(num_items)) + num_groups * num_levels
    else:
        if num_levels**2 > TERM_TABLE_ELEMENTS:
            return False
        work = num_groups * num_levels**2
    return work <= CLOSED_FORM_WORK * pair_work


def _owned_groups(work: Tensor, rank: int, world_size: int) -> Tensor:
    """(G,) bool: the groups of ``rank`` when consecutive groups are split into ``world_size``
    runs of about equal ``work`` ((G,) float64: n_u^2, or 0 for a group without a valid pair);
    every rank computes the same split, and every group has one owner."""
    done_before = torch.cumsum(work, 0) - work
    owner = torch.floor((done_before + work / 2) * world_size / work.sum().clamp(min=1)).clamp(max=world_size - 1)
    return owner == rank
