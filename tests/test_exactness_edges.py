"""Exactness edge cases found by checking mlloss against sklearn, torchmetrics and LibAUC.

Each test pins a defect that once existed: a hinge closed form a hair below zero, a float64
logistic loss off by 1e-11 in small groups, and a LoA label term of -0.0.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import itertools
import math

import pytest
import torch

import mlloss
from mlloss.metrics import aggregate_levels
from reference import hardest_loss, laa_loss, pair_loss

try:
    import triton  # noqa: F401

    BACKENDS = ("auto", "exact", "torch", "triton")
except ImportError:
    BACKENDS = ("auto", "exact", "torch")

# Every margin s_pos - s_neg exceeds 0.3: each hinge term max(0, 0.3 - t) is exactly 0.
INACTIVE_SCORES = [5.4465227, -0.0878283, -1.6249210, 4.9666824, -11.6883850, 5.0507803, -2.3173261,
                   -0.6409171, -3.2726724, 3.9869602]
INACTIVE_LABELS = [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "backend,dtype,grouped", list(itertools.product(BACKENDS, (torch.float32, torch.float64), (False, True)))
)
def test_hinge_without_an_active_pair_is_exactly_zero(backend, dtype, grouped):
    scores = torch.tensor(INACTIVE_SCORES, dtype=dtype)
    groups = torch.zeros(10, dtype=torch.int64) if grouped else None
    value = mlloss.AUCLoss(surrogate="hinge", margin=0.3, backend=backend)(scores, torch.tensor(INACTIVE_LABELS), groups)
    assert value.item() == 0.0 and not torch.signbit(value)


@pytest.mark.parametrize("seed", range(20))
def test_hinge_closed_form_is_never_negative(seed):
    # Mostly inactive pairs (positives far above negatives, a few close calls), three levels,
    # groups: a sum of non-negative terms must not come out negative.
    gen = torch.Generator().manual_seed(seed)
    n = 300
    levels = torch.randint(0, 3, (n,), generator=gen)
    scores = (levels * 4.0 + torch.randn(n, generator=gen, dtype=torch.float64) * 0.7) * 10**torch.randint(
        -3, 4, (), generator=gen
    )
    groups = torch.randint(0, 7, (n,), generator=gen)
    for loss in (mlloss.AUCLoss(surrogate="hinge", margin=0.5), mlloss.LaALoss(surrogate="hinge", margin=0.5)):
        labels = (levels > 0).to(torch.float64) if isinstance(loss, mlloss.AUCLoss) else levels.to(torch.float64)
        for g in (None, groups):
            assert loss(scores, labels, g).item() >= 0.0


def logistic_brute_force(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean of log(1 + exp(s_j - s_i)) over (positive i, negative j) pairs, with logaddexp (exact)."""
    margins = scores[labels == 0][None, :] - scores[labels == 1][:, None]
    return torch.logaddexp(margins, torch.zeros_like(margins)).mean()


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "exact"])
@pytest.mark.parametrize("group_size", [2, 400], ids=["padded-small-groups", "rectangles"])
def test_float64_logistic_is_exact_on_every_path(backend, group_size):
    # A mis-ordered pair 25 logits apart: softplus's threshold (x > 20 -> x) drops 1.4e-11 of it.
    scores = torch.tensor([0.0, 25.0], dtype=torch.float64)
    labels = torch.tensor([1.0, 0.0])
    value = mlloss.AUCLoss(backend=backend)(scores, labels)
    torch.testing.assert_close(value, logistic_brute_force(scores, labels), rtol=1e-15, atol=0)
    # The same in groups small enough for the padded path, or large enough for the rectangles.
    gen = torch.Generator().manual_seed(group_size)
    n = 2 * group_size
    scores = torch.randn(n, generator=gen, dtype=torch.float64) * 20
    labels = torch.randint(0, 2, (n,), generator=gen).to(torch.float64)
    groups = torch.arange(n) // group_size
    value = mlloss.AUCLoss(backend=backend)(scores, labels, groups)
    expected = torch.stack([logistic_brute_force(scores[groups == g], labels[groups == g]) for g in range(2)]).mean()
    torch.testing.assert_close(value, expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize("pairs", ["all", "hardest"])
@pytest.mark.parametrize("path", [b for b in BACKENDS if b != "exact"] + (["triton-layout"] if "triton" in BACKENDS else []))
def test_float64_logistic_keeps_pair_terms_near_the_unit_roundoff(path, pairs, monkeypatch):
    """Every positive 35-45 logits above every negative: each pair's term log(1 + e^-t) is about
    e^-t, 3e-20 to 6e-16, which log(1 + x) computed as written rounds to a few bits or to 0;
    log1p keeps it, on every path (the Triton tier's dense kernels and its layout kernels)."""
    if path == "triton-layout":
        from mlloss.kernels import dense

        monkeypatch.setattr(dense, "MAX_ITEMS", 0)
    gen = torch.Generator().manual_seed(0)
    labels = torch.tensor([1.0, 0.0] * 20, dtype=torch.float64)
    scores = labels * 40 + torch.rand(40, generator=gen, dtype=torch.float64) * 5
    x = scores.clone().requires_grad_(True)
    value = mlloss.AUCLoss(pairs=pairs, backend=path.split("-")[0])(x, labels)
    value.backward()
    y = scores.clone().requires_grad_(True)
    expected = (pair_loss if pairs == "all" else hardest_loss)(y, labels)
    expected.backward()
    assert 0 < expected.item() < 1e-15
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "exact"])
def test_float64_logistic_hardest_pair_is_exact(backend):
    scores = torch.tensor([0.0, 25.0, -3.0], dtype=torch.float64)
    labels = torch.tensor([1.0, 0.0, 0.0])
    value = mlloss.AUCLoss(pairs="hardest", backend=backend)(scores, labels)
    torch.testing.assert_close(value, torch.logaddexp(torch.tensor(0.0, dtype=torch.float64), torch.tensor(25.0)),
                               rtol=1e-15, atol=0)


