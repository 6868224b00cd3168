"""``contiguous_groups=True``: a group is a run of consecutive equal ids (a user-grouped batch),
which the Triton tier lays out where it is instead of sorting the ids.

Every loss is checked against the float64 brute force of ``reference`` with the runs as groups
(numbered here by a plain loop, not by the library), on both tiers and on the Triton tier's dense
and layout kernels (forced), with and without a mask, on batches whose ids come back after other
ids' runs (so that runs and ids differ). On the Triton tier the result equals, bit for bit, the
same loss without the flag given the runs' ordinals as ids; the layout kernels then sort nothing.
Under ``TRITON_INTERPRET=1`` the kernels run on the CPU; ``MLLOSS_TEST_DEVICE=cuda`` runs the
same tests on a GPU.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

import mlloss
from mlloss.ops.layout import Levels, pair_layout, run_ordinals
from reference import hardest_loss, laa_loss, loa_loss, pair_loss

DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
TIERS = [("torch", "dense"), ("triton", "dense"), ("triton", "layout")]


def runs_of(ids: torch.Tensor) -> torch.Tensor:
    """Each item's run of consecutive equal ids, numbered 0, 1, ... by a plain loop."""
    runs, run = [], 0
    for i, value in enumerate(ids.tolist()):
        run += i > 0 and value != ids[i - 1].item()
        runs.append(run)
    return torch.tensor(runs, dtype=torch.int64)


def user_grouped_ids(num_items: int, gen: torch.Generator, distinct: int = 5) -> torch.Tensor:
    """Runs of 1-12 items whose ids, drawn from ``distinct`` values, differ from the previous run's
    and come back after other runs (a user's impressions consecutive, users seen again later)."""
    ids, previous = [], None
    while len(ids) < num_items:
        value = int(torch.randint(0, distinct, (1,), generator=gen)) * 13 - 20
        if value == previous:
            continue
        ids += [value] * int(torch.randint(1, 13, (1,), generator=gen))
        previous = value
    return torch.tensor(ids[:num_items])


def batch(seed: int, n: int = 150):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = (torch.rand(n, 2, generator=gen, dtype=torch.float64) < torch.tensor([0.4, 0.15])).to(torch.float64)
    ids = user_grouped_ids(n, gen)
    mask = torch.rand(n, generator=gen) < 0.8
    assert runs_of(ids).max() + 1 > len(torch.unique(ids)), "some id comes back after another's run"
    return scores, labels, ids, mask


# name -> (the loss, the labels it takes of the batch's two columns, the float64 brute force)
LOSSES = {
    "auc": (lambda **kw: mlloss.AUCLoss(**kw), lambda y: y[:, 0], lambda s, y, g: pair_loss(s, y, g)),
    "pdaom": (lambda **kw: mlloss.PDAOMLoss(**kw), lambda y: y[:, 0],
              lambda s, y, g: hardest_loss(s, y, g, surrogate="exponential", reduction="sum")),
    "soft pdaom": (lambda **kw: mlloss.PDAOMLoss(temperature=0.5, **kw), lambda y: y[:, 0],
                   lambda s, y, g: hardest_loss(s, y, g, surrogate="exponential", reduction="sum", temperature=0.5)),
    "loa": (lambda **kw: mlloss.LoALoss([1.0, 2.0], **kw), lambda y: y, lambda s, y, g: loa_loss(s, y, g, [1.0, 2.0])),
    "laa": (lambda **kw: mlloss.LaALoss(**kw), lambda y: y, lambda s, y, g: laa_loss(s, y, g)),
    # one ordinal column of 0..9: past the counting layout's levels, the sorted layout
    "graded laa": (lambda **kw: mlloss.LaALoss(**kw), lambda y: (y[:, :1] * 7 + y[:, 1:] * 2).round(),
                   lambda s, y, g: laa_loss(s, y, g)),
}
CASES = [pytest.param(backend, kind, name, masked, marks=[pytest.mark.triton] if backend == "triton" else [])
         for (backend, kind), name, masked in itertools.product(TIERS, LOSSES, (False, True))
         # the soft max-violation pairs and an ordinal column of 10 levels take the layout kernels only
         if not (backend == "triton" and kind == "dense" and name in ("soft pdaom", "graded laa"))]


