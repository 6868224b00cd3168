"""A small seeded fuzz of the Triton tier (``backend="triton"``, under TRITON_INTERPRET=1) against a
float64 brute force written here from docs/loss-spec.md (independent of tests/reference.py) and
against the PyTorch tier: every loss and surrogate, all / hardest / soft hardest pairs, masks,
groups, ties and score dtypes, on both of the Triton tier's all-pairs paths (the dense kernels
and, with ``kernels.dense.MAX_ITEMS`` lowered, the layout kernels) and with small tiles, so that
batches of a few dozen items cross block boundaries. Values, gradients (with a random upstream
gradient), ``loss.parts`` and run-to-run bits are compared.

(The full fuzz, a few thousand cases, is a scratch script; these cases are its cheap sample. A second
sample runs the layout kernel's fast branch, CUDA's, on the logistic cases.)
"""

from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

pytest.importorskip("triton")

import mlloss  # noqa: E402
from mlloss.kernels import dense, hardest, pairwise  # noqa: E402

pytestmark = pytest.mark.triton
SURROGATES = ("logistic", "hinge", "squared", "exponential")


def phi(t, surrogate, margin):
    if surrogate == "logistic":
        return torch.logaddexp(torch.zeros_like(t), -t)
    if surrogate == "hinge":
        return torch.relu(margin - t)  # relu'(0) = 0: no pull at the kink (mlloss.surrogates)
    if surrogate == "squared":
        return (margin - t) ** 2
    return torch.exp(-t)


def soft_extreme(values, signed_temperature):
    """t log mean exp(s / t): the soft max for t > 0, the soft min for t < 0, written from the
    values' own extreme e as e + t log mean exp((s - e) / t), so that equal values give exactly
    their value (a log-sum-exp less log n rounds it by an ulp, which a surrogate at its kink, a
    hinge or square at margin 0, turns into a different slope: seeds 3344, 4012 and 4455 of a
    wider run of this fuzz)."""
    extreme = values.max() if signed_temperature > 0 else values.min()
    return extreme + signed_temperature * torch.log(torch.mean(torch.exp((values - extreme) / signed_temperature)))


def problem_loss(s, level, group, *, cost, surrogate, margin, hardest_pairs, temperature, reduction):
    """(loss, valid pairs, groups with pairs) of one problem: levels ``level`` (float64), per group,
    reduced over the groups with a valid pair."""
    per_group, valid = [], 0
    for u in torch.unique(group):
        s_u, v_u = s[group == u], level[group == u]
        present = torch.unique(v_u)
        if present.numel() < 2:
            continue
        if not hardest_pairs:
            upper = v_u[:, None] > v_u[None, :]
            c = torch.where(upper, (v_u[:, None] - v_u[None, :]) if cost == "linear" else 1.0, 0.0)
            t = s_u[:, None] - s_u[None, :]
            per_group.append((c * torch.where(upper, phi(t, surrogate, margin), 0.0)).sum() / c.sum())
            valid += int(upper.sum())
            continue
        num, den = 0.0, 0.0
        for a in present:
            for b in present[present < a]:
                high, low = s_u[v_u == a], s_u[v_u == b]
                if temperature is None:
                    low_of_high, high_of_low = high.amin(), low.amax()  # amin/amax split ties equally
                else:
                    low_of_high, high_of_low = soft_extreme(high, -temperature), soft_extreme(low, temperature)
                c = float(a - b) if cost == "linear" else 1.0
                num = num + c * phi(low_of_high - high_of_low, surrogate, margin)
                den += c
                valid += 1
        per_group.append(num / den)
    if not per_group:
        return s.sum() * 0, 0, 0
    stacked = torch.stack(per_group)
    return (stacked.mean() if reduction == "mean" else stacked.sum()), valid, len(per_group)


