"""The loss spec's exact identities, gradcheck in float64, and hypothesis properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mlloss
from reference import hardest_loss, pair_loss


def batch(seed: int, n: int = 60, num_labels: int = 2, num_groups: int = 8):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (n, num_labels), generator=gen).to(torch.float64)
    groups = torch.randint(0, num_groups, (n,), generator=gen)
    return scores, labels, groups


@pytest.mark.parametrize("grouped", (False, True))
def test_soft_hardest_exponential_at_unit_temperature_equals_all_pairs_exponential(grouped):
    # phi(softmin - softmax) = mean_pos exp(-s) * mean_neg exp(s) = mean over pairs of exp(s_j - s_i).
    scores, labels, groups = batch(1)
    groups = groups if grouped else None
    soft = mlloss.AUCLoss(surrogate="exponential", pairs="hardest", temperature=1.0)
    every = mlloss.AUCLoss(surrogate="exponential", pairs="all")
    x, y = scores.clone().requires_grad_(True), scores.clone().requires_grad_(True)
    a, b = soft(x, labels[:, 0], groups), every(y, labels[:, 0], groups)
    a.backward(), b.backward()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-10, atol=1e-14)


def test_soft_hardest_tends_to_hard_as_temperature_vanishes():
    scores, labels, groups = batch(2)
    hard = mlloss.LaALoss(pairs="hardest")(scores, labels, groups)
    soft = mlloss.LaALoss(pairs="hardest", temperature=1e-4)(scores, labels, groups)
    torch.testing.assert_close(soft, hard, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("surrogate", ("exponential", "squared", "hinge"))
@pytest.mark.parametrize("loss_class", (mlloss.AUCLoss, mlloss.LaALoss, mlloss.LoALoss))
def test_closed_forms_equal_blocked_all_pairs(surrogate, loss_class):
    scores, labels, groups = batch(3, n=400, num_groups=30)
    labels = labels[:, 0] if loss_class is mlloss.AUCLoss else labels
    values = []
    for backend in ("exact", "torch"):
        x = scores.clone().requires_grad_(True)
        value = loss_class(surrogate=surrogate, backend=backend)(x, labels, groups)
        value.backward()
        values.append((value, x.grad))
    torch.testing.assert_close(values[0][0], values[1][0], rtol=1e-10, atol=0)
    torch.testing.assert_close(values[0][1], values[1][1], rtol=1e-8, atol=1e-13)


def test_exponential_closed_form_does_not_overflow_where_the_loss_is_finite():
    # exp(s_j - s_i) with s ~ +-400: each factor of the product form overflows float64 (e^800),
    # yet the pair terms exp(-1) are finite; the log-domain form gets them right.
    scores = torch.tensor([400.0, 401.0, 399.0, 400.0], dtype=torch.float64)
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    value = mlloss.AUCLoss(surrogate="exponential")(scores, labels)
    expected = pair_loss(scores, labels, surrogate="exponential")
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("backend", ["exact", "torch"])
def test_overflowing_exponential_loss_raises_instead_of_passing_silently(backend):
    # One overflow contract for every path: a non-finite loss raises (never an inf gradient step).
    scores = torch.tensor([-60.0, 60.0], dtype=torch.float32)
    labels = torch.tensor([1.0, 0.0])
    with pytest.raises(OverflowError, match="exp overflows"):
        mlloss.AUCLoss(surrogate="exponential", backend=backend)(scores, labels)
    # Without the data check the inf comes back for the caller to see.
    value = mlloss.AUCLoss(surrogate="exponential", backend=backend, validate_args=False)(scores, labels)
    assert torch.isinf(value)


@pytest.mark.parametrize(
    "loss",
    [
        mlloss.AUCLoss(),
        mlloss.AUCLoss(surrogate="exponential"),
        mlloss.AUCLoss(surrogate="squared", backend="torch"),
        mlloss.LoALoss([1.0, 0.5]),
        mlloss.LaALoss(),
        mlloss.LaALoss(surrogate="exponential", cost="uniform"),
        mlloss.LaALoss(surrogate="squared"),
        mlloss.LaALoss(pairs="hardest", temperature=0.5),
        mlloss.PDAOMLoss(),
    ],
    ids=repr,
)
def test_gradcheck_float64(loss):
    scores, labels, groups = batch(4, n=24, num_groups=4)
    labels = labels[:, 0] if isinstance(loss, mlloss.AUCLoss) else labels
    x = scores.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda s: loss(s, labels, groups), (x,), eps=1e-6, atol=1e-7)


def test_loa_and_laa_with_one_label_equal_auc():
    scores, labels, groups = batch(5)
    auc = mlloss.AUCLoss()(scores, labels[:, 0], groups)
    torch.testing.assert_close(mlloss.LoALoss()(scores, labels[:, :1], groups), auc)
    torch.testing.assert_close(mlloss.LaALoss()(scores, labels[:, :1], groups), auc)


def test_laa_merges_levels_that_are_equal_in_exact_arithmetic():
    # 0.1 + 0.2 != 0.3 in binary floating point; the aggregated levels must still coincide,
    # otherwise a spurious pair with cost 5e-17 appears between (1,1,0) and (0,0,1).
    labels = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    scores = torch.tensor([0.0, 1.0])
    loss = mlloss.LaALoss([0.1, 0.2, 0.3])
    assert loss(scores, labels).item() == 0.0
    assert loss.parts["valid_pairs"].item() == 0


scores_strategy = st.lists(
    st.floats(min_value=-5, max_value=5, allow_nan=False, width=64), min_size=2, max_size=40
)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), values=scores_strategy)
def test_properties_permutation_shift_and_reference(data, values):
    n = len(values)
    scores = torch.tensor(values, dtype=torch.float64)
    labels = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), dtype=torch.float64)
    groups = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    surrogate = data.draw(st.sampled_from(["logistic", "hinge", "squared", "exponential"]))
    pairs = data.draw(st.sampled_from(["all", "hardest"]))
    loss = mlloss.LaALoss(surrogate=surrogate, pairs=pairs)
    value = loss(scores, labels, groups)
    # Agrees with the brute force.
    reference = (pair_loss if pairs == "all" else hardest_loss)(
        scores, labels, groups, cost="linear", surrogate=surrogate
    )
    torch.testing.assert_close(value, reference, rtol=1e-9, atol=1e-12)
    # Invariant to the order of the items and to a common shift of the scores.
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(loss(scores[perm], labels[perm], groups[perm]), value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss(scores + 3.25, labels, groups), value, rtol=1e-9, atol=1e-12)
    # Invariant to renaming the groups.
    torch.testing.assert_close(loss(scores, labels, groups * 1000 - 7), value, rtol=1e-9, atol=1e-12)
    assert value >= 0


@settings(max_examples=30, deadline=None)
@given(values=scores_strategy, data=st.data())
def test_property_logistic_auc_loss_bounds_the_auc(values, data):
    # log(1 + exp(-t)) >= log(2) * 1(t <= 0), so the logistic loss / log 2 bounds the
    # fraction of mis-ordered pairs (ties counted as mis-ordered) from above.
    n = len(values)
    scores = torch.tensor(values, dtype=torch.float64)
    labels = torch.tensor(data.draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), dtype=torch.float64)
    positives, negatives = scores[labels == 1], scores[labels == 0]
    if positives.numel() == 0 or negatives.numel() == 0:
        return
    misordered = (positives[:, None] <= negatives[None, :]).to(torch.float64).mean()
    value = mlloss.AUCLoss()(scores, labels)
    assert value / torch.log(torch.tensor(2.0, dtype=torch.float64)) >= misordered - 1e-12


@pytest.fixture
def registry(monkeypatch):
    """``mlloss.registry`` with its tables restored after the test."""
    from mlloss import registry

    monkeypatch.setattr(registry, "LOSSES", dict(registry.LOSSES))
    monkeypatch.setattr(registry, "SINGLE_LABEL", set(registry.SINGLE_LABEL))
    return registry


def test_build_loss_by_name_and_bce_plus_pdaom_is_eq7(registry):
    scores, labels, groups = batch(6)
    label = labels[:, 0]
    assert isinstance(mlloss.build_loss("laa"), mlloss.LaALoss)
    assert mlloss.build_loss("balanced-loa").balanced
    with pytest.raises(ValueError, match=r"'balanced-loa' sets weights='balanced'; got weights=\[1, 2\]"):
        mlloss.build_loss("balanced-loa", weights=[1, 2])  # (it built a plain LoA with those weights)
    assert mlloss.build_loss("balanced-loa", priors=[0.2, 0.5]).priors.tolist() == [0.2, 0.5]
    combined = mlloss.build_loss("bce+pdaom", lam=10.0)
    value = combined(scores, label, groups)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(scores.float(), label.float())
    pdaom = hardest_loss(torch.sigmoid(scores), label, groups, surrogate="exponential", reduction="sum")
    # Eq. 7 (summed cross-entropy + lam * sum over users) divided by the batch size
    torch.testing.assert_close(value.double(), bce.double() + 10.0 * pdaom / len(label), rtol=1e-6, atol=1e-6)
    all_pairs = mlloss.build_loss("bce+auc", lam=10.0)  # a mean-reduced ranking term is not rescaled
    expected = bce.double() + 10.0 * mlloss.AUCLoss()(torch.sigmoid(scores), label, groups).double()
    torch.testing.assert_close(all_pairs(scores, label, groups).double(), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="unknown loss name 'lda'"):
        mlloss.build_loss("lda")
    with pytest.raises(ValueError, match="single-label"):
        mlloss.build_loss("bce+laa")
    mlloss.register_loss("hinge-auc", lambda **kw: mlloss.AUCLoss(surrogate="hinge", **kw), single_label=True)
    assert mlloss.build_loss("bce+hinge-auc").ranking.surrogate == "hinge"


def test_bce_plus_a_users_ranking_loss_without_parts_or_item_count(registry):
    # A registered loss that reports no parts and no num_items: parts lists only what exists (it
    # listed valid_pairs and raised KeyError on reading it), and a summed term is divided by the
    # items of the mask (it was divided by all N).
    class SummedPairs(torch.nn.Module):
        reduction = "sum"

        def forward(self, scores, labels, groups=None, mask=None):
            keep = torch.ones_like(labels, dtype=torch.bool) if mask is None else mask
            positive, negative = scores[keep & (labels == 1)], scores[keep & (labels == 0)]
            return torch.exp(negative[None, :] - positive[:, None]).sum()

    mlloss.register_loss("summed-pairs", SummedPairs, single_label=True)
    loss = mlloss.build_loss("bce+summed-pairs", lam=2.0)
    scores = torch.tensor([0.3, -0.2, 1.5, 0.1, -1.0, 0.7, 2.0, -0.4, 0.0, 0.9], dtype=torch.float64)
    labels = torch.tensor([1, 0, 1, 0, 0, 1, 1, 0, 1, 0])
    mask = torch.arange(10) < 6
    value = loss(scores, labels, mask=mask)
    assert dict(loss.parts).keys() == {"bce", "ranking"}
    kept, kept_labels = scores[mask], labels[mask].double()
    probabilities = torch.sigmoid(kept)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(kept, kept_labels) + 2.0 * SummedPairs()(
        probabilities, labels[mask]) / 6
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)


def test_register_loss_matches_names_as_build_loss_reads_them_and_keeps_taken_ones(registry):
    hinge = lambda **kw: mlloss.AUCLoss(surrogate="hinge", **kw)  # noqa: E731
    mlloss.register_loss(" Hinge-AUC ", hinge, single_label=True)
    assert mlloss.build_loss("hinge-auc").surrogate == "hinge"
    assert mlloss.build_loss("BCE+Hinge-AUC").ranking.surrogate == "hinge"
    # A taken name, a built-in one too, needs replace=True; the error names its holder.
    with pytest.raises(ValueError, match="'auc' is taken \\(by AUCLoss\\); pass replace=True"):
        mlloss.register_loss("AUC", hinge)
    assert isinstance(mlloss.build_loss("auc"), mlloss.AUCLoss) and mlloss.build_loss("auc").surrogate == "logistic"
    with pytest.raises(ValueError, match="'hinge-auc' is taken"):
        mlloss.register_loss("hinge-auc", hinge)
    # Replaced without single_label, the name no longer combines with BCE.
    mlloss.register_loss("hinge-auc", lambda **kw: mlloss.LaALoss(**kw), replace=True)
    assert isinstance(mlloss.build_loss("hinge-auc"), mlloss.LaALoss)
    with pytest.raises(ValueError, match="single-label"):
        mlloss.build_loss("bce+hinge-auc")
    for name, error, match in [("", ValueError, "non-empty"), ("bce+x", ValueError, "without '\\+'"),
                               (3, TypeError, "name must be a string")]:
        with pytest.raises(error, match=match):
            mlloss.register_loss(name, hinge)
    for factory in (mlloss.AUCLoss(), "auc"):  # a built loss, a name
        with pytest.raises(TypeError, match="factory must build the loss"):
            mlloss.register_loss("x", factory)
    with pytest.raises(TypeError, match="replace must be a bool"):
        mlloss.register_loss("x", hinge, replace="yes")