def use_kernels(kind: str, monkeypatch) -> None:
    if kind == "layout":
        pytest.importorskip("triton")
        from mlloss.kernels import dense

        monkeypatch.setattr(dense, "MAX_ITEMS", 0)
        monkeypatch.setattr(dense, "MAX_RUN_ITEMS", 0)


def leaf(scores: torch.Tensor) -> torch.Tensor:
    """Scores of a call of their own, on the test device, that take a gradient."""
    return scores.detach().clone().to(DEVICE).requires_grad_(True)


def on_device(*tensors):
    return [None if t is None else t.to(DEVICE) for t in tensors]


@pytest.mark.parametrize("backend,kind,name,masked", CASES)
def test_contiguous_groups_are_the_runs(backend, kind, name, masked, monkeypatch):
    use_kernels(kind, monkeypatch)
    make, take_labels, reference = LOSSES[name]
    scores, labels, ids, mask = batch(len(name) + 3 * masked)
    labels, mask = take_labels(labels), (mask if masked else None)
    x = leaf(scores)
    value = make(backend=backend, contiguous_groups=True)(x, *on_device(labels, ids, mask))
    value.backward()

    keep = torch.ones(len(scores), dtype=torch.bool) if mask is None else mask
    y = scores.detach().clone().requires_grad_(True)
    expected = reference(y[keep], labels[keep], runs_of(ids)[keep])  # the runs as groups, over the mask's items
    expected.backward()
    torch.testing.assert_close(value.detach().cpu(), expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=1e-8, atol=1e-12)
    # and not the ids as groups: the batch's ids come back after other runs
    assert not torch.isclose(reference(scores[keep], labels[keep], ids[keep]), expected.detach(), rtol=1e-6)

    # the same bits as the loss without the flag, given the runs' ordinals as ids
    z = leaf(scores)
    plain = make(backend=backend)(z, *on_device(labels, run_ordinals(ids), mask))
    plain.backward()
    assert torch.equal(value.detach(), plain.detach()) and torch.equal(x.grad, z.grad)


@pytest.mark.parametrize("backend,kind,name", sorted({case.values[:3] for case in CASES}),
                         ids=lambda value: str(value))