def brute_force(case, scores):
    """(loss, [per-label losses], valid pairs, groups with pairs) over the kept items."""
    keep = torch.ones(scores.shape[0], dtype=torch.bool) if case["mask"] is None else case["mask"]
    s, labels = scores[keep], case["labels"].to(torch.float64)[keep]
    group = torch.zeros(s.shape[0], dtype=torch.int64) if case["groups"] is None else case["groups"][keep]
    options = dict(surrogate=case["surrogate"], margin=case["margin"], hardest_pairs=case["pairs"] == "hardest",
                   temperature=case["temperature"], reduction=case["reduction"])
    if case["loss"] == "laa":
        weights = torch.tensor(case["weights"] or [1.0] * labels.shape[1], dtype=torch.float64)
        loss, valid, groups = problem_loss(s, labels @ weights, group, cost=case["cost"], **options)
        return loss, [loss], valid, groups
    mixing = [1.0] * labels.shape[1] if case["weights"] is None else case["weights"]
    losses, valid, groups = [], 0, 0
    for k in range(labels.shape[1]):
        loss_k, valid_k, groups_k = problem_loss(s, labels[:, k], group, cost="uniform", **options)
        losses.append(loss_k)
        valid, groups = valid + valid_k, groups + groups_k
    return sum(a * loss_k for a, loss_k in zip(mixing, losses)), losses, valid, groups


