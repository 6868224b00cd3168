"""Group ids in any integer dtype: the same groups give the same bits.

The losses keep ids of at most 32 bits as int32 (``check.group_vector``): the layout sorts the ids,
and a radix sort passes over every bit of its keys (CUDA's sort of int32 keys takes 4 passes, of
int64 keys 8). Nothing else may change: every loss, on each tier (the dense and the layout kernels
under ``TRITON_INTERPRET=1``, and the PyTorch tier), with and without a mask and with contiguous
groups, gives the loss and gradient of int64 ids bit for bit, whether the ids arrive as int32,
int16, uint8 or as int64 ids far outside the int32 range. ``MLLOSS_TEST_DEVICE=cuda`` (with
``TRITON_INTERPRET=0``) runs the same comparisons on a GPU, where the layout sorts the ids with
CUDA's radix sort.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

import mlloss
from mlloss import _validation as check

NUM_ITEMS = 120
DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")

LOSSES = {
    "auc": lambda backend, **kw: mlloss.AUCLoss(backend=backend, **kw),
    "auc exponential": lambda backend, **kw: mlloss.AUCLoss(surrogate="exponential", backend=backend, **kw),
    "pdaom": lambda backend, **kw: mlloss.PDAOMLoss(backend=backend, **kw),
    "laa": lambda backend, **kw: mlloss.LaALoss(backend=backend, **kw),
    "laa hardest": lambda backend, **kw: mlloss.LaALoss(pairs="hardest", backend=backend, **kw),
    "balanced loa": lambda backend, **kw: mlloss.LoALoss(weights="balanced", backend=backend, **kw),
}
SINGLE_LABEL = ("auc", "auc exponential", "pdaom")


def id_forms(ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same groups as ids of several dtypes (``ids`` in 0..127)."""
    return {"int32": ids.to(torch.int32), "int16": ids.to(torch.int16), "uint8": ids.to(torch.uint8),
            "wide int64": ids * (1 << 40) - (1 << 50)}


def batch(seed: int, contiguous: bool):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 12, (NUM_ITEMS,), generator=gen) * 10  # 0 .. 110
    if contiguous:
        ids = ids.sort().values
    scores = torch.randn(NUM_ITEMS, generator=gen, dtype=torch.float64)
    labels = (torch.rand(NUM_ITEMS, 2, generator=gen) < torch.tensor([0.3, 0.6])).double()
    mask = torch.rand(NUM_ITEMS, generator=gen) < 0.8
    return ids.to(DEVICE), scores.to(DEVICE), labels.to(DEVICE), mask.to(DEVICE)


def loss_and_grad(name, backend, scores, labels, groups, mask, contiguous):
    leaf = scores.clone().requires_grad_(True)
    loss = LOSSES[name](backend, contiguous_groups=contiguous)
    value = loss(leaf, labels[:, :1] if name in SINGLE_LABEL else labels, groups, mask)
    (value * 1.5).backward()
    return value.detach(), leaf.grad


@pytest.mark.parametrize("contiguous", [False, True], ids=["ids", "contiguous"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("kernels", ["torch", "dense", "layout"])
@pytest.mark.parametrize("name", list(LOSSES))
def test_every_id_dtype_gives_the_bits_of_int64_ids(name, kernels, masked, contiguous, monkeypatch):
    if kernels == "layout":  # the layout kernels, which batches past the dense kernels' sizes take
        from mlloss.kernels import dense

        monkeypatch.setattr(dense, "MAX_ITEMS", 0)
        monkeypatch.setattr(dense, "MAX_RUN_ITEMS", 0)
    backend = "torch" if kernels == "torch" else "triton"
    ids, scores, labels, mask = batch(7, contiguous)
    mask = mask if masked else None
    expected_loss, expected_grad = loss_and_grad(name, backend, scores, labels, ids, mask, contiguous)
    assert expected_loss.isfinite() and expected_grad.abs().sum() > 0
    for form, groups in id_forms(ids).items():
        loss, grad = loss_and_grad(name, backend, scores, labels, groups, mask, contiguous)
        assert torch.equal(loss, expected_loss), f"{form}: {loss.item()!r} != {expected_loss.item()!r}"
        assert torch.equal(grad, expected_grad), f"{form}: gradients differ"


def test_ids_of_at_most_32_bits_are_kept_as_int32_and_the_others_as_int64():
    ids = torch.tensor([3, 0, 3, 100], device=DEVICE)
    narrow = (torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32)
    for dtype in (*narrow, torch.int64, torch.uint32, torch.uint64):
        groups = check.group_vector(ids.to(dtype), 4)
        assert groups.dtype == (torch.int32 if dtype in narrow else torch.int64), dtype
        assert groups.tolist() == ids.tolist(), dtype
    # the widest ids keep their groups: uint32 ids over 2^31, uint64 ids over 2^63 (wrapping to distinct ones)
    wide = torch.tensor([2**32 - 1, 5, 2**32 - 1], dtype=torch.int64, device=DEVICE).to(torch.uint32)
    assert check.group_vector(wide, 3).tolist() == [2**32 - 1, 5, 2**32 - 1]
    huge = torch.tensor([-1, 5, -1], dtype=torch.int64, device=DEVICE).view(torch.uint64)  # 2^64 - 1
    assert check.group_vector(huge, 3).tolist() == [-1, 5, -1]


def test_a_compiled_step_with_int32_ids_matches_eager_and_does_not_recompile():
    from torch._dynamo.testing import CompileCounterWithBackend

    loss = mlloss.AUCLoss()
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(lambda s, y, g: loss(s, y, g), backend=counter, fullgraph=True, dynamic=False)
    for seed in (1, 2):
        ids, scores, labels, _ = batch(seed, contiguous=False)
        groups = ids.to(torch.int32)
        leaf = scores.clone().requires_grad_(True)
        value = step(leaf, labels[:, 0], groups)
        (value * 1.5).backward()  # as loss_and_grad
        expected, expected_grad = loss_and_grad("auc", "auto", scores, labels, groups, None, False)
        torch.testing.assert_close(value.detach(), expected, rtol=1e-12, atol=0)
        torch.testing.assert_close(leaf.grad, expected_grad, rtol=1e-10, atol=1e-14)
    assert counter.frame_count == 1
