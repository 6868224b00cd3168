"""Budgets of the host path of one loss call on the Triton backend, measured on the CPU.

``benchmarks/host_path.py`` runs one forward + backward of every loss under a
``TorchDispatchMode`` (the kernels on Triton's interpreter, whose own tensor traffic is not an
aten op on CUDA and is not counted) and counts the aten ops and the ops that make the host wait
for the device on CUDA. A CUDA step with few launches and no waits is what lets the pair kernel,
not the host, set the time of a call.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_path  # noqa: E402
from op_count import HOST_DATA_OPS  # noqa: E402

pytestmark = pytest.mark.triton
MAX_OPS = 30
# What ``mask=`` adds to a call (ops.dispatch.without_masked): on the layout paths the fill of the
# left-out scores and labels, their group (a sort and a search of the ids; without groups, the
# layout's group spans); for the balanced priors the count of the mask and the fill of the labels
# it counts. The dense kernels read the mask: nothing but the balanced priors' ops.
MASK_OPS = 12
DENSE_MASK_OPS = 4


# One count per call configuration: the counts are deterministic, and several cases compare
# with the same call (a masked case with the unmasked one, a dense case with its layout twin).
count_call = functools.lru_cache(maxsize=None)(host_path.count_call)

CASES = [(loss, grouped, masked, False) for loss in host_path.LOSSES
         for grouped, masked in ((False, False), (True, False), (False, True), (True, True))]
# the losses the dense small-batch kernels take, with them off (batches over 2,048 items)
CASES += [(loss, grouped, False, True) for loss in host_path.DENSE_LOSSES for grouped in (False, True)]


@pytest.mark.parametrize("loss,grouped,masked,layout", CASES,
                         ids=[f"{c[0]}-{'groups' if c[1] else 'no-groups'}{'-mask' * c[2]}{'-layout' * c[3]}"
                              for c in CASES])
def test_one_call_stays_within_the_op_and_sync_budget(loss: str, grouped: bool, masked: bool, layout: bool) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    checked = count_call(loss, grouped=grouped, validate=True, masked=masked, layout=layout)
    unchecked = count_call(loss, grouped=grouped, validate=False, masked=masked, layout=layout)
    if loss in host_path.DENSE_LOSSES and not (layout or masked):  # no layout: no sorts or searches
        assert not {"sort", "searchsorted"} & set(checked.op_names), checked.op_names
        assert checked.ops < count_call(loss, grouped=grouped, validate=True, masked=False, layout=True).ops
    if masked:
        plain = count_call(loss, grouped=grouped, validate=True, masked=False, layout=False)
        budget = DENSE_MASK_OPS if loss in host_path.DENSE_LOSSES else MASK_OPS
        assert checked.ops <= plain.ops + budget, f"{loss}: {checked.ops} aten ops {checked.op_names}"
    else:
        assert checked.ops <= MAX_OPS, f"{loss}: {checked.ops} aten ops {checked.op_names}"
    # The data check is one fused reduction and one read: the only host synchronisation.
    assert checked.sync_names == ["_local_scalar_dense"], checked.sync_names
    assert unchecked.syncs == 0, unchecked.sync_names
    assert unchecked.ops < checked.ops
    # No tensor from Python data per call (a host-to-device copy on CUDA, which a graph capture
    # rejects): constants live in buffers or are Python scalars of the ops.
    for call in (checked, unchecked):
        assert not HOST_DATA_OPS & set(call.op_names), call.op_names


# What ``mask=`` adds to the cross-entropy (ops.pointwise): the fill of the left-out logits and
# labels (a view, a zero, two wheres) and the weights of the others (a count, its clamp, a division);
# a summed ranking (PDAOM, Eq. 7) divides its loss and gradient by the count.
CROSS_ENTROPY_MASK_OPS = 7
SUMMED_MASK_OPS = 2


@pytest.mark.parametrize("objective", list(host_path.OBJECTIVES))
@pytest.mark.parametrize("grouped,masked", [(False, False), (True, False), (True, True)],
                         ids=["no-groups", "groups", "groups-mask"])
def test_the_cross_entropy_objectives_stay_within_the_budget(objective: str, grouped: bool, masked: bool) -> None:
    # bce, bce+auc and bce+pdaom on a two-task model's logits: the cross-entropy's data check and
    # the ranking's are read in one host read, and nothing else waits for the device.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    checked = count_call(objective, grouped=grouped, validate=True, masked=masked)
    unchecked = count_call(objective, grouped=grouped, validate=False, masked=masked)
    if masked:
        plain = count_call(objective, grouped=grouped, validate=True)
        budget = CROSS_ENTROPY_MASK_OPS + (SUMMED_MASK_OPS if "pdaom" in objective else 0)
        assert checked.ops <= plain.ops + budget, f"{objective}: {checked.ops} aten ops {checked.op_names}"
    else:
        assert checked.ops <= MAX_OPS, f"{objective}: {checked.ops} aten ops {checked.op_names}"
    assert checked.sync_names == ["_to_copy"], checked.sync_names  # the read of the checks' values
    assert unchecked.syncs == 0, unchecked.sync_names
    assert unchecked.ops < checked.ops
    for call in (checked, unchecked):
        assert not HOST_DATA_OPS & set(call.op_names), call.op_names


@pytest.mark.parametrize("name", ["bce", "bce+auc", "bce+pdaom"])
def test_probabilities_are_checked_in_the_one_read(name: str) -> None:
    # inputs="probabilities" (heads that end in a sigmoid): the same single read as logits.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    import mlloss

    scores, labels, groups = host_path.batch()
    probabilities = torch.sigmoid(host_path.loss_scores("bce+auc(2 task columns)", scores))
    loss = mlloss.build_loss(name, inputs="probabilities", **({} if name == "bce" else {"backend": "triton"}))
    for counted in (False, True):  # the first call compiles the kernels
        x = probabilities.clone().requires_grad_(True)
        counter = host_path.OpCounter()
        with host_path.kernels_uncounted(), counter if counted else contextlib.nullcontext():
            loss(x, labels, groups).backward()
    assert counter.syncs == ["_to_copy"], counter.syncs
    # (+2: until the check is read, torch's cross-entropy of probabilities sees them clamped into
    # [0, 1], NaN as 0.5; its slope (z - y) / (z (1 - z)) takes 3 ops more than sigmoid(z) - y)
    assert len(counter.ops) <= MAX_OPS + 2, collections.Counter(counter.ops)


@pytest.mark.parametrize("loss", ["AUCLoss", "PDAOMLoss"])
@pytest.mark.parametrize("layout", [False, True], ids=["dense", "layout"])
def test_task_columns_cost_one_call_not_one_per_column(loss: str, layout: bool) -> None:
    # Two task columns (AUCLoss.task_columns, which bce+auc and bce+pdaom use) issue one call's ops:
    # the one-column call's and the copy of the columns into rows, not twice the one-column call's.
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    for validate in (True, False):
        one = count_call(loss, grouped=True, validate=validate, layout=layout)
        columns = count_call(f"{loss}(2 task columns)", grouped=True, validate=validate, layout=layout)
        assert columns.ops <= one.ops + 3 < 2 * one.ops, (columns.op_names, one.op_names)
        assert columns.syncs == one.syncs


# every loss with groups and a mask (the most inputs to copy), AUC also without
REPLAY_CASES = [("AUCLoss", False, False)] + [(loss, True, True) for loss in host_path.LOSSES]


@pytest.mark.parametrize("loss,grouped,masked", REPLAY_CASES,
                         ids=[f"{c[0]}-{'groups' if c[1] else 'no-groups'}{'-mask' * c[2]}" for c in REPLAY_CASES])
def test_a_replayed_call_issues_its_copies_and_the_autograd_formula(loss: str, grouped: bool, masked: bool) -> None:
    """With graph replay on (``mlloss.set_graph_replay``), a call that replays its graph issues none
    of the call's device work (no allocation of the kernels' outputs, no sort, no status word made):
    the copies of its inputs into the graph's, the three copies of the outputs, the data check's
    read (with the checks on) and the autograd formula, within the same budgets."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    checked = host_path.count_call(loss, grouped=grouped, validate=True, masked=masked, replay=True)
    unchecked = host_path.count_call(loss, grouped=grouped, validate=False, masked=masked, replay=True)
    for call in (checked, unchecked):
        assert not {"empty", "zeros", "sort", "searchsorted"} & set(call.op_names), call.op_names
        assert call.op_names["clone"] == 3 and call.op_names["copy_"] >= 2, call.op_names  # outputs; scores, labels
        assert not HOST_DATA_OPS & set(call.op_names), call.op_names
        assert call.ops <= MAX_OPS, call.op_names
    assert checked.sync_names == ["_local_scalar_dense"], checked.sync_names
    assert unchecked.syncs == 0, unchecked.sync_names


