"""The Triton kernels against the float64 brute force and against the PyTorch tier.

Runs on the CPU through the Triton interpreter (TRITON_INTERPRET must be set before triton is
imported, hence the environment line above the imports), or on CUDA with
MLLOSS_TEST_DEVICE=cuda TRITON_INTERPRET=0. Small tiles and several partner-range chunks make
tiny batches exercise the unmasked loop, the masked loop and the chunked two-level reduction.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from mlloss.kernels import scan  # noqa: E402
from mlloss.kernels._launch import launcher  # noqa: E402
from mlloss.kernels.hardest import hardest_loss_and_grad  # noqa: E402
from mlloss.kernels.pairwise import STATUS_OVERFLOW, pair_loss_and_grad  # noqa: E402
from mlloss.kernels.reduce import normaliser_source  # noqa: E402
from mlloss.ops.layout import Levels, pair_layout  # noqa: E402
from mlloss.ops.dispatch import pair_loss, problem_levels  # noqa: E402
from reference import hardest_loss, pair_loss as brute_force  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
SURROGATES = ("logistic", "hinge", "squared", "exponential")
# (BLOCK_M, BLOCK_N, warps) and chunks: square, wide and tall tiles, one to several chunks.
CONFIGS = [((16, 16, 4), 1), ((16, 32, 4), 3), ((32, 16, 4), 2), ((128, 128, 4), 1)]


def ordinal_case(sizes: list[int], num_levels: int, seed: int, *, integer_scores: bool = False):
    """Scores, level values (non-integer, ties) and group ids, items in random order."""
    gen = torch.Generator().manual_seed(seed)
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)) * 3 - 4
    groups = groups[torch.randperm(len(groups), generator=gen)]
    level_values = torch.sort(torch.rand(num_levels, generator=gen, dtype=torch.float64) * 3).values
    levels = level_values[torch.randint(0, num_levels, (len(groups),), generator=gen)]
    if integer_scores:  # exact ties and exact hinge kinks (t == margin == 1)
        scores = torch.randint(-2, 3, (len(groups),), generator=gen).to(torch.float64)
    else:
        scores = torch.randn(len(groups), generator=gen, dtype=torch.float64)
    return scores, levels, groups


def kernel_loss(scores, label_columns, groups, *, label_weights=None, mixing=None, cost="uniform",
                surrogate="logistic", margin=1.0, reduction="mean", config=CONFIGS[0], status=None, fast=None):
    """(loss, stats, grad) of the all-pairs kernels for labels (N, K) on DEVICE."""
    labels = label_columns.to(DEVICE)
    levels = problem_levels(labels, label_weights)
    layout = pair_layout(levels, None if groups is None else groups.to(DEVICE))
    tiles, chunks = config
    return pair_loss_and_grad(
        scores.to(DEVICE), levels, layout, mixing=mixing, cost=cost, surrogate=surrogate, margin=margin,
        reduction=reduction, status=status, tiles=tiles if DEVICE == "cpu" else None, chunks=chunks, fast=fast,
    )


def reference(scores, levels, groups, **options):
    x = scores.detach().clone().requires_grad_(True)
    value = brute_force(x, levels, groups, **options)
    value.backward()
    return value.detach(), x.grad


def assert_close(loss, grad, ref_loss, ref_grad, rtol=1e-4):
    scale = max(ref_grad.abs().max().item(), 1e-12)
    torch.testing.assert_close(loss.cpu().double(), ref_loss, rtol=rtol, atol=rtol * 1e-3)
    torch.testing.assert_close(grad.cpu().double(), ref_grad, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0][0]}x{c[0][1]}-chunks{c[1]}")
@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("cost", ["uniform", "linear"])
def test_ordinal_levels_match_brute_force(config, surrogate: str, cost: str) -> None:
    # Ragged N, groups of very different sizes including singletons, one spanning many tiles.
    scores, levels, groups = ordinal_case([1, 70, 3, 1, 45, 30], 4, seed=1)
    loss, stats, grad = kernel_loss(
        scores, levels[:, None], groups, label_weights=[1.0], cost=cost, surrogate=surrogate, margin=0.7, config=config
    )
    assert_close(loss, grad, *reference(scores, levels, groups, cost=cost, surrogate=surrogate, margin=0.7), rtol=1e-9)
    same_group = groups[:, None] == groups[None, :]
    assert stats[1].item() == (same_group & (levels[:, None] > levels[None, :])).sum().item()  # valid pairs


# LaA of binary label columns ranks the label patterns: up to MAX_WALK_LEVELS levels the finalize
# step walks each group's cells for Z_u, beyond it (and for an ordinal column, above) kernel 1
# writes per-position shares whose prefix sums give Z_u.
PATTERN_CASES = {  # label weights, their levels, how the finalize step finds Z_u
    "3 levels walk": ([1.0, 1.0], 3, "walk"),
    "16 levels walk": ([1.0, 0.5, 2.0, 0.25], 16, "walk"),
    "32 levels shares": ([1.0, 0.5, 2.0, 0.25, 4.0], 32, "shares"),
}


@pytest.mark.parametrize("config", CONFIGS[:2], ids=["16x16", "16x32-chunks3"])
@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("cost", ["uniform", "linear"])
@pytest.mark.parametrize("case", PATTERN_CASES.values(), ids=PATTERN_CASES.keys())
def test_label_patterns_match_brute_force(config, grouped: bool, cost: str, case) -> None:
    weights, num_levels, source = case
    scores, _, groups = ordinal_case([1, 70, 3, 1, 45, 30, 6], 2, seed=5)
    gen = torch.Generator().manual_seed(5)
    bits = (torch.rand(len(scores), len(weights), generator=gen) < 0.4).to(torch.float64)
    levels = problem_levels(bits, weights)
    assert levels.num_ranks == num_levels and normaliser_source(levels) == source
    groups = groups if grouped else None
    loss, stats, grad = kernel_loss(scores, bits, groups, label_weights=weights, cost=cost, config=config)
    values = bits @ torch.tensor(weights, dtype=torch.float64)
    assert_close(loss, grad, *reference(scores, values, groups, cost=cost), rtol=1e-9)
    same_group = torch.ones(len(scores), len(scores), dtype=torch.bool) if groups is None else groups[:, None] == groups[None, :]
    assert stats[1].item() == (same_group & (values[:, None] > values[None, :])).sum().item()  # valid pairs


@pytest.mark.parametrize("config", CONFIGS[:2], ids=["16x16", "16x32-chunks3"])
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_ungrouped_binary_ties_and_hinge_kinks(config, surrogate: str) -> None:
    scores, levels, _ = ordinal_case([97], 2, seed=2, integer_scores=True)
    labels = (levels > levels.min()).to(torch.float64)
    loss, _, grad = kernel_loss(scores, labels[:, None], None, surrogate=surrogate, config=config)
    assert_close(loss, grad, *reference(scores, labels, None, surrogate=surrogate), rtol=1e-9)


# Scores of the fast logistic's cases (natural units; base 2 multiplies them by 1.44): the factored
# terms serve row blocks whose scores span at most 64 / 1.44 = 44, whose columns may lie anywhere.
FAST_SCORES = {
    # every block fits
    "moderate": lambda gen, n: torch.randn(n, generator=gen, dtype=torch.float64) * 3,
    # upper rows fit, their lower partners lie 100 above (past b's cap of 2^92 / 1.44 = 64: the
    # excess) or 100 below (b flushes); the lower rows span 200 and take the per-pair terms (their
    # factors would overflow: 2^(100 * 1.44) > the float32 max)
    "far lower partners": lambda gen, n: torch.randn(n, generator=gen, dtype=torch.float64),
    # the other way round
    "far upper partners": lambda gen, n: torch.randn(n, generator=gen, dtype=torch.float64),
}


@pytest.mark.parametrize("config", CONFIGS[1:3], ids=["16x32-chunks3", "32x16-chunks2"])
@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("cost", ["uniform", "linear"])
@pytest.mark.parametrize("case", FAST_SCORES)
def test_fast_logistic_matches_brute_force(config, grouped: bool, cost: str, case: str) -> None:
    """The fast branch of the logistic (CUDA's, forced here; the interpreter computes its special
    functions exactly): the factored terms of row blocks that fit, the per-pair terms of those that
    do not, partners far above and below a block's centre. Float32 against the float64 brute force."""
    gen = torch.Generator().manual_seed(11)
    _, levels, groups = ordinal_case([1, 70, 3, 1, 45, 30, 60], 3, seed=11)
    scores = FAST_SCORES[case](gen, len(levels))
    top, bottom = levels.max(), levels.min()
    far = torch.where(torch.rand(len(levels), generator=gen) < 0.5, 100.0, -100.0).to(torch.float64)
    if case == "far lower partners":
        scores = torch.where(levels == bottom, far, scores)
    elif case == "far upper partners":
        scores = torch.where(levels == top, far, scores)
    scores = scores.to(torch.float32).to(torch.float64)  # the float64 reference sees the same scores
    groups = groups if grouped else None
    loss, _, grad = kernel_loss(scores.to(torch.float32), levels[:, None], groups, label_weights=[1.0], cost=cost,
                                config=config, fast=True)
    assert grad.dtype == torch.float32
    assert_close(loss, grad, *reference(scores, levels, groups, cost=cost), rtol=2e-5)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("level", ["lowest", "highest"])