def _soft_hardest_reference(scores, levels, groups, temperature, surrogate):
    """Per group, sum_{a > b} (l_a - l_b) phi(softmin_a - softmax_b) / sum (l_a - l_b), the soft
    extremes of each (group, level) cell as tau log mean exp(+-s / tau) in mpmath, with 40 digits
    past those that exp(s / tau) = 1 + s / tau + ... spends on its leading 1 (float64 arithmetic
    keeps none of their digits when tau is far above the cell's spread); summed over the groups
    (PDAOM's reduction)."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40 + max(0, math.ceil(math.log10(temperature)))):
        tau = mpmath.mpf(temperature)

        def soft(values, sign):  # sign -1: the soft min, +1: the soft max
            return sign * tau * mpmath.log(mpmath.fsum(mpmath.exp(sign * mpmath.mpf(v) / tau) for v in values) / len(values))

        def phi(t):
            return mpmath.exp(-t) if surrogate == "exponential" else mpmath.log1p(mpmath.exp(-t))

        total = mpmath.mpf(0)
        for u in sorted(set(groups)):
            cells = {}
            for s, level, g in zip(scores, levels, groups):
                if g == u:
                    cells.setdefault(level, []).append(s)
            pairs = [(a, b) for a in cells for b in cells if a > b]
            if pairs:
                total += (mpmath.fsum((a - b) * phi(soft(cells[a], -1) - soft(cells[b], 1)) for a, b in pairs)
                          / sum(a - b for a, b in pairs))
        return float(total)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b in ("torch", "triton")] + (
    ["triton, many scan blocks"] if "triton" in BACKENDS else []))
@pytest.mark.parametrize("temperature", [0.5, 1e4, 1e9, 1e14, 1e40])
@pytest.mark.parametrize("graded", [False, True])
def test_soft_max_violation_pairs_keep_their_digits_at_any_temperature(backend, temperature, graded, monkeypatch):
    """With tau far above a cell's spread every exp((s - max) / tau) is 1 to within its rounding,
    and log(mean) came from the roundings: off by 4e-5 of the loss at tau = 1e12, and from about
    1e16 on the soft extremes were the hard ones, where tau -> inf gives the cell's mean. Binary
    PDAOM and LaA of an ordinal column (linear costs), float64 scores, against mpmath; on the
    Triton tier also with scan blocks of 16 positions and carry chunks of 4 blocks, so that the
    cells' sums cross blocks and chunks."""
    gen = torch.Generator().manual_seed(3)
    n = 60
    if backend == "triton, many scan blocks":
        from mlloss.kernels import hardest as hardest_kernels, scan

        monkeypatch.setattr(hardest_kernels, "FINALIZE_BLOCK", {"cuda": 16, "interpreter": 16})
        monkeypatch.setattr(scan, "CARRY_CHUNK", 4)
        backend, n, users = "triton", 200, 2  # cells of 40-100 items: some cross a chunk of blocks
    else:
        users = 5
    scores = torch.randn(n, generator=gen, dtype=torch.float64) * 3
    groups = torch.randint(0, users, (n,), generator=gen)
    if graded:
        labels = torch.randint(0, 4, (n,), generator=gen)
        loss = mlloss.LaALoss(pairs="hardest", temperature=temperature, reduction="sum", backend=backend)
        surrogate = "logistic"
    else:
        labels = (torch.rand(n, generator=gen) < 0.4).long()
        loss = mlloss.PDAOMLoss(temperature=temperature, backend=backend)
        surrogate = "exponential"
    expected = _soft_hardest_reference(scores.tolist(), labels.tolist(), groups.tolist(), temperature, surrogate)
    assert loss(scores, labels, groups=groups).item() == pytest.approx(expected, rel=1e-12, abs=0)