def test_the_counter_sees_syncs_and_library_internals() -> None:
    # The counter must not be blind: the same call on the PyTorch tier (its dense tables read
    # sizes on the host) shows syncs, and a deliberate .item() is one.
    counter = host_path.OpCounter()
    scores, labels, groups = host_path.batch()
    import mlloss

    with counter:
        mlloss.AUCLoss(backend="torch", validate_args=False)(scores, labels[:, 0], groups)
        torch.ones(2).sum().item()
    assert "_local_scalar_dense" in counter.syncs and len(counter.syncs) > 2
    assert "sort" in counter.ops  # seen inside the library's op
    with counter:  # a CPU tensor's tolist dispatches nothing; a CUDA tensor's is a copy to the host
        before = len(counter.syncs)
        scores[:3].tolist()
    assert counter.syncs[before:] == ["_to_copy"]
    with counter:
        torch.tensor([0.5, 2.0]) * scores[:2]
    assert HOST_DATA_OPS & set(counter.ops)


# Bytes per item one call allocates at most (the scores' gradient included; results/host-path.json
# at N = 2^20): the layout's int32 spans, order and ranks, kernel 1's partials, the gradient.
# Issue 10's line is 48 MB at N = 2^20, i.e. 48 bytes per item, with CUDA's sort scratch on top.
MAX_BYTES_PER_ITEM = {False: 32, True: 40}  # without / with groups