def test_fast_logistic_keeps_what_a_non_finite_score_gives(bad: float, level: str) -> None:
    """One infinite or NaN score (the data check off): the fast branch's loss and gradient are
    the exact branch's (a NaN stays NaN: the block reductions skip it, its row's factor keeps it)."""
    _, levels, groups = ordinal_case([1, 70, 3, 1, 45, 30, 60], 3, seed=12)
    scores = torch.randn(len(levels), generator=torch.Generator().manual_seed(12))
    scores[(levels == (levels.min() if level == "lowest" else levels.max())).nonzero()[3]] = bad
    (loss, _, grad), (exact_loss, _, exact_grad) = (
        kernel_loss(scores, levels[:, None], groups, label_weights=[1.0], fast=fast) for fast in (True, False)
    )
    assert grad.isnan().any() == math.isnan(bad)
    torch.testing.assert_close(loss, exact_loss, rtol=1e-5, atol=0, equal_nan=True)
    torch.testing.assert_close(grad, exact_grad, rtol=1e-5, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_several_problems_are_mixed_in_one_launch(reduction: str) -> None:
    scores, _, groups = ordinal_case([40, 1, 57, 12], 2, seed=3)
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 2, (len(scores), 3), generator=gen).to(torch.float64)
    labels[:, 2] = 0  # a label without a valid pair contributes 0
    mixing = torch.tensor([1.0, 0.25, 2.0], dtype=torch.float64, device=DEVICE)
    loss, stats, grad = kernel_loss(scores, labels, groups, mixing=mixing, reduction=reduction, config=CONFIGS[1])
    expected = [reference(scores, labels[:, k], groups, reduction=reduction) for k in range(3)]
    ref_loss = sum(float(a) * value for a, (value, _) in zip(mixing.cpu(), expected))
    ref_grad = sum(float(a) * g for a, (_, g) in zip(mixing.cpu(), expected))
    assert_close(loss, grad, ref_loss, ref_grad, rtol=1e-9)
    torch.testing.assert_close(stats[:3].cpu(), torch.stack([value for value, _ in expected]), rtol=1e-9, atol=0)


def test_one_class_and_singleton_groups_give_exactly_zero() -> None:
    n = 77
    scores = torch.randn(n, dtype=torch.float64)
    one_class = torch.ones(n, 1, dtype=torch.float64)
    loss, stats, grad = kernel_loss(scores, one_class, None)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0 and stats.tolist() == [0.0, 0.0, 0.0]
    labels = torch.randint(0, 2, (n, 1)).to(torch.float64)
    loss, _, grad = kernel_loss(scores, labels, torch.arange(n))  # every item its own group
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_narrow_floats_accumulate_in_float32(dtype: torch.dtype) -> None:
    scores, levels, groups = ordinal_case([60, 37, 9], 3, seed=4)
    rounded = scores.to(dtype)
    loss, _, grad = kernel_loss(rounded, levels[:, None], groups, label_weights=[1.0], cost="linear")
    assert loss.dtype == grad.dtype == torch.float32
    # The reference is built from the same rounded inputs (FlagGems' upcast rule).
    assert_close(loss, grad, *reference(rounded.double(), levels, groups, cost="linear"), rtol=1e-5)


def test_float64_stays_float64() -> None:
    scores, levels, groups = ordinal_case([50, 80], 4, seed=5)
    loss, stats, grad = kernel_loss(scores / 3, levels[:, None] / 7, groups, label_weights=[1.0], cost="linear")
    assert loss.dtype == grad.dtype == stats.dtype == torch.float64
    assert_close(loss, grad, *reference(scores / 3, levels / 7, groups, cost="linear"), rtol=1e-12)


