"""Every loss against the float64 brute-force reference: values and gradients, on randomised batches
with ties, singleton and one-class groups, K = 1..5 labels, weights, every surrogate and backend."""

from __future__ import annotations

import importlib.util
import itertools
import warnings

import pytest
import torch

import mlloss
from reference import hardest_loss, laa_loss, loa_loss, pair_loss

SURROGATES = ("logistic", "hinge", "squared", "exponential")
RTOL = 1e-6


def random_batch(seed: int, *, num_labels: int = 1, grouped: bool = True, ties: bool = False, n: int | None = None):
    gen = torch.Generator().manual_seed(seed)
    n = n if n is not None else int(torch.randint(2, 70, (1,), generator=gen))
    if ties:  # few distinct scores, spaced by exactly the margin, to hit ties and hinge kinks
        scores = torch.randint(-3, 4, (n,), generator=gen).to(torch.float64) * 0.5
    else:
        scores = torch.randn(n, generator=gen, dtype=torch.float64) * 1.5
    priors = torch.rand(num_labels, generator=gen) * 0.8 + 0.1
    labels = (torch.rand(n, num_labels, generator=gen) < priors).to(torch.float64)
    # Many small groups (singletons and one-class groups among them) with non-contiguous ids.
    groups = torch.randint(0, max(1, n // 4), (n,), generator=gen) * 37 - 100 if grouped else None
    return scores, labels, groups


def value_and_grad(fn, scores):
    x = scores.detach().clone().requires_grad_(True)
    value = fn(x)
    (grad,) = torch.autograd.grad(value, x, allow_unused=True)
    return value.detach(), (torch.zeros_like(x) if grad is None else grad)


def assert_matches(ours_fn, reference_fn, scores, rtol=RTOL):
    ours, ours_grad = value_and_grad(ours_fn, scores)
    ref, ref_grad = value_and_grad(reference_fn, scores)
    assert torch.isfinite(ours) and torch.isfinite(ours_grad).all()
    torch.testing.assert_close(ours, ref, rtol=rtol, atol=1e-12)
    scale = ref_grad.abs().max().clamp(min=1e-12)
    torch.testing.assert_close(ours_grad / scale, ref_grad / scale, rtol=rtol, atol=rtol)


CASES = list(itertools.product(range(6), SURROGATES, ("auto", "torch"), ("mean", "sum")))


@pytest.mark.parametrize("seed,surrogate,backend,reduction", CASES)
def test_auc_loss_matches_reference(seed, surrogate, backend, reduction):
    scores, labels, groups = random_batch(seed, grouped=seed % 2 == 0, ties=seed % 3 == 0)
    loss = mlloss.AUCLoss(surrogate=surrogate, backend=backend, reduction=reduction, margin=1.0)
    assert_matches(
        lambda s: loss(s, labels[:, 0], groups),
        lambda s: pair_loss(s, labels[:, 0], groups, surrogate=surrogate, reduction=reduction),
        scores,
    )


@pytest.mark.parametrize("seed,surrogate,backend,reduction", CASES)
def test_laa_loss_matches_reference(seed, surrogate, backend, reduction):
    num_labels = 1 + seed % 5
    scores, labels, groups = random_batch(seed, num_labels=num_labels, grouped=seed % 2 == 1, ties=seed % 3 == 1)
    weights = None if seed < 3 else [0.5 + k for k in range(num_labels)]
    cost = "linear" if seed % 2 == 0 else "uniform"
    loss = mlloss.LaALoss(weights, cost=cost, surrogate=surrogate, backend=backend, reduction=reduction)
    assert_matches(
        lambda s: loss(s, labels, groups),
        lambda s: laa_loss(s, labels, groups, weights, cost=cost, surrogate=surrogate, reduction=reduction),
        scores,
    )


@pytest.mark.parametrize("seed,surrogate,backend,reduction", CASES)
def test_loa_loss_matches_reference(seed, surrogate, backend, reduction):
    num_labels = 1 + (seed + 2) % 5
    scores, labels, groups = random_batch(seed + 100, num_labels=num_labels, grouped=seed % 2 == 0, ties=seed % 3 == 2)
    weights = [0.0 if k == 1 else 0.3 + k for k in range(num_labels)] if seed >= 3 else None
    loss = mlloss.LoALoss(weights, surrogate=surrogate, backend=backend, reduction=reduction)
    assert_matches(
        lambda s: loss(s, labels, groups),
        lambda s: loa_loss(s, labels, groups, weights, surrogate=surrogate, reduction=reduction),
        scores,
    )


@pytest.mark.parametrize("seed,surrogate,temperature", list(itertools.product(range(4), SURROGATES, (None, 0.7))))
def test_hardest_pairs_match_reference(seed, surrogate, temperature):
    # (the mean reduction on odd seeds: LoA's labels count their groups with a pair each)
    scores, labels, groups = random_batch(seed + 200, num_labels=3, grouped=True, ties=temperature is None and seed % 2 == 0)
    reduction = "mean" if seed % 2 else "sum"
    options = dict(surrogate=surrogate, pairs="hardest", temperature=temperature, reduction=reduction)
    assert_matches(
        lambda s: mlloss.AUCLoss(**options)(s, labels[:, 0], groups),
        lambda s: hardest_loss(s, labels[:, 0], groups, surrogate=surrogate, reduction=reduction, temperature=temperature),
        scores,
    )
    assert_matches(
        lambda s: mlloss.LaALoss(**options)(s, labels, groups),
        lambda s: hardest_loss(s, labels.sum(1), groups, cost="linear", surrogate=surrogate, reduction=reduction,
                               temperature=temperature),
        scores,
    )
    assert_matches(
        lambda s: mlloss.LoALoss([1.0, 2.0, 0.5], **options)(s, labels, groups),
        lambda s: loa_loss(s, labels, groups, [1.0, 2.0, 0.5], pairs="hardest", surrogate=surrogate, reduction=reduction,
                           temperature=temperature),
        scores,
    )


@pytest.mark.parametrize("temperature", (None, 0.5))
def test_pdaom_is_exponential_hardest_sum_over_users(temperature):
    scores, labels, groups = random_batch(7, grouped=True)
    assert_matches(
        lambda s: mlloss.PDAOMLoss(temperature=temperature)(s, labels, groups),
        lambda s: hardest_loss(s, labels[:, 0], groups, surrogate="exponential", reduction="sum", temperature=temperature),
        scores,
    )


def test_ordinal_label_column_for_laa():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(50, generator=gen, dtype=torch.float64)
    ratings = torch.randint(0, 5, (50,), generator=gen)
    groups = torch.randint(0, 6, (50,), generator=gen)
    for cost in ("linear", "uniform"):
        assert_matches(
            lambda s: mlloss.LaALoss(cost=cost)(s, ratings, groups),
            lambda s: pair_loss(s, ratings, groups, cost=cost),
            scores,
        )
    # Non-integer ordinal values, declared as real-valued levels, go through the general level index.
    levels = ratings.to(torch.float64) * 0.37 + 0.01
    assert_matches(
        lambda s: mlloss.LaALoss(real_levels=True)(s, levels), lambda s: pair_loss(s, levels, cost="linear"), scores
    )
    # The column as a strided view of a wider table, in each dtype, with a weight or without:
    # the levels (a (1, N) row of the column, copied when strided) are the same, and no search
    # is handed a strided tensor (torch warns of the extra copy).
    table = torch.stack([ratings, ratings.flip(0), ratings], dim=1)
    for dtype, weight in itertools.product((torch.int64, torch.float32, torch.float64), (None, [2.5])):
        column = table.to(dtype)[:, 1:2]
        for backend in ("torch", "triton") if importlib.util.find_spec("triton") else ("torch",):
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # (Triton 3.6's interpreter warns of NumPy)
                assert_matches(
                    lambda s: mlloss.LaALoss(weight, backend=backend)(s, column, groups),
                    lambda s: pair_loss(s, ratings.flip(0) * (weight or [1])[0], groups, cost="linear"),
                    scores,
                )


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_large_groups_use_tiles_and_match_closed_forms(surrogate):
    # 5,000 items in one group exceed the bucketed size, so the torch path runs tiles; the
    # closed forms (and, for logistic, an independent blockwise float64 sum) check it.
    gen = torch.Generator().manual_seed(11)
    scores = torch.randn(5000, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (5000, 2), generator=gen).to(torch.float64)
    tiled = value_and_grad(lambda s: mlloss.LaALoss(surrogate=surrogate, backend="torch")(s, labels), scores)
    if surrogate == "logistic":
        expected = value_and_grad(lambda s: _blockwise_laa_logistic(s, labels.sum(1)), scores)
    else:
        expected = value_and_grad(lambda s: mlloss.LaALoss(surrogate=surrogate, backend="exact")(s, labels), scores)
    torch.testing.assert_close(tiled[0], expected[0], rtol=1e-9, atol=0)
    torch.testing.assert_close(tiled[1], expected[1], rtol=1e-7, atol=1e-12)


def _blockwise_laa_logistic(scores, levels):
    upper = levels[:, None] > levels[None, :]
    cost = torch.where(upper, levels[:, None] - levels[None, :], torch.zeros(()))
    t = scores[:, None] - scores[None, :]
    return (cost * torch.nn.functional.softplus(-t)).sum() / cost.sum()


@pytest.mark.parametrize("loss", [mlloss.AUCLoss(), mlloss.LoALoss(), mlloss.LaALoss(), mlloss.PDAOMLoss(),
                                  mlloss.AUCLoss(surrogate="squared"), mlloss.LaALoss(surrogate="hinge")])
@pytest.mark.parametrize("case", ["empty", "one item", "one class", "all singletons"])
def test_no_valid_pair_gives_exact_zero_and_zero_gradient(loss, case):
    n = {"empty": 0, "one item": 1, "one class": 6, "all singletons": 6}[case]
    scores = torch.randn(n, dtype=torch.float32, requires_grad=True)
    labels = torch.ones(n, 2) if case == "one class" else torch.arange(n).remainder(2)[:, None].repeat(1, 2)
    if isinstance(loss, (mlloss.AUCLoss,)):
        labels = labels[:, 0]
    groups = torch.arange(n) if case == "all singletons" else None
    value = loss(scores, labels, groups)
    value.backward()
    assert value.item() == 0.0
    assert scores.grad is not None and torch.equal(scores.grad, torch.zeros_like(scores))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("surrogate,backend", [("logistic", "auto"), ("exponential", "auto"), ("hinge", "torch")])
def test_half_precision_accumulates_in_fp32_and_returns_input_dtype_gradient(dtype, surrogate, backend):
    scores, labels, groups = random_batch(5, num_labels=2, n=300)
    rounded = scores.to(dtype)
    x = rounded.clone().requires_grad_(True)
    value = mlloss.LaALoss(surrogate=surrogate, backend=backend)(x, labels, groups)
    value.backward()
    assert value.dtype == torch.float32 and x.grad.dtype == dtype
    # Reference on the same rounded inputs, in float64 (FlagGems' upcast reference).
    ref, ref_grad = value_and_grad(lambda s: laa_loss(s, labels, groups, surrogate=surrogate), rounded.to(torch.float64))
    torch.testing.assert_close(value.double(), ref, rtol=1e-5, atol=1e-6)
    scale = ref_grad.abs().max()
    torch.testing.assert_close(x.grad.double() / scale, ref_grad / scale, rtol=0, atol=2e-2)


@pytest.mark.parametrize("backend", ("torch", "auto"))
def test_same_inputs_give_the_same_bits(backend):
    scores, labels, groups = random_batch(9, num_labels=2, n=3000)
    scores = scores.to(torch.float32)
    for groups_ in (None, groups):
        runs = [value_and_grad(lambda s: mlloss.LaALoss(backend=backend, surrogate="logistic" if backend == "torch" else "exponential")(s, labels, groups_), scores) for _ in range(2)]
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


def test_scores_of_shape_n_by_one_and_grad_output_scaling():
    scores, labels, groups = random_batch(4, n=40)
    column = scores[:, None].clone().requires_grad_(True)
    (mlloss.AUCLoss()(column, labels, groups) * 3.0).backward()
    _, grad = value_and_grad(lambda s: pair_loss(s, labels[:, 0], groups), scores)
    torch.testing.assert_close(column.grad[:, 0], 3.0 * grad, rtol=1e-9, atol=1e-12)


def test_parts_report_valid_pairs_and_label_terms():
    labels = torch.tensor([[1, 0], [0, 1], [0, 0], [1, 1]], dtype=torch.float64)
    scores = torch.tensor([0.3, -0.2, 0.1, 0.9], dtype=torch.float64)
    loa = mlloss.LoALoss([1.0, 2.0], label_names=["click", "buy"])
    value = loa(scores, labels)
    parts = loa.parts
    assert all(v.dim() == 0 for v in parts.values())  # scalars: one log_dict line works
    torch.testing.assert_close(value, parts["label_loss/click"] + 2 * parts["label_loss/buy"])
    assert parts["valid_pairs/click"].item() == 4 and parts["valid_pairs/buy"].item() == 4
    assert parts["valid_pairs"].item() == 8 and parts["mixing_weight/buy"].item() == 2.0
    laa = mlloss.LaALoss()
    laa(scores, labels)
    # Aggregated levels 1, 1, 0, 2: pairs (2>1) x2, (2>0), (1>0) x2.
    assert laa.parts["valid_pairs"].item() == 5 and laa.parts["groups_with_pairs"].item() == 1


def test_parts_entries_are_detached_and_made_once():
    """``LossParts`` holds detached scalars whatever its makers return (a user's loss whose parts
    close over a differentiable term), each maker called on first read only."""
    from mlloss.parts import LossParts

    weight = torch.tensor(2.0, requires_grad=True)
    calls = []
    parts = LossParts({"term": lambda: calls.append(1) or weight * 3.0})
    assert "term" in parts and not calls  # a membership test makes nothing
    assert not parts["term"].requires_grad and parts["term"].grad_fn is None
    assert parts["term"].item() == 6.0 and len(calls) == 1


def _every_built_loss():
    """(name, loss, scores (N, K), labels) for every name ``build_loss`` takes, bce+ included."""
    from mlloss.registry import LOSSES, SINGLE_LABEL

    gen = torch.Generator().manual_seed(7)
    labels = torch.randint(0, 2, (30, 2), generator=gen).double()
    for name in sorted(LOSSES) + [f"bce+{n}" for n in sorted(SINGLE_LABEL)]:
        single = name in SINGLE_LABEL or name.startswith("bce")
        yield name, mlloss.build_loss(name), (labels[:, :1] if single else labels)


@pytest.mark.parametrize("name", [name for name, *_ in _every_built_loss()])
def test_a_loss_pickles_after_a_call(name):
    # loss.parts closed over the call's results: torch.save(model) and pickling a module that holds a
    # used loss raised "Can't pickle local object 'pair_parts.<locals>.<lambda>'".
    import pickle

    _, loss, labels = next(item for item in _every_built_loss() if item[0] == name)
    scores = torch.randn(labels.shape[0], dtype=torch.float64)
    value = loss(scores, labels)
    copy = pickle.loads(pickle.dumps(loss))
    assert dict(copy.parts) == dict(loss.parts) and len(copy.parts) > 0
    assert torch.isfinite(value)


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("name", ["auc", "laa", "bce", "bce+pdaom"])
def test_a_second_derivative_raises_instead_of_dropping_the_losss_share(name, backend):
    # The gradient is a formula computed in the forward pass: autograd.grad(create_graph=True) returned it
    # without a graph, and a gradient penalty's parameter gradient silently lost the loss's share.
    loss = mlloss.build_loss(name) if name.startswith("bce") else mlloss.build_loss(name, backend=backend)
    weights = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    features = torch.randn(40, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    labels = torch.randint(0, 2, (40, 2 if name == "laa" else 1), generator=torch.Generator().manual_seed(2)).double()
    value = loss(features @ weights, labels)
    (grad,) = torch.autograd.grad(value, weights, create_graph=True)
    assert grad.requires_grad
    with pytest.raises(RuntimeError, match="second derivatives"):
        (value + grad.square().sum()).backward()
    # create_graph=True alone, and the first derivative, are as before
    first = torch.autograd.grad(loss(features @ weights, labels), weights)[0]
    torch.testing.assert_close(grad.detach(), first, rtol=0, atol=0)
    # scores changed in place after the call (probabilities for a metric) leave backward working,
    # as they did before the second derivative's guard
    logits = features @ weights * 1.0
    value = loss(logits, labels)
    logits.sigmoid_()
    torch.testing.assert_close(torch.autograd.grad(value, weights)[0], first, rtol=0, atol=0)
