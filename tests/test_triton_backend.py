"""The losses with backend="triton" against the float64 brute force, under TRITON_INTERPRET=1.

The interpreter runs the real kernels on the CPU (slowly: small batches only). On a CUDA machine
the same tests run the compiled kernels when CUDA tensors are requested with MLLOSS_TEST_DEVICE=cuda.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

pytest.importorskip("triton")

import mlloss  # noqa: E402
from reference import laa_loss, loa_loss, pair_loss  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
SURROGATES = ("logistic", "hinge", "squared", "exponential")


def batch(seed: int, n: int = 90, num_labels: int = 2):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (n, num_labels), generator=gen).to(torch.float64)
    groups = torch.randint(0, 12, (n,), generator=gen) * 5 + 3
    return scores, labels, groups


def check(ours, reference, scores, rtol=1e-4):
    x = scores.to(DEVICE).clone().requires_grad_(True)
    value = ours(x)
    value.backward()
    y = scores.clone().requires_grad_(True)
    expected = reference(y)
    expected.backward()
    torch.testing.assert_close(value.detach().cpu().double(), expected.detach(), rtol=rtol, atol=1e-9)
    scale = y.grad.abs().max()
    torch.testing.assert_close(x.grad.cpu().double() / scale, y.grad / scale, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("surrogate,grouped", list(itertools.product(SURROGATES, (False, True))))
def test_every_loss_through_the_triton_backend(surrogate, grouped):
    scores, labels, groups = batch(len(surrogate) + grouped)
    groups = groups if grouped else None
    labels_device = labels.to(DEVICE)
    groups_device = None if groups is None else groups.to(DEVICE)
    options = dict(surrogate=surrogate, backend="triton")
    check(lambda s: mlloss.AUCLoss(**options)(s, labels_device[:, 0], groups_device),
          lambda s: pair_loss(s, labels[:, 0], groups, surrogate=surrogate), scores)
    check(lambda s: mlloss.LoALoss([1.0, 0.5], **options)(s, labels_device, groups_device),
          lambda s: loa_loss(s, labels, groups, [1.0, 0.5], surrogate=surrogate), scores)
    for cost in ("linear", "uniform"):
        check(lambda s: mlloss.LaALoss(cost=cost, **options)(s, labels_device, groups_device),
              lambda s: laa_loss(s, labels, groups, cost=cost, surrogate=surrogate), scores)
    # PDAOM is a max-violation loss: O(N) whatever the backend, checked here for completeness.
    from reference import hardest_loss
    check(lambda s: mlloss.PDAOMLoss(backend="triton")(s, labels_device[:, 0], groups_device),
          lambda s: hardest_loss(s, labels[:, 0], groups, surrogate="exponential", reduction="sum"), scores)


@pytest.mark.parametrize("grouped", [False, True], ids=["no-groups", "groups"])
def test_masked_items_change_nothing_on_the_triton_backend(grouped):
    # mask= (a fixed-size batch's fillers): the loss of the kept items, NaN fillers ignored.
    scores, labels, groups = batch(11)
    keep = torch.arange(scores.shape[0]) % 3 != 1
    groups = groups if grouped else None
    garbage = scores.masked_fill(~keep, float("nan"))
    labels_device, keep_device = labels.to(DEVICE), keep.to(DEVICE)
    groups_device = None if groups is None else groups.to(DEVICE)
    kept_groups = None if groups is None else groups[keep]

    def kept_only(reference):
        def on_kept(s):
            return reference(s[keep])
        return on_kept

    check(lambda s: mlloss.LaALoss(backend="triton")(s, labels_device, groups_device, mask=keep_device),
          kept_only(lambda s: laa_loss(s, labels[keep], kept_groups)), garbage.nan_to_num(0.0))
    x = garbage.to(DEVICE).clone().requires_grad_(True)
    value = mlloss.AUCLoss(backend="triton")(x, labels_device[:, 0], groups_device, mask=keep_device)
    value.backward()
    y = scores[keep].clone().requires_grad_(True)
    expected = pair_loss(y, labels[keep, 0], kept_groups)
    expected.backward()
    torch.testing.assert_close(value.detach().cpu().double(), expected.detach(), rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(x.grad.cpu().double()[keep], y.grad, rtol=1e-4, atol=1e-6)
    assert torch.equal(x.grad.cpu()[~keep], torch.zeros(int((~keep).sum()), dtype=x.grad.dtype))


@pytest.fixture(params=["dense", "layout"])
def kernels(request, monkeypatch) -> str:
    """Which kernels a call runs: the dense ones (batches of at most ``dense.MAX_ITEMS`` items),
    or the counting layout's (``MAX_ITEMS`` set to 0 for the test)."""
    if request.param == "layout":
        from mlloss.kernels import dense

        monkeypatch.setattr(dense, "MAX_ITEMS", 0)
    return request.param


