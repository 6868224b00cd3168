"""Numerics and memory of the losses on the CPU paths, against a float64 brute force over all pairs
written here from docs/loss-spec.md (no code shared with mlloss or tests/reference.py).

Covers: the dtype rule (float16 / bfloat16 scores give a float32 loss and a gradient in their own
dtype, equal to the float64 loss of the rounded scores), float64 exactness, batches without a
valid pair (exactly +0, zero gradient), float64 gradcheck, and the max-violation pairs of one group
with more levels than a block holds (tiles, never a (levels x levels) table).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import itertools
import math

import pytest
import torch

import mlloss

try:
    import triton  # noqa: F401

    BACKENDS = ("auto", "torch", "triton")
except ImportError:
    BACKENDS = ("auto", "torch")

SURROGATES = ("logistic", "hinge", "squared", "exponential")


def phi(t: torch.Tensor, surrogate: str, margin: float = 1.0) -> torch.Tensor:
    if surrogate == "logistic":
        return torch.logaddexp(-t, torch.zeros_like(t))
    if surrogate == "hinge":
        return torch.clamp(margin - t, min=0)
    if surrogate == "squared":
        return (margin - t) ** 2
    return torch.exp(-t)


def soft_extreme(x: torch.Tensor, temperature: float | None, lowest: bool) -> torch.Tensor:
    """min / max, or -tau log mean exp(-x / tau) / tau log mean exp(x / tau)."""
    if temperature is None:
        return x.min() if lowest else x.max()
    sign = -1.0 if lowest else 1.0
    return sign * temperature * (torch.logsumexp(sign * x / temperature, 0) - math.log(x.numel()))


def brute_force(scores, levels, groups=None, mask=None, *, cost="uniform", surrogate="logistic", pairs="all",
                temperature=None, reduction="mean") -> torch.Tensor:
    """The spec's loss of one label (or aggregated label) ``levels``, every pair formed, float64."""
    scores, levels = scores.double(), levels.double()
    if mask is not None:
        scores, levels, groups = scores[mask], levels[mask], None if groups is None else groups[mask]
    members = [torch.arange(scores.numel())] if groups is None else [
        torch.nonzero(groups == u).flatten() for u in torch.unique(groups)]
    per_group = []
    for idx in members:
        s, y = scores[idx], levels[idx]
        if pairs == "all":
            upper = y[:, None] > y[None, :]
            c = (y[:, None] - y[None, :]) if cost == "linear" else torch.ones_like(upper, dtype=torch.float64)
            c = torch.where(upper, c, 0.0)
            if c.sum() > 0:
                per_group.append((c * torch.where(upper, phi(s[:, None] - s[None, :], surrogate), 0.0)).sum() / c.sum())
            continue
        numerator, denominator = s.sum() * 0, 0.0
        for a, b in itertools.permutations(torch.unique(y).tolist(), 2):
            if a > b:
                c = a - b if cost == "linear" else 1.0
                margin = soft_extreme(s[y == a], temperature, True) - soft_extreme(s[y == b], temperature, False)
                numerator, denominator = numerator + c * phi(margin, surrogate), denominator + c
        if denominator > 0:
            per_group.append(numerator / denominator)
    if not per_group:
        return scores.sum() * 0
    stacked = torch.stack(per_group)
    return stacked.mean() if reduction == "mean" else stacked.sum()


def _batch(n: int = 20, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = (torch.rand(n, 2, generator=gen) < 0.4).double()
    labels[0], labels[1] = torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])
    groups = torch.arange(n) % 3
    mask = torch.rand(n, generator=gen) < 0.8
    return scores, labels, groups, mask


def _losses(surrogate: str, pairs: str, temperature, backend: str):
    """(name, module, its labels from the (N, 2) labels, the brute force of its scores)."""
    options = dict(surrogate=surrogate, pairs=pairs, temperature=temperature)
    spec = dict(options)
    yield "auc", mlloss.AUCLoss(backend=backend, **options), lambda y: y[:, 0], \
        lambda s, y, g, m: brute_force(s, y[:, 0], g, m, **spec)
    yield "laa", mlloss.LaALoss(backend=backend, **options), lambda y: y, \
        lambda s, y, g, m: brute_force(s, y.sum(1), g, m, cost="linear", **spec)
    yield "loa", mlloss.LoALoss([1.0, 0.5], backend=backend, **options), lambda y: y, \
        lambda s, y, g, m: brute_force(s, y[:, 0], g, m, **spec) + 0.5 * brute_force(s, y[:, 1], g, m, **spec)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("surrogate,pairs", [("logistic", "all"), ("hinge", "all"), ("exponential", "hardest")])
def test_dtype_rule_against_float64_brute_force(dtype, backend, surrogate, pairs):
    # float16 / bfloat16 scores: the loss is float32, the gradient comes back in the scores' dtype,
    # and both equal the float64 brute force of the rounded scores (fp32 accumulation); float64: 1e-10.
    scores, labels, groups, mask = _batch()
    narrow = scores.to(dtype)
    for name, loss, labels_of, reference in _losses(surrogate, pairs, None, backend):
        for g, m in [(None, None), (groups, mask)]:
            leaf = narrow.detach().clone().requires_grad_(True)
            value = loss(leaf, labels_of(labels), g, m)
            value.backward()
            exact = narrow.double().detach().clone().requires_grad_(True)
            expected = reference(exact, labels, g, m)
            expected.backward()
            assert value.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), name
            assert leaf.grad.dtype == dtype, name
            rtol = 1e-10 if dtype == torch.float64 else 1e-5
            torch.testing.assert_close(value.double(), expected, rtol=rtol, atol=0, msg=name)
            # The gradient is exact up to its rounding to the scores' dtype.
            grad_rtol = {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float64: 1e-10}[dtype]
            torch.testing.assert_close(leaf.grad.double(), exact.grad, rtol=grad_rtol, atol=1e-12, msg=name)


