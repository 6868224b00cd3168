"""The fused (loss, gradient) forms of the O(N log N) paths against autograd.

Each ``*_loss_and_grad`` function computes its gradient with plain tensor arithmetic; here it is
compared with autograd through the differentiable form it replaces (same layout, same sorted
float64 scores) and with autograd through the float64 brute force of ``reference.py``. The
inputs are built with ``ordinal_layout`` and the normalisers of ``ops.layout``, as the loss
entry point builds them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from torch import Tensor

from mlloss.ops import closed_form, hardest
from mlloss.ops.layout import (
    OrdinalLayout,
    group_pair_cost,
    ordinal_layout,
    pair_cost_matrix,
    reduction_coefficients,
)
from reference import hardest_loss, pair_loss

# (differentiable form, fused form) per closed-form surrogate.
ALL_PAIRS = {
    "exponential": (closed_form.exponential_all_pairs, closed_form.exponential_all_pairs_loss_and_grad),
    "squared": (closed_form.squared_all_pairs, closed_form.squared_all_pairs_loss_and_grad),
    "hinge": (closed_form.hinge_all_pairs, closed_form.hinge_all_pairs_loss_and_grad),
}
SURROGATES = ("logistic", "hinge", "squared", "exponential")
TEMPERATURES = (None, 0.5, 1.0, 3.0)
LOSS_RTOL = 1e-13  # loss against the differentiable form
GRAD_RTOL = 1e-12  # gradient against autograd, relative to its largest entry
REFERENCE_RTOL = 1e-12  # both against the brute force


@dataclass(frozen=True)
class Case:
    """One batch in input order, with the options of the loss."""

    scores: Tensor  # (N,) float64
    levels: Tensor  # (N,) float64
    groups: Tensor | None  # (N,) int64
    cost: str
    reduction: str
    margin: float


@dataclass(frozen=True)
class Prepared:
    """A case as the loss entry point hands it to the paths: sorted scores and the tables."""

    layout: OrdinalLayout
    cost_matrix: Tensor
    coefficients: Tensor
    sorted_scores: Tensor


def random_case(seed: int, *, integer_scores: bool = False) -> Case:
    """A batch that cycles with the seed through sizes (1, 2 and more items), binary, integer
    and non-integer (LaA-aggregated) levels, no groups / many small groups (singletons and
    one-class groups among them), tied scores, both costs, both reductions and several margins."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    n = pick((1, 2, 3, 8, 20, 40, 60))
    level_kind = seed % 3
    if level_kind == 0:  # binary label
        levels = torch.randint(0, 2, (n,), generator=gen).to(torch.float64)
    elif level_kind == 1:  # a 0..4 rating
        levels = torch.randint(0, 5, (n,), generator=gen).to(torch.float64)
    else:  # LaA: three binary labels aggregated with non-integer weights
        labels = (torch.rand(n, 3, generator=gen) < 0.4).to(torch.float64)
        levels = labels @ torch.tensor([0.7, 0.2, 1.3], dtype=torch.float64)
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
        levels=levels,
        groups=groups,
        cost=pick(("linear", "uniform")),
        reduction=pick(("mean", "sum")),
        margin=pick((1.0, 0.5, 2.0)) if not integer_scores else pick((1.0, 2.0)),
    )


def prepare(case: Case) -> Prepared:
    layout = ordinal_layout(case.levels, case.groups)
    cost_matrix = pair_cost_matrix(layout.level_values, case.cost)
    coefficients = reduction_coefficients(group_pair_cost(layout.counts, cost_matrix), case.reduction)
    return Prepared(layout, cost_matrix, coefficients, case.scores[layout.order])


def autograd_value_and_grad(fn, scores: Tensor) -> tuple[Tensor, Tensor]:
    x = scores.detach().clone().requires_grad_(True)
    value = fn(x)
    if not value.requires_grad:  # a constant zero (no pair to differentiate)
        return value.detach(), torch.zeros_like(x)
    (grad,) = torch.autograd.grad(value, x, allow_unused=True)
    return value.detach(), torch.zeros_like(x) if grad is None else grad


def reference_value_and_grad(fn, case: Case, prepared: Prepared, **options) -> tuple[Tensor, Tensor]:
    """The brute force's loss and its gradient in the sorted order of the fused forms."""
    value, grad = autograd_value_and_grad(
        lambda s: fn(
            s, case.levels, case.groups, cost=case.cost, margin=case.margin, reduction=case.reduction, **options
        ),
        case.scores,
    )
    return value, grad[prepared.layout.order]


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
    fused = ALL_PAIRS[surrogate][1]
    extra = () if surrogate == "exponential" else (case.margin,)
    return fused(prepared.sorted_scores, prepared.layout, prepared.cost_matrix, prepared.coefficients, *extra)


