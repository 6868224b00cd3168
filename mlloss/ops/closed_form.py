"""Exact closed forms of the all-pairs sums (loss spec, "Exact identities").

Each ``*_loss_and_grad`` function returns each group's float64 loss
coef_u * sum_{i, j in u, level_i > level_j} c_ij * phi(s_i - s_j)  (G,)
for scores already sorted by the dense tables (``layout.dense_tables``), at a cost of
O(N log N) or O(N + G L^2), together with d (their sum) / d (sorted) scores, computed in the same pass
from plain tensor arithmetic: no autograd graph is recorded (the custom op ``mlloss::pair_loss``
returns this gradient and its backward only scales it, see ``fused``).

* exponential: sum_{a > b} C_ab * A_a * B_b with A_a = sum_{level a} exp(-s), B_b = sum_{level b}
  exp(s), per group; every sum is carried in the log domain (logsumexp per cell, then per group)
  so nothing overflows unless the loss itself does.
* squared: (m - s_i + s_j)^2 expands into per-cell counts, sums and sums of squares of scores
  centred on their group mean (centring leaves differences intact and keeps the expansion exact).
* hinge: for every lower level b, each upper item i pays sum over lower j with s_j > s_i - m of
  (m - s_i + s_j); a merge of {s_j} and {s_i - m} sorted by (group, value) gives the count and
  the sum of those s_j from prefix sums. O(L N log N).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layout import CellTables, LevelCosts, OrdinalLayout, cell_logsumexp, dense_cells, sortable

# The (G, L, L) term table of the exponential form is built in chunks of groups of this many entries.
TERM_TABLE_ELEMENTS = 1 << 24


@torch.no_grad()
def exponential_all_pairs_loss_and_grad(
    scores: Tensor, layout: OrdinalLayout, costs: LevelCosts, group_coefficients: Tensor
) -> tuple[Tensor, Tensor]:
    """(group losses, gradient) of the exponential closed form, every sum in the log domain.

    For item i in cell (u, a):  d loss / d s_i = exp(s_i + log P_ua) - exp(-s_i + log Q_ua), with
    Q_ua = coef_u * sum_b C_ab B_ub (i as the upper item) and P_ua = coef_u * sum_a' C_a'a A_ua'
    (i as the lower item). Each entry is a partial sum of the loss's own terms: finite if the loss is.
    """
    log_upper = dense_cells(layout, cell_logsumexp(-scores, layout), float("-inf"))  # log A
    log_lower = dense_cells(layout, cell_logsumexp(scores, layout), float("-inf"))  # log B
    log_cost = torch.log(costs.matrix())  # -inf where a <= b
    log_coefficients = torch.log(group_coefficients)  # -inf for groups without a valid pair
    # Groups without a valid pair keep -inf: a zero gradient, and no (G, L, L) work.
    log_push_down = torch.full_like(log_upper, float("-inf"))  # log Q
    log_push_up = torch.full_like(log_lower, float("-inf"))  # log P
    valid_groups = torch.nonzero(group_coefficients > 0).flatten()
    chunk = max(1, TERM_TABLE_ELEMENTS // max(1, layout.num_levels**2))
    log_terms = []
    for start in range(0, valid_groups.numel(), chunk):
        ids = valid_groups[start : start + chunk]
        log_coefficient = log_coefficients[ids]
        table = log_upper[ids, :, None] + log_lower[ids, None, :] + log_cost
        log_terms.append(torch.logsumexp(table.flatten(1), dim=1) + log_coefficient)
        log_push_down[ids] = torch.logsumexp(log_lower[ids, None, :] + log_cost, dim=2) + log_coefficient[:, None]
        log_push_up[ids] = torch.logsumexp(log_upper[ids, :, None] + log_cost, dim=1) + log_coefficient[:, None]
    group_losses = scores.new_zeros(layout.num_groups)
    if not log_terms:  # no valid pair anywhere
        return group_losses, torch.zeros_like(scores)
    group_losses.index_copy_(0, valid_groups, torch.exp(torch.cat(log_terms)))
    cell = (layout.group, layout.level)
    grad = torch.exp(scores + log_push_up[cell]) - torch.exp(-scores + log_push_down[cell])
    return group_losses, grad


@torch.no_grad()
def squared_all_pairs_loss_and_grad(
    scores: Tensor,
    layout: OrdinalLayout,
    costs: LevelCosts,
    group_coefficients: Tensor,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(group losses, gradient) of the squared closed form from per-cell moments, O(N + G K), K the
    most levels of a group (``CellTables``).

    With centred scores x, n / S the cell counts / sums and, for item i in cell (u, a),
    n^- = sum_b C_ab n_ub, S^- = sum_b C_ab S_ub (its lower partners), n^+ = sum_a' C_a'a n_ua',
    S^+ = sum_a' C_a'a S_ua' (its upper partners):
    d loss / d s_i = 2 coef_u [(x_i - m) n^- - S^- + (x_i + m) n^+ - S^+].
    """
    centred = _centre_on_group_mean(scores, layout)
    lengths = layout.cell_lengths
    # Each group's own cells, its levels measured from its middle one: with (G, L) tables over every
    # level of the batch, a group's level differences cancelled against the batch's (levels 0.01 and
    # 0.02 beside others near 1e14 lost their pair in float64).
    cells = CellTables.of(layout)
    costs = LevelCosts(cells.values, costs.linear)
    count = cells.table(lengths.to(scores.dtype))
    first = cells.table(torch.segment_reduce(centred, "sum", lengths=lengths))
    second = cells.table(torch.segment_reduce(centred.square(), "sum", lengths=lengths))

    pairs = costs.pair_sums

    # sum over pairs of (m - x_i + x_j)^2 = m^2 + x_i^2 + x_j^2 - 2m x_i + 2m x_j - 2 x_i x_j
    per_group = (
        margin**2 * pairs(count, count)
        + pairs(second, count)
        + pairs(count, second)
        - 2 * margin * pairs(first, count)
        + 2 * margin * pairs(count, first)
        - 2 * pairs(first, first)
    )
    group_losses = group_coefficients * per_group

    weight = 2 * group_coefficients[:, None]
    below_count = weight * costs.below(count)  # 2 coef_u n^-_ua
    below_sum = weight * costs.below(first)  # 2 coef_u S^-_ua
    above_count = weight * costs.above(count)  # 2 coef_u n^+_ua
    above_sum = weight * costs.above(first)  # 2 coef_u S^+_ua
    cell = (layout.group, cells.item_slot(layout))
    grad = (
        (centred - margin) * below_count[cell] - below_sum[cell]
        + (centred + margin) * above_count[cell] - above_sum[cell]
    )
    return group_losses, grad