# Every kernel family: dense (<= MAX_ITEMS), layout all pairs, hardest walk; binary, LoA, LaA patterns, an ordinal column.
STRIDED_LOSSES = {
    "auc": (lambda: mlloss.AUCLoss(backend="triton"), 1),
    "pdaom": (lambda: mlloss.PDAOMLoss(surrogate="logistic", backend="triton"), 1),
    "soft hardest": (lambda: mlloss.AUCLoss(pairs="hardest", temperature=0.5, backend="triton"), 1),
    "loa": (lambda: mlloss.LoALoss([1.0, 0.5], backend="triton"), 2),
    "laa": (lambda: mlloss.LaALoss(backend="triton"), 2),
    "laa graded hardest": (lambda: mlloss.LaALoss(pairs="hardest", backend="triton"), 1),
}


@pytest.mark.parametrize("name", list(STRIDED_LOSSES))
def test_strided_inputs_give_the_contiguous_result(name, kernels):
    # A task's column of (N, K) scores, an expanded group id, a strided mask: the kernels index
    # flat memory, so the op hands them contiguous copies (they read neighbours' values before).
    make, num_labels = STRIDED_LOSSES[name]
    gen = torch.Generator().manual_seed(len(name))
    wide = torch.randn(60, 3, generator=gen, dtype=torch.float64).to(DEVICE)
    labels = torch.randint(0, 3 if name.endswith("graded hardest") else 2, (60, num_labels), generator=gen)
    labels = labels.to(torch.float64).to(DEVICE)
    wide_groups = (torch.randint(0, 6, (60, 2), generator=gen) * 5 + 3).to(DEVICE)
    wide_mask = (torch.rand(60, 2, generator=gen) < 0.8).to(DEVICE)
    cases = [(None, None), (wide_groups[:, 1], None), (torch.full((1,), 7, device=DEVICE).expand(60), None),
             (wide_groups[:, 0], wide_mask[:, 1])]
    for groups, mask in cases:
        results = []
        for copy in (False, True):
            leaf = wide.clone().requires_grad_(True)
            scores = leaf[:, 1].contiguous() if copy else leaf[:, 1]
            arguments = [a.contiguous() if copy and a is not None else a for a in (groups, mask)]
            value = make()(scores, labels, arguments[0], mask=arguments[1])
            value.backward()
            results.append((value.detach(), leaf.grad))
        assert not results[0][1][:, 1].eq(0).all()
        torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


GROUPED_LAYOUT_LOSSES = {
    "auc": (lambda backend: mlloss.AUCLoss(backend=backend), 1),
    "loa": (lambda backend: mlloss.LoALoss([1.0, 0.5], backend=backend), 2),
    "laa": (lambda backend: mlloss.LaALoss(cost="linear", backend=backend), 2),
    "pdaom": (lambda backend: mlloss.PDAOMLoss(surrogate="logistic", backend=backend), 1),
    "soft hardest": (lambda backend: mlloss.AUCLoss(pairs="hardest", temperature=0.5, backend=backend), 1),
}


