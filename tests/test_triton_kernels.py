"""Triton pairwise kernels vs an independent float64 brute force (all pairs, small N).

Runs on the CPU through the Triton interpreter; TRITON_INTERPRET must be set before
triton (or mlloss.kernels) is imported, hence the environment line above the imports.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from mlloss.kernels.pairwise import (  # noqa: E402
    label_bits_pairs_loss,
    label_bits_pairs_loss_and_grad,
    ordinal_pairs_loss,
    ordinal_pairs_loss_and_grad,
)

pytestmark = pytest.mark.triton

SURROGATES = ("logistic", "hinge", "squared", "exponential")


# --------------------------------------------------------------------------- #
# Reference and data                                                          #
# --------------------------------------------------------------------------- #
def _phi(t: torch.Tensor, surrogate: str, margin: float) -> torch.Tensor:
    if surrogate == "logistic":
        return F.softplus(-t)
    if surrogate == "hinge":
        return torch.relu(margin - t)  # relu' (0) == 0: subgradient 0 at the kink
    if surrogate == "squared":
        return (margin - t) ** 2
    return torch.exp(-t)


def _brute_force(scores: torch.Tensor, weight: torch.Tensor, surrogate: str, margin: float):
    """sum_ij weight_ij * phi(s_i - s_j) and its gradient, in float64 via autograd."""
    s = scores.detach().double().requires_grad_()
    t = s[:, None] - s[None, :]
    terms = torch.where(weight != 0, weight * _phi(t, surrogate, margin), torch.zeros_like(t))
    loss = terms.sum()
    loss.backward()
    return loss.detach(), s.grad


def _spans(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[start, end) of each item's group, for group ids sorted ascending."""
    start = torch.searchsorted(group, group, right=False).to(torch.int32)
    end = torch.searchsorted(group, group, right=True).to(torch.int32)
    return start, end


def _ordinal_case(sizes: list[int], num_levels: int, seed: int, integer_scores: bool = False):
    """Items sorted by (group asc, level desc), per-item coef, increasing level values."""
    gen = torch.Generator().manual_seed(seed)
    group = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    level = torch.randint(0, num_levels, (len(group),), generator=gen)
    order = torch.argsort(group * num_levels + (num_levels - 1 - level), stable=True)
    group, level = group[order], level[order]
    start, end = _spans(group)
    if integer_scores:  # exact ties and exact hinge kinks (t == margin == 1)
        scores = torch.randint(-2, 3, (len(group),), generator=gen).float()
    else:
        scores = torch.randn(len(group), generator=gen)
    coef = torch.rand(len(group), generator=gen) + 0.1
    level_value = torch.sort(torch.rand(num_levels, generator=gen) * 3).values
    return scores, level.to(torch.int32), level_value, start, end, coef, group


def _ordinal_weight(level, level_value, coef, group, cost: str) -> torch.Tensor:
    lv = level.long()
    valid = (group[:, None] == group[None, :]) & (lv[:, None] > lv[None, :])
    if cost == "linear":
        v = level_value.double()[lv]
        c = v[:, None] - v[None, :]
    else:
        c = torch.ones(len(lv), len(lv), dtype=torch.float64)
    return coef.double()[:, None] * c * valid


def _bits_case(sizes: list[int], k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    group = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    start, end = _spans(group)
    bits = torch.randint(0, 2**k, (len(group),), generator=gen, dtype=torch.int32)
    scores = torch.randn(len(group), generator=gen)
    coef = torch.rand(k, len(group), generator=gen) + 0.1
    return scores, bits, start, end, coef, group


def _bits_weight(bits, coef, group) -> torch.Tensor:
    k = coef.shape[0]
    b = ((bits.long()[None, :] >> torch.arange(k)[:, None]) & 1).double()  # (K, N)
    w = torch.einsum("ki,kj,ki->ij", b, 1 - b, coef.double())
    return w * (group[:, None] == group[None, :])


def _assert_close(loss, grad, ref_loss, ref_grad, rtol: float = 1e-4) -> None:
    scale = max(ref_grad.abs().max().item(), 1e-12)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=rtol, atol=rtol * 1e-3)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=rtol, atol=rtol * scale)