def test_masked_rows_join_no_run_when_every_row_is_a_run(backend, kind, name, monkeypatch):
    """Ids 1, 2, 1, 2, ...: every row its own run, numbered up to N (from 1: the last id differs
    from the first), so the left-out rows' group must lie past N; no run has a pair, and the loss
    and every gradient are exactly 0, as the brute force over the kept rows gives."""
    use_kernels(kind, monkeypatch)
    make, take_labels, _ = LOSSES[name]
    scores = torch.randn(8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    labels = take_labels(torch.tensor([[1.0, 0.0], [0.0, 1.0]]).repeat(4, 1))  # both classes, in the last row too
    ids = torch.tensor([1, 2] * 4)
    mask = torch.tensor([True, True, True, False, True, False, True, True])
    x = leaf(scores)
    value = make(backend=backend, contiguous_groups=True)(x, *on_device(labels, ids, mask))
    value.backward()
    assert value.item() == 0 and torch.equal(x.grad.cpu(), torch.zeros(8, dtype=torch.float64))


@pytest.mark.triton
@pytest.mark.parametrize("kind", ["dense", "layout"])
def test_contiguous_groups_in_ascending_runs_give_the_default_loss_bit_for_bit(kind, monkeypatch):
    """Ids already sorted are runs either way: the flag changes nothing but the work."""
    use_kernels(kind, monkeypatch)
    scores, labels, ids, _ = batch(5)
    ids = torch.sort(ids, stable=True).values
    runs = []
    for flag in (False, True):
        x = leaf(scores.float())
        loss = mlloss.AUCLoss(backend="triton", contiguous_groups=flag)(x, *on_device(labels[:, 0], ids))
        loss.backward()
        runs.append((loss.detach(), x.grad))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.triton
@pytest.mark.parametrize("name", ["auc", "pdaom", "laa"])
def test_dense_kernels_over_many_tiles_of_runs(name):
    """The dense kernels' blocks of rows visit only their runs' tiles, found by passes over the
    positions before and after them: short runs, a run across several blocks of rows, a run at
    each end, on a batch of many tiles (64 items a tile under the interpreter, 32 on CUDA)."""
    make, take_labels, reference = LOSSES[name]
    gen = torch.Generator().manual_seed(len(name))
    n = 1000
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = take_labels((torch.rand(n, 2, generator=gen, dtype=torch.float64) < 0.3).to(torch.float64))
    ids = user_grouped_ids(n, gen, distinct=6)
    ids[:5], ids[5] = 11, 12  # a run at the start
    ids[200:520] = 99  # one user across several blocks of rows and tiles
    ids[990:] = 11  # and one at the end, with the first run's id
    assert_the_runs_brute_force(make(backend="triton", contiguous_groups=True), reference, scores, labels, ids)


def assert_the_runs_brute_force(loss, reference, scores, labels, ids):
    """The loss with ``contiguous_groups=True`` and its gradient equal the float64 brute force
    with the runs of ``ids`` as groups."""
    x = leaf(scores)
    value = loss(x, *on_device(labels, ids))
    value.backward()
    y = scores.detach().clone().requires_grad_(True)
    expected = reference(y, labels, runs_of(ids))
    expected.backward()
    torch.testing.assert_close(value.detach().cpu(), expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=1e-8, atol=1e-12)


@pytest.mark.triton
@pytest.mark.parametrize("n", [63, 64, 65, 127, 128, 129])
@pytest.mark.parametrize("first_run", [0, 10], ids=["one-run", "two-runs"])
def test_dense_kernels_runs_that_end_at_a_tile_edge(n, first_run):
    """A block of rows visits the tiles up to its runs' last end: a run that ends one item past a
    tile (64 items under the interpreter, 32 on CUDA) still meets its last item, a positive."""
    gen = torch.Generator().manual_seed(n + first_run)
    scores = torch.randn(n, generator=gen, dtype=torch.float64)
    labels = (torch.rand(n, generator=gen) < 0.4).to(torch.float64)
    labels[-1] = 1.0
    ids = (torch.arange(n) >= first_run).long()
    assert_the_runs_brute_force(mlloss.AUCLoss(backend="triton", contiguous_groups=True), pair_loss, scores, labels, ids)


@pytest.mark.triton
def test_contiguous_groups_take_the_dense_kernels_up_to_their_own_limit(monkeypatch):
    """Runs bound each row's pairs: batches past ``MAX_ITEMS`` up to ``MAX_RUN_ITEMS`` take the
    dense kernels (no layout) with contiguous groups, the layout kernels without (limits scaled down)."""
    from mlloss.kernels import dense, levels

    monkeypatch.setattr(dense, "MAX_ITEMS", 64)
    monkeypatch.setattr(dense, "MAX_RUN_ITEMS", 200)
    laid_out = []
    counting_layout = levels.counting_layout
    monkeypatch.setattr(levels, "counting_layout", lambda *a, **k: laid_out.append(1) or counting_layout(*a, **k))
    for n, flag, expect_layout in ((150, True, False), (150, False, True), (250, True, True)):
        scores, labels, ids, _ = batch(n, n=n)
        laid_out.clear()
        x = leaf(scores)
        value = mlloss.AUCLoss(backend="triton", contiguous_groups=flag)(x, *on_device(labels[:, 0], ids))
        value.backward()
        assert bool(laid_out) == expect_layout, (n, flag)
        y = scores.detach().clone().requires_grad_(True)
        expected = pair_loss(y, labels[:, 0], runs_of(ids) if flag else ids)
        expected.backward()
        torch.testing.assert_close(value.detach().cpu(), expected.detach(), rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=1e-8, atol=1e-12)


@pytest.mark.triton
@pytest.mark.parametrize("scanned", [False, True])
@pytest.mark.parametrize("problems,num_ranks", [(1, 2), (2, 3), (1, 8)])
def test_counting_layout_of_contiguous_groups_is_the_sorted_layout_of_their_runs(monkeypatch, scanned, problems,
                                                                                 num_ranks):
    """No sort of the ids: the group edges are where an id changes. Runs across block edges and
    whole blocks (blocks of 128 positions, loops over the blocks in steps of a few)."""
    from mlloss.kernels import levels as level_kernels

    monkeypatch.setattr(level_kernels, "COUNT_BLOCK", 2)
    monkeypatch.setattr(level_kernels, "SCAN_CHUNK", 4)
    monkeypatch.setattr(level_kernels, "SCAN_BLOCKS", 0 if scanned else 1 << 30)
    monkeypatch.setattr(level_kernels, "GROUPED_BLOCK", 128)
    gen = torch.Generator().manual_seed(10 * num_ranks + problems)
    num_items = 1250
    ids = user_grouped_ids(num_items, gen, distinct=4)
    ids[300:700] = ids[300]  # one user across three block edges
    rank = torch.randint(0, num_ranks, (problems, num_items), generator=gen, dtype=torch.int32)
    levels = Levels(rank.to(DEVICE), num_ranks, None)
    got = level_kernels.counting_layout(levels, ids.to(DEVICE), contiguous_groups=True)
    expected = pair_layout(levels, runs_of(ids).to(DEVICE))
    for field in ("order", "cell_start", "cell_end", "group_start", "group_end"):
        assert torch.equal(getattr(got, field).cpu().long(), getattr(expected, field).cpu().long()), field


@pytest.mark.triton
def test_the_layout_kernels_sort_no_ids_and_the_dense_kernels_add_no_op():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import host_path

    for layout in (False, True):
        plain = host_path.count_call("AUCLoss", grouped=True, validate=False, layout=layout)
        runs = host_path.count_call("AUCLoss(contiguous groups)", grouped=True, validate=False, layout=layout)
        assert runs.syncs == 0
        if layout:
            assert plain.op_names.get("sort") == 1 and "sort" not in runs.op_names, runs.op_names
            assert runs.ops == plain.ops - 1
        else:
            assert runs.op_names == plain.op_names
    # with a mask, the left-out items' group breaks the runs: the runs' ordinals rank the groups
    # instead of a sort and a search of the ids, and the layout sorts once
    plain = host_path.count_call("AUCLoss", grouped=True, validate=False, layout=True, masked=True)
    runs = host_path.count_call("AUCLoss(contiguous groups)", grouped=True, validate=False, layout=True, masked=True)
    assert plain.op_names["sort"] == 2 and runs.op_names["sort"] == 1, (plain.op_names, runs.op_names)
    assert "searchsorted" not in runs.op_names and runs.syncs == 0


def test_run_ordinals_number_the_runs():
    gen = torch.Generator().manual_seed(0)
    for ids in (torch.zeros(0, dtype=torch.int64), torch.tensor([4]), torch.tensor([3, 3, 1, 3]),
                user_grouped_ids(200, gen), torch.tensor([7, 7, 7])):
        ordinals = run_ordinals(ids)
        expected = runs_of(ids)
        assert ordinals.dtype == torch.int32 and ordinals.shape == ids.shape
        if len(ids):  # numbered from 0 or 1: the same runs, in order
            assert torch.equal((ordinals - ordinals[0]).long(), expected)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
def test_compiled_step_with_contiguous_groups_equals_eager(backend):
    """fullgraph: the flag is a constant of the op's options, no graph break."""
    scores, labels, ids, mask = batch(9, n=120)
    loss = mlloss.AUCLoss(backend=backend, contiguous_groups=True, validate_args=False)

    def step(x, y, g, m):
        return loss(x, y, g, m)

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    results = []
    for fn in (step, compiled):
        x = leaf(scores)
        value = fn(x, *on_device(labels[:, 0], ids, mask))
        value.backward()
        results.append((value.detach(), x.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-12, atol=0)


def test_the_option_is_checked_shown_and_passed_through_build_loss():
    with pytest.raises(TypeError, match="contiguous_groups"):
        mlloss.AUCLoss(contiguous_groups="yes")
    assert "contiguous_groups=True" in repr(mlloss.LaALoss(contiguous_groups=True))
    assert "contiguous_groups" not in repr(mlloss.LaALoss())
    combined = mlloss.build_loss("bce+pdaom", lam=0.5, contiguous_groups=True)
    assert combined.ranking.contiguous_groups
    assert mlloss.build_loss("loa", contiguous_groups=True).contiguous_groups
