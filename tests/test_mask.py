"""``mask=``: a loss over a fixed-size batch with filler rows equals the loss of the real rows.

Every loss takes an optional (N,) bool ``mask``; the items where it is False (the filler rows of
``TensorBatches(fixed_size=True)``, or any padding) must change nothing: the value equals the
float64 brute force of ``tests/reference.py`` on the kept items alone, the gradient of a kept score
equals the brute force's, and a left-out score gets exactly 0, whatever the left-out rows hold
(NaN scores, labels outside {0, 1}) and with the data check on. Both tiers, with and without groups.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mlloss
import reference as ref
from triton_interpreter import warnings_as_errors

NUM_ITEMS = 40

# name: (loss factory taking a backend, float64 reference of (scores, labels, groups), label columns)
CASES = {
    "auc logistic": (lambda b: mlloss.AUCLoss(backend=b), lambda s, y, g: ref.pair_loss(s, y[:, 0], g), 1),
    "auc hinge": (lambda b: mlloss.AUCLoss(surrogate="hinge", backend=b),
                  lambda s, y, g: ref.pair_loss(s, y[:, 0], g, surrogate="hinge"), 1),
    "auc exponential": (lambda b: mlloss.AUCLoss(surrogate="exponential", backend=b),
                        lambda s, y, g: ref.pair_loss(s, y[:, 0], g, surrogate="exponential"), 1),
    "auc hardest": (lambda b: mlloss.AUCLoss(pairs="hardest", backend=b),
                    lambda s, y, g: ref.hardest_loss(s, y[:, 0], g), 1),
    "auc soft-hardest": (lambda b: mlloss.AUCLoss(pairs="hardest", temperature=0.5, backend=b),
                         lambda s, y, g: ref.hardest_loss(s, y[:, 0], g, temperature=0.5), 1),
    "pdaom": (lambda b: mlloss.PDAOMLoss(backend=b),
              lambda s, y, g: ref.hardest_loss(s, y[:, 0], g, surrogate="exponential", reduction="sum"), 1),
    "loa": (lambda b: mlloss.LoALoss([1.0, 0.5], backend=b), lambda s, y, g: ref.loa_loss(s, y, g, [1.0, 0.5]), 2),
    "laa linear": (lambda b: mlloss.LaALoss(backend=b), lambda s, y, g: ref.laa_loss(s, y, g), 2),
    "laa uniform squared": (lambda b: mlloss.LaALoss(cost="uniform", surrogate="squared", backend=b),
                            lambda s, y, g: ref.laa_loss(s, y, g, cost="uniform", surrogate="squared"), 2),
    "laa hardest": (lambda b: mlloss.LaALoss(pairs="hardest", backend=b),
                    lambda s, y, g: ref.laa_loss(s, y, g, pairs="hardest"), 2),
}
BACKENDS = ["auto", "torch", "triton"]


def batch(seed: int, dtype=torch.float64):
    """Scores, labels (N, 2), groups and a mask; the left-out rows hold garbage a check would reject."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(NUM_ITEMS, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (NUM_ITEMS, 2), generator=gen).to(torch.float64)
    groups = torch.randint(0, 5, (NUM_ITEMS,), generator=gen) * 7 - 3
    mask = torch.rand(NUM_ITEMS, generator=gen) < 0.7
    garbage_scores = scores.masked_fill(~mask, float("nan")).to(dtype)
    garbage_labels = labels.masked_fill(~mask[:, None], 5.0)
    return scores, labels, groups, mask, garbage_scores, garbage_labels


def masked_call(loss, scores, labels, groups, mask):
    leaf = scores.clone().requires_grad_(True)
    value = loss(leaf, labels, groups, mask=mask)
    value.backward()
    return value.detach(), leaf.grad


def reference_on_kept(reference, scores, labels, groups, mask):
    leaf = scores[mask].clone().requires_grad_(True)
    value = reference(leaf, labels[mask], None if groups is None else groups[mask])
    value.backward()
    grad = torch.zeros_like(scores)
    grad[mask] = leaf.grad
    return value.detach(), grad