@pytest.mark.parametrize("config", CONFIGS[:3], ids=["16x16", "16x32-chunks3", "32x16-chunks2"])
def test_bits_identical_run_to_run(config) -> None:
    scores, levels, groups = ordinal_case([120, 60], 4, seed=6)
    runs = [kernel_loss(scores.float(), levels[:, None], groups, label_weights=[1.0], cost="linear", config=config)
            for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_exponential_overflow_sets_the_status_bit() -> None:
    scores = torch.tensor([-60.0, 60.0])  # the positive far below the negative: exp(120) > float32
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with warnings.catch_warnings():  # the status bit says it; NumPy's overflow warning (interpreter) does not
        warnings.simplefilter("error", RuntimeWarning)
        loss, _, _ = kernel_loss(scores, torch.tensor([[1.0], [0.0]]), None, surrogate="exponential", status=status)
    assert torch.isinf(loss) and status.item() == STATUS_OVERFLOW


@pytest.mark.parametrize("temperature", [None, 0.3])  # 0.3: not a float32 value
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_hardest_pairs_match_brute_force_with_ties(temperature, surrogate: str) -> None:
    scores, levels, groups = ordinal_case([1, 40, 3, 33, 2], 2, seed=7, integer_scores=temperature is None)
    labels = (levels > levels.min()).to(torch.float64)
    device_labels = labels[:, None].to(DEVICE)
    device_scores = scores.to(DEVICE)
    levels_ = problem_levels(device_labels, None)
    layout = pair_layout(levels_, groups.to(DEVICE))
    loss, stats, grad = hardest_loss_and_grad(
        device_scores, levels_, layout, mixing=None, surrogate=surrogate, margin=0.5, temperature=temperature,
        reduction="sum", status=None,
    )
    x = scores.clone().requires_grad_(True)
    expected = hardest_loss(x, labels, groups, surrogate=surrogate, margin=0.5, reduction="sum", temperature=temperature)
    expected.backward()
    assert_close(loss, grad, expected.detach(), x.grad, rtol=1e-12)
    both_labels = sum(len(torch.unique(labels[groups == g])) == 2 for g in torch.unique(groups))
    assert stats[2].item() == both_labels == stats[1].item()  # groups with both labels = level pairs


@pytest.mark.parametrize("temperature", [None, 0.3])  # 0.3: not a float32 value
@pytest.mark.parametrize("cost", ["uniform", "linear"])
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_hardest_pairs_of_several_levels_match_brute_force_with_ties(cost: str, surrogate: str, temperature) -> None:
    """LaA's max-violation pairs: per group every pair of present levels, the min of the upper
    cell against the max of the lower one (hard: tied extremes sharing the gradient; soft: the
    cells' log-mean-exp, every item by its weight); groups missing levels, a group at one level
    and a one-item group; the statistics count the groups with a level pair and their present
    level pairs."""
    scores, _, groups = ordinal_case([1, 40, 3, 33, 2, 25], 2, seed=8, integer_scores=True)
    gen = torch.Generator().manual_seed(8)
    labels = torch.randint(0, 2, (len(scores), 3), generator=gen).to(torch.float64)
    # Group -4 holds one item; group -1 (40 items) is put at one level. Three labels with these
    # weights make 8 levels, so the small groups miss some.
    labels[groups == -1] = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    weights = [1.0, 0.5, 2.0]
    levels_ = problem_levels(labels.to(DEVICE), weights)
    layout = pair_layout(levels_, groups.to(DEVICE))
    loss, stats, grad = hardest_loss_and_grad(
        scores.to(DEVICE), levels_, layout, mixing=None, surrogate=surrogate, margin=0.5, temperature=temperature,
        reduction="mean", status=None, cost=cost,
    )
    x = scores.clone().requires_grad_(True)
    expected = hardest_loss(x, labels @ torch.tensor(weights, dtype=torch.float64), groups, cost=cost,
                            surrogate=surrogate, margin=0.5, reduction="mean", temperature=temperature)
    expected.backward()
    assert_close(loss, grad, expected.detach(), x.grad, rtol=1e-12)
    aggregated = labels @ torch.tensor(weights, dtype=torch.float64)
    present = [len(torch.unique(aggregated[groups == g])) for g in torch.unique(groups)]
    assert stats[2].item() == sum(p > 1 for p in present)  # groups with a level pair
    assert stats[1].item() == sum(p * (p - 1) // 2 for p in present)  # their present level pairs
    assert sorted(present)[:2] == [1, 1] and 2 in present  # the edge groups are there


@pytest.mark.parametrize("temperature", [None, 0.3])
@pytest.mark.parametrize("cost", ["uniform", "linear"])
@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("num_levels", [5, 48], ids=["graded", "many-levels"])
def test_hardest_pairs_of_an_ordinal_column_match_brute_force(num_levels: int, grouped: bool, cost: str,
                                                              temperature) -> None:
    """LaA's max-violation pairs of one ordinal column (ranks from the data, not from label
    patterns): graded relevance of a few values, and real values with more distinct levels in a
    group than any few binary columns make (each walk takes one step per level of its group)."""
    scores, levels, groups = ordinal_case([1, 40, 3, 33, 2, 90], num_levels, seed=10, integer_scores=True)
    groups = groups if grouped else None
    levels_ = problem_levels(levels[:, None].to(DEVICE), [1.0])
    layout = pair_layout(levels_, None if groups is None else groups.to(DEVICE))
    loss, stats, grad = hardest_loss_and_grad(
        scores.to(DEVICE), levels_, layout, mixing=None, surrogate="logistic", margin=0.5, temperature=temperature,
        reduction="mean", status=None, cost=cost,
    )
    x = scores.clone().requires_grad_(True)
    expected = hardest_loss(x, levels, groups, cost=cost, margin=0.5, reduction="mean", temperature=temperature)
    expected.backward()
    assert_close(loss, grad, expected.detach(), x.grad, rtol=1e-12)
    ids = torch.zeros_like(levels) if groups is None else groups
    present = [len(torch.unique(levels[ids == g])) for g in torch.unique(ids)]
    assert stats[1].item() == sum(p * (p - 1) // 2 for p in present)  # present level pairs
    assert max(present) > (30 if num_levels > 5 else 4)  # the walks of the big group are long


@pytest.mark.parametrize("temperature", [None, 0.3])
@pytest.mark.parametrize("grouped", [True, False], ids=["groups", "no-groups"])
@pytest.mark.parametrize("several", [False, True], ids=["binary", "levels"])
def test_hardest_pairs_of_cells_across_many_scan_blocks(monkeypatch, several, grouped, temperature) -> None:
    """Each cell's min and max (or soft sums) come from a segmented scan in blocks of positions
    and a scan of the blocks' open parts in chunks: with blocks of 16 positions and chunks of 4
    blocks, cells of up to a few hundred items span many blocks and chunks, some begin and end
    inside one block, and the results still equal the brute force, ties included."""
    from mlloss.kernels import hardest as hardest_kernels

    monkeypatch.setattr(hardest_kernels, "FINALIZE_BLOCK", {"cuda": 16, "interpreter": 16})
    monkeypatch.setattr(scan, "CARRY_CHUNK", 4)
    scores, levels, groups = ordinal_case([1, 300, 3, 17, 2, 150], 4, seed=11, integer_scores=temperature is None)
    groups = groups if grouped else None
    if several:
        labels, weights = levels[:, None], [1.0]
        expected_labels = levels
    else:
        labels, weights = (levels > levels.min())[:, None].to(torch.float64), None
        expected_labels = labels[:, 0]
    levels_ = problem_levels(labels.to(DEVICE), weights)
    layout = pair_layout(levels_, None if groups is None else groups.to(DEVICE))
    loss, _, grad = hardest_loss_and_grad(
        scores.to(DEVICE), levels_, layout, mixing=None, surrogate="logistic", margin=0.5, temperature=temperature,
        reduction="mean", status=None, cost="linear",
    )
    x = scores.clone().requires_grad_(True)
    expected = hardest_loss(x, expected_labels, groups, cost="linear", margin=0.5, reduction="mean",
                            temperature=temperature)
    expected.backward()
    assert_close(loss, grad, expected.detach(), x.grad, rtol=1e-12)


@pytest.mark.parametrize("case", ["auc", "hardest", "laa", "dense"])
def test_the_block_sums_are_added_over_several_steps(monkeypatch, case) -> None:
    """``combine`` adds a problem's per-block sums ``SUM_BLOCK`` (256) blocks a step: one step
    up to 262,144 items in finalize's blocks of 1,024, more above (and on the dense kernels'
    runs past 8,192 items, in blocks of 32 rows). Blocks of 16 positions and steps of 4 blocks
    make a batch of 300 items take five steps (the dense kernels' five blocks of 64 rows, two);
    every step's blocks must count, in the loss and in the gradient's scale."""
    import mlloss
    from mlloss.kernels import dense, pairwise, reduce
    from reference import laa_loss

    monkeypatch.setattr(reduce, "SUM_BLOCK", 4)
    for target in ("cuda", "interpreter"):  # the dict that the dense and hardest kernels share
        monkeypatch.setitem(pairwise.FINALIZE_BLOCK, target, 16)
    if case != "dense":
        monkeypatch.setattr(dense, "MAX_ITEMS", 0)
    gen = torch.Generator().manual_seed(3)
    n = 300
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = (torch.rand(n, 2, generator=gen) < torch.tensor([0.3, 0.1])).to(torch.float64)
    groups = torch.randint(0, 25, (n,), generator=gen)
    loss, reference, y = {
        "auc": (mlloss.AUCLoss(backend="triton"), brute_force, labels[:, 0]),
        "hardest": (mlloss.AUCLoss(pairs="hardest", backend="triton"), hardest_loss, labels[:, 0]),
        "laa": (mlloss.LaALoss(backend="triton"), laa_loss, labels),
        "dense": (mlloss.AUCLoss(backend="triton"), brute_force, labels[:, 0]),
    }[case]
    x = scores.clone().to(DEVICE).requires_grad_(True)
    value = loss(x, y.to(DEVICE), groups.to(DEVICE))
    value.backward()
    z = scores.clone().requires_grad_(True)
    expected = reference(z, y, groups)
    expected.backward()
    assert_close(value.detach(), x.grad, expected.detach(), z.grad, rtol=1e-12)


def test_several_level_hardest_pairs_refuse_several_problems() -> None:
    scores, _, groups = ordinal_case([30], 2, seed=9)
    labels = torch.randint(0, 2, (30, 2), generator=torch.Generator().manual_seed(9)).to(torch.float64).to(DEVICE)
    one = problem_levels(labels, [1.0, 1.0])
    two = Levels(one.rank.expand(2, -1), one.num_ranks, one.values.expand(2, -1))
    layout = pair_layout(two, None)
    with pytest.raises(ValueError, match="takes one problem; got 2 problems"):
        hardest_loss_and_grad(scores.to(DEVICE), two, layout, mixing=None, surrogate="logistic", margin=1.0,
                              temperature=0.5, reduction="mean", status=None)


# --------------------------------------------------------------------------- #
# Tier against tier (generative-recommenders style): random shapes, dtypes,   #
# groups and a random incoming gradient, Triton against the PyTorch tier.     #
# --------------------------------------------------------------------------- #
TIER_CASES = [
    # (seed, N, users or None, K labels, dtype, loss)
    (10, 2500, None, 1, torch.float32, "auc"),
    (11, 3000, 70, 2, torch.float32, "laa"),
    (12, 2200, 31, 3, torch.float64, "loa"),
    (13, 1800, None, 2, torch.bfloat16, "laa-uniform"),
    (14, 2600, 400, 1, torch.float32, "hardest"),
    (15, 2400, 60, 3, torch.float32, "laa-soft-hardest"),
    (16, 2400, 60, 3, torch.float32, "laa-graded-hardest"),
]


@pytest.mark.parametrize("case", TIER_CASES, ids=[c[-1] + "-" + str(c[1]) for c in TIER_CASES])
def test_triton_tier_matches_the_pytorch_tier(case) -> None:
    seed, n, users, num_labels, dtype, name = case
    gen = torch.Generator().manual_seed(seed)
    scores = (2 * torch.randn(n, generator=gen)).to(dtype)
    labels = (torch.rand(n, num_labels, generator=gen) < torch.linspace(0.5, 0.05, num_labels)).to(torch.float32)
    groups = None if users is None else torch.randint(0, users, (n,), generator=gen) * 1_000_003
    options = dict(
        mixing=None, label_weights=None, cost="uniform", surrogate="logistic", margin=1.0, pairs="all",
        temperature=None, reduction="mean", validate=True,
    )
    if name.startswith("laa"):
        options.update(label_weights=[1.0, 0.5][:num_labels], cost="uniform" if name.endswith("uniform") else "linear")
    if name == "loa":
        options["mixing"] = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    if name == "hardest":
        options.update(pairs="hardest", surrogate="exponential", reduction="sum")
    if name == "laa-soft-hardest":  # LaA's soft max-violation pairs: 8 levels, on the kernels
        options.update(label_weights=[1.0, 0.5, 2.0], pairs="hardest", temperature=0.3)
    if name == "laa-graded-hardest":  # one ordinal column (graded 0-3): its ranks come from the data
        labels = labels.sum(dim=1, keepdim=True)
        options.update(label_weights=[1.0], pairs="hardest")
    upstream = torch.randn((), generator=gen)
    results = []
    for backend, device in (("triton", DEVICE), ("torch", "cpu")):
        x = scores.to(device).clone().requires_grad_(True)
        device_options = dict(options)
        if options["mixing"] is not None:
            device_options["mixing"] = options["mixing"].to(device)
        result = pair_loss(x, labels.to(device), None if groups is None else groups.to(device), backend=backend,
                           **device_options)
        (result.loss * upstream.to(device)).backward()
        results.append((result.loss.detach().cpu().double(), x.grad.cpu().double(), result.stats.cpu()))
    (value, grad, stats), (ref_value, ref_grad, ref_stats) = results
    rtol = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-5}[dtype]
    torch.testing.assert_close(value, ref_value, rtol=rtol, atol=0)
    scale = ref_grad.abs().max()
    # bf16 gradients are rounded to 8 bits in both tiers; compare them at that resolution.
    grad_rtol = 1e-2 if dtype == torch.bfloat16 else rtol
    torch.testing.assert_close(grad / scale, ref_grad / scale, rtol=grad_rtol, atol=grad_rtol)
    torch.testing.assert_close(stats, ref_stats, rtol=rtol, atol=0)


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("block,chunk", [(8, 2), (16, 1024), (32, 4)])
def test_group_sums_add_only_each_groups_own_values(monkeypatch, block, chunk, grouped):
    # The ordinal column's Z_u: a prefix sum over the whole batch gave a group's sum as a difference of
    # running totals, which lost a small group after a large one. Small blocks and carry chunks make a
    # batch of a few hundred items cross both levels of the segmented scan.
    from mlloss.kernels import reduce

    monkeypatch.setattr(scan, "CARRY_CHUNK", chunk)
    gen = torch.Generator().manual_seed(block + chunk)
    sizes = torch.randint(1, 40, (30,), generator=gen)
    ids = torch.repeat_interleave(torch.arange(30), sizes)
    n = ids.numel()
    group_start = torch.searchsorted(ids, ids).to(torch.int32)
    group_end = torch.searchsorted(ids, ids, right=True).to(torch.int32)
    # magnitudes from 1e-6 to 1e10 along the batch, and a tiny group right after a huge one
    values = torch.randn(2, n, generator=gen, dtype=torch.float64) * torch.logspace(-6, 10, n, dtype=torch.float64)
    values[:, group_start[n // 2] : group_end[n // 2]] *= 1e-16
    sums = values.clone().to(DEVICE)
    carries = reduce.group_sums(sums, group_start.to(DEVICE) if grouped else None, block).cpu()
    sums = sums.cpu()
    starts, ends = (group_start, group_end) if grouped else (torch.zeros_like(group_start), torch.full_like(group_end, n))
    for b in range(2):
        for start, end in sorted(set(zip(starts.tolist(), ends.tolist()))):
            last = end - 1
            got = sums[b, last] + (carries[b, 3, last // block] if start // block != last // block else 0.0)
            expected = values[b, start:end].sum()
            assert abs(float(got - expected)) <= 1e-13 * float(values[b, start:end].abs().sum()), (b, start, end)


def _sequential_scan(restart, x, y, z, inverse_temperature, monoid):
    """The segmented inclusive scan lane by lane, in float64 (the reference of ``kernels.scan``).
    A softmin part (x, y, z) of n terms has z = y - n (each term minus 1): the reference keeps n
    and gives z = y - n of the rescaled sum y."""
    out = []
    for i, (r, xi, yi, zi) in enumerate(zip(restart.tolist(), x.tolist(), y.tolist(), z.tolist())):
        if r or i == 0:
            part, count = (xi, yi, zi), yi - zi
        elif monoid == "sum":
            part = (part[0] + xi, part[1] + yi, zi)
        else:
            low = min(part[0], xi)
            if monoid == "min":
                part = (low, (part[1] if part[0] == low else 0.0) + (yi if xi == low else 0.0), zi)
            else:
                total = sum(v * math.exp((low - m) * inverse_temperature) for m, v, _ in (part, (xi, yi, zi)) if v != 0)
                count += yi - zi
                part = (low, total, total - count)
        out.append(part)
    started = torch.cummax(restart.to(torch.int64), 0).values.to(torch.float64)
    x, y, z = torch.tensor(out, dtype=torch.float64).unbind(1)
    return started, x, y, z


@triton.jit
def _both_scans_kernel(restart_ptr, x_ptr, y_ptr, z_ptr, out_ptr, inverse_temperature: tl.float64,  # not fp32 on CUDA
                       MONOID: tl.constexpr, LANES: tl.constexpr):
    lanes = tl.arange(0, LANES)
    restart = tl.load(restart_ptr + lanes) != 0
    x = tl.load(x_ptr + lanes)
    y = tl.load(y_ptr + lanes)
    z = tl.load(z_ptr + lanes)
    started, x_a, y_a, z_a = scan.scan_associative(restart, x, y, z, inverse_temperature, MONOID)
    tl.store(out_ptr + lanes, started.to(tl.float64))
    tl.store(out_ptr + LANES + lanes, x_a)
    tl.store(out_ptr + 2 * LANES + lanes, y_a)
    tl.store(out_ptr + 3 * LANES + lanes, z_a)
    started, x_d, y_d, z_d = scan.scan_by_doubling(restart, x, y, z, inverse_temperature, MONOID)
    tl.store(out_ptr + 4 * LANES + lanes, started.to(tl.float64))
    tl.store(out_ptr + 5 * LANES + lanes, x_d)
    tl.store(out_ptr + 6 * LANES + lanes, y_d)
    tl.store(out_ptr + 7 * LANES + lanes, z_d)


@pytest.mark.parametrize("monoid", ["sum", "min", "softmin"])
def test_both_scans_of_a_block_equal_the_sequential_scan(monoid):
    """``kernels.scan``'s block scan runs ``tl.associative_scan`` on CUDA and doubling steps in
    the interpreter (which would run the former a Python call per lane): both equal a lane-by-lane
    scan, for every monoid, with ties, empty parts (+inf, 0) and a segment open at lane 0."""
    lanes, inverse_temperature = 64, 1 / 0.7
    gen = torch.Generator().manual_seed(5)
    restart = torch.rand(lanes, generator=gen) < 0.2
    restart[0] = False
    if monoid == "sum":
        x = torch.randn(lanes, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (lanes,), generator=gen)
        y = torch.zeros(lanes, dtype=torch.float64)
    else:
        x = torch.randint(0, 4, (lanes,), generator=gen).to(torch.float64)  # ties
        y = torch.randint(1, 4, (lanes,), generator=gen).to(torch.float64)
    z = torch.rand(lanes, generator=gen, dtype=torch.float64)  # passed through unchanged but by a softmin
    if monoid == "softmin":  # a part of n terms in (1/2, 1]: y their sum, z = y - n
        count = y
        y = count * (0.5 + 0.5 * torch.rand(lanes, generator=gen, dtype=torch.float64))
        z = y - count
    if monoid != "sum":
        empty = torch.rand(lanes, generator=gen) < 0.15
        x[empty], y[empty], z[empty] = float("inf"), 0.0, 0.0
    out = torch.empty(8, lanes, dtype=torch.float64, device=DEVICE)
    launcher(_both_scans_kernel)[(1,)](restart.to(torch.int32).to(DEVICE), x.to(DEVICE), y.to(DEVICE), z.to(DEVICE),
                                       out, inverse_temperature, MONOID=monoid, LANES=lanes)  # as the library launches
    expected = torch.stack(_sequential_scan(restart, x, y, z, inverse_temperature, monoid))
    for got in out.cpu().view(2, 4, lanes):  # associative, doubling
        torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)


@triton.jit
def _log_mean_kernel(y_ptr, z_ptr, n_ptr, out_ptr, LANES: tl.constexpr):
    lanes = tl.arange(0, LANES)
    tl.store(out_ptr + lanes, scan.log_mean(tl.load(y_ptr + lanes), tl.load(z_ptr + lanes), tl.load(n_ptr + lanes)))


def test_log_mean_keeps_the_digits_of_small_means_and_of_means_near_one():
    """``kernels.scan.log_mean``: log(y / n) below a mean of 1/2, Kahan's log1p(z / n) from 1/2 up
    (y = sum of a cell's terms exp(...), z = sum of exp(...) - 1). Cells of n items in which one term
    is 1 and the others are near 0 (the soft extreme is that item's score at a small temperature) have
    a mean near 1 / n: log1p(z / n) keeps the digits of 1 + z / n, 1 - 1 / n rounded, and is off by
    4e-13 of log(mean) at n = 1e5 (log(y / n) by 1e-16). Terms all near 1 (a large temperature) need
    log1p: log(y / n) keeps none of the digits of y / n - 1. Against mpmath, to a few units in the last
    place; both branches' ends (means of 1/2 and 1), an empty-free one-item cell (mean 1, log 0)."""
    mpmath = pytest.importorskip("mpmath")
    rows = []  # (y, z, n) exact in float64, and the mean as an exact rational
    for n in (3, 1_000, 99_991, 100_000, 7_777_777):
        rows.append((1.0, 1.0 - n, n))  # one term 1, the others 0: mean 1 / n
    for n in (2, 10, 1_000_000):
        rows.append((n / 2, -n / 2, n))  # mean exactly 1/2: log1p's side
    for n, d in ((2, 2.0**-40), (1_000, 1e-9), (99_991, 3e-3), (100_000, -2.0**-30)):
        rows.append((n + d, d, n))  # every term near 1: mean 1 + d / n
    rows.append((1.0, 0.0, 1))
    y, z, n = (torch.tensor(column, dtype=torch.float64) for column in zip(*rows))
    lanes = 16  # padded with one-item cells
    pad = lanes - len(rows)
    y, z = torch.cat([y, torch.ones(pad, dtype=torch.float64)]), torch.cat([z, torch.zeros(pad, dtype=torch.float64)])
    n = torch.cat([n.to(torch.int32), torch.ones(pad, dtype=torch.int32)])
    out = torch.empty(lanes, dtype=torch.float64, device=DEVICE)
    launcher(_log_mean_kernel)[(1,)](y.to(DEVICE), z.to(DEVICE), n.to(DEVICE), out, LANES=lanes)
    with mpmath.workdps(50):
        # the mean from z where the terms are near 1 (y rounds their digits away), else from y
        expected = [float(mpmath.log(1 + mpmath.mpf(z_) / n_) if y_ >= n_ / 2 else mpmath.log(mpmath.mpf(y_) / n_))
                    for y_, z_, n_ in rows]
    got = out.cpu()[: len(rows)].tolist()
    for row, value, want in zip(rows, got, expected):
        assert value == pytest.approx(want, rel=1e-15, abs=1e-300), row  # libdevice on CUDA: a few ulps


@triton.jit
def _both_running_extremes_kernel(x_ptr, out_ptr, MAX: tl.constexpr, REVERSE: tl.constexpr, LANES: tl.constexpr,
                                  WIDTH: tl.constexpr):
    lanes = tl.arange(0, LANES)
    at = lanes[:, None] * WIDTH + tl.arange(0, WIDTH)[None, :]
    x = tl.load(x_ptr + at)  # [LANES, WIDTH]; its column 0 also as a vector
    column = tl.load(x_ptr + lanes * WIDTH)
    tl.store(out_ptr + at, scan.running_extreme_associative(x, MAX, REVERSE))
    tl.store(out_ptr + LANES * WIDTH + at, scan.running_extreme_by_doubling(x, MAX, REVERSE))
    tl.store(out_ptr + 2 * LANES * WIDTH + lanes, scan.running_extreme_associative(column, MAX, REVERSE))
    tl.store(out_ptr + 2 * LANES * WIDTH + LANES + lanes, scan.running_extreme_by_doubling(column, MAX, REVERSE))


@pytest.mark.parametrize("extreme", ["max", "min"])
@pytest.mark.parametrize("reverse", [False, True])
def test_both_running_extremes_equal_torch_cummax(extreme, reverse):
    """``kernels.scan.running_extreme`` (the counting layout's group edges and prefixes):
    ``tl.associative_scan`` on CUDA, doubling steps in the interpreter; both equal torch's
    cummax / cummin along axis 0, from the first lane or from the last, of a matrix and of a
    vector, with ties."""
    lanes, width = 128, 4
    x = torch.randint(-50, 50, (lanes, width), generator=torch.Generator().manual_seed(11), dtype=torch.int32)
    out = torch.empty(2 * lanes * width + 2 * lanes, dtype=torch.int32, device=DEVICE)
    _both_running_extremes_kernel[(1,)](x.to(DEVICE), out, MAX=extreme == "max", REVERSE=reverse, LANES=lanes,
                                        WIDTH=width)
    running = torch.cummax if extreme == "max" else torch.cummin
    expected = running(x.flip(0), 0).values.flip(0) if reverse else running(x, 0).values
    out = out.cpu()
    for got in out[: 2 * lanes * width].view(2, lanes, width):  # associative, doubling
        assert torch.equal(got, expected)
    for got in out[2 * lanes * width :].view(2, lanes):
        assert torch.equal(got, expected[:, 0])


def test_a_small_groups_normaliser_survives_a_large_group_before_it():
    # LaA of an ordinal column (the "shares" normaliser: Z_u from per-position shares): group 1's only pair costs 1e-6, after a group
    # whose costs sum to 5e11. Its Z_u came out 0: the group silently left the loss.
    levels = torch.cat([(torch.arange(40, dtype=torch.float64) % 20) * 1e8, torch.tensor([3.0, 3.000001], dtype=torch.float64)])
    groups = torch.cat([torch.zeros(40), torch.ones(2)]).long()
    scores = torch.linspace(-1, 1, 42, dtype=torch.float64).flip(0)
    expected = brute_force(scores.clone().requires_grad_(True), levels, groups, cost="linear", reduction="sum")
    loss = pair_loss(scores.to(DEVICE), levels[:, None].to(DEVICE), groups.to(DEVICE), mixing=None, label_weights=[1.0],
                     cost="linear", surrogate="logistic", margin=1.0, pairs="all", temperature=None, reduction="sum",
                     backend="triton", validate=True, real_levels=True)
    assert normaliser_source(problem_levels(levels[:, None], [1.0])) == "shares"
    assert int(loss.groups_with_pairs.sum()) == 2
    torch.testing.assert_close(loss.loss.double().cpu(), expected.detach(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("num_labels", [2, 3, 12])
def test_pattern_ranks_kernel_ranks_each_row_as_the_pytorch_formula_does(dtype, num_labels):
    """kernels.levels.pattern_ranks (LaA's label patterns in one launch) against problem_levels'
    PyTorch formula, for labels of every dtype, as a strided column slice of a wider matrix."""
    from mlloss.kernels.levels import pattern_ranks
    from mlloss.ops.dispatch import _pattern_tables

    gen = torch.Generator().manual_seed(num_labels)
    wide = torch.randint(0, 2, (1500, num_labels + 3), generator=gen).to(dtype)
    labels = wide[:, 1 : 1 + num_labels]  # strides (num_labels + 3, 1), starting one element in
    weights = [0.5 + k for k in range(num_labels)]
    by_torch = problem_levels(labels.to(DEVICE), weights)
    by_kernel = problem_levels(labels.to(DEVICE), weights, on_kernels=True)
    assert by_kernel.rank.dtype == torch.int32 and by_kernel.rank.shape == (1, 1500)
    assert torch.equal(by_kernel.rank, by_torch.rank) and torch.equal(by_kernel.values, by_torch.values)
    # every pattern of the table reached: the whole table in one batch
    patterns = (torch.arange(2**num_labels)[:, None] >> torch.arange(num_labels)) & 1
    _, rank_table, _ = _pattern_tables(tuple(weights), torch.device(DEVICE))
    assert torch.equal(pattern_ranks(patterns.to(dtype).to(DEVICE), rank_table)[0], rank_table)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("bad", ["none", "nan score", "inf score", "label 0.5", "label 2", "nan label", "both"])
def test_pattern_ranks_make_the_data_check_check_batch_makes(bad, masked, monkeypatch):
    """LaA's binary columns with validate_args: the launch that ranks their patterns makes the data
    check (check_batch's bits under the summed-binary rule, over the mask only) and ranks as
    without it; a call of LaA launches no check of its own for them (it made one more launch)."""
    import mlloss
    from mlloss._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
    from mlloss.kernels import dense as dense_kernels, pairwise
    from mlloss.kernels.levels import pattern_ranks
    from mlloss.ops.dispatch import _pattern_tables

    gen = torch.Generator().manual_seed(12)
    scores = torch.randn(2000, generator=gen)  # two blocks of 1,024; the dense kernels take up to 2,048 items
    labels = (torch.rand(2000, 3, generator=gen) < 0.4).to(torch.float32)
    keep = torch.arange(2000) % 5 != 0
    at = 1501 if masked else 0  # kept items at, at + 1, at + 2 (the second block)
    if bad in ("nan score", "both"):
        scores[at] = float("nan")
    if bad == "inf score":
        scores[at + 1] = float("-inf")
    label = {"label 0.5": 0.5, "label 2": 2.0, "nan label": float("nan"), "both": 3.0}.get(bad)
    if label is not None:
        labels[at + 2, 2] = label
    if masked:  # fillers hold anything: never reported
        scores[~keep], labels[~keep] = float("inf"), 7.0
    mask = keep.to(DEVICE) if masked else None
    scores, labels = scores.to(DEVICE), labels.to(DEVICE)
    expected = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    pairwise.check_batch(scores, labels, expected, label_rule="summed-binary", mask=mask)
    assert (expected.item() != 0) == (bad != "none")
    _, rank_table, _ = _pattern_tables((1.0, 2.0, 4.0), torch.device(DEVICE))
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    ranks = pattern_ranks(labels, rank_table, (scores, status, mask))
    assert status.item() & (STATUS_BAD_SCORE | STATUS_BAD_LABEL) == expected.item()
    assert torch.equal(ranks, pattern_ranks(labels, rank_table))

    monkeypatch.setattr(pairwise, "check_batch", lambda *a, **k: pytest.fail("a check launch of its own"))
    dense_calls = []
    monkeypatch.setattr(dense_kernels, "dense_loss_and_grad",
                        lambda *a, _run=dense_kernels.dense_loss_and_grad, **k: dense_calls.append(1) or _run(*a, **k))
    loss = mlloss.LaALoss([1.0, 1.0, 1.0], backend="triton")  # 4 levels: the dense kernels take them
    near = slice(at - 100 if masked else 0, at + 100 if masked else 200)  # 200 items with the bad ones
    for dense in (True, False):  # the dense kernels, and the layout's
        with pytest.MonkeyPatch.context() as layout_only:
            if not dense:
                layout_only.setattr(dense_kernels, "MAX_ITEMS", 0)
            batch = (scores[near], labels[near]), {"mask": None if mask is None else mask[near]}
            if bad == "none":
                loss(*batch[0], **batch[1])
            else:
                with pytest.raises(ValueError, match="score|label"):
                    loss(*batch[0], **batch[1])
        assert len(dense_calls) == 1


def assert_same_layout(got, expected) -> None:
    """Two ``PairLayout``s are equal, bit for bit (int32 everywhere; group spans both None without groups)."""
    for name in ("order", "cell_start", "cell_end", "group_start", "group_end"):
        a, b = getattr(got, name), getattr(expected, name)
        assert (a is None and b is None) or (a.dtype == b.dtype == torch.int32 and torch.equal(a, b)), name


@pytest.mark.parametrize("num_items", [1, 2, 1000, 3000])
@pytest.mark.parametrize("problems,num_ranks", [(1, 2), (3, 2), (1, 3), (1, 4), (2, 8), (1, 1)])
def test_counting_layout_equals_the_sorted_layout(num_items, problems, num_ranks):
    """kernels.levels.counting_layout (few levels, no groups: a counting sort in item blocks of
    1,024) gives pair_layout's order and cell spans, bit for bit, across several blocks."""
    from mlloss.kernels.levels import counting_layout
    from mlloss.ops.layout import pair_layout

    gen = torch.Generator().manual_seed(num_items * 10 + num_ranks)
    rank = torch.randint(0, num_ranks, (problems, num_items), generator=gen, dtype=torch.int32)
    rank[:, : num_items // 3] = num_ranks - 1  # a long run of one level across block boundaries
    levels = Levels(rank.to(DEVICE), num_ranks, None)
    counted = counting_layout(levels)
    assert counted.group_start is None and counted.group_end is None
    assert_same_layout(counted, pair_layout(levels, None))


def test_counting_layout_writes_every_position_for_ranks_outside_the_levels():
    """Ranks the data check refuses (labels other than 0/1 with validate_args=False) count as the
    nearest level: the order is still a permutation, so no kernel reads an unwritten index."""
    from mlloss.kernels.levels import counting_layout

    rank = torch.tensor([[0, 5, -3, 1, 1, 2, 0, -1]], dtype=torch.int32)
    layout = counting_layout(Levels(rank.to(DEVICE), 2, None))
    assert torch.equal(torch.sort(layout.order[0].cpu().long()).values, torch.arange(8))
    clamped = rank.clamp(0, 1)
    assert torch.equal(layout.order.cpu(), torch.sort(clamped, stable=True).indices.to(torch.int32))


def group_ids(pattern: str, num_items: int, gen: torch.Generator, block: int = 512) -> torch.Tensor:
    """Group ids of ``pattern``: users of ~50 items in runs (some crossing the counting layout's
    blocks of ``block`` positions with groups: 512), the same ids shuffled (negative ones too), one
    group, one item per group."""
    if pattern == "one group":
        return torch.full((num_items,), 7)
    if pattern == "singletons":
        return torch.randperm(num_items, generator=gen) - num_items // 2
    runs = torch.cumsum(torch.rand(num_items, generator=gen) < 0.02, 0)
    first, last = 900 * block // 512, 2200 * block // 512
    runs[first:last] = runs[first]  # one user across a whole block and two block edges
    if pattern == "runs":
        return runs
    return (runs * 37 - 500)[torch.randperm(num_items, generator=gen)]


@pytest.mark.parametrize("pattern,problems,num_ranks", [
    ("runs", 1, 2), ("runs", 2, 3), ("shuffled", 1, 2), ("shuffled", 2, 8),
    ("one group", 1, 3), ("one group", 1, 2), ("singletons", 1, 4), ("singletons", 2, 2),
])
def test_counting_layout_with_groups_equals_the_sorted_layout(pattern, problems, num_ranks):
    """With groups, the counting layout gives pair_layout's order, cell spans and group spans,
    bit for bit: groups inside one block, across block edges, across whole blocks, and of one item."""
    from mlloss.kernels.levels import counting_layout

    gen = torch.Generator().manual_seed(len(pattern) * 100 + num_ranks * 10 + problems)
    num_items = 3000
    rank = torch.randint(0, num_ranks, (problems, num_items), generator=gen, dtype=torch.int32)
    rank[:, 1000:1500] = num_ranks - 1  # a long run of one level inside the long group
    groups = group_ids(pattern, num_items, gen).to(DEVICE)
    levels = Levels(rank.to(DEVICE), num_ranks, None)
    assert_same_layout(counting_layout(levels, groups), pair_layout(levels, groups))


@pytest.mark.parametrize("scanned", [False, True])
@pytest.mark.parametrize("pattern,problems,num_ranks", [
    ("runs", 2, 3), ("shuffled", 1, 2), ("one group", 1, 3), ("singletons", 2, 2),
    (None, 3, 2), (None, 1, 8),
])
def test_counting_layout_over_many_blocks(monkeypatch, scanned, pattern, problems, num_ranks):
    """Past ``levels.SCAN_BLOCKS`` blocks of positions a third launch scans the blocks' counts and
    group edges once, and the positions kernel reads the prefix sums; below, each of its programs
    sums the blocks before it. Both give pair_layout's layout bit for bit, with and without
    groups; steps of a few blocks (``COUNT_BLOCK``, ``SCAN_CHUNK``) make every loop over the blocks
    take several."""
    from mlloss.kernels import levels as level_kernels

    monkeypatch.setattr(level_kernels, "COUNT_BLOCK", 2)
    monkeypatch.setattr(level_kernels, "SCAN_CHUNK", 4)
    monkeypatch.setattr(level_kernels, "SCAN_BLOCKS", 0 if scanned else 1 << 30)
    monkeypatch.setattr(level_kernels, "BLOCK", 256)  # blocks of a quarter of the size: the same
    monkeypatch.setattr(level_kernels, "GROUPED_BLOCK", 128)  # loops at a quarter of the items
    gen = torch.Generator().manual_seed(len(pattern or "") * 100 + num_ranks * 10 + problems)
    num_items = 1250  # 10 blocks of 128 positions with groups, 5 of 256 without
    rank = torch.randint(0, num_ranks, (problems, num_items), generator=gen, dtype=torch.int32)
    rank[:, 250:375] = num_ranks - 1
    groups = None if pattern is None else group_ids(pattern, num_items, gen, block=128).to(DEVICE)
    levels = Levels(rank.to(DEVICE), num_ranks, None)
    assert_same_layout(level_kernels.counting_layout(levels, groups), pair_layout(levels, groups))


@pytest.mark.parametrize("num_items", [1, 2, 5])
def test_counting_layout_with_groups_of_a_few_items(num_items):
    from mlloss.kernels.levels import counting_layout

    rank = torch.tensor([[1, 0, 1, 1, 0][:num_items]], dtype=torch.int32)
    groups = torch.tensor([3, 3, -1, 3, -1][:num_items])
    levels = Levels(rank.to(DEVICE), 2, None)
    assert_same_layout(counting_layout(levels, groups.to(DEVICE)), pair_layout(levels, groups.to(DEVICE)))


def test_counting_layout_with_groups_writes_every_position_for_ranks_outside_the_levels():
    from mlloss.kernels.levels import counting_layout

    rank = torch.tensor([[0, 5, -3, 1, 1, 2, 0, -1]], dtype=torch.int32)
    groups = torch.tensor([1, 0, 1, 0, 1, 0, 1, 1])
    layout = counting_layout(Levels(rank.to(DEVICE), 2, None), groups.to(DEVICE))
    assert torch.equal(torch.sort(layout.order[0].cpu().long()).values, torch.arange(8))
    expected = pair_layout(Levels(rank.clamp(0, 1).to(DEVICE), 2, None), groups.to(DEVICE))
    assert torch.equal(layout.order, expected.order)


@pytest.mark.parametrize("dtype,grouped", [(torch.float32, False), (torch.bool, True), (torch.int64, False),
                                           (torch.float32, True)])
@pytest.mark.parametrize("bad", ["none", "nan score", "label 0.5", "label 2"])
def test_counting_layout_reads_label_columns_as_passed_and_checks_them(dtype, grouped, bad):
    """The dispatch hands the counting layout the caller's binary columns transposed (a view of
    any dtype and strides) and the data check: the layout of the int32 ranks, check_batch's bits,
    with and without groups."""
    from mlloss._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
    from mlloss.kernels.levels import counting_layout
    from mlloss.kernels.pairwise import check_batch

    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2500, generator=gen)
    wide = (torch.rand(2500, 4, generator=gen) < 0.3).to(torch.float32)
    planted = bad == "nan score" or (bad == "label 0.5" and dtype == torch.float32) or (
        bad == "label 2" and dtype != torch.bool)  # what the dtype can hold
    if bad == "nan score":
        scores[1234] = float("nan")
    elif planted:
        wide[1234, 2] = 0.5 if bad == "label 0.5" else 2.0
    columns = wide.to(dtype)[:, 1:3]  # strides (4, 1), one element in
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    groups = group_ids("shuffled", 2500, gen).to(DEVICE) if grouped else None
    layout = counting_layout(Levels(columns.to(DEVICE).t(), 2, None), groups, check=(scores.to(DEVICE), status))
    expected = pair_layout(Levels(columns.t().to(torch.int32).clamp(0, 1).contiguous().to(DEVICE), 2, None), groups)
    assert_same_layout(layout, expected)
    reference = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    check_batch(scores.to(DEVICE), columns.to(DEVICE), reference, label_rule="binary")
    assert status.item() == reference.item()
    assert reference.item() == (0 if not planted else STATUS_BAD_SCORE if bad == "nan score" else STATUS_BAD_LABEL)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_layout_call_names_a_bad_entry(grouped) -> None:
    """Past the dense kernels' size: the counting layout's data check names it."""
    scores = torch.randn(2100, dtype=torch.float64)
    labels = (torch.arange(2100) % 3 == 0).to(torch.float32)
    groups = (torch.arange(2100) // 50).to(DEVICE) if grouped else None
    import mlloss

    loss = mlloss.AUCLoss(backend="triton")
    with pytest.raises(ValueError, match=r"scores\[777\]"):
        loss(scores.index_fill(0, torch.tensor([777]), float("inf")).to(DEVICE), labels.to(DEVICE), groups)
    with pytest.raises(ValueError, match=r"labels\[5"):
        loss(scores.to(DEVICE), labels.index_fill(0, torch.tensor([5]), 0.5).to(DEVICE), groups)