DEGENERATE = {
    "empty": (0, "mixed", None),
    "one-item": (1, "mixed", None),
    "one-label": (6, "one-label", None),
    "single-class-groups": (6, "mixed", "singletons"),
    "mask-keeps-nothing": (6, "mixed", "mask-none"),
    "mask-keeps-one": (6, "mixed", "mask-one"),
}


@pytest.mark.parametrize("case", list(DEGENERATE))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_batches_without_a_valid_pair_give_plus_zero_and_zero_gradient(case, dtype):
    n, labelling, extra = DEGENERATE[case]
    labels = torch.zeros(n, 2) if labelling == "one-label" else (torch.arange(n)[:, None] % 2 == 0).repeat(1, 2).float()
    groups = torch.arange(n) if extra == "singletons" else None
    mask = None if extra not in ("mask-none", "mask-one") else torch.arange(n) < (0 if extra == "mask-none" else 1)
    for surrogate, pairs, temperature in [("logistic", "all", None), ("exponential", "all", None),
                                          ("hinge", "hardest", None), ("squared", "hardest", 0.5)]:
        for backend in BACKENDS:
            options = dict(surrogate=surrogate, pairs=pairs, temperature=temperature, backend=backend)
            losses = [(mlloss.AUCLoss(**options), labels[:, 0]), (mlloss.LaALoss(**options), labels),
                      (mlloss.LoALoss(**options), labels), (mlloss.LoALoss("balanced", **options), labels)]
            if pairs == "hardest":
                losses.append((mlloss.PDAOMLoss(surrogate=surrogate, temperature=temperature, backend=backend), labels[:, 0]))
            for loss, y in losses:
                leaf = torch.randn(n).to(dtype).requires_grad_(True)
                value = loss(leaf, y, groups, mask)
                value.backward()
                assert value.item() == 0.0 and not torch.signbit(value), (case, loss)
                assert leaf.grad.dtype == dtype and bool((leaf.grad == 0).all()), (case, loss)


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("pairs,temperature", [("all", None), ("hardest", None), ("hardest", 0.3)])
def test_gradcheck_float64(surrogate, pairs, temperature):
    # Scores spread apart (no hinge pair at its kink, no tied extreme), groups and a mask.
    n = 12
    gen = torch.Generator().manual_seed(5)
    labels = torch.stack([torch.arange(n) % 3 == 0, torch.arange(n) % 4 == 1], 1).double()
    groups = torch.arange(n) % 2
    mask = torch.ones(n, dtype=torch.bool)
    mask[[2, 7]] = False
    options = dict(surrogate=surrogate, pairs=pairs, temperature=temperature, backend="torch")
    losses = [(mlloss.AUCLoss(**options), labels[:, 0]), (mlloss.LaALoss([1.0, 2.5], **options), labels),
              (mlloss.LoALoss([0.7, 1.3], **options), labels)]
    if pairs == "hardest":
        combined = mlloss.build_loss("bce+pdaom", surrogate=surrogate, temperature=temperature, backend="torch", lam=3.0)
    else:
        combined = mlloss.build_loss("bce+auc", surrogate=surrogate, backend="torch", lam=3.0)
    losses.append((combined, labels[:, 0]))
    for loss, y in losses:
        for g, m in [(None, None), (groups, mask)]:
            scores = (torch.randperm(n, generator=gen).double() * 0.37).requires_grad_(True)
            assert torch.autograd.gradcheck(lambda s: loss(s, y, g, m), (scores,), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("cost", ["linear", "uniform"])
@pytest.mark.parametrize("temperature", [None, 0.5])
def test_hardest_pairs_of_a_group_wider_than_a_block_are_tiled(surrogate, cost, temperature, monkeypatch):
    # A real-valued label has a level per item: the max-violation pairs of one group form a
    # (levels x levels) table, which was built whole (12 GB at 16,384 items, N x N at any N). With
    # blocks of 64 level pairs, a group of 40 levels must be cut into tiles of at most 64, and the
    # loss and gradient must still be the brute force's (beside it, a group narrow enough for one block).
    from mlloss.ops import hardest

    monkeypatch.setattr(hardest, "BLOCK_ELEMENTS", 64)
    largest = []
    original = hardest.surrogate_value_and_pull

    def recording(reverse_margin, *args):
        largest.append(reverse_margin.numel())
        return original(reverse_margin, *args)

    monkeypatch.setattr(hardest, "surrogate_value_and_pull", recording)
    gen = torch.Generator().manual_seed(7)
    n = 90
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    levels = torch.randint(0, 40, (n,), generator=gen).double()
    levels[:40] = torch.arange(40.0)  # group 0 holds all 40 levels
    levels[75:] = levels[75:] % 4  # group 1: 15 items at 4 levels, one block
    groups = (torch.arange(n) >= 75).long()
    for g in (None, groups):
        largest.clear()
        leaf = scores.clone().requires_grad_(True)
        value = mlloss.LaALoss(surrogate=surrogate, pairs="hardest", temperature=temperature, cost=cost,
                               backend="torch")(leaf, levels, g)
        value.backward()
        exact = scores.clone().requires_grad_(True)
        expected = brute_force(exact, levels, g, cost=cost, surrogate=surrogate, pairs="hardest", temperature=temperature)
        expected.backward()
        assert max(largest) <= 64
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
        torch.testing.assert_close(leaf.grad, exact.grad, rtol=1e-10, atol=1e-15)