@torch.no_grad()
def hinge_all_pairs_loss_and_grad(
    scores: Tensor,
    layout: OrdinalLayout,
    costs: LevelCosts,
    group_coefficients: Tensor,
    margin: float,
) -> tuple[Tensor, Tensor]:
    """(group losses, subgradient) of the hinge closed form, O(L N log N).

    A pair (i upper, j lower) is active when s_j > fl(s_i - m) (relu'(0) = 0: a pair at the kink
    is inactive). d loss / d s_i = -sum_{j active with i} w_ij for an upper item and
    + sum_{i active with j} w_ij for a lower item, w_ij = c_ij * coef_u.
    """
    centred = _centre_on_group_mean(scores, layout)
    cell_sums = dense_cells(layout, torch.segment_reduce(centred, "sum", lengths=layout.cell_lengths), 0.0)
    group_losses = scores.new_zeros(layout.num_groups)
    grad = torch.zeros_like(scores)
    for lower_level in range(layout.num_levels - 1):
        pair_weight = costs.between(layout.level, lower_level) * group_coefficients[layout.group]
        group_losses += _hinge_against_level_and_grad(
            scores, centred, layout, lower_level, pair_weight, cell_sums[:, lower_level], margin, grad
        )
    return group_losses, grad


def _hinge_against_level_and_grad(
    scores: Tensor,
    centred: Tensor,
    layout: OrdinalLayout,
    lower_level: int,
    pair_weight: Tensor,
    cell_sum: Tensor,
    margin: float,
    grad: Tensor,
) -> Tensor:
    """Per group (G,): sum_i pair_weight_i * sum_{j in cell (g_i, lower_level)} max(0, m - x_i + x_j)
    over its items i; adds the subgradient into ``grad``.

    One merge serves both sides: lower items (key s_j) and upper queries (key s_i - m) sorted by
    (group, key), lower first on equal keys. The lower items before a query are its inactive
    partners (s_j <= s_i - m); the queries before a lower item are exactly its active partners.
    The merge is two stable integer sorts (the keys as ``sortable`` integers, then the groups),
    and every quantity is carried in merge order and put back once.
    """
    lower = torch.nonzero(layout.level == lower_level).flatten()
    upper = torch.nonzero(pair_weight > 0).flatten()
    if lower.numel() == 0 or upper.numel() == 0:
        return centred.new_zeros(layout.num_groups)
    items = torch.cat([lower, upper])  # the merge's entries: lower items, then the upper queries
    # Activity is decided on the raw scores, the sums use the centred ones: fl(s_i - m) is exact
    # for integer (and most grid) scores, so the kink s_j = s_i - m is found exactly, whereas the
    # rounding of the centring could move a pair at the kink to either side.
    key = torch.cat([scores.index_select(0, lower), scores.index_select(0, upper) - margin])
    group = layout.group.index_select(0, items).to(torch.int32)
    by_key = torch.sort(sortable(key), stable=True).indices
    merged = by_key.index_select(0, torch.sort(group.index_select(0, by_key), stable=True).indices)
    is_lower = merged < lower.numel()  # merge position -> entry, and whether it is a lower item
    centred_at, weight = torch.stack([centred, pair_weight], 1).index_select(0, items.index_select(0, merged)).unbind(1)
    weight = torch.where(is_lower, 0.0, weight)  # a lower item is no query
    lengths = torch.bincount(group, minlength=layout.num_groups)  # merge entries per group, in merge order
    lower_count = layout.counts[:, lower_level]

    def per_entry(per_group: Tensor) -> Tensor:  # each merge entry's value of its group
        return per_group.repeat_interleave(lengths, output_size=merged.numel())

    lower_before = torch.cumsum(is_lower, 0) - per_entry(torch.cumsum(lower_count, 0) - lower_count)
    active_count = (per_entry(lower_count) - lower_before).to(centred.dtype)  # at a query: s_j > s_i - m
    nonempty = lengths[lengths > 0]
    active_sum = per_entry(cell_sum) - _within_group_cumsum(torch.where(is_lower, centred_at, 0.0), nonempty)
    # Each active pair adds m - x_i + x_j > 0, so the exact sum is >= 0, and exactly 0 without an
    # active pair; the prefix-sum differences behind active_sum round, which could leave -1e-16
    # (or a stray +1e-16) where a query has no active pair: keep the exact value there.
    pair_sum = torch.where(
        (active_count > 0) & ~is_lower, (active_count * (margin - centred_at) + active_sum).clamp(min=0), 0.0
    )
    active_weight = _within_group_cumsum(weight, nonempty)  # the queries up to each position
    step = torch.where(is_lower, active_weight, -weight * active_count)
    grad.index_add_(0, items, torch.empty_like(step).scatter_(0, merged, step))  # distinct items
    return torch.segment_reduce(weight * pair_sum, "sum", lengths=lengths)


