"""The one-launch dense kernels of small binary batches (``kernels/dense.py``) against the float64
brute force, against the layout kernels they replace, and their place in the dispatch.

Runs on the CPU through the Triton interpreter, or on CUDA with MLLOSS_TEST_DEVICE=cuda
TRITON_INTERPRET=0. The scores are float64 unless a test says otherwise, and float64 runs the
kernels' exact branch on both (no fp32 scalar reaches a CUDA kernel: test_cuda_specializations), so
the brute-force comparisons ask 1e-10 on either device; float32 takes the fast special
functions on CUDA.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

pytest.importorskip("triton")

import mlloss  # noqa: E402
from mlloss.kernels import dense  # noqa: E402
from mlloss.kernels.hardest import hardest_loss_and_grad  # noqa: E402
from mlloss.kernels.pairwise import pair_loss_and_grad  # noqa: E402
from mlloss.ops.layout import pair_layout  # noqa: E402
from mlloss.ops.dispatch import problem_levels  # noqa: E402
from reference import hardest_loss, laa_loss, loa_loss, pair_loss as brute_force  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
SURROGATES = ("logistic", "hinge", "squared", "exponential")


def case(n: int, seed: int, *, users: int | None = 9, ties: bool = False, dtype=torch.float64):
    """Scores, 0/1 labels and group ids (unsorted, spread over several row blocks)."""
    gen = torch.Generator().manual_seed(seed)
    if ties:  # exact ties of the extremes, and exact hinge kinks
        scores = torch.randint(-2, 3, (n,), generator=gen).to(dtype)
    else:
        scores = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    labels = (torch.rand(n, generator=gen) < 0.3).to(torch.int32)
    groups = None if users is None else torch.randint(0, users, (n,), generator=gen) * 7 - 20
    return scores, labels, groups


def run_dense(scores, labels, groups, **options):
    """The dense kernels on labels (N,) (one problem) or (B, N) (B label columns)."""
    options = {"margin": 1.0, "reduction": "mean", "hardest": False, "status": None, "mixing": None, **options}
    rows = (labels[None] if labels.dim() == 1 else labels).to(torch.int32).contiguous()
    return dense.dense_loss_and_grad(
        scores.to(DEVICE), rows.to(DEVICE), None if groups is None else groups.to(DEVICE), **options
    )


def reference(scores, labels, groups, *, hardest=False, **options):
    x = scores.double().clone().requires_grad_(True)
    value = (hardest_loss if hardest else brute_force)(x, labels.double(), groups, **options)
    value.backward()
    return value.detach(), x.grad


def assert_close(result, expected, rtol):
    (loss, _, grad), (ref_loss, ref_grad) = result, expected
    scale = max(ref_grad.abs().max().item(), 1e-12)
    torch.testing.assert_close(loss.cpu().double(), ref_loss, rtol=rtol, atol=rtol * 1e-3)
    torch.testing.assert_close(grad.cpu().double(), ref_grad, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("users", [None, 1, 9, 300], ids=["no-groups", "one-group", "9-groups", "singletons"])
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_all_pairs_match_the_brute_force(surrogate, users, reduction) -> None:
    scores, labels, groups = case(150, seed=len(surrogate) + (users or 0))
    margin = 0.3 if surrogate in ("hinge", "squared") else 1.0  # 0.3: not a float32 value
    result = run_dense(scores, labels, groups, surrogate=surrogate, margin=margin, reduction=reduction)
    expected = reference(scores, labels, groups, surrogate=surrogate, margin=margin, reduction=reduction)
    assert_close(result, expected, rtol=1e-10)
    # stats: the loss, the valid pairs and the groups with a valid pair
    ids = torch.zeros_like(labels) if groups is None else groups
    pairs = sum(int(labels[ids == g].sum()) * int((1 - labels[ids == g]).sum()) for g in torch.unique(ids))
    with_pairs = sum(0 < int(labels[ids == g].sum()) < int((ids == g).sum()) for g in torch.unique(ids))
    assert result[1].tolist() == [pytest.approx(result[0].item()), pairs, with_pairs]


@pytest.mark.parametrize("users", [None, 9], ids=["no-groups", "groups"])
@pytest.mark.parametrize("surrogate", SURROGATES)
def test_hardest_pairs_match_the_brute_force_and_the_layout_kernel_with_ties(surrogate, users) -> None:
    scores, labels, groups = case(130, seed=3 + len(surrogate), users=users, ties=True)
    result = run_dense(scores, labels, groups, surrogate=surrogate, margin=0.5, hardest=True, reduction="sum")
    expected = reference(scores, labels, groups, hardest=True, surrogate=surrogate, margin=0.5, reduction="sum")
    assert_close(result, expected, rtol=1e-12)
    # the sort-based kernel it stands in for: the same tie rule (a tied extreme gets 1/ties)
    device_scores, device_labels = scores.to(DEVICE), labels[:, None].to(DEVICE)
    levels = problem_levels(device_labels, None)
    layout = pair_layout(levels, None if groups is None else groups.to(DEVICE))
    loss, stats, grad = hardest_loss_and_grad(device_scores, levels, layout, mixing=None, surrogate=surrogate,
                                              margin=0.5, temperature=None, reduction="sum", status=None)
    torch.testing.assert_close(result[0], loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(result[2], grad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(result[1], stats, rtol=1e-12, atol=0)


def test_float32_matches_the_layout_kernel_and_is_deterministic() -> None:
    scores, labels, groups = case(500, seed=11, users=40, dtype=torch.float32)
    first, second = run_dense(scores, labels, groups, surrogate="logistic"), run_dense(scores, labels, groups,
                                                                                        surrogate="logistic")
    for a, b in zip(first, second):
        assert torch.equal(a, b)  # bit-identical run to run
    levels = problem_levels(labels[:, None].to(DEVICE), None)
    loss, stats, grad = pair_loss_and_grad(scores.to(DEVICE), levels, pair_layout(levels, groups.to(DEVICE)),
                                           mixing=None, cost="uniform", surrogate="logistic", margin=1.0,
                                           reduction="mean", status=None)
    assert first[0].dtype == first[2].dtype == torch.float32
    torch.testing.assert_close(first[0], loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(first[2], grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(first[1], stats, rtol=1e-5, atol=0)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_batches_give_zero_without_pairs(n) -> None:
    scores, labels, groups = case(max(n, 1), seed=5)
    scores, labels, groups = scores[:n], torch.ones(n, dtype=torch.int32), groups[:n]
    loss, stats, grad = run_dense(scores, labels, groups, surrogate="logistic")
    assert loss.item() == 0.0 and stats.tolist() == [0.0, 0.0, 0.0] and torch.equal(grad.cpu(), torch.zeros(n, dtype=grad.dtype))


def test_an_overflowing_loss_sets_the_status_bit() -> None:
    from mlloss._validation import STATUS_OVERFLOW

    scores, labels, groups = case(60, seed=2)
    status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    run_dense(scores * 1e4, labels, groups, surrogate="exponential", status=status)
    assert status.item() == STATUS_OVERFLOW
    with pytest.raises(OverflowError):
        mlloss.AUCLoss(surrogate="exponential", backend="triton")((scores * 1e4).to(DEVICE), labels.to(DEVICE),
                                                                  groups.to(DEVICE))


def test_the_dispatch_takes_the_dense_kernels_for_small_binary_problems(monkeypatch) -> None:
    """AUC, PDAOM (no temperature), LoA and LaA of binary columns with at most MAX_LEVELS label
    levels, up to MAX_ITEMS items on the Triton tier; LaA of an ordinal column or of more levels,
    max-violation and soft hardest pairs of LaA and larger batches keep the layout kernels."""
    calls = []
    original = dense.dense_loss_and_grad
    monkeypatch.setattr(dense, "dense_loss_and_grad", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setattr(dense, "MAX_ITEMS", 100)
    scores, labels, groups = case(100, seed=1)
    scores, labels, groups = scores.to(DEVICE), labels.to(DEVICE), groups.to(DEVICE)
    expectations = [
        (mlloss.AUCLoss(backend="triton"), labels, True),
        (mlloss.PDAOMLoss(backend="triton"), labels, True),
        (mlloss.PDAOMLoss(backend="triton", temperature=0.5), labels, False),
        (mlloss.LoALoss(backend="triton"), torch.stack([labels, 1 - labels], 1), True),
        (mlloss.LoALoss("balanced", backend="triton"), torch.stack([labels, 1 - labels], 1), True),
        (mlloss.LaALoss(backend="triton"), torch.stack([labels, 1 - labels], 1), True),  # 3 levels
        (mlloss.LaALoss([1.0, 0.5], cost="uniform", backend="triton"), torch.stack([labels, 1 - labels], 1), True),
        (mlloss.LaALoss([1.0, 0.5, 0.25], backend="triton"), torch.stack([labels, 1 - labels, labels], 1), False),
        (mlloss.LaALoss(backend="triton"), (labels * 3)[:, None], False),  # an ordinal column
        (mlloss.LaALoss(pairs="hardest", backend="triton"), torch.stack([labels, 1 - labels], 1), False),
    ]
    for loss, loss_labels, takes_dense in expectations:
        calls.clear()
        loss(scores, loss_labels, groups)
        assert bool(calls) == takes_dense, loss
    calls.clear()
    bigger, bigger_labels, bigger_groups = (t.to(DEVICE) for t in case(101, seed=1))
    mlloss.AUCLoss(backend="triton")(bigger, bigger_labels, bigger_groups)
    assert not calls


@pytest.mark.parametrize("hardest", [False, True], ids=["all-pairs", "hardest"])
@pytest.mark.parametrize("users", [None, 9], ids=["no-groups", "groups"])
def test_label_columns_mixed_match_the_brute_force(users, hardest) -> None:
    """LoA: one problem per label column over the same scores, mixed by the a_k."""
    scores, labels, groups = case(140, seed=21, users=users)
    columns = torch.stack([labels, (torch.arange(140) % 3 == 0).to(torch.int32), 1 - labels])
    weights = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    options = dict(surrogate="exponential" if hardest else "logistic", reduction="sum" if hardest else "mean")
    result = run_dense(scores, columns, groups, hardest=hardest, mixing=weights.to(DEVICE), **options)
    x = scores.clone().requires_grad_(True)
    expected = loa_loss(x, columns.t().double(), groups, weights.tolist(), pairs="hardest" if hardest else "all", **options)
    expected.backward()
    assert_close(result, (expected.detach(), x.grad), rtol=1e-10)
    assert result[1].shape == (9,)  # per column: loss, valid pairs, groups with pairs


@pytest.mark.parametrize("hardest", [False, True], ids=["all-pairs", "hardest"])
@pytest.mark.parametrize("users", [None, 9], ids=["no-groups", "groups"])
def test_the_kernels_skip_the_items_outside_the_mask(users, hardest) -> None:
    """A mask read by the kernels: the loss, statistics and gradient of the kept items alone;
    the others hold NaN scores, labels of 5 and any group, and get a gradient of exactly 0."""
    scores, labels, groups = case(170, seed=31, users=users)
    keep = torch.rand(170, generator=torch.Generator().manual_seed(1)) < 0.7
    columns = torch.stack([labels, 1 - labels])
    garbage_scores = scores.masked_fill(~keep, float("nan"))
    garbage_columns = columns.masked_fill(~keep, 5)
    garbage_groups = None if groups is None else groups.masked_fill(~keep, 10**9)
    options = dict(surrogate="exponential" if hardest else "logistic", reduction="sum" if hardest else "mean",
                   hardest=hardest, mixing=torch.tensor([1.0, 0.5], dtype=torch.float64, device=DEVICE))
    loss, stats, grad = run_dense(garbage_scores, garbage_columns, garbage_groups, mask=keep.to(DEVICE), **options)
    kept = run_dense(scores[keep], columns[:, keep], None if groups is None else groups[keep], **options)
    torch.testing.assert_close(loss, kept[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(stats, kept[1], rtol=1e-12, atol=0)
    torch.testing.assert_close(grad[keep.to(DEVICE)], kept[2], rtol=1e-12, atol=1e-15)
    assert torch.equal(grad.cpu()[~keep], torch.zeros(int((~keep).sum()), dtype=grad.dtype))


def test_the_data_check_reads_only_the_items_of_the_mask() -> None:
    from mlloss._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
    from mlloss.kernels.pairwise import check_batch

    scores, labels, _ = case(50, seed=4)
    keep = torch.arange(50) % 4 != 0
    scores, labels = scores.masked_fill(~keep, float("nan")), labels.masked_fill(~keep, 5)[:, None]

    def status_of(scores, mask):
        status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        check_batch(scores.to(DEVICE), labels.to(DEVICE), status, label_rule="binary",
                    mask=None if mask is None else mask.to(DEVICE))
        return status.item()

    assert status_of(scores, None) == STATUS_BAD_SCORE | STATUS_BAD_LABEL
    assert status_of(scores, keep) == 0
    assert status_of(scores.index_fill(0, torch.tensor([5]), float("inf")), keep) == STATUS_BAD_SCORE
    # through a loss: the offending kept entry is named, the fillers are not
    with pytest.raises(ValueError, match=r"scores\[5\]"):
        mlloss.AUCLoss(backend="triton")(scores.index_fill(0, torch.tensor([5]), float("inf")).to(DEVICE),
                                         labels[:, 0].clamp(max=1).to(DEVICE), mask=keep.to(DEVICE))


@pytest.mark.parametrize("cost", ["linear", "uniform"])
@pytest.mark.parametrize("users", [None, 1, 9, 300], ids=["no-groups", "one-group", "9-groups", "singletons"])
@pytest.mark.parametrize("weights", [[1.0, 1.0], [1.0, 0.5]], ids=["3-levels", "4-levels"])
def test_aggregated_levels_match_the_brute_force_and_the_layout_kernel(weights, users, cost) -> None:
    """LaA of two binary columns: one problem of 3 or 4 levels, each pair costing the levels'
    difference (linear) or 1; the float64 brute force, and the layout kernel's statistics."""
    scores, labels, groups = case(160, seed=40 + len(weights) + (users or 0))
    columns = torch.stack([labels, (torch.rand(160, generator=torch.Generator().manual_seed(7)) < 0.4).int()], 1)
    levels = problem_levels(columns.double().to(DEVICE), weights)
    assert levels.values.shape[1] == (3 if weights == [1.0, 1.0] else 4)
    result = dense.dense_loss_and_grad(
        scores.to(DEVICE), levels.rank, None if groups is None else groups.to(DEVICE), mixing=None,
        surrogate="logistic", margin=1.0, hardest=False, reduction="mean", status=None,
        values=levels.values, linear=cost == "linear")
    x = scores.clone().requires_grad_(True)
    expected = laa_loss(x, columns.double(), groups, weights=weights, cost=cost)
    expected.backward()
    assert_close(result, (expected.detach(), x.grad), rtol=1e-10)
    layout = pair_loss_and_grad(scores.to(DEVICE), levels, pair_layout(levels, None if groups is None else groups.to(DEVICE)),
                                mixing=None, cost=cost, surrogate="logistic", margin=1.0, reduction="mean", status=None)
    torch.testing.assert_close(result[1], layout[1], rtol=1e-10, atol=0)


