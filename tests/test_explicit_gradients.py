"""The fused (loss, gradient) forms of the PyTorch tier against autograd through a brute force.

Each ``*_loss_and_grad`` function of ``ops.closed_form`` and ``ops.hardest`` computes its gradient
with plain tensor arithmetic; here it is compared with autograd through the float64 brute force of
``reference.py`` (``pair_loss``, ``hardest_loss``, ``laa_loss``: every pair formed, no code shared
with mlloss). The inputs are built as the custom op's PyTorch tier builds them
(``torch_tier.pair_loss_and_grad`` / ``_problems_on_tables``): ``problem_levels`` from the labels,
the ``dense_tables`` of the problem under test, then the cost matrix and the normalisers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
from torch import Tensor

from mlloss.ops import closed_form, hardest
from mlloss.ops.layout import (
    LevelCosts,
    Levels,
    OrdinalLayout,
    dense_tables,
    group_coefficients,
    group_pair_costs,
    run_bounds,
    sortable,
    value_ranks,
)
from mlloss.ops.dispatch import LEVEL_RESOLUTION, problem_levels
from reference import hardest_loss, laa_loss, pair_loss

ALL_PAIRS = {
    "exponential": closed_form.exponential_all_pairs_loss_and_grad,
    "squared": closed_form.squared_all_pairs_loss_and_grad,
    "hinge": closed_form.hinge_all_pairs_loss_and_grad,
}
SURROGATES = ("logistic", "hinge", "squared", "exponential")
TEMPERATURES = (None, 0.5, 1.0, 3.0)
LAA_WEIGHTS = [0.7, 0.2, 1.3]  # non-integer: aggregated levels 0, 0.2, 0.7, 0.9, 1.3, 1.5, 2.0, 2.2
# Against the brute force: the loss to LOSS_RTOL, the gradient to GRAD_RTOL times its largest
# entry. (The exponential and squared closed forms once matched a differentiable implementation
# of theirs bit for bit; the brute force sums in another order. Observed: losses within 6e-15
# (squared, whose moment expansion cancels most), gradients within 1.1e-15; the tolerances leave
# a margin for other CPUs and BLAS libraries.)
LOSS_RTOL = 1e-13
GRAD_RTOL = 1e-13
# LaA from the raw labels (reference.laa_loss): the loss rounds each sum_k w_k y_k to LEVEL_RESOLUTION
# of its own size, at most 2^-41 * 4 < 2e-12 here, which moves a linear cost v_a - v_b (0.2 at least)
# by at most 4e-12, i.e. 2e-11 relative: loss and gradient move by at most about 4e-11.
AGGREGATION_RTOL = 5e-11


@dataclass(frozen=True)
class Case:
    """One batch in input order, with the options of the loss."""

    scores: Tensor  # (N,) float64
    labels: Tensor  # (N, K) float64
    label_weights: list[float] | None  # None: K binary problems (LoA); else one aggregated problem
    groups: Tensor | None  # (N,) int64
    cost: str
    reduction: str
    margin: float
    problem: int = 0  # the problem under test (a label column when label_weights is None)


@dataclass(frozen=True)
class Prepared:
    """A case as the PyTorch tier hands it to the fused forms: sorted scores and the tables."""

    tables: OrdinalLayout
    costs: LevelCosts
    coefficients: Tensor
    sorted_scores: Tensor


def binary(labels) -> tuple[Tensor, None]:
    """Binary label columns, one problem each (AUC / LoA)."""
    labels = torch.as_tensor(labels, dtype=torch.float64)
    return labels.reshape(labels.shape[0], -1), None


def ordinal(levels, weight: float = 1.0) -> tuple[Tensor, list[float]]:
    """One ordinal label column, its level ``weight * label`` (LaA with one column)."""
    return torch.as_tensor(levels, dtype=torch.float64)[:, None], [weight]


def random_case(seed: int, *, integer_scores: bool = False) -> Case:
    """A batch that cycles with the seed through sizes (1, 2 and more items), binary (either of
    two LoA columns), ordinal 0..4 and non-integer LaA-aggregated levels, no groups / many small
    groups (singletons and one-class groups among them), tied scores, both costs, both
    reductions and several margins."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    n = pick((1, 2, 3, 8, 20, 40, 60))
    level_kind = seed % 3
    problem = 0
    if level_kind == 0:  # two binary labels (LoA); the problem under test alternates
        labels, label_weights = binary(torch.randint(0, 2, (n, 2), generator=gen))
        problem = (seed // 6) % 2
    elif level_kind == 1:  # a 0..4 rating
        labels, label_weights = ordinal(torch.randint(0, 5, (n,), generator=gen))
    else:  # LaA: three binary labels aggregated with non-integer weights
        labels, label_weights = (torch.rand(n, 3, generator=gen) < 0.4).to(torch.float64), LAA_WEIGHTS
    grouped = (seed // 3) % 2 == 1
    groups = torch.randint(0, max(1, n // 4), (n,), generator=gen) * 37 - 100 if grouped else None
    if integer_scores:
        scores = torch.randint(-3, 4, (n,), generator=gen).to(torch.float64)
    elif seed % 4 == 0:  # ties: every score drawn from a small pool of continuous values
        pool = torch.randn(max(1, n // 3), generator=gen, dtype=torch.float64) * 2
        scores = pool[torch.randint(pool.numel(), (n,), generator=gen)]
    else:
        scores = torch.randn(n, generator=gen, dtype=torch.float64) * 2
    return Case(
        scores=scores,
        labels=labels,
        label_weights=label_weights,
        groups=groups,
        cost=pick(("linear", "uniform")),
        reduction=pick(("mean", "sum")),
        margin=pick((1.0, 0.5, 2.0)) if not integer_scores else pick((1.0, 2.0)),
        problem=problem,
    )


def prepare(case: Case) -> Prepared:
    """The tables and normalisers as ``torch_tier.pair_loss_and_grad`` and ``_problems_on_tables`` build
    them, for the problem under test alone."""
    levels = problem_levels(case.labels, case.label_weights)
    levels = Levels(levels.rank[case.problem : case.problem + 1], levels.num_ranks, levels.values)
    tables = dense_tables(levels, case.groups)
    costs = LevelCosts.of(tables.level_values, case.cost)
    coefficients, _ = group_coefficients(costs.group_cost(tables.counts), tables)
    return Prepared(tables, costs, coefficients, case.scores.to(torch.float64)[tables.order])


def reference_levels(case: Case) -> Tensor:
    """The problem's level per item, from the labels as the loss defines it: the label (binary
    columns), w_0 y_0 (one ordinal column), or sum_k w_k y_k rounded to nearest (ties up) at
    LEVEL_RESOLUTION * 2^e, 2^e the largest power of two not above it (several aggregated columns:
    ``dispatch.problem_levels`` makes sums that are equal in exact arithmetic one level)."""
    if case.label_weights is None:
        return case.labels[:, case.problem]
    aggregated = case.labels @ torch.tensor(case.label_weights, dtype=torch.float64)
    if case.labels.shape[1] == 1:
        return aggregated

    def rounded(level: float) -> float:
        mantissa, exponent = math.frexp(level)  # level = mantissa 2^exponent, mantissa in [1/2, 1)
        step = LEVEL_RESOLUTION / 2  # the grid of the mantissa: LEVEL_RESOLUTION of 2^(exponent - 1)
        return math.ldexp(math.floor(mantissa / step + 0.5) * step, exponent)

    return torch.tensor([rounded(level) for level in aggregated.tolist()], dtype=torch.float64)


def aggregated_from_raw_labels(case: Case) -> bool:
    """LaA over several columns: ``reference.laa_loss`` sees unrounded levels (AGGREGATION_RTOL)."""
    return case.label_weights is not None and case.labels.shape[1] > 1


def reference_loss(case: Case, pairs: str, *, raw_labels: bool = False, **options):
    """The brute-force loss of the case's problem as a function of the (input-order) scores:
    ``pair_loss`` / ``hardest_loss`` on ``reference_levels``, or with ``raw_labels``, LaA's
    ``laa_loss`` on the labels and weights themselves."""
    common = dict(cost=case.cost, margin=case.margin, reduction=case.reduction, **options)
    if raw_labels:
        return lambda s: laa_loss(s, case.labels, case.groups, case.label_weights, pairs=pairs, **common)
    fn = hardest_loss if pairs == "hardest" else pair_loss
    levels = reference_levels(case)
    return lambda s: fn(s, levels, case.groups, **common)


def autograd_value_and_grad(fn, scores: Tensor) -> tuple[Tensor, Tensor]:
    x = scores.detach().clone().requires_grad_(True)
    value = fn(x)
    if not value.requires_grad:  # a constant zero (no pair to differentiate)
        return value.detach(), torch.zeros_like(x)
    (grad,) = torch.autograd.grad(value, x, allow_unused=True)
    return value.detach(), torch.zeros_like(x) if grad is None else grad


def reference_value_and_grad(
    case: Case, prepared: Prepared, pairs: str, *, raw_labels: bool = False, **options
) -> tuple[Tensor, Tensor]:
    """The brute force's loss and its autograd gradient, in the sorted order of the fused forms."""
    value, grad = autograd_value_and_grad(reference_loss(case, pairs, raw_labels=raw_labels, **options), case.scores)
    return value, grad[prepared.tables.order]


def check_against_brute_force(case: Case, prepared: Prepared, value: Tensor, grad: Tensor, pairs: str, **options) -> None:
    expected_value, expected_grad = reference_value_and_grad(case, prepared, pairs, **options)
    assert_close(value, grad, expected_value, expected_grad, value_rtol=LOSS_RTOL, grad_rtol=GRAD_RTOL)
    if aggregated_from_raw_labels(case):
        expected_value, expected_grad = reference_value_and_grad(case, prepared, pairs, raw_labels=True, **options)
        assert_close(value, grad, expected_value, expected_grad, value_rtol=AGGREGATION_RTOL, grad_rtol=AGGREGATION_RTOL)


def assert_close(
    value: Tensor, grad: Tensor, expected_value: Tensor, expected_grad: Tensor, *, value_rtol: float, grad_rtol: float
) -> None:
    """Loss to ``value_rtol``, gradient to ``grad_rtol`` times its largest entry."""
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    torch.testing.assert_close(value, expected_value.to(value.dtype), rtol=value_rtol, atol=0.0)
    scale = float(expected_grad.abs().max()) if expected_grad.numel() else 0.0
    error = float((grad - expected_grad).abs().max()) if grad.numel() else 0.0
    assert error <= grad_rtol * scale, f"gradient error {error:.3g} vs largest entry {scale:.3g}"


def fused_all_pairs(surrogate: str, case: Case, prepared: Prepared) -> tuple[Tensor, Tensor]:
    """(loss, gradient): the sum of the path's group losses, reduced."""
    extra = () if surrogate == "exponential" else (case.margin,)
    group_losses, grad = ALL_PAIRS[surrogate](prepared.sorted_scores, prepared.tables, prepared.costs,
                                              prepared.coefficients, *extra)
    assert group_losses.shape == (prepared.tables.num_groups,)
    return reduced(case, group_losses.sum(), grad, (prepared.coefficients > 0).sum())


def reduced(case: Case, value: Tensor, grad: Tensor, num_groups: Tensor) -> tuple[Tensor, Tensor]:
    """The loss and gradient of summed group losses reduced as ``torch_tier._problems_on_tables``
    reduces them: ``"mean"`` over the ``num_groups`` groups with a pair."""
    if case.reduction == "mean":
        return value / num_groups.clamp(min=1), grad / num_groups.clamp(min=1)
    return value, grad


def check_all_pairs(surrogate: str, case: Case) -> None:
    prepared = prepare(case)
    value, grad = fused_all_pairs(surrogate, case, prepared)
    if not bool((prepared.coefficients > 0).any()):  # no valid pair: exact zeros
        assert value.item() == 0.0 and not grad.any()
    check_against_brute_force(case, prepared, value, grad, "all", surrogate=surrogate)


@pytest.mark.parametrize("surrogate", tuple(ALL_PAIRS))
@pytest.mark.parametrize("seed", range(48))
def test_all_pairs_fused_gradient_matches_autograd(surrogate, seed):
    check_all_pairs(surrogate, random_case(seed))


@pytest.mark.parametrize("seed", range(48))
def test_hinge_fused_subgradient_is_zero_at_the_kink(seed):
    # Integer scores and margins: many pairs with s_i - s_j == m exactly, where relu'(0) = 0 (the
    # brute force's torch.relu has the same subgradient there).
    check_all_pairs("hinge", random_case(seed, integer_scores=True))


@pytest.mark.parametrize("surrogate", ("exponential", "squared"))
def test_fused_forms_on_a_large_batch(surrogate):
    gen = torch.Generator().manual_seed(7)
    n = 3000
    labels, label_weights = ordinal(torch.randint(0, 4, (n,), generator=gen), weight=0.5)  # levels 0, 0.5, 1, 1.5
    case = Case(
        scores=torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 50,
        labels=labels,
        label_weights=label_weights,
        groups=torch.randint(0, 200, (n,), generator=gen),
        cost="linear",
        reduction="mean",
        margin=1.0,
    )
    check_all_pairs(surrogate, case)


def test_hinge_fused_form_on_a_large_batch():
    gen = torch.Generator().manual_seed(8)
    n = 3000
    labels, label_weights = ordinal(torch.randint(0, 4, (n,), generator=gen))
    case = Case(
        scores=torch.randn(n, generator=gen, dtype=torch.float64),
        labels=labels,
        label_weights=label_weights,
        groups=torch.randint(0, 200, (n,), generator=gen),
        cost="uniform",
        reduction="sum",
        margin=0.5,
    )
    check_all_pairs("hinge", case)


def exponential_over_valid_pairs(scores: Tensor, levels: Tensor, groups: Tensor | None, *, cost: str, reduction: str) -> Tensor:
    """The exponential all-pairs loss, exp evaluated on the valid pairs only (float64 brute force).

    ``reference.pair_loss`` evaluates phi on every (i, j) and masks afterwards: at scores of
    +-600..800 the masked-out pairs' exp(s_j - s_i) overflow to inf and autograd through the mask
    gives 0 * inf = NaN. Here the valid pairs are listed first (from the levels and groups, which
    carry no gradient), so the only exponentials evaluated are the loss's own terms, each at most
    the loss times the group's cost sum: when the loss is finite, so are the terms, their float64
    sum and its autograd gradient; no log domain is needed, and no float128 (not portable). Each
    term's only error is the rounding of s_j - s_i (an absolute error of about |s| * eps in the
    exponent), as small as the fused form's log-domain sums can hope for. A term that underflows
    (e^-1600) is the correctly rounded 0, with gradient 0.
    """
    per_group = []
    for group in [None] if groups is None else torch.unique(groups):
        idx = torch.arange(scores.numel()) if group is None else torch.nonzero(groups == group).flatten()
        s, v = scores[idx], levels[idx]
        upper, lower = torch.nonzero(v[:, None] > v[None, :], as_tuple=True)
        if upper.numel() == 0:
            continue
        c = v[upper] - v[lower] if cost == "linear" else torch.ones_like(v[upper])
        per_group.append((c * torch.exp(s[lower] - s[upper])).sum() / c.sum())
    stacked = torch.stack(per_group)
    return stacked.mean() if reduction == "mean" else stacked.sum()


@pytest.mark.parametrize("spread", (600.0, 800.0))
@pytest.mark.parametrize("grouped", (False, True))
def test_exponential_fused_form_stays_finite_for_extreme_scores(spread, grouped):
    # Scores in five clusters centred at -spread .. spread. With groups (one cluster each),
    # sum exp(-s) and sum exp(s) of a group reach e^600 to e^800: the product form overflows,
    # each pair term exp(s_j - s_i) is moderate. Without groups, no upper item sits in a lower
    # cluster than a lower item: the pair terms are moderate or vanish, and the items far from
    # the middle cluster get gradients down to e^-2 spread.
    gen = torch.Generator().manual_seed(int(spread))
    n = 60
    cluster = torch.arange(n) % 5
    centres = torch.linspace(-spread, spread, 5, dtype=torch.float64)
    scores = centres[cluster] + torch.randn(n, generator=gen, dtype=torch.float64)
    levels = torch.randint(0, 3, (n,), generator=gen).to(torch.float64)
    if not grouped:  # level 0 in clusters 0-2, level 2 in clusters 2-4, level 1 in cluster 2
        levels = torch.where(cluster < 2, 0.0, torch.where(cluster > 2, 2.0, levels))
    groups = cluster if grouped else None
    case = Case(scores, *ordinal(levels), groups, "linear", "mean", 1.0)
    prepared = prepare(case)
    value, grad = fused_all_pairs("exponential", case, prepared)
    assert torch.isfinite(value) and value > 0 and torch.isfinite(grad).all()
    # Log-domain sums carry an absolute error of about spread * eps into every exponent.
    rtol = 8 * spread * torch.finfo(torch.float64).eps
    expected_value, expected_grad = autograd_value_and_grad(
        lambda s: exponential_over_valid_pairs(s, levels, groups, cost="linear", reduction="mean"), scores
    )
    expected_grad = expected_grad[prepared.tables.order]
    assert_close(value, grad, expected_value, expected_grad, value_rtol=rtol, grad_rtol=rtol)
    if not grouped:  # the tiny gradients far from the middle cluster, entry by entry (no entry
        # here subtracts two large pushes, which with groups can cancel to a larger relative error)
        assert torch.equal(grad == 0, expected_grad == 0)
        nonzero = expected_grad != 0
        torch.testing.assert_close(grad[nonzero], expected_grad[nonzero], rtol=rtol, atol=0.0)
    if grouped:  # (the masked-out pairs of reference.pair_loss overflow without groups: NaN gradients)
        expected = reference_value_and_grad(case, prepared, "all", surrogate="exponential")
        assert_close(value, grad, *expected, value_rtol=rtol, grad_rtol=rtol)


def fused_hardest(case: Case, prepared: Prepared, surrogate: str, temperature: float | None,
                  scores: Tensor | None = None):
    """(loss, groups with a level pair, gradient) of the max-violation pairs, reduced over the
    groups as ``torch_tier._problems_on_tables`` reduces them (``scores``: other sorted scores)."""
    group_losses, grad = hardest.hardest_pair_loss_and_grad(
        prepared.sorted_scores if scores is None else scores, prepared.tables, prepared.costs, surrogate,
        case.margin, temperature,
    )
    num_groups = (prepared.tables.level_pairs > 0).sum()
    value, grad = reduced(case, group_losses.sum(), grad, num_groups)
    return value, num_groups, grad


def groups_with_a_level_pair(case: Case) -> int:
    """Groups holding two distinct levels (every level pair a > b has a positive cost)."""
    levels = reference_levels(case)
    if case.groups is None:
        return int(torch.unique(levels).numel() > 1)
    return sum(int(torch.unique(levels[case.groups == u]).numel() > 1) for u in torch.unique(case.groups))


def check_hardest(case: Case, surrogate: str, temperature: float | None) -> None:
    prepared = prepare(case)
    value, num_groups, grad = fused_hardest(case, prepared, surrogate, temperature)
    assert num_groups.item() == groups_with_a_level_pair(case)
    check_against_brute_force(case, prepared, value, grad, "hardest", surrogate=surrogate, temperature=temperature)


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("seed", range(24))
def test_hardest_fused_gradient_matches_autograd(surrogate, seed):
    # (seed // 4: the tied cases of random_case, seed % 4 == 0, meet every temperature)
    check_hardest(random_case(seed), surrogate, TEMPERATURES[(seed // 4) % len(TEMPERATURES)])


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("seed", range(12))
def test_hardest_fused_gradient_at_ties_and_kinks(surrogate, seed):
    # Integer scores: tied extremes in most cells (autograd through the brute force's min / max
    # splits the gradient evenly among them) and hinge margins exactly at the kink.
    check_hardest(random_case(seed, integer_scores=True), surrogate, None)


def test_hard_hardest_splits_the_gradient_among_tied_extremes():
    scores = torch.tensor([1.0, 1.0, 1.0, 3.0, 0.5, 0.5], dtype=torch.float64)
    case = Case(scores, *binary([1, 1, 1, 1, 0, 0]), None, "uniform", "mean", 1.0)
    prepared = prepare(case)
    value, _, grad = fused_hardest(case, prepared, "squared", None)
    pull = 2 * (1.0 - 0.5)  # -dphi/dt = 2 (m - t) at t = min - max = 0.5
    expected = torch.zeros(6, dtype=torch.float64)
    expected[:3] = -pull / 3  # the three tied minima of the upper cell
    expected[4:] = pull / 2  # the two tied maxima of the lower cell
    assert value.item() == 0.25
    assert torch.equal(grad, expected[prepared.tables.order])
    check_hardest(case, "squared", None)


def test_hard_hardest_uses_the_exact_extreme_of_tied_scores():
    # Three tied minima at 7 against a maximum of 6, margin 1: exactly at the hinge's kink, so
    # loss 0 and subgradient 0. (The mean of the tied values, 7 * (1/3) summed three times, is
    # 6.999999999999999: a form that took the extreme as that mean would put this pair an ulp
    # past the kink.)
    scores = torch.tensor([7.0, 7.0, 7.0, 9.0, 6.0, 5.0], dtype=torch.float64)
    case = Case(scores, *binary([1, 1, 1, 1, 0, 0]), None, "uniform", "mean", 1.0)
    value, _, grad = fused_hardest(case, prepare(case), "hinge", None)
    assert value.item() == 0.0 and not grad.any()
    check_hardest(case, "hinge", None)


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize(("seed", "integer_scores"), [(3, False), (15, False), (3, True), (21, True)])  # 7-11 groups with pairs
def test_hard_hardest_on_float32_scores_equals_the_float64_call(surrogate, seed, integer_scores):
    # The PyTorch tier keeps float32 scores in float32 for the hard extremes (exact in any dtype):
    # float32 scores and their float64 copy give the same extremes, hence the float64 call's loss
    # and its gradient rounded once, only on the items that attain their cell's min or max
    # (integer scores: ties in most cells).
    case = random_case(seed, integer_scores=integer_scores)
    case = replace(case, scores=case.scores.float().double())  # values a float32 holds
    prepared = prepare(case)
    value, _, grad = fused_hardest(case, prepared, surrogate, None)
    value32, _, grad32 = fused_hardest(case, prepared, surrogate, None, scores=prepared.sorted_scores.float())
    assert grad32.dtype == torch.float32 and value32.dtype == torch.float64
    assert torch.equal(value32, value)  # per-cell work in float64 on the same extremes
    # (an item that is both extremes of its cell adds two shares: rounded before the sum here)
    torch.testing.assert_close(grad32, grad.float(), rtol=1e-6, atol=2**-23 * float(grad.abs().max()))
    assert torch.equal(grad32 != 0, grad != 0) and grad.any()


@pytest.mark.parametrize("grouped", (False, True))
def test_batches_without_a_valid_pair_give_zero_loss_and_gradient(grouped):
    # One level per group (and one level overall without groups): no valid pair.
    scores = torch.randn(9, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    groups = torch.arange(9) // 3
    labels, label_weights = ordinal(groups.to(torch.float64)) if grouped else binary(torch.ones(9))
    case = Case(scores, labels, label_weights, groups if grouped else None, "linear", "mean", 1.0)
    prepared = prepare(case)
    for surrogate in ALL_PAIRS:
        value, grad = fused_all_pairs(surrogate, case, prepared)
        assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(scores))
    for surrogate in SURROGATES:
        for temperature in (None, 1.0):
            value, num_groups, grad = fused_hardest(case, prepared, surrogate, temperature)
            assert value.item() == 0.0 and num_groups.item() == 0
            assert torch.equal(grad, torch.zeros_like(scores))


def test_groups_without_a_valid_pair_get_zero_gradient():
    gen = torch.Generator().manual_seed(5)
    n = 30
    groups = torch.arange(n) % 5
    levels = torch.randint(0, 3, (n,), generator=gen).to(torch.float64)
    levels[groups == 0] = 1.0  # one-class groups, at two different levels
    levels[groups == 1] = 2.0
    case = Case(torch.randn(n, generator=gen, dtype=torch.float64), *ordinal(levels), groups, "linear", "mean", 1.0)
    prepared = prepare(case)
    silent = prepared.tables.group < 2  # group ids 0 and 1 sort first
    assert not prepared.coefficients[:2].any() and prepared.coefficients[2:].all()
    for surrogate in ALL_PAIRS:
        assert not fused_all_pairs(surrogate, case, prepared)[1][silent].any()
        check_all_pairs(surrogate, case)
    for surrogate in SURROGATES:
        for temperature in (None, 0.5):
            assert not fused_hardest(case, prepared, surrogate, temperature)[2][silent].any()
            check_hardest(case, surrogate, temperature)


@pytest.mark.parametrize("labels", ("binary", "ordinal"))
def test_single_item_batch(labels):
    # (Empty batches never reach these forms: the loss entry point returns 0 below two items,
    # and so does its PyTorch tier before building tables; the forms handle one item anyway.)
    case = Case(torch.full((1,), 0.3, dtype=torch.float64), *(binary if labels == "binary" else ordinal)([1.0]),
                None, "linear", "sum", 1.0)
    prepared = prepare(case)
    for surrogate in ALL_PAIRS:
        value, grad = fused_all_pairs(surrogate, case, prepared)
        assert value.item() == 0.0 and grad.shape == (1,) and not grad.any()
    for surrogate in SURROGATES:
        for temperature in (None, 1.0):
            value, num_groups, grad = fused_hardest(case, prepared, surrogate, temperature)
            assert value.item() == 0.0 and num_groups.item() == 0 and grad.shape == (1,) and not grad.any()


def test_fused_forms_record_no_graph():
    case = random_case(11)
    prepared = prepare(case)
    scores = prepared.sorted_scores.clone().requires_grad_(True)
    prepared = replace(prepared, sorted_scores=scores)
    outputs = [fused_all_pairs(surrogate, case, prepared) for surrogate in ALL_PAIRS]
    outputs += [fused_hardest(case, prepared, surrogate, t) for surrogate in SURROGATES for t in (None, 1.0)]
    assert not any(tensor.requires_grad for output in outputs for tensor in output)


@pytest.mark.parametrize("cost", ["linear", "uniform"])
@pytest.mark.parametrize("num_levels", [1, 2, 7, 40])
def test_level_costs_sum_over_level_pairs_as_the_cost_table_does(cost, num_levels):
    # LevelCosts sums by prefix sums along the levels; the reference forms the (L, L) table
    # c_ab = v_a - v_b (linear) or 1 for v_a > v_b and contracts it.
    gen = torch.Generator().manual_seed(num_levels)
    values = torch.sort(torch.randn(num_levels, generator=gen, dtype=torch.float64) * 5 + 1000).values
    table = torch.rand(6, num_levels, generator=gen, dtype=torch.float64) * 3
    other = torch.randint(0, 4, (6, num_levels), generator=gen)
    gap = values[:, None] - values[None, :]
    matrix = torch.where(gap > 0, gap if cost == "linear" else torch.ones_like(gap), 0.0)
    costs = LevelCosts.of(values, cost)
    torch.testing.assert_close(costs.matrix(), matrix, rtol=0, atol=0)
    torch.testing.assert_close(costs.below(table), table @ matrix.T, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(costs.above(table), table @ matrix, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(costs.pair_sums(table, other), torch.einsum("ga,ab,gb->g", table, matrix, other.double()),
                               rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("seed", range(24))
def test_group_normalisers_and_pair_counts_match_a_count_over_item_pairs(seed):
    # group_pair_costs: the pair count in closed form ((n^2 - sum of cell counts^2) / 2), the linear
    # cost from each item's partners; the reference forms every pair of items of a group.
    case = random_case(seed)
    tables = prepare(case).tables
    level = reference_levels(case)
    groups = torch.zeros(level.numel(), dtype=torch.int64) if case.groups is None else case.groups
    first_of = {int(g): k for k, g in reversed(list(enumerate(groups[tables.order].tolist())))}
    want_cost, want_pairs = torch.zeros(tables.num_groups, dtype=torch.float64), torch.zeros(tables.num_groups)
    for i in range(level.numel()):
        for j in range(level.numel()):
            if groups[i] == groups[j] and level[i] > level[j]:
                u = int(tables.group[first_of[int(groups[i])]])
                want_cost[u] += (level[i] - level[j]) if case.cost == "linear" else 1.0
                want_pairs[u] += 1
    cost, pairs = group_pair_costs(tables, case.cost == "linear")
    assert torch.equal(pairs, want_pairs.double())
    torch.testing.assert_close(cost, want_cost, rtol=AGGREGATION_RTOL, atol=0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.uint8,
                                   torch.bool])
def test_value_ranks_count_the_smaller_values(dtype):
    # each value's rank is the number of values below it (ties equal); the reference counts with
    # a Python loop over the values. The floats are sorted as integers (layout.sortable): signed
    # values, -0.0 beside 0.0, infinities.
    gen = torch.Generator().manual_seed(3)
    values = torch.randint(0, 40, (500,), generator=gen).to(dtype)
    if dtype.is_floating_point:
        values = (values - 20) / 8
        values[:6] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), -0.0, 1e-3])
    values = values[::2]  # strided, as a column of a (N, K) label matrix
    rank = value_ranks(values)
    listed = values.tolist()
    assert rank.tolist() == [sum(other < value for other in listed) for value in listed]


@pytest.mark.parametrize("num", [0, 1, 2, 7, 500])
def test_run_bounds_are_the_binary_searches_of_each_sorted_value(num):
    # layout.run_bounds: each position's run of equal values, [first, one past the last), as the
    # left and right binary searches of its value find it (runs of 1 to many, one run, none)
    gen = torch.Generator().manual_seed(num)
    for high in (1, 3, num + 1):
        ordered = torch.sort(torch.randint(0, high, (num,), generator=gen)).values
        start, stop = run_bounds(ordered)
        assert torch.equal(start, torch.searchsorted(ordered, ordered))
        assert torch.equal(stop, torch.searchsorted(ordered, ordered, right=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_sortable_integers_keep_the_order_and_the_ties_of_the_floats(dtype):
    # layout.sortable: the hinge closed form's merge and value_ranks sort floats as integers;
    # any two values compare as their integers do (-0.0 equals 0.0), and the NaNs, of either
    # sign, come last as torch.sort puts them
    gen = torch.Generator().manual_seed(5)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-30, -1e-30, float("nan"), -float("nan")])
    values = torch.cat([special, torch.randn(200, generator=gen) * 10]).to(dtype)
    keys = sortable(values)
    assert not keys.is_floating_point() and keys.element_size() == values.element_size()
    finite = ~torch.isnan(values)
    a, b = values[finite][:, None], values[finite][None, :]
    ka, kb = keys[finite][:, None], keys[finite][None, :]
    assert torch.equal(a < b, ka < kb) and torch.equal(a == b, ka == kb)
    assert torch.isnan(values[torch.sort(keys, stable=True).indices][-2:]).all()
    assert keys[6] == keys[7]


@pytest.mark.parametrize("seed", range(12))
def test_each_items_partners_are_the_positions_of_its_valid_pairs(seed):
    # OrdinalLayout.partners: the upper partners [group_start, cell_start), the lower ones
    # [cell_end, group_end) of each sorted position, against the pairs formed from the sorted
    # labels and groups position by position
    case = random_case(seed)
    tables = prepare(case).tables
    level = reference_levels(case)[tables.order]
    groups = (torch.zeros_like(level, dtype=torch.int64) if case.groups is None else case.groups)[tables.order]
    partners = tables.partners
    for i in range(level.numel()):
        upper = [j for j in range(level.numel()) if groups[j] == groups[i] and level[j] > level[i]]
        lower = [j for j in range(level.numel()) if groups[j] == groups[i] and level[j] < level[i]]
        assert upper == list(range(int(partners.group_start[i]), int(partners.cell_start[i])))
        assert lower == list(range(int(partners.cell_end[i]), int(partners.group_end[i])))


@pytest.mark.parametrize("seed", range(12))
def test_stacked_problems_keep_each_problems_own_tables(seed):
    # dense_tables lays B problems (label columns) out as one problem of B N items, problem-major:
    # problem b's items hold the sorted positions [b N, (b + 1) N), in the order, groups and cells
    # of its own tables, its groups consecutive; per_problem sums per-group values per problem
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(2, 60, (), generator=gen))
    num_problems = 1 + seed % 4
    labels = (torch.rand(n, num_problems, generator=gen) < 0.3).to(torch.float64)
    if seed % 4 == 3:
        labels[:, 0] = 0  # a problem with one level, beside others with two
    groups = (None, torch.randint(-5, 5, (n,), generator=gen) * 37,
              torch.randint(0, 3, (n,), generator=gen) * 2**61)[seed % 3]  # the last: ids compacted by unique
    levels = problem_levels(labels, None)
    stacked = dense_tables(levels, groups)
    assert stacked.num_problems == num_problems and int(stacked.groups_per_problem.sum()) == stacked.num_groups
    first_group, pairs = 0, []
    for b in range(num_problems):
        alone = dense_tables(Levels(levels.rank[b : b + 1], levels.num_ranks, None), groups)
        items, own_groups = slice(b * n, (b + 1) * n), slice(first_group, first_group + alone.num_groups)
        assert int(stacked.groups_per_problem[b]) == alone.num_groups
        assert torch.equal(stacked.order[items] - b * n, alone.order)
        assert torch.equal(stacked.group[items] - first_group, alone.group)
        assert torch.equal(stacked.level_values[stacked.level[items]], alone.level_values[alone.level])
        assert torch.equal(stacked.group_pairs[own_groups], alone.group_pairs)
        assert torch.equal(stacked.problem_rows(stacked.order)[b], stacked.order[items])
        first_group += alone.num_groups
        pairs.append(float(alone.group_pairs.sum()))
    assert stacked.per_problem(stacked.group_pairs.to(torch.float64)).tolist() == pairs


@pytest.mark.cost_model  # each backend's own choice of path, as a user's call makes it
@pytest.mark.parametrize("surrogate,backend,pairs", [("logistic", "torch", "all"), ("hinge", "exact", "all"),
                                                     ("squared", "exact", "all"), ("hinge", "torch", "all"),
                                                     ("logistic", "torch", "hardest")])
def test_a_level_per_item_builds_no_level_pair_table(surrogate, backend, pairs, monkeypatch):
    # A real-valued label has a level per item: an (L, L) table would be quadratic in the batch
    # (2 GB at 16,384 items; the max-violation pairs' (G, L, L) tables took 10 GB at 2,048 items in
    # 40 groups). Only the exponential closed form, which works on level pairs, may build it.
    import mlloss

    def refuse(self):
        raise AssertionError("an (L, L) cost table was built")

    monkeypatch.setattr(LevelCosts, "matrix", refuse)
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(400, generator=gen, dtype=torch.float64)
    levels = torch.rand(400, generator=gen, dtype=torch.float64)
    groups = torch.arange(400) // 100
    for grouped in (None, groups):
        value = mlloss.LaALoss(surrogate=surrogate, real_levels=True, backend=backend, pairs=pairs)(scores, levels, grouped)
        expected = (laa_loss(scores, levels[:, None], grouped, cost="linear", surrogate=surrogate) if pairs == "all"
                    else hardest_loss(scores, levels, grouped, cost="linear", surrogate=surrogate))
        torch.testing.assert_close(value, expected, rtol=1e-10, atol=0)


@pytest.mark.cost_model
@pytest.mark.parametrize("surrogate", ["hinge", "exponential", "squared"])
def test_closed_forms_give_way_to_the_blocked_sum_where_it_is_cheaper(surrogate, monkeypatch):
    # Choices where one path took at least 1.5x the other's time (one thread): without users
    # (the pairs of 4,096 items) the closed forms; with a level per item (20 users of 30) the
    # hinge form (L N: 348 against 1.9 ms) and the exponential one (G L^2: 431 against 2.7 ms)
    # give way to the blocked sum; so does the hinge form at 16 levels in users of 50 (25
    # against 7.5 ms), where the other two stay (4.5-4.7 against 7.5-8.2 ms). Both paths exact.
    import mlloss
    from mlloss.ops import torch_tier

    calls = []
    closed = torch_tier.CLOSED_FORMS[surrogate]
    monkeypatch.setitem(torch_tier.CLOSED_FORMS, surrogate, lambda *a: calls.append(1) or closed(*a))
    gen = torch.Generator().manual_seed(1)
    cases = [  # (items, levels, groups, closed form expected)
        (4096, torch.randint(0, 2, (4096,), generator=gen).double(), None, True),
        (600, torch.rand(600, generator=gen, dtype=torch.float64), torch.arange(600) % 20,
         None if surrogate == "squared" else False),  # squared: 3.3 against 2.7 ms, too close to pin
        (4096, torch.randint(0, 16, (4096,), generator=gen).double(), torch.arange(4096) % 82,
         surrogate != "hinge"),
    ]
    for num_items, levels, groups, expect_closed in cases:
        scores = torch.randn(num_items, generator=gen, dtype=torch.float64)
        calls.clear()
        value = mlloss.LaALoss(surrogate=surrogate, real_levels=True, backend="exact")(scores, levels, groups)
        assert expect_closed is None or bool(calls) == expect_closed, (num_items, groups is None)
        if num_items <= 600:
            expected = laa_loss(scores, levels[:, None], groups, cost="linear", surrogate=surrogate)
            torch.testing.assert_close(value, expected, rtol=1e-10, atol=0)


@pytest.mark.parametrize("temperature", [None, 0.5])
def test_max_violation_pairs_in_blocks_of_groups_match_the_brute_force(temperature, monkeypatch):
    # Groups of 2-40 cells in buckets of padded widths, cut into blocks of a few groups each.
    import mlloss

    monkeypatch.setattr(hardest, "BLOCK_ELEMENTS", 64)
    gen = torch.Generator().manual_seed(3)
    sizes = torch.randint(1, 41, (25,), generator=gen)
    groups = torch.repeat_interleave(torch.arange(25) * 3 - 7, sizes)
    scores = torch.randn(groups.numel(), generator=gen, dtype=torch.float64)
    levels = torch.round(torch.rand(groups.numel(), generator=gen, dtype=torch.float64) * 30) / 4  # ties and many levels
    leaf = scores.clone().requires_grad_(True)
    value = mlloss.LaALoss(pairs="hardest", temperature=temperature, real_levels=True, backend="torch")(leaf, levels, groups)
    value.backward()
    reference = scores.clone().requires_grad_(True)
    expected = hardest_loss(reference, levels, groups, cost="linear", temperature=temperature)
    expected.backward()
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(leaf.grad, reference.grad, rtol=1e-10, atol=1e-14)
