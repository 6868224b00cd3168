"""Every loss name on batches without a valid pair: exactly 0, a zero gradient, never NaN.

An empty batch, a single item, one class, and users who are each alone: a pairwise loss has no
pair to average over and returns exactly 0 with a zero gradient (loss spec). The cross-entropy
is not pairwise: it is 0 on an empty batch and an ordinary cross-entropy otherwise, and the
``bce+`` objectives then add exactly nothing for their ranking term.
"""

from __future__ import annotations

import pytest
import torch

import mlloss
from mlloss.registry import LOSSES, SINGLE_LABEL

NAMES = sorted(LOSSES) + [f"bce+{name}" for name in sorted(SINGLE_LABEL)]
MULTI_LABEL = {"loa", "balanced-loa", "laa"}


def degenerate_batches():
    """(case, scores, labels (N, 2), groups) without a single valid pair."""
    gen = torch.Generator().manual_seed(0)
    n = 9
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    mixed = torch.randint(0, 2, (n, 2), generator=gen).to(torch.float64)
    mixed[0], mixed[1] = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])  # both classes in each column
    yield "empty", scores[:0], mixed[:0], torch.zeros(0, dtype=torch.int64)
    yield "single item", scores[:1], mixed[:1], torch.zeros(1, dtype=torch.int64)
    yield "one class", scores, torch.ones(n, 2, dtype=torch.float64), torch.zeros(n, dtype=torch.int64)
    yield "singleton groups", scores, mixed, torch.arange(n)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", [c[0] for c in degenerate_batches()])
def test_no_valid_pair_gives_exactly_zero_and_a_zero_gradient(name, case):
    _, scores, labels, groups = next(c for c in degenerate_batches() if c[0] == case)
    loss = mlloss.build_loss(name)
    x = scores.clone().requires_grad_(True)
    value = loss(x, labels if name in MULTI_LABEL else labels[:, 0], groups)
    value.backward()
    assert torch.isfinite(value) and torch.isfinite(x.grad).all()
    if not name.startswith("bce"):
        assert value.item() == 0.0 and torch.count_nonzero(x.grad) == 0
        return
    # The cross-entropy alone: 0 on an empty batch, else the ordinary mean over items.
    bce = mlloss.build_loss("bce")(scores, labels[:, 0])
    assert value.item() == bce.item()
    if name != "bce":
        assert loss.parts["ranking"].item() == 0.0 and loss.parts["valid_pairs"].item() == 0.0
    if case == "empty":
        assert value.item() == 0.0