def test_aggregated_levels_skip_the_items_outside_the_mask() -> None:
    scores, labels, groups = case(150, seed=50)
    columns = torch.stack([labels, 1 - labels.roll(3)], 1).double()
    keep = torch.arange(150) % 5 != 2
    garbage_scores, garbage_columns = scores.masked_fill(~keep, float("nan")), columns.masked_fill(~keep[:, None], 5.0)
    x = garbage_scores.to(DEVICE).clone().requires_grad_(True)
    value = mlloss.LaALoss(backend="triton")(x, garbage_columns.to(DEVICE), groups.to(DEVICE), mask=keep.to(DEVICE))
    value.backward()
    y = scores[keep].clone().requires_grad_(True)
    expected = laa_loss(y, columns[keep], groups[keep])
    expected.backward()
    torch.testing.assert_close(value.detach().cpu().double(), expected.detach(), rtol=1e-10, atol=0)
    torch.testing.assert_close(x.grad.cpu().double()[keep], y.grad, rtol=1e-9, atol=1e-12)
    assert torch.equal(x.grad.cpu()[~keep], torch.zeros(int((~keep).sum()), dtype=x.grad.dtype))


def test_the_dense_kernels_refuse_what_they_do_not_compute() -> None:
    scores, labels, _ = case(40, seed=1)
    values = torch.arange(5, dtype=torch.float64, device=DEVICE)[None]
    with pytest.raises(ValueError, match="3 to 4 levels"):
        run_dense(scores, labels, None, surrogate="logistic", values=values)
    with pytest.raises(ValueError, match="hardest=True"):
        run_dense(scores, labels, None, surrogate="logistic", values=values[:, :3], hardest=True)