# --------------------------------------------------------------------------- #
# Ordinal pairs                                                               #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("cost", ["uniform", "linear"])
def test_ordinal_matches_brute_force(surrogate: str, cost: str) -> None:
    # Ragged N (150), groups of very different sizes including singletons, a group
    # spanning several tiles, and BLOCK_M != BLOCK_N.
    scores, level, lv, start, end, coef, group = _ordinal_case([1, 70, 3, 1, 45, 30], 4, seed=1)
    loss, grad = ordinal_pairs_loss_and_grad(
        scores, level, lv, start, end, coef, cost=cost, surrogate=surrogate, margin=0.7, block_m=32, block_n=64
    )
    ref = _brute_force(scores, _ordinal_weight(level, lv, coef, group, cost), surrogate, 0.7)
    assert loss.dtype == grad.dtype == torch.float32 and loss.dim() == 0 and grad.shape == scores.shape
    _assert_close(loss, grad, *ref)


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_ordinal_ties_and_hinge_kinks(surrogate: str) -> None:
    scores, level, lv, start, end, coef, group = _ordinal_case([40, 57], 3, seed=2, integer_scores=True)
    loss, grad = ordinal_pairs_loss_and_grad(
        scores, level, lv, start, end, coef, cost="linear", surrogate=surrogate, margin=1.0, block_m=64, block_n=64
    )
    _assert_close(loss, grad, *_brute_force(scores, _ordinal_weight(level, lv, coef, group, "linear"), surrogate, 1.0))


@pytest.mark.parametrize("block", [16, 64, 128])
def test_ordinal_block_sizes_and_large_single_group(block: int) -> None:
    scores, level, lv, start, end, coef, group = _ordinal_case([201], 5, seed=3)
    loss, grad = ordinal_pairs_loss_and_grad(
        scores, level, lv, start, end, coef, surrogate="logistic", block_m=block, block_n=128
    )
    ref = _brute_force(scores, _ordinal_weight(level, lv, coef, group, "uniform"), "logistic", 1.0)
    _assert_close(loss, grad, *ref)


def test_ordinal_one_class_and_singleton_groups_give_zero() -> None:
    n = 77
    scores = torch.randn(n)
    zeros = torch.zeros(n, dtype=torch.int32)
    coef = torch.ones(n)
    # One group, every item on level 0: no valid pair.
    start, end = zeros, torch.full((n,), n, dtype=torch.int32)
    loss, grad = ordinal_pairs_loss_and_grad(scores, zeros, torch.zeros(1), start, end, coef, block_m=64, block_n=64)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0
    # Every item its own group, on distinct levels: still no same-group pair.
    idx = torch.arange(n, dtype=torch.int32)
    level = torch.arange(n - 1, -1, -1, dtype=torch.int32)
    loss, grad = ordinal_pairs_loss_and_grad(scores, level, torch.rand(n), idx, idx + 1, coef, block_m=64, block_n=64)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


