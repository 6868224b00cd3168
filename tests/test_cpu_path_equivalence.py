"""The PyTorch tier's blocked all-pairs sum after its allocation and tiling changes.

``ops.allpairs._weighted_pairs`` writes its block temporaries in place (the pull of the exponential
surrogate *is* its value, so aliasing would corrupt one of them), and on the CPU the rectangles
between level runs are cut into square tiles and the listed pairs of small groups into chunks of
whole groups. Checked here: each path of the blocked sum (the pairs of small groups listed,
rectangles between level runs, masked tiles of a group with a level per item; the listed pairs'
lower sums both ways, the CPU's indexed add and the lower-major list), with tiles and
chunks cut small, against the float64 brute force of ``tests/reference.py`` for every surrogate and both costs; float32 scores
within float32 rounding of it; the block arithmetic against its out-of-place formula, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import mlloss
from mlloss.ops import allpairs, torch_tier
from mlloss.surrogates import NAMES, surrogate_value_and_pull
from reference import laa_loss, loa_loss, pair_loss

# (groups drawn with about this many items each or None, level kind): each picks one path of allpairs
PATHS = {
    "listed": (20, "ordinal"),  # groups of at most MAX_LISTED_GROUP items: their valid pairs listed
    # two groups of ~200 items, 0/1 labels: ~10,000 valid pairs a rectangle (LISTED_PAIRS_PER_RECTANGLE)
    "dense small groups": (200, "binary"),
    "rectangles": (None, "ordinal"),  # one group of 400 items, 5 levels: rectangles between level runs
    "tiles": (None, "real"),  # one group, a level per item: masked square tiles
}


def _batch(path: str, dtype: torch.dtype, seed: int = 0):
    per_group, kind = PATHS[path]
    gen = torch.Generator().manual_seed(seed)
    num_items = 400
    scores = (torch.randn(num_items, generator=gen, dtype=torch.float64) * 2).to(dtype)
    if kind == "ordinal":
        labels = torch.randint(0, 5, (num_items,), generator=gen).to(torch.float64)
    elif kind == "binary":
        labels = torch.randint(0, 2, (num_items,), generator=gen).to(torch.float64)
    else:
        labels = torch.rand(num_items, generator=gen, dtype=torch.float64) * 4
    groups = None if per_group is None else torch.randint(0, num_items // per_group, (num_items,), generator=gen)
    return scores, labels, groups


@pytest.fixture(params=["indexed add", "lower-major runs"])
def lower_sums(request, monkeypatch):
    """The listed pairs' two ways to each lower item's sum: the CPU's indexed add in list order,
    and the lower-major list of the same pairs that devices with atomic adds take (forced here)."""
    if request.param == "lower-major runs":
        monkeypatch.setattr(allpairs, "ORDERED_INDEX_ADD", ())
    return request.param


def _loss_and_grad(loss_fn, scores, *args):
    x = scores.detach().clone().requires_grad_(True)
    value = loss_fn(x, *args)
    value.backward()
    return value.detach(), x.grad


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("cost", ["linear", "uniform"])
@pytest.mark.parametrize("surrogate", NAMES)
def test_blocked_pairs_match_the_float64_brute_force(path, cost, surrogate, lower_sums):
    scores, labels, groups = _batch(path, torch.float64)
    real = PATHS[path][1] == "real"
    loss = mlloss.LaALoss(backend="torch", cost=cost, surrogate=surrogate, margin=0.5, real_levels=real)
    value, grad = _loss_and_grad(lambda x: loss(x, labels, groups), scores)
    expected, expected_grad = _loss_and_grad(
        lambda x: laa_loss(x, labels, groups, cost=cost, surrogate=surrogate, margin=0.5), scores
    )
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("per_layout", [1, 2, 3])
@pytest.mark.parametrize("path", ["listed", "dense small groups", "rectangles"])
def test_problems_stacked_in_one_layout_or_several_match_the_brute_force(path, per_layout, monkeypatch):
    # torch_tier stacks a call's problems into layouts of at most STACKED_ITEMS items: LoA's three
    # labels (one of weight 0) and three task columns, one, two or three problems to a layout, give
    # the brute force's loss and gradient and each problem's own statistics
    monkeypatch.setattr(torch_tier, "STACKED_ITEMS", 400 * per_layout)
    scores, _, groups = _batch(path, torch.float64)
    gen = torch.Generator().manual_seed(1)
    labels = (torch.rand(400, 3, generator=gen) < torch.tensor([0.5, 0.2, 0.05])).to(torch.float64)
    weights = [1.0, 0.0, 2.5]
    loa = mlloss.LoALoss(weights, backend="torch")
    value, grad = _loss_and_grad(lambda x: loa(x, labels, groups), scores)
    expected, expected_grad = _loss_and_grad(lambda x: loa_loss(x, labels, groups, weights), scores)
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)
    columns = torch.stack([scores, scores.flip(0), scores * 0.5], 1)
    auc = mlloss.AUCLoss(backend="torch")
    value, grad = _loss_and_grad(lambda x: auc(x, labels, groups), columns)
    assert grad.shape == columns.shape
    for k in range(3):
        alone = mlloss.AUCLoss(backend="torch")
        term, term_grad = _loss_and_grad(lambda x: alone(x, labels[:, k], groups), columns[:, k])
        torch.testing.assert_close(term, pair_loss(columns[:, k], labels[:, k], groups), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(auc.parts[f"label_loss/{k}"], term, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad[:, k], term_grad, rtol=1e-12, atol=1e-14)
        assert float(auc.parts[f"valid_pairs/{k}"]) == float(alone.parts["valid_pairs"])
        assert float(loa.parts[f"valid_pairs/{k}"]) == float(alone.parts["valid_pairs"])
        torch.testing.assert_close(loa.parts[f"label_loss/{k}"], pair_loss(scores, labels[:, k], groups),
                                   rtol=1e-12, atol=1e-14)
    assert float(auc.parts["groups_with_pairs"]) == float(loa.parts["groups_with_pairs"]) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_cpus_indexed_add_adds_in_index_order(dtype):
    # allpairs.ORDERED_INDEX_ADD: the listed pairs' lower sums are one index_add_ on the CPU, bitwise
    # reproducible only if it adds each entry in turn, whatever the threads (numpy's add.at does)
    np = pytest.importorskip("numpy")
    gen = torch.Generator().manual_seed(5)
    index = torch.randint(0, 3000, (1 << 20,), generator=gen, dtype=torch.int32)
    values = torch.randn(1 << 20, generator=gen, dtype=torch.float64).to(dtype)
    expected = np.zeros(3000, dtype=values.numpy().dtype)
    np.add.at(expected, index.numpy(), values.numpy())
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 4):
            torch.set_num_threads(count)
            added = torch.zeros(3000, dtype=dtype).index_add_(0, index, values)
            assert np.array_equal(added.numpy(), expected), count
    finally:
        torch.set_num_threads(threads)
    assert "cpu" in allpairs.ORDERED_INDEX_ADD


@pytest.mark.parametrize("path,listed", [("listed", True), ("dense small groups", False)])
def test_small_groups_are_listed_unless_rectangles_hold_many_pairs_each(path, listed, monkeypatch):
    # groups of at most MAX_LISTED_GROUP items go through _small_groups unless their valid pairs
    # exceed LISTED_PAIRS_PER_RECTANGLE per pair of their levels (then rectangles)
    calls = []
    small_groups = allpairs._small_groups
    monkeypatch.setattr(allpairs, "_small_groups", lambda *args: calls.append(1) or small_groups(*args))
    scores, labels, groups = _batch(path, torch.float64)
    assert int(torch.bincount(groups).max()) <= allpairs.MAX_LISTED_GROUP
    mlloss.LaALoss(backend="torch")(scores.requires_grad_(True), labels, groups).backward()
    assert bool(calls) == listed


@pytest.mark.parametrize("surrogate", NAMES)
@pytest.mark.parametrize("positives", [3, 150, 397])
def test_rectangles_and_pair_list_chunks_cut_small_match_the_float64_brute_force(surrogate, positives, monkeypatch,
                                                                                 lower_sums):
    # Tiles of 16 x 16 pairs: a rectangle of 150 x 250 is cut both ways, one of 3 x 397 (or 397 x 3)
    # takes its short run whole and cuts the long one; groups of up to 20 items in chunks of one
    # or a few groups (about 2^10 listed pairs, never a group cut). Every tile's and chunk's sums
    # and gradient updates must add up exactly once.
    monkeypatch.setattr(allpairs, "CPU_TILE_SIDE", 16)
    monkeypatch.setattr(allpairs, "CPU_PAIR_LIST_CHUNK", 1 << 10)
    gen = torch.Generator().manual_seed(positives)
    scores = torch.randn(400, generator=gen, dtype=torch.float64)
    labels = (torch.randperm(400, generator=gen) < positives).to(torch.float64)
    for groups in (None, torch.randint(0, 25, (400,), generator=gen)):
        loss = mlloss.AUCLoss(backend="torch", surrogate=surrogate)
        value, grad = _loss_and_grad(lambda x: loss(x, labels, groups), scores)
        expected, expected_grad = _loss_and_grad(lambda x: laa_loss(x, labels, groups, surrogate=surrogate), scores)
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_float32_blocked_pairs_stay_within_float32_rounding(path):
    scores, labels, groups = _batch(path, torch.float32, seed=1)
    real = PATHS[path][1] == "real"
    loss = mlloss.LaALoss(backend="torch", surrogate="exponential", real_levels=real)
    value, grad = _loss_and_grad(lambda x: loss(x, labels, groups), scores)
    expected, expected_grad = _loss_and_grad(
        lambda x: laa_loss(x, labels, groups, surrogate="exponential"), scores.to(torch.float64)
    )
    torch.testing.assert_close(value.to(torch.float64), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad.to(torch.float64), expected_grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("linear_cost", [True, False])
@pytest.mark.parametrize("surrogate", NAMES)
def test_block_arithmetic_equals_its_out_of_place_formula_bit_for_bit(surrogate, linear_cost):
    gen = torch.Generator().manual_seed(3)
    upper, lower = torch.randn(6, 1, generator=gen) * 3, torch.randn(1, 9, generator=gen) * 3
    upper_values, lower_values = torch.rand(6, 1, generator=gen) * 2, torch.rand(1, 9, generator=gen) * 2
    upper[0, 0] = 80.0  # exp(s_j - s_i) of an invalid pair would overflow: must be evaluated at 0
    valid = upper_values > lower_values
    assert not valid[0].all()  # row 0 has an invalid pair, whose exp(80 - s_j) would overflow
    coefficient = torch.tensor(0.37)
    # the formula written out of place: w = valid * c * coef, (w phi(x), w pull(x)) at x = 0 off the valid pairs
    weight = (torch.where(valid, upper_values - lower_values, 0) if linear_cost else valid.float()) * coefficient
    value, pull = surrogate_value_and_pull((lower - upper).masked_fill(~valid, 0), surrogate, 1.0)
    weighted_value, weighted_pull = allpairs._weighted_pairs(
        upper, lower, upper_values, lower_values, valid.clone(), coefficient, linear_cost, surrogate, 1.0
    )
    assert torch.equal(weighted_value, weight * value)
    assert torch.equal(weighted_pull, weight * pull)
    assert weighted_value.isfinite().all() and weighted_pull.isfinite().all()