def differentiable_all_pairs(surrogate: str, case: Case, prepared: Prepared) -> tuple[Tensor, Tensor]:
    form = ALL_PAIRS[surrogate][0]
    extra = () if surrogate == "exponential" else (case.margin,)
    return autograd_value_and_grad(
        lambda s: form(s, prepared.layout, prepared.cost_matrix, prepared.coefficients, *extra),
        prepared.sorted_scores,
    )


def check_all_pairs(surrogate: str, case: Case) -> None:
    prepared = prepare(case)
    value, grad = fused_all_pairs(surrogate, case, prepared)
    if not bool((prepared.coefficients > 0).any()):  # (the differentiable exponential form fails here)
        assert value.item() == 0.0 and not grad.any()
        return
    if surrogate != "hinge" or not bool((case.scores == case.scores.round()).all()):
        # Integer scores put pairs exactly at the hinge's kink, where the differentiable form's
        # centring rounding may pick either subgradient: compared with the brute force only.
        expected_value, expected_grad = differentiable_all_pairs(surrogate, case, prepared)
        assert_close(value, grad, expected_value, expected_grad, value_rtol=LOSS_RTOL, grad_rtol=GRAD_RTOL)
        if surrogate != "hinge":  # the same float operations: the same loss, bit for bit
            assert torch.equal(value, expected_value)
    expected_value, expected_grad = reference_value_and_grad(pair_loss, case, prepared, surrogate=surrogate)
    assert_close(value, grad, expected_value, expected_grad, value_rtol=REFERENCE_RTOL, grad_rtol=REFERENCE_RTOL)


@pytest.mark.parametrize("surrogate", tuple(ALL_PAIRS))
@pytest.mark.parametrize("seed", range(48))
def test_all_pairs_fused_gradient_matches_autograd(surrogate, seed):
    check_all_pairs(surrogate, random_case(seed))


@pytest.mark.parametrize("seed", range(48))
def test_hinge_fused_subgradient_is_zero_at_the_kink(seed):
    # Integer scores and margins: many pairs with s_i - s_j == m exactly, where relu'(0) = 0.
    check_all_pairs("hinge", random_case(seed, integer_scores=True))


@pytest.mark.parametrize("surrogate", ("exponential", "squared"))
def test_fused_forms_on_a_large_batch(surrogate):
    gen = torch.Generator().manual_seed(7)
    n = 3000
    case = Case(
        scores=torch.randn(n, generator=gen, dtype=torch.float64) * 3 + 50,
        levels=torch.randint(0, 4, (n,), generator=gen).to(torch.float64) * 0.5,
        groups=torch.randint(0, 200, (n,), generator=gen),
        cost="linear",
        reduction="mean",
        margin=1.0,
    )
    check_all_pairs(surrogate, case)


def test_hinge_fused_form_on_a_large_batch():
    gen = torch.Generator().manual_seed(8)
    n = 3000
    case = Case(
        scores=torch.randn(n, generator=gen, dtype=torch.float64),
        levels=torch.randint(0, 4, (n,), generator=gen).to(torch.float64),
        groups=torch.randint(0, 200, (n,), generator=gen),
        cost="uniform",
        reduction="sum",
        margin=0.5,
    )
    check_all_pairs("hinge", case)


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
    case = Case(scores, levels, cluster if grouped else None, "linear", "mean", 1.0)
    prepared = prepare(case)
    value, grad = fused_all_pairs("exponential", case, prepared)
    assert torch.isfinite(value) and value > 0 and torch.isfinite(grad).all()
    # Log-domain sums carry an absolute error of about spread * eps into every exponent.
    rtol = 8 * spread * torch.finfo(torch.float64).eps
    assert_close(value, grad, *differentiable_all_pairs("exponential", case, prepared), value_rtol=rtol, grad_rtol=rtol)
    if grouped:  # (the brute force's masked-out pairs overflow without groups: NaN gradients)
        expected = reference_value_and_grad(pair_loss, case, prepared, surrogate="exponential")
        assert_close(value, grad, *expected, value_rtol=rtol, grad_rtol=rtol)


def fused_hardest(case: Case, prepared: Prepared, surrogate: str, temperature: float | None):
    return hardest.hardest_pair_loss_and_grad(
        prepared.sorted_scores, prepared.layout, prepared.cost_matrix, surrogate, case.margin,
        case.reduction, temperature,
    )