def make_case(seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n = rng.choice([2, 3, 15, 16, 17, 31, 33, 63, 65])
    loss = ("auc", "loa", "laa")[seed % 3]
    pairs = rng.choice(["all", "all", "hardest"])
    case = dict(
        loss=loss, n=n, surrogate=SURROGATES[(seed // 3) % 4], margin=rng.choice([1.0, 0.5, 0.0]), pairs=pairs,
        temperature=rng.choice([None, 0.5, 2.0]) if pairs == "hardest" else None, reduction=rng.choice(["mean", "sum"]),
        cost=rng.choice(["linear", "uniform"]), weights=None, layout=seed % 2 == 1, small_tiles=seed % 4 >= 2,
        dtype=rng.choice([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
    )
    if loss == "loa":
        case["weights"] = rng.choice([None, [1.0, 0.0, 0.5]])
        labels = (torch.rand(n, 3, generator=gen) < rng.choice([0.2, 0.5])).double()
    elif loss == "laa" and rng.random() < 0.5:  # an ordinal column
        labels = torch.randint(0, rng.choice([3, 6]), (n, 1), generator=gen).double()
    elif loss == "laa":  # binary columns: 4 levels (dense kernels) or 8 (layout kernels)
        columns = rng.choice([2, 3])
        case["weights"] = [1.0, 2.0, 4.0][:columns]
        labels = (torch.rand(n, columns, generator=gen) < 0.4).double()
    else:
        labels = (torch.rand(n, 1, generator=gen) < rng.choice([0.1, 0.5])).double()
    case["labels"] = labels
    case["groups"] = rng.choice([
        None, torch.randint(0, 4, (n,), generator=gen) * 7 - 9, torch.randperm(n, generator=gen) - 2**62,
        torch.randint(0, max(1, n // 2), (n,), generator=gen),
    ])
    case["mask"] = rng.choice([None, torch.rand(n, generator=gen) < 0.7, torch.zeros(n, dtype=torch.bool)])
    scores = rng.choice([
        torch.randn(n, generator=gen, dtype=torch.float64),
        torch.randint(-2, 3, (n,), generator=gen).double() * 0.5,  # many ties
        torch.full((n,), 0.25, dtype=torch.float64),
    ])
    if case["mask"] is not None:  # what a left-out row holds does not matter
        scores = scores.masked_fill(~case["mask"], float("nan"))
    case["scores"] = scores.to(case["dtype"])
    case["upstream"] = rng.choice([1.0, -0.7, 2.5])
    return case


@pytest.fixture
def kernel_paths(monkeypatch):
    def apply(case):
        if case["layout"]:  # binary problems and few-level LaA take the layout kernels too
            monkeypatch.setattr(dense, "MAX_ITEMS", 0)
        if case["small_tiles"]:
            monkeypatch.setitem(dense.TILES, "interpreter", (16, 16, 1))
            monkeypatch.setitem(pairwise.TILES, "interpreter", (16, 32, 4))
            monkeypatch.setitem(pairwise.FINALIZE_BLOCK, "interpreter", 32)
            monkeypatch.setitem(hardest.LEVELS_BLOCK, "interpreter", 32)
    return apply


def in_runs(case):
    """The case with its items ordered by group, each group a run, and the loss told so
    (``contiguous_groups=True``)."""
    order = torch.argsort(case["groups"], stable=True)
    ordered = {key: case[key][order] for key in ("scores", "labels", "groups")}
    if case["mask"] is not None:
        ordered["mask"] = case["mask"][order]
    return dict(case, **ordered, contiguous=True)


def run(case, backend):
    options = dict(surrogate=case["surrogate"], margin=case["margin"], pairs=case["pairs"],
                   temperature=case["temperature"], reduction=case["reduction"], backend=backend,
                   contiguous_groups=case.get("contiguous", False))
    if case["loss"] == "auc":
        loss_fn, labels = mlloss.AUCLoss(**options), case["labels"][:, 0].bool()
    elif case["loss"] == "loa":
        loss_fn, labels = mlloss.LoALoss(case["weights"], **options), case["labels"].to(torch.int64)
    else:
        loss_fn, labels = mlloss.LaALoss(case["weights"], cost=case["cost"], **options), case["labels"].float()
    x = case["scores"].clone().requires_grad_(True)
    value = loss_fn(x, labels, case["groups"], case["mask"])
    (value * case["upstream"]).backward()
    return value.detach(), x.grad, {name: float(part) for name, part in loss_fn.parts.items()}


@pytest.mark.parametrize("seed", range(48))
def test_triton_tier_against_brute_force_and_torch_tier(seed, kernel_paths):
    case = make_case(seed)
    kernel_paths(case)
    value, grad, parts = run(case, "triton")
    again = run(case, "triton")
    assert torch.equal(value, again[0]) and torch.equal(grad, again[1]), "not bit-identical on a second run"

    scores = case["scores"].to(torch.float64, copy=True).requires_grad_(True)  # the rounded inputs, in float64
    expected, label_losses, valid, groups = brute_force(case, scores)
    (expected * case["upstream"]).backward()
    tolerance = 1e-6 if case["dtype"] == torch.float64 else 1e-4
    value_atol = 0.0 if case["dtype"] == torch.float64 else 1e-6  # a loss near 0, accumulated in float32
    torch.testing.assert_close(value.double(), expected.detach(), rtol=tolerance, atol=value_atol)
    grad_tolerance = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(case["dtype"], tolerance)
    scale = max(float(scores.grad.abs().max()), 1e-12)
    torch.testing.assert_close(grad.double() / scale, scores.grad / scale, rtol=grad_tolerance, atol=grad_tolerance)
    if case["mask"] is not None:
        assert not grad[~case["mask"]].any(), "a left-out item got a gradient"
    assert parts["valid_pairs"] == valid and parts["groups_with_pairs"] == groups
    if case["loss"] == "loa":
        for k, label_loss in enumerate(label_losses):
            assert parts[f"label_loss/{k}"] == pytest.approx(float(label_loss.detach()), rel=tolerance, abs=1e-6)

    torch_value, torch_grad, torch_parts = run(case, "torch")
    torch.testing.assert_close(value, torch_value, rtol=tolerance, atol=value_atol)
    torch.testing.assert_close(grad.double() / scale, torch_grad.double() / scale, rtol=grad_tolerance, atol=grad_tolerance)
    assert parts.keys() == torch_parts.keys()
    for name in parts:
        assert parts[name] == pytest.approx(torch_parts[name], rel=tolerance, abs=1e-6), name


def _fast_seeds(count: int, surrogates: tuple[str, ...] = ("logistic",)) -> list[int]:
    """The first ``count`` seeds whose case is an all-pairs loss of float32, float16 or bfloat16
    scores with one of ``surrogates``: the kernels' fast branch serves them on CUDA."""
    seeds, seed = [], 0
    while len(seeds) < count:
        case = make_case(seed)
        if case["surrogate"] in surrogates and case["pairs"] == "all" and case["dtype"] != torch.float64:
            seeds.append(seed)
        seed += 1
    return seeds


def _assert_matches_brute_force(case, value, grad):
    """The fast branch's value and gradient against the float64 brute force (the interpreter
    computes its special functions exactly: the base-2 algebra is what is compared)."""
    scores = case["scores"].to(torch.float64, copy=True).requires_grad_(True)
    expected, _, _, _ = brute_force(case, scores)
    (expected * case["upstream"]).backward()
    torch.testing.assert_close(value.double(), expected.detach(), rtol=1e-4, atol=1e-6)
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(case["dtype"], 1e-4)
    scale = max(float(scores.grad.abs().max()), 1e-6)  # a float16 gradient below ~6e-8 is 0 in every branch
    torch.testing.assert_close(grad.double() / scale, scores.grad / scale, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("seed", _fast_seeds(12))
def test_fast_logistic_on_the_layout_kernels_against_brute_force(seed, kernel_paths, monkeypatch):
    """The layout kernel's fast branch (CUDA's: base-2 scores, the factored terms in row blocks
    that fit, the per-pair terms in the others; the interpreter computes its special functions
    exactly) on the fuzz's cases, every second one with 30% of its scores 80 times larger (blocks
    that do not fit, partners far from a block's centre)."""
    from mlloss.kernels import _common

    case = make_case(seed)
    kernel_paths(dict(case, layout=True))
    monkeypatch.setattr(_common, "fast_math", lambda device, accumulation: accumulation == torch.float32)
    if seed % 2:
        wide = torch.rand(case["n"], generator=torch.Generator().manual_seed(seed)) < 0.3
        case["scores"] = (case["scores"].double() * torch.where(wide, 80.0, 1.0)).to(case["dtype"])
    value, grad, _ = run(case, "triton")
    _assert_matches_brute_force(case, value, grad)


@pytest.mark.parametrize("seed", _fast_seeds(16, SURROGATES))
def test_fast_branch_on_the_dense_kernels_against_brute_force(seed, kernel_paths, monkeypatch):
    """The dense kernels' fast branch (CUDA's for float32 accumulation: base-2 scores for the
    logistic and exponential terms, ln 2 back once per row), which the other CPU tests never run,
    on the fuzz's all-pairs cases of every surrogate; every second grouped one in runs of its groups
    (``contiguous_groups=True``: the run-bounded kernels), and every odd logistic, hinge or squared
    one with 30% of its scores 80 times larger."""
    from mlloss.kernels import _common

    case = make_case(seed)
    kernel_paths(dict(case, layout=False))
    fast = lambda device, accumulation: accumulation == torch.float32  # noqa: E731
    monkeypatch.setattr(_common, "fast_math", fast)  # the layout kernels' (LaA of 5 levels or more)
    monkeypatch.setattr(dense, "fast_math", fast)  # imported by name
    if case["groups"] is not None and seed % 4 < 2:
        case = in_runs(case)
    if seed % 2 and case["surrogate"] != "exponential":  # exp(80 x) overflows, as it must
        wide = torch.rand(case["n"], generator=torch.Generator().manual_seed(seed)) < 0.3
        case["scores"] = (case["scores"].double() * torch.where(wide, 80.0, 1.0)).to(case["dtype"])
    value, grad, _ = run(case, "triton")
    _assert_matches_brute_force(case, value, grad)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("temperature,score", [(1.0, -1.5), (0.3, 0.3), (3.0, 0.3)])
def test_soft_extremes_of_equal_scores_are_the_score(backend, temperature, score):
    """A cell of equal scores has softmin = softmax = its score exactly (mean exp 1). The PyTorch
    tier computed -tau (log sum exp(-s / tau) - log n), off by an ulp, which put a pair at the
    hinge's kink (margin 0) on its active side: a gradient of -0.5 where the Triton tier, and
    relu'(0) = 0, give none."""
    scores = torch.full((6,), score, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([1, 0, 1, 0, 1, 0])
    groups = torch.tensor([4, 4, 4, 9, 9, 9])
    for grouped in (None, groups):
        loss = mlloss.AUCLoss(surrogate="hinge", margin=0.0, pairs="hardest", temperature=temperature,
                              reduction="sum", backend=backend)(scores, labels, grouped)
        (grad,) = torch.autograd.grad(loss, scores)
        assert float(loss.detach()) == 0.0
        assert not grad.any(), grad
    laa = mlloss.LaALoss(surrogate="hinge", margin=0.0, pairs="hardest", temperature=temperature, backend=backend)
    loss = laa(scores, torch.tensor([0, 1, 2, 0, 1, 2]), groups)
    (grad,) = torch.autograd.grad(loss, scores)
    assert float(loss.detach()) == 0.0 and not grad.any(), grad
