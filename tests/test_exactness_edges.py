"""Exactness edge cases found by checking mlloss against sklearn, torchmetrics and LibAUC.

Each test pins a defect that once existed: a hinge closed form a hair below zero, a float64
logistic loss off by 1e-11 in small groups, and a LoA label term of -0.0.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import itertools

import pytest
import torch

import mlloss

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


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "exact"])
def test_float64_logistic_hardest_pair_is_exact(backend):
    scores = torch.tensor([0.0, 25.0, -3.0], dtype=torch.float64)
    labels = torch.tensor([1.0, 0.0, 0.0])
    value = mlloss.AUCLoss(pairs="hardest", backend=backend)(scores, labels)
    torch.testing.assert_close(value, torch.logaddexp(torch.tensor(0.0, dtype=torch.float64), torch.tensor(25.0)),
                               rtol=1e-15, atol=0)


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