@pytest.mark.parametrize("grouped", [False, True], ids=["no-groups", "groups"])
@pytest.mark.parametrize("loss", ["AUCLoss", "LaALoss", "PDAOMLoss"])
def test_one_call_allocates_at_most_its_bytes_per_item(loss: str, grouped: bool) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("skips the interpreter's launches: needs TRITON_INTERPRET=1 before triton is imported")
    n = 1 << 14
    peak, in_sorts = host_path.peak_memory(loss, grouped=grouped, num_items=n, users=n // 50)
    assert peak <= MAX_BYTES_PER_ITEM[grouped] * n + (1 << 14), f"{loss}: {peak / n:.2f} bytes per item"
    if grouped:
        # A sort of N group ids returns N int64 indices and N keys: at least 12 bytes per item, live.
        assert 12 * n <= in_sorts <= peak
    else:  # a few levels without groups: a counting sort (kernels.levels), no sort of the batch,
        # and PDAOM's cell extremes from a scan, no sort of the scores (LaA's first call sorts its
        # few pattern levels, tens of bytes, into its cached tables)
        assert in_sorts < 1024


# --------------------------------------------------------------------------- #
# Tests from a mutation audit of the measurement tools                        #
# --------------------------------------------------------------------------- #
def test_the_counter_knows_each_kind_of_syncing_op_and_what_runs_no_kernel() -> None:
    # one op at a time, each answer known from what the op needs on CUDA: data-dependent output
    # shapes wait for the device; views and bare allocations run no kernel
    x = torch.arange(6.0)
    mask = x > 2
    cases = [
        (lambda: torch.nonzero(x), "nonzero", True),
        (lambda: torch.masked_select(x, mask), "masked_select", True),
        (lambda: x[mask], "index", True),  # boolean-mask indexing
        (lambda: x[torch.tensor([0, 2])], "index", False),  # integer indices: shape known
        (lambda: torch.repeat_interleave(x, torch.full((6,), 2)), "repeat_interleave", True),
        (lambda: torch.repeat_interleave(x, torch.full((6,), 2), output_size=12), "repeat_interleave", False),
        (lambda: torch.unique(x), "_unique2", True),
        (lambda: torch.bincount(torch.tensor([0, 1, 1])), "bincount", True),
        (lambda: x.to(torch.float64), "_to_copy", False),  # CPU to CPU: stands for device to device
        (lambda: x.sum().item(), "_local_scalar_dense", True),
    ]
    for run, name, syncing in cases:
        counter = host_path.OpCounter()
        with counter:
            run()
        assert name in counter.ops, (name, counter.ops)
        assert (name in counter.syncs) == syncing, (name, counter.ops, counter.syncs)
    batched, weight, matrix = torch.ones(2, 3, 4), torch.ones(4, 5), torch.ones(2, 3)
    counter = host_path.OpCounter()
    with counter:
        x.view(2, 3).t()[1:2].unsqueeze(0)
        torch.empty(3)
        x + 1
        batched @ weight  # mm, then _unsafe_view (a view without an alias annotation)
        matrix.t().reshape(-1)  # one copy: clone, then _unsafe_view
    assert "_unsafe_view" in counter.ops
    assert counter.kernels == ["add", "mm", "clone"], (counter.ops, counter.kernels)
    assert len(counter.ops) > 2 and counter.syncs == []


def test_a_calls_count_is_its_forward_and_its_backward() -> None:
    # count_call counts one forward + backward after a warm-up call: the same ops as a forward and
    # a backward counted apart (with two counters) after the same warm-up
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("counts the interpreter's calls: needs TRITON_INTERPRET=1 before triton is imported")
    for name in ("AUCLoss", "LaALoss"):
        scores, labels, groups = host_path.batch()
        scores, labels = host_path.loss_scores(name, scores), host_path.loss_labels(name, labels)
        loss = host_path.BUILDERS[name](False)
        with host_path.kernels_uncounted():
            loss(scores.clone().requires_grad_(True), labels, groups).backward()
            forward, backward = host_path.OpCounter(), host_path.OpCounter()
            x = scores.clone().requires_grad_(True)
            with forward:
                value = loss(x, labels, groups)
            with backward:
                value.backward()
        assert len(backward.ops) > 0
        counted = host_path.count_call(name, grouped=True, validate=False)
        assert counted.op_names == dict(collections.Counter(forward.ops + backward.ops)), name
        assert counted.ops == len(forward.ops) + len(backward.ops)


def test_the_peak_in_a_sort_is_what_is_live_before_it_plus_its_outputs(monkeypatch) -> None:
    # a made-up "loss" whose bytes are known: it keeps a 4 KiB buffer, then sorts 1,024 int64 keys
    # (allocated before the sort) into 1,024 values and 1,024 int64 indices
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("skips the interpreter's launches: needs TRITON_INTERPRET=1 before triton is imported")

    class Sorting(torch.nn.Module):
        def forward(self, scores, labels, groups):
            kept = torch.zeros(1024, dtype=torch.float32)  # 4,096 bytes, live through the sort
            keys = torch.arange(1024, 0, -1)  # 8,192 bytes, live through the sort
            values, order = torch.sort(keys)  # 8,192 + 8,192 bytes made by the sort
            return (scores * (kept[0] + values[0].float() + order[0].float())).sum()

    monkeypatch.setitem(host_path.BUILDERS, "made-up sort", lambda validate: Sorting())
    peak, in_sorts = host_path.peak_memory("made-up sort", grouped=False, num_items=64)
    assert in_sorts == 4096 + 8192 + 2 * 8192
    assert peak >= in_sorts


@pytest.mark.parametrize("items", ["0", "-5"])
def test_the_tool_refuses_a_memory_batch_without_items(items, monkeypatch, capsys) -> None:
    """host_path.py --memory -5 counted every call (half a minute) and then failed making a batch of
    -5 items, writing nothing; --memory 0 silently measured nothing. Now refused before the counts."""
    monkeypatch.setattr(host_path, "all_counts", lambda: pytest.fail("counted the calls"))
    with pytest.raises(SystemExit):
        host_path.main(["--memory", items, "--output", "/nonexistent/host-path.json"])
    assert f"--memory must be >= 1 (items); got {items}" in capsys.readouterr().err