def test_a_soft_extreme_dominated_by_one_item_of_a_large_cell_keeps_its_digits():
    """The other end of the temperature test above, on the PyTorch tier: a user's 100,000 positives
    of which one scores 0 and the others 40-80, at tau = 1, so that the soft min's mean of
    exp(-(s - min) / tau) is 1e-5 (one term 1, the rest below 1e-17). From a mean of 1/2 up the soft
    extremes take log1p of the mean of the terms minus 1; here that would keep only the digits of
    1 - 1e-5 rounded: 4.6e-12 of the loss off. The kernels' ``scan.log_mean`` has its own test
    (tests/test_triton_kernels.py); 100,000 items take the interpreter 16 s."""
    mpmath = pytest.importorskip("mpmath")
    n = 100_000
    gen = torch.Generator().manual_seed(0)
    positives = torch.cat([torch.zeros(1, dtype=torch.float64), 40 + 40 * torch.rand(n - 1, generator=gen, dtype=torch.float64)])
    scores = torch.cat([positives, torch.tensor([-1.0], dtype=torch.float64)])
    labels = torch.cat([torch.ones(n, dtype=torch.long), torch.zeros(1, dtype=torch.long)])
    with mpmath.workdps(40):
        soft_min = -mpmath.log(mpmath.fsum(mpmath.exp(-mpmath.mpf(s)) for s in positives.tolist()) / n)
        expected = float(mpmath.exp(-(soft_min - -1)))  # one negative: its soft max is its score
    loss = mlloss.PDAOMLoss(temperature=1.0, backend="torch")(scores, labels, groups=torch.zeros(n + 1, dtype=torch.long))
    assert loss.item() == pytest.approx(expected, rel=2e-13, abs=0)


@pytest.mark.parametrize(
    "backend,surrogate,pairs",
    [(b, s, p) for b in BACKENDS for s in ("logistic", "exponential", "hinge", "squared") for p in ("all", "hardest")
     if not (b == "exact" and s == "logistic" and p == "all")],
)
def test_a_label_without_a_valid_pair_reports_plus_zero(backend, surrogate, pairs):
    scores = torch.tensor([0.3, -0.2, 0.1, -0.9, -1.2, 0.4])  # a negative sum: 0 * sum was -0.0
    labels = torch.tensor([[1, 0], [0, 0], [1, 0], [0, 0], [1, 0], [0, 0]])  # label 1 never positive
    loss = mlloss.LoALoss([1.0, 1.0], surrogate=surrogate, pairs=pairs, backend=backend)
    loss(scores, labels, torch.tensor([0, 0, 0, 1, 1, 1]))
    term = loss.parts["label_loss/1"]
    assert term.item() == 0.0 and not torch.signbit(term)


