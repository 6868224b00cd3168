"""The Triton tier against the PyTorch tier (generative-recommenders' tier-against-tier tests).

Every loss family (AUC, LoA, LaA and the max-violation PDAOM) with every surrogate of the one table
(``mlloss.surrogates.NAMES``: a new surrogate is tested here without an edit) runs once on each tier,
``backend="triton"`` (the kernels of ``kernels/``, under ``TRITON_INTERPRET=1`` on the CPU) and
``backend="torch"`` (``mlloss.ops.torch_tier``), on a batch whose size (500 to 1,024 items), score
dtype, groups, labels, margin, reduction and incoming gradient are drawn from the case's seed. The
losses and the gradients with respect to the scores must agree: to float64 rounding for float64
scores, to float32 accumulation-order rounding otherwise (both tiers accumulate fp16/bf16/fp32 in
float32, in different orders). About 1 s a case on the interpreter. (The layout kernels, which
batches past 2,048 items take, are compared with the PyTorch tier in test_triton_kernels.py and
test_triton_backend.py, with the dense kernels off.)
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

pytest.importorskip("triton")

import mlloss  # noqa: E402
from mlloss.surrogates import NAMES, USES_MARGIN  # noqa: E402

pytestmark = pytest.mark.triton

FAMILIES = ("auc", "loa", "laa", "pdaom")
DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def draw_case(family: str, surrogate: str):
    """(loss options, scores, labels, groups, incoming gradient) drawn from the case's own seed."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{family}/{surrogate}".encode()))

    def pick(options):
        return options[int(torch.randint(len(options), (), generator=gen))]

    num_items = int(torch.randint(500, 1025, (), generator=gen))
    dtype = pick(DTYPES)
    num_groups = pick((None, 7, 60, 400))
    groups = None if num_groups is None else torch.randint(0, num_groups, (num_items,), generator=gen) * 3 - 50
    scores = (torch.randn(num_items, generator=gen, dtype=torch.float64) * 1.5).to(dtype)
    prior = float(torch.empty(()).uniform_(0.05, 0.5, generator=gen))
    options = dict(surrogate=surrogate, reduction=pick(("mean", "sum")))
    if surrogate in USES_MARGIN:
        options["margin"] = pick((0.5, 1.0, 2.0))
    if family in ("auc", "pdaom"):
        labels = (torch.rand(num_items, generator=gen) < prior).to(pick((torch.float32, torch.int64, torch.bool)))
        if family == "pdaom":
            options["temperature"] = pick((None, 0.5))
    elif family == "loa":
        num_labels = 2
        labels = (torch.rand(num_items, num_labels, generator=gen) < prior).float()
        options["weights"] = pick((None, [1.0, 0.5]))
    else:  # laa: binary columns with weights, or one ordinal column (0..4 ratings)
        if pick((True, False)):
            labels = (torch.rand(num_items, 3, generator=gen) < prior).float()
            options["weights"] = pick((None, [0.5, 1.0, 3.0]))
        else:
            labels = torch.randint(0, 5, (num_items,), generator=gen).float()
        options["cost"] = pick(("linear", "uniform"))
    incoming = float(torch.empty(()).uniform_(0.5, 2.0, generator=gen))
    return options, scores, labels, groups, incoming


def build(family: str, options: dict, backend: str) -> torch.nn.Module:
    loss = {"auc": mlloss.AUCLoss, "loa": mlloss.LoALoss, "laa": mlloss.LaALoss, "pdaom": mlloss.PDAOMLoss}[family]
    return loss(backend=backend, **options)


def loss_and_grad(family, options, scores, labels, groups, incoming, backend):
    leaf = scores.clone().requires_grad_(True)
    loss = build(family, options, backend)(leaf, labels, groups)
    (loss * incoming).backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("surrogate", NAMES)
@pytest.mark.parametrize("family", FAMILIES)
def test_triton_tier_matches_the_pytorch_tier(family: str, surrogate: str) -> None:
    options, scores, labels, groups, incoming = draw_case(family, surrogate)
    triton_loss, triton_grad = loss_and_grad(family, options, scores, labels, groups, incoming, "triton")
    torch_loss, torch_grad = loss_and_grad(family, options, scores, labels, groups, incoming, "torch")
    case = f"{family}/{surrogate} N={scores.numel()} {scores.dtype} groups={groups is not None} {options}"

    assert triton_loss.dtype == torch_loss.dtype and triton_grad.dtype == torch_grad.dtype == scores.dtype, case
    wide = scores.dtype == torch.float64
    torch.testing.assert_close(
        triton_loss, torch_loss, rtol=1e-10 if wide else 2e-5, atol=1e-12 if wide else 1e-6, msg=lambda m: f"{case}: {m}"
    )
    # Gradient entries are compared on the scale of the largest one (the small ones are sums of
    # cancelling pulls); bfloat16 gradients carry 8 bits.
    scale = float(torch_grad.double().abs().max()) or 1.0
    rtol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 1.6e-2}[scores.dtype]
    torch.testing.assert_close(
        triton_grad.double(), torch_grad.double(), rtol=rtol, atol=rtol * scale, msg=lambda m: f"{case}: {m}"
    )


def test_auto_takes_the_sync_free_kernels_for_small_cuda_batches() -> None:
    """``backend="auto"``: the closed forms (whose tables read sizes on the host) for surrogates
    that have one, except on CUDA for batches the dense kernels take, which never wait for the
    device (a CUDA graph can capture them); logistic: the kernels on CUDA, the blocked sums on
    the CPU. Only the choice is tested here: no CUDA tensor is made."""
    from mlloss.kernels.dense import MAX_ITEMS
    from mlloss.ops.dispatch import CLOSED_FORMS, resolve_tier

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for surrogate in CLOSED_FORMS:
        assert resolve_tier("auto", surrogate, "all", cuda, MAX_ITEMS) == "triton"
        assert resolve_tier("auto", surrogate, "all", cuda, MAX_ITEMS + 1) == "exact"
        assert resolve_tier("auto", surrogate, "all", cuda) == "exact"
        assert resolve_tier("auto", surrogate, "all", cpu, 16) == "exact"
        assert resolve_tier("auto", surrogate, "hardest", cuda, 10**6) == "triton"
    assert resolve_tier("auto", "logistic", "all", cuda, 10**6) == "triton"
    # groups in runs: the dense kernels take batches up to their own limit (kernels.dense.MAX_RUN_ITEMS)
    from mlloss.kernels.dense import MAX_RUN_ITEMS

    assert resolve_tier("auto", "hinge", "all", cuda, MAX_RUN_ITEMS, contiguous_groups=True) == "triton"
    assert resolve_tier("auto", "hinge", "all", cuda, MAX_RUN_ITEMS + 1, contiguous_groups=True) == "exact"
    assert resolve_tier("auto", "hinge", "all", cpu, 16, contiguous_groups=True) == "exact"
    assert resolve_tier("auto", "logistic", "all", cpu, 16) == "torch"
    assert resolve_tier("exact", "hinge", "all", cuda, 16) == "exact"  # asked for: kept