@pytest.mark.parametrize("name", list(GROUPED_LAYOUT_LOSSES))
@pytest.mark.parametrize("shuffled", [False, True], ids=["runs", "shuffled"])
@pytest.mark.parametrize("kernels", ["layout"], indirect=True)
def test_grouped_layout_calls_across_blocks_equal_the_torch_tier(name, shuffled, kernels):
    """1,300 items in users of ~40 (one user of 300 across a block edge of the counting layout's
    512-position blocks), on the layout kernels: the PyTorch tier's value and gradient, with a mask too."""
    make, num_labels = GROUPED_LAYOUT_LOSSES[name]
    gen = torch.Generator().manual_seed(len(name) + 10 * shuffled)
    n = 1300
    groups = torch.cumsum(torch.rand(n, generator=gen) < 0.025, 0)
    groups[400:700] = groups[400]
    if shuffled:
        groups = (groups * 7 - 30)[torch.randperm(n, generator=gen)]
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = (torch.rand(n, num_labels, generator=gen) < 0.3).to(torch.float64)
    mask = torch.rand(n, generator=gen) < 0.9
    for masked in (None, mask):
        results = []
        for backend, device in (("triton", DEVICE), ("torch", "cpu")):
            leaf = scores.clone().to(device).requires_grad_(True)
            value = make(backend)(leaf, labels.to(device), groups.to(device),
                                  mask=None if masked is None else masked.to(device))
            value.backward()
            results.append((value.detach().cpu(), leaf.grad.cpu()))
        assert results[0][1].abs().sum() > 0
        torch.testing.assert_close(results[0], results[1], rtol=1e-9, atol=1e-12)


# Every kernel family, and the two places a NaN could drop out: a hinge (a max with 0) and the
# max-violation pairs (a min and a max over a cell).
UNCHECKED_LOSSES = {
    "auc hinge": (lambda backend: mlloss.AUCLoss(surrogate="hinge", backend=backend, validate_args=False), 1),
    "loa hinge": (lambda backend: mlloss.LoALoss([1.0, 0.5], surrogate="hinge", backend=backend,
                                                 validate_args=False), 2),
    "laa hinge": (lambda backend: mlloss.LaALoss(surrogate="hinge", backend=backend, validate_args=False), 2),
    "pdaom": (lambda backend: mlloss.PDAOMLoss(backend=backend, validate_args=False), 1),
    "pdaom hinge": (lambda backend: mlloss.PDAOMLoss(surrogate="hinge", backend=backend, validate_args=False), 1),
    "laa graded hardest": (lambda backend: mlloss.LaALoss(pairs="hardest", backend=backend, validate_args=False), 1),
    "pdaom soft": (lambda backend: mlloss.PDAOMLoss(temperature=0.5, backend=backend, validate_args=False), 1),
}


@pytest.mark.parametrize("name", list(UNCHECKED_LOSSES))
def test_without_the_data_checks_a_nan_score_makes_the_loss_nan_as_on_the_torch_tier(name, kernels):
    """With ``validate_args=False`` nothing reads the scores: a NaN score in a group with a pair
    makes the loss NaN on the Triton tier as on the PyTorch tier and in the brute force (a training
    loop sees it), where a max with 0 or a max over a cell would skip it; a NaN in a group without
    a pair, or outside the mask, leaves the loss finite and equal to the PyTorch tier's, and the
    NaN score's gradient 0 (the PyTorch tier's soft extremes gave it 0 * NaN: its slope in its
    cell, times the cell's zero gradient)."""
    make, num_labels = UNCHECKED_LOSSES[name]
    gen = torch.Generator().manual_seed(len(name))
    n = 48
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    scores[5] = float("nan")
    num_levels = 3 if name.endswith("graded hardest") else 2
    labels = torch.randint(0, num_levels, (n, num_labels), generator=gen)
    labels[:24] = torch.arange(24).remainder(num_levels)[:, None]  # pairs around item 5
    labels = labels.to(torch.float64)
    in_groups = torch.arange(n) // 8  # item 5 in a group with pairs
    alone = in_groups.clone()
    alone[5] = 100  # item 5 in a group of its own: no pair
    keep = torch.arange(n) != 5
    cases = [(None, None, True), (in_groups, None, True), (alone, None, False), (in_groups, keep, False)]
    for groups, mask, nan in cases:
        results, grads = [], []
        for backend, device in (("triton", DEVICE), ("torch", "cpu")):
            leaf = scores.clone().to(device).requires_grad_(True)
            value = make(backend)(leaf, labels.to(device), None if groups is None else groups.to(device),
                                  mask=None if mask is None else mask.to(device))
            value.backward()
            results.append(value.detach().cpu())
            grads.append(leaf.grad.cpu())
        assert bool(results[1].isnan()) == nan  # the PyTorch tier, as the brute force
        torch.testing.assert_close(results[0], results[1], rtol=1e-9, atol=1e-12, equal_nan=True)
        if not nan:
            assert grads[0][5] == grads[1][5] == 0
            torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("grouped", [False, True], ids=["no-groups", "groups"])