@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_masked_loss_equals_the_brute_force_on_the_kept_items(case: str, backend: str, grouped: bool) -> None:
    make, reference, columns = CASES[case]
    if backend == "triton":
        pytest.importorskip("triton")
    try:
        loss = make(backend)
    except ValueError:
        pytest.skip(f"{case} has no {backend} backend")
    for seed in range(2):
        scores, labels, groups, mask, garbage_scores, garbage_labels = batch(seed)
        groups = groups if grouped else None
        labels, garbage_labels = labels[:, :columns], garbage_labels[:, :columns]
        value, grad = masked_call(loss, garbage_scores, garbage_labels, groups, mask)
        expected, expected_grad = reference_on_kept(reference, scores, labels, groups, mask)
        torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-12)
        assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))  # exactly 0, not NaN


@pytest.mark.parametrize("case", ["auc logistic", "laa linear", "pdaom"])
def test_float32_masked_loss_is_within_1e_4_of_the_float64_brute_force(case: str) -> None:
    make, reference, columns = CASES[case]
    scores, labels, groups, mask, garbage_scores, garbage_labels = batch(3, dtype=torch.float32)
    value, grad = masked_call(make("auto"), garbage_scores, garbage_labels[:, :columns], groups, mask)
    expected, expected_grad = reference_on_kept(reference, scores, labels[:, :columns], groups, mask)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value.double(), expected, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-6)