def test_ordinal_tiny_and_empty_inputs() -> None:
    one = torch.zeros(1, dtype=torch.int32)
    loss, grad = ordinal_pairs_loss_and_grad(torch.randn(1), one, torch.zeros(1), one, one + 1, torch.ones(1))
    assert loss.item() == 0.0 and grad.tolist() == [0.0]
    empty = torch.zeros(0, dtype=torch.int32)
    loss, grad = ordinal_pairs_loss_and_grad(torch.randn(0), empty, torch.zeros(1), empty, empty, torch.ones(0))
    assert loss.item() == 0.0 and grad.shape == (0,)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ordinal_half_precision_inputs(dtype: torch.dtype) -> None:
    scores, level, lv, start, end, coef, group = _ordinal_case([60, 37, 9], 3, seed=4)
    scores = scores.to(dtype)
    loss, grad = ordinal_pairs_loss_and_grad(
        scores, level, lv, start, end, coef, cost="linear", surrogate="logistic", block_m=64, block_n=64
    )
    assert loss.dtype == grad.dtype == torch.float32
    # Reference from the same rounded inputs; fp32 accumulation, so only slightly looser.
    ref = _brute_force(scores.float(), _ordinal_weight(level, lv, coef, group, "linear"), "logistic", 1.0)
    _assert_close(loss, grad, *ref, rtol=1e-3)


@pytest.mark.parametrize("surrogate", SURROGATES)
def test_ordinal_float64_accumulates_in_float64(surrogate: str) -> None:
    scores, level, lv, start, end, coef, group = _ordinal_case([50, 80], 4, seed=5)
    # Values not representable in float32: rounding any input to fp32 would break 1e-9.
    scores, lv, coef = scores.double() / 3, lv.double() / 7, coef.double() / 3
    loss, grad = ordinal_pairs_loss_and_grad(
        scores, level, lv, start, end, coef, cost="linear", surrogate=surrogate, margin=0.7, block_m=64, block_n=64
    )
    assert loss.dtype == grad.dtype == torch.float64
    ref = _brute_force(scores, _ordinal_weight(level, lv, coef, group, "linear"), surrogate, 0.7)
    _assert_close(loss, grad, *ref, rtol=1e-9)