def check_hardest(case: Case, surrogate: str, temperature: float | None, *, differentiable: bool = True) -> None:
    prepared = prepare(case)
    value, num_groups, grad = fused_hardest(case, prepared, surrogate, temperature)
    if differentiable:
        expected_value, expected_grad = autograd_value_and_grad(
            lambda s: hardest.hardest_pair_loss(
                s, prepared.layout, prepared.cost_matrix, surrogate, case.margin, case.reduction, temperature
            )[0],
            prepared.sorted_scores,
        )
        expected_groups = hardest.hardest_pair_loss(
            prepared.sorted_scores, prepared.layout, prepared.cost_matrix, surrogate, case.margin,
            case.reduction, temperature,
        )[1]
        assert torch.equal(num_groups, expected_groups)
        assert_close(value, grad, expected_value, expected_grad, value_rtol=LOSS_RTOL, grad_rtol=GRAD_RTOL)
    expected_value, expected_grad = reference_value_and_grad(
        hardest_loss, case, prepared, surrogate=surrogate, temperature=temperature
    )
    assert_close(value, grad, expected_value, expected_grad, value_rtol=REFERENCE_RTOL, grad_rtol=REFERENCE_RTOL)


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("seed", range(24))
def test_hardest_fused_gradient_matches_autograd(surrogate, seed):
    # (seed // 4: the tied cases of random_case, seed % 4 == 0, meet every temperature)
    check_hardest(random_case(seed), surrogate, TEMPERATURES[(seed // 4) % len(TEMPERATURES)])


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("seed", range(12))
def test_hardest_fused_gradient_at_ties_and_kinks(surrogate, seed):
    # Integer scores: tied extremes in most cells and hinge margins exactly at the kink. The
    # differentiable form's extreme is the mean of the tied values, which can be off the min by
    # an ulp and so flip the hinge's subgradient; the fused form uses the exact min and max.
    check_hardest(random_case(seed, integer_scores=True), surrogate, None, differentiable=surrogate != "hinge")


def test_hard_hardest_splits_the_gradient_among_tied_extremes():
    scores = torch.tensor([1.0, 1.0, 1.0, 3.0, 0.5, 0.5], dtype=torch.float64)
    levels = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    case = Case(scores, levels, None, "uniform", "mean", 1.0)
    prepared = prepare(case)
    value, _, grad = fused_hardest(case, prepared, "squared", None)
    pull = 2 * (1.0 - 0.5)  # -dphi/dt = 2 (m - t) at t = min - max = 0.5
    expected = torch.zeros(6, dtype=torch.float64)
    expected[:3] = -pull / 3  # the three tied minima of the upper cell
    expected[4:] = pull / 2  # the two tied maxima of the lower cell
    assert value.item() == 0.25
    assert torch.equal(grad, expected[prepared.layout.order])


def test_hard_hardest_uses_the_exact_extreme_of_tied_scores():
    # Three tied minima at 7 against a maximum of 6, margin 1: exactly at the hinge's kink, so
    # loss 0 and subgradient 0. The mean of the tied values, 7 * (1/3) summed three times, is
    # 6.999999999999999: the differentiable form puts this pair an ulp past the kink.
    scores = torch.tensor([7.0, 7.0, 7.0, 9.0, 6.0, 5.0], dtype=torch.float64)
    levels = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    case = Case(scores, levels, None, "uniform", "mean", 1.0)
    value, _, grad = fused_hardest(case, prepare(case), "hinge", None)
    assert value.item() == 0.0 and not grad.any()
    check_hardest(case, "hinge", None, differentiable=False)


@pytest.mark.parametrize("grouped", (False, True))
def test_batches_without_a_valid_pair_give_zero_loss_and_gradient(grouped):
    # One level per group (and one level overall without groups): no valid pair.
    scores = torch.randn(9, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    groups = torch.arange(9) // 3
    levels = groups.to(torch.float64) if grouped else torch.ones(9, dtype=torch.float64)
    case = Case(scores, levels, groups if grouped else None, "linear", "mean", 1.0)
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
    case = Case(torch.randn(n, generator=gen, dtype=torch.float64), levels, groups, "linear", "mean", 1.0)
    prepared = prepare(case)
    silent = prepared.layout.group < 2  # group ids 0 and 1 sort first
    assert not prepared.coefficients[:2].any() and prepared.coefficients[2:].all()
    for surrogate in ALL_PAIRS:
        assert not fused_all_pairs(surrogate, case, prepared)[1][silent].any()
    for surrogate in SURROGATES:
        for temperature in (None, 0.5):
            assert not fused_hardest(case, prepared, surrogate, temperature)[2][silent].any()


def test_single_item_batch():
    # (Empty batches never reach these forms: the loss entry point returns 0 below two items.)
    one = torch.ones(1, dtype=torch.float64)
    case = Case(0.3 * one, one, None, "linear", "sum", 1.0)
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