def cross_entropy_reference(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over tasks of the mean over items of -y log sigmoid(s) - (1 - y) log sigmoid(-s)."""
    terms = -labels * torch.log(torch.sigmoid(scores)) - (1 - labels) * torch.log(torch.sigmoid(-scores))
    return terms.mean(0).sum()


@pytest.mark.parametrize("garbage", [math.inf, math.nan])  # a NaN made the fillers' gradient NaN through sigmoid
@pytest.mark.parametrize("name", ["bce", "bce+pdaom", "bce+auc"])
def test_masked_cross_entropy_objectives_equal_the_kept_items(name: str, garbage: float) -> None:
    scores, labels, groups, mask, garbage_scores, garbage_labels = batch(4)
    logits = torch.stack([scores, -0.5 * scores], 1)
    garbage_logits = logits.masked_fill(~mask[:, None], garbage)
    loss = mlloss.build_loss(name)
    value, grad = masked_call(loss, garbage_logits, garbage_labels, groups, mask)

    def objective(s, y, g):
        total = cross_entropy_reference(s, y)
        if name == "bce+pdaom":  # Eq. 7 over N: the kept items' count
            total = total + sum(ref.hardest_loss(torch.sigmoid(s[:, k]), y[:, k], g, surrogate="exponential",
                                                 reduction="sum") for k in range(2)) / s.shape[0]
        elif name == "bce+auc":
            total = total + sum(ref.pair_loss(torch.sigmoid(s[:, k]), y[:, k], g) for k in range(2))
        return total

    leaf = logits[mask].clone().requires_grad_(True)
    expected = objective(leaf, labels[mask], groups[mask])
    expected.backward()
    torch.testing.assert_close(value, expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad[mask], leaf.grad, rtol=1e-9, atol=1e-12)
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))
    if name != "bce":
        assert int(loss.ranking.num_items) == int(mask.sum())


def test_balanced_priors_count_only_the_kept_items() -> None:
    scores, labels, groups, mask, garbage_scores, garbage_labels = batch(5)
    masked = mlloss.LoALoss("balanced", num_labels=2)
    plain = mlloss.LoALoss("balanced", num_labels=2)
    value = masked(garbage_scores, garbage_labels, groups, mask=mask)
    expected = plain(scores[mask], labels[mask], groups[mask])
    assert masked.seen_items.item() == mask.sum().item()
    torch.testing.assert_close(masked.seen_positives, labels[mask].sum(0))
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12)
    masked.eval(), plain.eval()
    masked.seen_positives.zero_(), masked.seen_items.zero_(), plain.seen_positives.zero_(), plain.seen_items.zero_()
    # evaluation before any training batch: the batch's own priors, over the kept items
    masked.seen_positives = torch.zeros(0, dtype=torch.float64)
    plain.seen_positives = torch.zeros(0, dtype=torch.float64)
    torch.testing.assert_close(masked(garbage_scores, garbage_labels, groups, mask=mask),
                               plain(scores[mask], labels[mask], groups[mask]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mask_that_keeps_nothing_gives_zero(backend: str) -> None:
    scores, labels, groups, *_ = batch(6)
    nothing = torch.zeros(NUM_ITEMS, dtype=torch.bool)
    # balanced LoA's priors over no item: 0, not 0 / 0 (a NaN mixing weight made the loss NaN),
    # as its first training batch and in evaluation
    losses = [mlloss.AUCLoss(backend=backend), mlloss.LaALoss(backend=backend), mlloss.LoALoss(backend=backend),
              mlloss.LoALoss("balanced", backend=backend), mlloss.LoALoss("balanced", backend=backend).eval(),
              mlloss.build_loss("bce+pdaom", backend=backend)]
    for loss in losses:
        column = labels if isinstance(loss, (mlloss.LaALoss, mlloss.LoALoss)) else labels[:, 0]
        with warnings_as_errors():  # the zeros that stand for left-out logits do not look like probabilities
            value, grad = masked_call(loss, scores, column, groups, nothing)
        assert value.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


def test_an_all_true_mask_changes_nothing() -> None:
    scores, labels, groups, *_ = batch(7)
    everything = torch.ones(NUM_ITEMS, dtype=torch.bool)
    for grouped in (groups, None):
        masked = masked_call(mlloss.AUCLoss(), scores, labels[:, 0], grouped, everything)
        plain = masked_call(mlloss.AUCLoss(), scores, labels[:, 0], grouped, None)
        torch.testing.assert_close(masked, plain, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss", [mlloss.AUCLoss(), mlloss.BCELoss()], ids=["AUCLoss", "BCELoss"])
@pytest.mark.parametrize("mask,error,words", [
    (torch.ones(NUM_ITEMS), TypeError, "mask must be a bool tensor"),
    ([True] * NUM_ITEMS, TypeError, "got list"),
    (torch.ones(NUM_ITEMS - 1, dtype=torch.bool), ValueError, f"mask must have shape ({NUM_ITEMS},)"),
    (torch.ones(NUM_ITEMS, 2, dtype=torch.bool), ValueError, "got (40, 2)"),
])
def test_bad_masks_are_named(loss, mask, error, words) -> None:
    scores, labels, groups, *_ = batch(8)
    with pytest.raises(error, match="mask") as caught:
        loss(scores, labels[:, 0], groups, mask=mask)
    assert words in str(caught.value)


def test_compiled_step_with_a_mask_is_one_graph_equal_to_eager() -> None:
    # A fixed-size batch keeps N fixed while the mask, labels and groups change: one graph.
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    loss = mlloss.build_loss("bce+pdaom")

    def step(features, labels, groups, mask):
        return loss(model(features), labels, groups, mask=mask)

    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend=counter)
    for seed in range(3):
        scores, labels, groups, mask, *_ = batch(seed)
        features = torch.stack([scores, scores.sin(), scores.cos()], 1)
        values = []
        for fn in (step, compiled):
            model.zero_grad()
            value = fn(features, labels, groups, mask)
            value.backward()
            values.append((value.detach(), model.weight.grad.clone()))
        torch.testing.assert_close(values[1], values[0], rtol=1e-12, atol=1e-12)
    assert counter.frame_count == 1


def test_kept_logits_that_look_like_probabilities_still_warn(monkeypatch) -> None:
    scores, labels, groups, mask, *_ = batch(9)
    logits = torch.rand(NUM_ITEMS, 1, dtype=torch.float64).masked_fill(~mask[:, None], 7.0)  # the fillers' are not
    monkeypatch.setattr(mlloss._validation, "_probability_like_batches", 0)  # counted in a row, per process
    loss = mlloss.BCELoss()
    for _ in range(mlloss._validation.PROBABILITY_WARNING_BATCHES - 1):
        loss(logits, labels[:, :1], mask=mask)
    with pytest.warns(UserWarning, match="inputs='probabilities'"):
        loss(logits, labels[:, :1], mask=mask)