def test_without_the_data_checks_a_score_at_infinity_beyond_the_soft_extremes_leaves_the_step_finite(
    grouped, kernels
):
    """A positive at +inf and a negative at -inf (``validate_args=False``) lie beyond the soft min
    of the positives and the soft max of the negatives, which the loss takes: the loss and its
    gradient stay finite, the same on both tiers (the PyTorch tier's soft extremes of the other
    side, which the loss does not use, made every slope of those cells NaN: inf - inf)."""
    gen = torch.Generator().manual_seed(11)
    scores = torch.randn(48, generator=gen, dtype=torch.float64)
    labels = (torch.arange(48) % 3 == 0).to(torch.float64)
    scores[3], scores[4] = float("inf"), float("-inf")  # a positive, a negative
    groups = torch.arange(48) // 12 if grouped else None
    results = []
    for backend, device in (("triton", DEVICE), ("torch", "cpu")):
        leaf = scores.clone().to(device).requires_grad_(True)
        loss = mlloss.PDAOMLoss(temperature=0.5, backend=backend, validate_args=False)
        value = loss(leaf, labels.to(device), None if groups is None else groups.to(device))
        value.backward()
        results.append((value.detach().cpu(), leaf.grad.cpu()))
    assert results[1][0].isfinite() and results[1][1].isfinite().all()
    assert results[1][1][3] == 0 and results[1][1][4] == 0 and results[1][1].abs().sum() > 0
    torch.testing.assert_close(results[0], results[1], rtol=1e-9, atol=1e-12)


SOFT_EXTREME_LOSSES = {
    "pdaom": (lambda backend: mlloss.PDAOMLoss(temperature=0.5, backend=backend, validate_args=False), 2),
    "laa graded": (lambda backend: mlloss.LaALoss(pairs="hardest", temperature=0.5, backend=backend,
                                                  validate_args=False), 3),
}


@pytest.mark.parametrize("name", list(SOFT_EXTREME_LOSSES))
def test_without_the_data_checks_a_cell_of_one_infinite_score_leaves_the_step_finite(name, kernels):
    """A user whose only positive is at +inf, and one whose only negative is at -inf
    (``validate_args=False``): the cell's soft extreme is that score, the margin infinite the
    right way, the pair's term 0 and every gradient finite, the same on both tiers (the Triton
    tier's rescaling of the cell's sum to its own infinite min, exp(inf - inf), made them NaN)."""
    make, num_levels = SOFT_EXTREME_LOSSES[name]
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(36, generator=gen, dtype=torch.float64)
    labels = (torch.arange(36) % num_levels).to(torch.float64)
    groups = torch.arange(36) // 12
    top, bottom = float(num_levels - 1), 0.0
    labels[0:12] = torch.where(labels[0:12] == top, bottom, labels[0:12])  # user 0: item 1 its only top item
    labels[1], scores[1] = top, float("inf")
    labels[12:24] = torch.where(labels[12:24] == bottom, top, labels[12:24])  # user 1: item 12 its only bottom one
    labels[12], scores[12] = bottom, float("-inf")
    results = []
    for backend, device in (("triton", DEVICE), ("torch", "cpu")):
        leaf = scores.clone().to(device).requires_grad_(True)
        value = make(backend)(leaf, labels.to(device), groups.to(device))
        value.backward()
        results.append((value.detach().cpu(), leaf.grad.cpu()))
    (value, grad), (torch_value, torch_grad) = results
    assert torch_value.isfinite() and torch_grad.isfinite().all() and grad[1] == grad[12] == 0
    assert torch_grad[24:].abs().sum() > 0  # user 2's pairs, untouched
    torch.testing.assert_close(value, torch_value, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, torch_grad, rtol=1e-9, atol=1e-12)