def _one_level_pairs_far_apart(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 N(0, 1) scores at levels of two items each, but the top level's three items score
    50, 150, 50: exp(150 - 50) is inf in float32, yet every valid pair's term is finite (top items
    against the rest: about exp(-50)), whichever way a level's items are ordered."""
    gen = torch.Generator().manual_seed(n)
    levels = (torch.arange(n) // 2).to(torch.float64)
    levels[:3] = n
    scores = torch.randn(n, generator=gen)
    scores[:3] = torch.tensor([50.0, 150.0, 50.0])
    return scores, levels


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("grouped", [True, False], ids=["padded-small-groups", "one-large-group"])
def test_pairs_of_one_level_never_reach_the_surrogate(backend, grouped):
    # Two items of one level form no valid pair; computed under a zero weight, their exponential
    # term was 0 * inf = NaN on the PyTorch tier: a false OverflowError (NaN without the checks).
    scores, levels = _one_level_pairs_far_apart(300)
    groups = torch.arange(300) // 4 if grouped else None  # 2 levels a group, or 150 levels in one
    leaf = scores.clone().requires_grad_(True)
    value = mlloss.LaALoss(surrogate="exponential", backend=backend)(leaf, levels[:, None], groups)
    value.backward()
    double = scores.double().requires_grad_(True)
    expected = pair_loss(double, levels, groups, cost="linear", surrogate="exponential")
    expected.backward()
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=0)
    assert torch.isfinite(leaf.grad).all()
    torch.testing.assert_close(leaf.grad.double(), double.grad, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("surrogate", ["logistic", "hinge", "squared", "exponential"])
@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_large_groups_with_many_levels_are_exact_on_the_torch_tier(surrogate, cost, monkeypatch):
    # A real-valued label (a level per item) in a group of 300: masked tiles of its level-sorted
    # items, in several row blocks here (small tiles); beside it a group of 300 at 4 levels
    # (rectangles) and groups of 10 (padded blocks). Both large-group paths must run.
    from mlloss.ops import allpairs

    monkeypatch.setattr(allpairs, "TILE_ELEMENTS", 1 << 14)  # masked tiles of 64 x 64
    used = {"tiles": 0, "rectangles": 0}
    for name, key in (("_level_tiles", "tiles"), ("_level_rectangles", "rectangles")):
        def spy(*args, _real=getattr(allpairs, name), _key=key, **kwargs):
            used[_key] += 1
            return _real(*args, **kwargs)
        monkeypatch.setattr(allpairs, name, spy)
    gen = torch.Generator().manual_seed(len(surrogate) + len(cost))
    scores = torch.randn(700, generator=gen, dtype=torch.float64)
    levels = torch.rand(700, generator=gen, dtype=torch.float64)
    levels[300:600] = torch.round(levels[300:600] * 3)
    groups = torch.cat([torch.full((300,), 5), torch.full((300,), 9), 20 + torch.arange(100) // 10])
    leaf = scores.clone().requires_grad_(True)
    value = mlloss.LaALoss(cost=cost, surrogate=surrogate, real_levels=True, backend="torch")(leaf, levels, groups)
    value.backward()
    double = scores.clone().requires_grad_(True)
    expected = pair_loss(double, levels, groups, cost=cost, surrogate=surrogate)
    expected.backward()
    assert used == {"tiles": 1, "rectangles": 1}
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=0)
    torch.testing.assert_close(leaf.grad, double.grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("masked", [False, True], ids=["all", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", BACKENDS)
def test_real_levels_far_from_zero_keep_their_differences(backend, dtype, masked):
    # Levels 1e8 + 0.01 k: the pair costs are their differences. The kernels cast the values to
    # float32 (every cost 0: a zero loss) and summed them in the normalisers' prefix sums (2.7e-6
    # off in float64); the values are now measured from the median level, which a mask's fillers
    # (labelled 0) are not while they are fewer than the kept items.
    from reference import laa_loss

    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(120, generator=gen, dtype=torch.float64).to(dtype)
    levels = 1e8 + torch.randint(0, 5, (120,), generator=gen).double() * 0.01
    mask = torch.rand(120, generator=gen) < 0.7 if masked else None
    surrogate = "exponential" if backend == "exact" else "logistic"
    value = mlloss.LaALoss(real_levels=True, surrogate=surrogate, backend=backend)(scores, levels[:, None], mask=mask)
    kept = torch.ones(120, dtype=torch.bool) if mask is None else mask
    expected = laa_loss(scores.double()[kept], levels[kept, None], surrogate=surrogate)
    torch.testing.assert_close(value.double(), expected, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


@pytest.mark.parametrize("name", ["auc", "laa"])
@pytest.mark.parametrize("surrogate", ["squared", "hinge"])
def test_the_closed_forms_keep_scores_far_from_zero(surrogate, name):
    """Scores near 1e6 (a model's raw outputs before any normalisation): the closed forms' sums of
    scores and of their squares are taken from each group's mean, or a pair's (s_i - s_j)^2 would
    be the difference of sums near 1e12 * N and lose most of its digits."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(300, generator=gen, dtype=torch.float64) + 1e6
    labels = torch.randint(0, 2, (300, 2), generator=gen).to(torch.float64)
    groups = torch.randint(0, 4, (300,), generator=gen)
    loss, reference, y = {"auc": (mlloss.AUCLoss, pair_loss, labels[:, 0]),
                          "laa": (mlloss.LaALoss, laa_loss, labels)}[name]
    x = scores.clone().requires_grad_(True)
    value = loss(surrogate=surrogate, backend="exact")(x, y, groups)
    value.backward()
    z = scores.clone().requires_grad_(True)
    expected = reference(z, y, groups, surrogate=surrogate)
    expected.backward()
    torch.testing.assert_close(value, expected, rtol=1e-10, atol=0)
    torch.testing.assert_close(x.grad, z.grad, rtol=1e-8, atol=1e-15)


@pytest.mark.parametrize("pairs,temperature", [("all", None), ("hardest", None), ("hardest", 1.0)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_label_of_mixing_weight_zero_adds_nothing_even_when_its_terms_overflow(backend, pairs, temperature):
    # L = sum_k a_k L_k: with a = (0, 1) label 0's exp(1000) pair is no part of the loss; 0 * inf made the
    # loss NaN (an OverflowError) on every tier.
    scores = torch.tensor([0.0, 1000.0, 1.0, 0.5], dtype=torch.float64)
    labels = torch.tensor([[1, 0], [0, 1], [0, 0], [1, 1]])
    options = dict(surrogate="exponential", pairs=pairs, temperature=temperature)
    leaf = scores.clone().requires_grad_(True)
    value = mlloss.LoALoss([0.0, 1.0], backend=backend, **options)(leaf, labels)
    value.backward()
    reference = scores.clone().requires_grad_(True)
    expected = mlloss.AUCLoss(backend="torch", **options)(reference, labels[:, 1])
    expected.backward()
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(leaf.grad, reference.grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float16_gradient_that_overflows_raises(backend):
    # float16 scores: the loss is float32 (exp(12) = 162,755 fits) but the gradient returns as float16,
    # where it was silently inf. A float32 loss above 65,504 whose gradients fit stays a result.
    scores = torch.tensor([0.0, 12.0, 1.0, -1.0], dtype=torch.float16)
    labels = torch.tensor([1, 0, 1, 0])
    with pytest.raises(OverflowError, match="returned in float16, must stay below 65504"):
        mlloss.PDAOMLoss(backend=backend)(scores.clone().requires_grad_(True), labels)
    users = torch.arange(40).repeat_interleave(2)  # 40 users, each one pair of loss exp(8) = 2,981
    many = torch.tensor([0.0, 8.0], dtype=torch.float16).repeat(40).requires_grad_(True)
    value = mlloss.PDAOMLoss(backend=backend)(many, torch.tensor([1, 0]).repeat(40), users)
    (grad,) = torch.autograd.grad(value, many)
    assert value.dtype == torch.float32 and value.item() > 65504 and torch.isfinite(grad).all()


@pytest.mark.parametrize("pairs", ["all", "hardest"])
@pytest.mark.parametrize("surrogate", ["logistic", "squared"])
def test_a_real_valued_label_in_many_small_groups_is_linear_in_the_batch(surrogate, pairs):
    # A level per item in 10,000 groups of two: the (group, level) tables over every level of the
    # batch were 10,000 x 20,000 (refused: "Is the label really ordinal?"), and 3,000 items in pairs
    # took the squared closed form 6-9 s. Each group's own levels now. Every group holds one pair, whose
    # cost cancels in c * phi / c: the loss is the mean of phi(s_high - s_low).
    gen = torch.Generator().manual_seed(3)
    n = 20_000
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    levels = torch.rand(n, generator=gen, dtype=torch.float64) * 1e4
    groups = torch.arange(n) // 2
    value = mlloss.LaALoss(real_levels=True, surrogate=surrogate, pairs=pairs, backend="torch")(scores, levels[:, None], groups)
    first, second = scores[0::2], scores[1::2]
    margin = torch.where(levels[0::2] > levels[1::2], first - second, second - first)
    terms = torch.nn.functional.softplus(-margin) if surrogate == "logistic" else (1 - margin) ** 2
    torch.testing.assert_close(value, terms.mean(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("cost", ["linear", "uniform"])
def test_a_groups_costs_keep_their_precision_far_from_the_other_groups_levels(cost):
    # One user's watch times 0.010-0.0125 s beside others' near 1e4 s: measured from the batch's median
    # level and cast to float32, that user's costs lost their differences (the loss 7% off). The PyTorch
    # tier measures each group's levels from its own middle item.
    from reference import laa_loss

    levels = torch.tensor([0.0100, 0.0107, 0.0125, 10000.0, 10003.0, 10001.0, 10002.5], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    scores = torch.tensor([0.9, -0.4, 0.2, 0.3, -0.1, 0.5, 0.0])
    value = mlloss.LaALoss(real_levels=True, cost=cost, backend="torch")(scores, levels[:, None], groups)
    expected = laa_loss(scores.double(), levels[:, None], groups, cost=cost)
    torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=0)
    # binary columns of weights 1e4 and 1e-4: one group whose only pair is [1, 1] against [1, 0]
    labels = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 0]])
    value = mlloss.LaALoss([1e4, 1e-4], cost=cost, backend="torch")(scores[:4], labels, torch.tensor([0, 0, 1, 1]))
    expected = laa_loss(scores[:4].double(), labels, torch.tensor([0, 0, 1, 1]), weights=[1e4, 1e-4], cost=cost)
    torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=0)


NEAR_ZERO_CASES = [(b, s, "all", 4) for b in ("auto", "torch", "exact") for s in ("logistic", "squared")
                   if (b, s) != ("exact", "logistic")]  # exact: closed forms only
if "triton" in BACKENDS:  # the walk over 6 levels, and the prefix sums of an ordinal column of 20
    NEAR_ZERO_CASES += [("triton", "logistic", pairs, far) for pairs in ("all", "hardest") for far in (4, 18)]


@pytest.mark.parametrize("backend,surrogate,pairs,far", NEAR_ZERO_CASES)
def test_a_group_near_zero_keeps_its_pair_beside_levels_near_1e14(backend, surrogate, pairs, far):
    # Measured from the batch's median level in float64, the levels 0.01 and 0.02 both became -1e14:
    # the group's pair cost 0, Z_u = 0, and the group silently left the mean (the squared closed form's
    # (G, L) tables cancelled likewise; the kernels' normalisers, sums of terms of both signs, too).
    # Every tier measures a group's levels from its own.
    from reference import laa_loss

    levels = torch.cat([torch.tensor([0.01, 0.02], dtype=torch.float64), 1e14 + torch.arange(far, dtype=torch.float64)])
    groups = torch.cat([torch.zeros(2, dtype=torch.int64), torch.ones(far, dtype=torch.int64)])
    scores = torch.randn(2 + far, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    leaf = scores.clone().requires_grad_(True)
    loss = mlloss.LaALoss(real_levels=True, surrogate=surrogate, pairs=pairs, backend=backend)
    value = loss(leaf, levels[:, None], groups)
    value.backward()
    reference = scores.clone().requires_grad_(True)
    expected = laa_loss(reference, levels[:, None], groups, surrogate=surrogate, pairs=pairs)
    expected.backward()
    assert int(loss.parts["groups_with_pairs"]) == 2
    rtol = 1e-10 if backend == "triton" else 1e-12
    torch.testing.assert_close(value, expected, rtol=rtol, atol=0)
    torch.testing.assert_close(leaf.grad, reference.grad, rtol=rtol, atol=1e-15)


def _far_apart_batches():
    """(name, labels, weights, real_levels, groups): LaA batches in which one group's levels sit
    far from the others', one per path of the Triton kernels (the dense kernel's level costs, the
    layout kernels' walk over a few levels and prefix sums over an ordinal column)."""
    gen = torch.Generator().manual_seed(11)
    # 8 watch times 0.010-0.0125 s of one user beside 3 users' near 1e4 s: 20 levels, an ordinal column
    watch = torch.cat([0.010 + 0.0025 * torch.rand(8, generator=gen, dtype=torch.float64),
                       1e4 + 10 * torch.rand(12, generator=gen, dtype=torch.float64)])
    watch_groups = torch.cat([torch.zeros(8, dtype=torch.int64), 1 + torch.arange(12) // 4])
    # binary columns of weights 1e4 and 1e-4 (3e-4): one user's pairs cost only 1e-4, the others'
    # mostly 1e4, so that the batch's middle level is near 1e4
    two = torch.randint(0, 2, (24, 2), generator=gen)
    two[:8, 0], two[8:, 0] = 0, 1
    three = torch.randint(0, 2, (24, 3), generator=gen)
    three[:8, 0], three[8:, 0] = 0, 1
    groups = torch.arange(24) // 8
    return [
        ("ordinal column, prefix sums", watch[:, None], None, True, watch_groups),
        ("two columns, dense kernel", two, [1e4, 1e-4], False, groups),
        ("three columns, walk", three, [1e4, 1e-4, 3e-4], False, groups),
    ]


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs triton")
@pytest.mark.parametrize("case", [name for name, *_ in _far_apart_batches()])
@pytest.mark.parametrize("pairs,cost", [("all", "linear"), ("all", "uniform"), ("hardest", "linear")])
def test_the_kernels_keep_a_groups_costs_far_from_the_other_groups_levels(case, pairs, cost):
    # The Triton kernels took the levels measured from the batch's middle level and subtracted them
    # in float32: the small user's costs rounded away (the loss 1.5% off for the watch times, 81% for
    # the weights [1e4, 1e-4]). They now measure each group's from its own lowest level, and the dense
    # kernel rounds each level pair's float64 difference once.
    from reference import laa_loss

    _, labels, weights, real_levels, groups = next(b for b in _far_apart_batches() if b[0] == case)
    scores = torch.randn(labels.shape[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    leaf = scores.float().requires_grad_(True)
    loss = mlloss.LaALoss(weights, cost=cost, real_levels=real_levels, pairs=pairs, backend="triton")
    value = loss(leaf, labels, groups)
    value.backward()
    reference = scores.clone().requires_grad_(True)
    expected = laa_loss(reference, labels, groups, weights=weights, cost=cost, pairs=pairs)
    expected.backward()
    torch.testing.assert_close(value.double(), expected.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(leaf.grad.double(), reference.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("cost", ["uniform", "linear"])
def test_two_levels_float32_cannot_tell_apart_are_still_a_pair_on_the_pytorch_tier(cost):
    # The blocked sums rounded each item's level to the scores' dtype and took gap > 0 as the pair
    # test: with weights [57150, 5e-5], 57150 and 57150 + 5e-5 are one float32, so their pair left
    # the sum while Z_u (float64) kept it (0.568 for 0.660 with uniform costs). Validity now comes
    # from the level indices.
    from reference import laa_loss

    labels = torch.tensor([[0, 0], [0, 1], [1, 0], [1, 1]])
    scores = torch.tensor([0.3, -0.2, 0.1, 0.4])
    value = mlloss.LaALoss([57150.0, 5e-5], cost=cost, backend="torch")(scores, labels)
    expected = laa_loss(scores.double(), labels, weights=[57150.0, 5e-5], cost=cost)
    torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weights,columns", [([1.0, 1e12, 1.4], 3), ([1e-13, 1.0], 2), ([1e-13, 1.0] + [1e3] * 11, 13)])
def test_laa_levels_keep_their_precision_beside_far_larger_weights(backend, weights, columns):
    # Aggregated levels were rounded to 2^-40 of the weights' sum: beside a weight of 1e12 the
    # levels 1 and 1.4 became 1 and 1 (0.463 for 0.451), and 1e-13 beside 1 became 0 (the loss
    # 0, its only pair lost). Each level is now rounded to 2^-40 of its own size. The 13 columns
    # take the on-device sums instead of the pattern tables.
    from reference import laa_loss

    generator = torch.Generator().manual_seed(columns)
    labels = torch.zeros(6, columns, dtype=torch.int64)
    labels[0, 0] = labels[1, 2 if columns == 3 else 0] = 1  # items at the small levels; the rest at 0
    labels[3, 1] = 1  # an item at the large level (1e12, or 1)
    scores = torch.randn(6, generator=generator, dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1]) if columns == 2 else None
    surrogate = "squared" if backend == "exact" else "logistic"  # "exact": the closed forms
    for cost in ("linear", "uniform"):
        value = mlloss.LaALoss(weights, cost=cost, surrogate=surrogate, backend=backend)(scores, labels, groups)
        expected = laa_loss(scores, labels, groups, weights=weights, cost=cost, surrogate=surrogate)
        torch.testing.assert_close(value, expected, rtol=1e-9, atol=0)
    levels = aggregate_levels(labels, weights)
    expected_levels = labels.double() @ torch.tensor(weights, dtype=torch.float64)
    torch.testing.assert_close(levels, expected_levels, rtol=2.0**-40, atol=0)