def _centre_on_group_mean(scores: Tensor, layout: OrdinalLayout) -> Tensor:
    """Scores minus their group mean: pair differences are unchanged."""
    sizes = layout.group_sizes
    means = torch.segment_reduce(scores, "sum", lengths=sizes) / sizes.clamp(min=1)
    return scores - means.index_select(0, layout.group)


def _within_group_cumsum(values: Tensor, lengths: Tensor) -> Tensor:
    """Inclusive cumulative sum restarted at every group (``lengths``: the groups' lengths, none 0).

    Every group's first value is lowered by the previous group's total, so the running sum
    enters each group at about 0 and the rounding left over (the running sum just before the
    group) is subtracted: the error stays of the order of one group's sum instead of growing
    with the sum of all the groups before it (the weights of the gradient are all positive).
    """
    starts = torch.cumsum(lengths, 0) - lengths
    totals = torch.segment_reduce(values, "sum", lengths=lengths)
    shifted = values.index_add(0, starts[1:], -totals[:-1])
    running = torch.cumsum(shifted, 0)
    before = running.index_select(0, starts) - values.index_select(0, starts)
    return running - before.repeat_interleave(lengths, output_size=values.numel())


def _exponential_with_margin(scores, layout, costs, group_coefficients, margin):
    return exponential_all_pairs_loss_and_grad(scores, layout, costs, group_coefficients)


#: Surrogate name -> (sorted scores, tables, level costs, group coefficients, margin) -> (group losses, grad):
#: the surrogates whose all-pairs sum has a closed form (``backend="exact"``, and ``"auto"``'s choice).
CLOSED_FORMS = {
    "exponential": _exponential_with_margin,
    "squared": squared_all_pairs_loss_and_grad,
    "hinge": hinge_all_pairs_loss_and_grad,
}