# The max-violation kernels' three gradients: one level pair (dense, and the layout's scan), several.
HARD_EXTREME_LOSSES = {
    "pdaom": lambda surrogate, backend: mlloss.PDAOMLoss(surrogate=surrogate, backend=backend, validate_args=False),
    "auc hardest": lambda surrogate, backend: mlloss.AUCLoss(pairs="hardest", surrogate=surrogate, backend=backend,
                                                             validate_args=False),
    "laa graded hardest": lambda surrogate, backend: mlloss.LaALoss(pairs="hardest", surrogate=surrogate,
                                                                    backend=backend, validate_args=False),
}


@pytest.mark.parametrize("surrogate", ["exponential", "squared"])  # an unbounded slope: inf at an infinite margin
@pytest.mark.parametrize("name", list(HARD_EXTREME_LOSSES))
def test_without_the_data_checks_an_infinite_extreme_gives_the_torch_tiers_gradient(name, surrogate, kernels):
    """A positive at -inf (``validate_args=False``) is its group's hardest positive at an infinite
    reverse margin: the loss is inf, the gradient infinite at the extremes of its pairs and 0 at
    the group's other items, bit for bit as on the PyTorch tier (the Triton tier's infinite pull
    times their share of 0 made them NaN)."""
    gen = torch.Generator().manual_seed(len(name))
    scores = torch.randn(48, generator=gen, dtype=torch.float64)
    num_levels = 3 if name.startswith("laa") else 2
    labels = (torch.arange(48) % 4 % num_levels).to(torch.float64)  # item 1 at level 1, a positive
    scores[1] = float("-inf")
    for groups in (None, torch.arange(48) // 12):
        results = []
        for backend, device in (("triton", DEVICE), ("torch", "cpu")):
            leaf = scores.clone().to(device).requires_grad_(True)
            value = HARD_EXTREME_LOSSES[name](surrogate, backend)(
                leaf, labels.to(device), None if groups is None else groups.to(device))
            value.backward()
            results.append((value.detach().cpu(), leaf.grad.cpu()))
        (value, grad), (torch_value, torch_grad) = results
        assert value == torch_value == float("inf") and grad[1] == float("-inf")
        assert not grad.isnan().any() and (grad == 0).sum() > 24, grad  # the group's other items: 0
        assert torch.equal(grad.isinf(), torch_grad.isinf())
        torch.testing.assert_close(grad, torch_grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["auc", "pdaom", "loa"])
def test_every_label_dtype_gives_the_float_labels_result(name, kernels):
    # Labels become (K, N) int32 rows for the kernels: int32 labels, which need no conversion,
    # were handed over as the transposed view and read as flat memory.
    make, num_labels = STRIDED_LOSSES[name]
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(50, generator=gen, dtype=torch.float64).to(DEVICE)
    wide = torch.randint(0, 2, (50, 3), generator=gen).to(DEVICE)
    groups = (torch.arange(50) % 4).to(DEVICE)
    expected = make()(scores, wide[:, 1:1 + num_labels].double().contiguous(), groups)
    for dtype in (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32):
        labels = wide.to(dtype)  # then a strided view of that dtype, as a column of a label table is
        labels = labels[:, 1] if num_labels == 1 else labels[:, 1:]
        torch.testing.assert_close(make()(scores, labels, groups), expected, rtol=0, atol=0)


@pytest.mark.parametrize("make", [
    lambda: mlloss.PDAOMLoss(backend="triton"),
    lambda: mlloss.AUCLoss(pairs="hardest", temperature=1.0, surrogate="exponential", backend="triton"),
    lambda: mlloss.LaALoss(pairs="hardest", surrogate="exponential", backend="triton"),
    lambda: mlloss.AUCLoss(surrogate="exponential", backend="triton"),
], ids=["pdaom", "soft-hardest", "laa-graded-hardest", "all-pairs"])
def test_a_float32_loss_that_overflows_raises_on_the_triton_backend(make, kernels):
    # The max-violation terms are summed in float64: finite there, inf once cast to float32. The
    # check reads the loss as returned (it read the float64 sum and let inf through).
    scores = torch.tensor([-50.0, 50.0, 0.0, 1.0], device=DEVICE)
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0], device=DEVICE)
    with pytest.raises(OverflowError, match="not finite in the scores' dtype"):
        make()(scores, labels)