def test_ordinal_is_deterministic() -> None:
    scores, level, lv, start, end, coef, _ = _ordinal_case([120, 60], 4, seed=6)
    args = (scores, level, lv, start, end, coef)
    kw = dict(cost="linear", surrogate="logistic", block_m=32, block_n=64)
    loss1, grad1 = ordinal_pairs_loss_and_grad(*args, **kw)
    loss2, grad2 = ordinal_pairs_loss_and_grad(*args, **kw)
    assert torch.equal(loss1, loss2) and torch.equal(grad1, grad2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ordinal_autograd_wrapper_scales_grad_output(dtype: torch.dtype) -> None:
    scores, level, lv, start, end, coef, group = _ordinal_case([33, 90], 3, seed=7)
    scores = scores.to(dtype)
    x = scores.clone().requires_grad_()
    loss = ordinal_pairs_loss(x, level, lv, start, end, coef, surrogate="hinge", margin=0.5, block_m=64, block_n=64)
    (2.5 * loss).backward()
    assert x.grad.dtype == dtype
    ref_loss, ref_grad = _brute_force(scores.float(), _ordinal_weight(level, lv, coef, group, "uniform"), "hinge", 0.5)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    _assert_close(loss.detach(), x.grad.float() / 2.5, ref_loss, ref_grad, rtol=tol)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy, in the interpreter
def test_exponential_overflow_raises() -> None:
    scores = torch.tensor([-60.0, 60.0])  # upper far below lower: exp(120) overflows float32
    level = torch.tensor([1, 0], dtype=torch.int32)
    start, end = torch.zeros(2, dtype=torch.int32), torch.full((2,), 2, dtype=torch.int32)
    with pytest.raises(OverflowError, match="log-domain"):
        ordinal_pairs_loss_and_grad(scores, level, torch.tensor([0.0, 1.0]), start, end, torch.ones(2),
                                    surrogate="exponential")


def test_bad_arguments_are_rejected() -> None:
    scores, level, lv, start, end, coef, _ = _ordinal_case([10], 2, seed=8)
    with pytest.raises(ValueError, match="surrogate"):
        ordinal_pairs_loss_and_grad(scores, level, lv, start, end, coef, surrogate="sigmoid")
    with pytest.raises(ValueError, match="cost"):
        ordinal_pairs_loss_and_grad(scores, level, lv, start, end, coef, cost="quadratic")
    with pytest.raises(ValueError, match="block_m"):
        ordinal_pairs_loss_and_grad(scores, level, lv, start, end, coef, block_m=48)
    with pytest.raises(ValueError, match="coef"):
        ordinal_pairs_loss_and_grad(scores, level, lv, start, end, coef[:-1])


# --------------------------------------------------------------------------- #
# Label bits (LoA)                                                            #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_label_bits_matches_brute_force(surrogate: str, k: int) -> None:
    scores, bits, start, end, coef, group = _bits_case([1, 64, 2, 50, 1, 29], k, seed=10 + k)
    loss, grad = label_bits_pairs_loss_and_grad(
        scores, bits, start, end, coef, surrogate=surrogate, margin=0.8, block_m=64, block_n=32
    )
    _assert_close(loss, grad, *_brute_force(scores, _bits_weight(bits, coef, group), surrogate, 0.8))


def test_label_bits_ties_single_class_and_singletons() -> None:
    gen = torch.Generator().manual_seed(20)
    group = torch.repeat_interleave(torch.arange(4), torch.tensor([1, 30, 1, 70]))
    start, end = _spans(group)
    n = len(group)
    scores = torch.randint(-2, 3, (n,), generator=gen).float()  # ties and hinge kinks
    bits = torch.randint(0, 8, (n,), generator=gen, dtype=torch.int32)
    bits[1:31] = 5  # group 1: every item has the same labels -> no pair
    coef = torch.rand(3, n, generator=gen) + 0.1
    loss, grad = label_bits_pairs_loss_and_grad(
        scores, bits, start, end, coef, surrogate="hinge", block_m=64, block_n=64
    )
    ref_loss, ref_grad = _brute_force(scores, _bits_weight(bits, coef, group), "hinge", 1.0)
    _assert_close(loss, grad, ref_loss, ref_grad)
    assert torch.count_nonzero(grad[:32]) == 0  # singleton + single-class group + singleton

    same = torch.full((n,), 7, dtype=torch.int32)
    loss, grad = label_bits_pairs_loss_and_grad(scores, same, start, end, coef, block_m=64, block_n=64)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


def test_label_bits_bf16_and_autograd_wrapper() -> None:
    scores, bits, start, end, coef, group = _bits_case([80, 41], 3, seed=21)
    scores = scores.to(torch.bfloat16)
    x = scores.clone().requires_grad_()
    loss = label_bits_pairs_loss(x, bits, start, end, coef, surrogate="logistic", block_m=64, block_n=64)
    (-3.0 * loss).backward()
    assert x.grad.dtype == torch.bfloat16
    ref_loss, ref_grad = _brute_force(scores.float(), _bits_weight(bits, coef, group), "logistic", 1.0)
    torch.testing.assert_close(loss.detach().double(), ref_loss, rtol=1e-3, atol=1e-6)
    # The bf16 grad itself is rounded (8-bit mantissa); compare the fp32 kernel output tightly.
    _, grad = label_bits_pairs_loss_and_grad(scores, bits, start, end, coef, block_m=64, block_n=64)
    _assert_close(loss.detach(), grad, ref_loss, ref_grad, rtol=1e-3)
    torch.testing.assert_close(x.grad.double(), -3.0 * ref_grad, rtol=1e-2, atol=1e-2 * ref_grad.abs().max().item())


def test_label_bits_is_deterministic() -> None:
    scores, bits, start, end, coef, _ = _bits_case([150, 50], 2, seed=22)
    r1 = label_bits_pairs_loss_and_grad(scores, bits, start, end, coef, block_m=32, block_n=64)
    r2 = label_bits_pairs_loss_and_grad(scores, bits, start, end, coef, block_m=32, block_n=64)
    assert torch.equal(r1[0], r2[0]) and torch.equal(r1[1], r2[1])