def test_a_dropped_row_cannot_leak_an_overflow() -> None:
    """Rows outside the mask run the pair loop as an item of score 0 (the kernels drop them after
    it): with exponential pairs of scores near -100 such a row overflows in float32, the kept
    items do not, and nothing of it may reach the loss or the gradient."""
    scores, labels, _ = case(90, seed=8, users=None, dtype=torch.float32)  # one group: every row meets every item
    scores = scores - 100.0
    keep = torch.arange(90) % 3 != 0
    loss, stats, grad = run_dense(scores, labels, None, mask=keep.to(DEVICE), surrogate="exponential")
    kept = run_dense(scores[keep], labels[keep], None, surrogate="exponential")
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, kept[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grad[keep.to(DEVICE)], kept[2], rtol=1e-5, atol=1e-8)
    assert torch.equal(grad.cpu()[~keep], torch.zeros(30, dtype=grad.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
@pytest.mark.parametrize("hardest", [False, True])
def test_dense_kernels_read_label_columns_as_passed(dtype, hardest):
    """The dispatch hands the dense kernels the caller's (N, K) label columns transposed, a view
    of any dtype and strides (a slice of a wider label matrix): the same bits as the int32 rows."""
    scores, _, groups = case(150, 11, users=4)  # three row blocks of the interpreter's tiles
    gen = torch.Generator().manual_seed(5)
    wide = (torch.rand(150, 5, generator=gen) < 0.3).to(dtype)
    columns = wide[:, 1:4]  # (N, 3) with strides (5, 1), starting one element in
    surrogate = "exponential" if hardest else "logistic"
    as_rows = run_dense(scores, columns.t().to(torch.int32), groups, hardest=hardest, surrogate=surrogate)
    as_passed = dense.dense_loss_and_grad(
        scores.to(DEVICE), columns.to(DEVICE).t(), groups.to(DEVICE), margin=1.0, reduction="mean",
        hardest=hardest, status=None, mixing=None, surrogate=surrogate,
    )
    for got, expected in zip(as_passed, as_rows):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("bad", ["none", "nan score", "inf score", "label 0.5", "label 2", "nan label", "both"])
def test_the_dense_kernels_data_check_sets_the_bits_check_batch_sets(bad, masked) -> None:
    """check=True (the dispatch's path for binary columns with validate_args): the rows kernel's
    data check gives check_batch's status bits, over the mask only, for one and several columns."""
    from mlloss._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
    from mlloss.kernels.pairwise import check_batch

    scores, _, groups = case(150, seed=8, users=4)
    gen = torch.Generator().manual_seed(9)
    columns = (torch.rand(150, 2, generator=gen) < 0.4).to(torch.float32)
    keep = torch.arange(150) % 5 != 0
    at = 7 if masked else 0  # a kept item (item 0 is a filler when masked)
    if bad in ("nan score", "both"):
        scores[at] = float("nan")
    if bad == "inf score":
        scores[at] = float("-inf")
    label = {"label 0.5": 0.5, "label 2": 2.0, "nan label": float("nan"), "both": 3.0}.get(bad)
    if label is not None:
        columns[at, 1] = label
    if masked:  # fillers hold anything: never reported
        scores[~keep], columns[~keep] = float("inf"), 7.0
    mask = keep.to(DEVICE) if masked else None
    expected = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    check_batch(scores.to(DEVICE), columns.to(DEVICE), expected, label_rule="binary", mask=mask)
    for cols in (columns[:, 1:], columns):  # one problem (AUC), two (LoA)
        status = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        dense.dense_loss_and_grad(scores.to(DEVICE), cols.to(DEVICE).t(), groups.to(DEVICE), mask, surrogate="logistic",
                                  margin=1.0, reduction="mean", hardest=False, status=status, mixing=None, check=True)
        # (combine adds the overflow bit of a non-finite loss, as it does after check_batch)
        assert status.item() & (STATUS_BAD_SCORE | STATUS_BAD_LABEL) == expected.item(), (bad, cols.shape)
    assert (expected.item() != 0) == (bad != "none")