def test_triton_backend_in_bf16_accumulates_in_fp32():
    scores, labels, groups = batch(9)
    rounded = scores.to(torch.bfloat16)
    x = rounded.to(DEVICE).clone().requires_grad_(True)
    value = mlloss.LaALoss(backend="triton")(x, labels.to(DEVICE), groups.to(DEVICE))
    value.backward()
    assert value.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    expected = laa_loss(rounded.double(), labels, groups)
    torch.testing.assert_close(value.cpu().double(), expected, rtol=1e-5, atol=1e-6)


def test_a_step_with_the_triton_backend_is_captured_by_torch_compile_fullgraph():
    # The loss is one torch.library op: a model step calling it compiles as one graph (aot_eager:
    # graph capture without C++ codegen) and gives the eager values and gradients. Every tensor
    # lives on DEVICE, so on CUDA the compiled kernels run.
    n = 64
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(n, 3, generator=gen).to(DEVICE)
    labels = torch.randint(0, 2, (n,), generator=gen).to(DEVICE)
    groups = torch.randint(0, 4, (n,), generator=gen).to(DEVICE)
    layer = torch.nn.Linear(3, 1).to(DEVICE)
    loss = mlloss.AUCLoss(backend="triton")

    def step(x):
        return loss(layer(x), labels, groups)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (compiled, step):
        layer.zero_grad()
        value = fn(features)
        value.backward()
        results.append((value.detach(), layer.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_cpu_tensors_without_the_interpreter_get_the_libraries_error_before_any_launch():
    # Without TRITON_INTERPRET, Triton has no CPU driver: its own error ("0 active drivers")
    # helps nobody. Every kernel entry (the data check, the dense, layout and max-violation
    # kernels) names the fix first, with the checks on or off.
    script = textwrap.dedent("""
        import torch, mlloss
        gen = torch.Generator().manual_seed(0)
        for n, make in [(64, lambda: mlloss.AUCLoss(backend="triton")),
                        (64, lambda: mlloss.AUCLoss(backend="triton", validate_args=False)),
                        (3000, lambda: mlloss.LaALoss(backend="triton", validate_args=False)),
                        (64, lambda: mlloss.PDAOMLoss(backend="triton", validate_args=False))]:
            scores = torch.randn(n, generator=gen)
            labels = torch.randint(0, 2, (n,), generator=gen)
            try:
                make()(scores, labels, torch.randint(0, 4, (n,), generator=gen))
            except RuntimeError as error:
                print(str(error).split(";")[0])
    """)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.splitlines() == ["the Triton kernels need CUDA tensors"] * 4, result.stdout


CAPTURED_LOSSES = {
    "AUCLoss": lambda **kw: mlloss.AUCLoss(**kw),
    "LaALoss": lambda **kw: mlloss.LaALoss(**kw),
    "LaALoss(hardest)": lambda **kw: mlloss.LaALoss(pairs="hardest", **kw),
    "LaALoss(soft hardest)": lambda **kw: mlloss.LaALoss(pairs="hardest", temperature=0.5, **kw),
    "LaALoss(graded hardest)": lambda **kw: mlloss.LaALoss(pairs="hardest", **kw),  # one ordinal column
    "LoALoss": lambda **kw: mlloss.LoALoss([1.0, 0.5], **kw),
    "LoALoss(balanced)": lambda **kw: mlloss.LoALoss("balanced", num_labels=2, **kw),
    "PDAOMLoss": lambda **kw: mlloss.PDAOMLoss(**kw),
    "bce+pdaom": lambda **kw: mlloss.build_loss("bce+pdaom", **kw),
    # "auto" takes the closed form above 2,048 items, which reads sizes on the host: the kernels.
    "AUCLoss(exponential)": lambda **kw: mlloss.AUCLoss(surrogate="exponential", backend="triton", **kw),
}


@pytest.mark.skipif(DEVICE != "cuda", reason="captures a CUDA graph: MLLOSS_TEST_DEVICE=cuda on a GPU")
@pytest.mark.parametrize("loss_name", list(CAPTURED_LOSSES))
@pytest.mark.parametrize("num_items", [300, 5000])  # the dense kernels, the layout kernels
def test_a_step_without_data_checks_is_captured_in_a_cuda_graph(loss_name: str, num_items: int):
    """With ``validate_args=False`` a forward + backward issues no host synchronisation and no
    host-to-device copy, so ``torch.cuda.graph`` captures it; replays on batches with other labels
    and groups (copied into the captured inputs) give the loss and gradient of eager calls."""
    tasks = 2 if loss_name == "bce+pdaom" else 1
    num_labels = 1 if loss_name in ("AUCLoss", "PDAOMLoss", "bce+pdaom", "AUCLoss(exponential)") else 2

    def make_batch(seed):
        gen = torch.Generator().manual_seed(seed)
        features = torch.randn(num_items, 4, generator=gen)
        labels = torch.randint(0, 2, (num_items, max(tasks, num_labels)), generator=gen).float()
        labels = labels[:, 0] if num_labels == 1 and tasks == 1 else labels
        if "graded" in loss_name:  # one ordinal column, 0-2: its levels known only from the data
            labels = labels.sum(dim=1, keepdim=True)
        groups = torch.randint(0, 20 + 10 * seed, (num_items,), generator=gen) * 7
        return features.to(DEVICE), labels.to(DEVICE), groups.to(DEVICE)

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, tasks).to(DEVICE)
    captured_loss = CAPTURED_LOSSES[loss_name](validate_args=False).to(DEVICE)
    eager_loss = CAPTURED_LOSSES[loss_name]().to(DEVICE)

    def step(loss, features, labels, groups):
        scores = layer(features)
        return loss(scores if tasks > 1 else scores[:, 0], labels, groups)

    static = [t.clone() for t in make_batch(0)]
    for _ in range(2):  # the eager loss sees the warm-up batches too (the balanced LoA's running priors)
        step(eager_loss, *static)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream: Triton compiles, allocator settles
        for _ in range(2):
            layer.zero_grad(set_to_none=True)
            step(captured_loss, *static).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    layer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_value = step(captured_loss, *static)
        static_value.backward()
    static_grad = layer.weight.grad

    for seed in (1, 2, 3):
        batch = make_batch(seed)
        for target, source in zip(static, batch):
            target.copy_(source)
        graph.replay()
        replayed = (static_value.clone(), static_grad.clone())
        layer.zero_grad(set_to_none=True)
        value = step(eager_loss, *batch)
        value.backward()
        torch.testing.assert_close(replayed[0], value.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(replayed[1], layer.weight.grad, rtol=1e-6, atol=1e-7)
