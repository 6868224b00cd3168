"""Eager calls replayed from CUDA graphs (``mlloss.set_graph_replay``, ``mlloss.ops.replay``).

On the CPU (under TRITON_INTERPRET=1) a captured call's graph is the module's stand-in, whose
replay runs the call's function again on the static inputs and writes the results into the
static outputs, as a graph's kernels would: what these tests check there is the bookkeeping
(signatures, the static inputs and outputs, the copies in and out, the data check after a
replay, the bound on graphs, the fallback). With MLLOSS_TEST_DEVICE=cuda on a GPU the same tests capture
real CUDA graphs.
"""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

pytest.importorskip("triton")

import mlloss  # noqa: E402
from mlloss.ops import replay  # noqa: E402
from triton_interpreter import warnings_as_errors  # noqa: E402

pytestmark = pytest.mark.triton
DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")

LOSSES = {
    "AUCLoss": lambda **kw: mlloss.AUCLoss(backend="triton", **kw),
    "LaALoss": lambda **kw: mlloss.LaALoss(backend="triton", **kw),
    "LaALoss(soft hardest)": lambda **kw: mlloss.LaALoss(pairs="hardest", temperature=0.5, backend="triton", **kw),
    "LoALoss(balanced)": lambda **kw: mlloss.LoALoss("balanced", num_labels=2, backend="triton", **kw),
    "PDAOMLoss": lambda **kw: mlloss.PDAOMLoss(backend="triton", **kw),
    "bce+pdaom": lambda **kw: mlloss.build_loss("bce+pdaom", backend="triton", **kw),
}
SINGLE_LABEL = ("AUCLoss", "PDAOMLoss")


@contextlib.contextmanager
def replay_on(**options):
    """Replay on: real CUDA graphs on a GPU, the stand-in graphs on the CPU."""
    if DEVICE == "cuda":
        before = mlloss.graph_replay_enabled()  # MLLOSS_GRAPH_REPLAY=1 may have turned it on for the run
        mlloss.set_graph_replay(True, **options)
        try:
            yield
        finally:
            mlloss.set_graph_replay(before)
    else:
        with replay.stand_in_on_cpu():
            if options:
                replay._STATE.max_graphs = options["max_graphs"]
            yield


def make_batch(name: str, seed: int, num_items: int = 96, masked: bool = False):
    gen = torch.Generator().manual_seed(seed)
    tasks = 2 if name == "bce+pdaom" else 1
    scores = torch.randn(num_items, tasks, generator=gen).squeeze(1)
    labels = torch.randint(0, 2, (num_items, 2), generator=gen).float()
    labels = labels[:, 0] if name in SINGLE_LABEL else labels
    groups = torch.randint(0, 6 + seed, (num_items,), generator=gen) * 7
    mask = torch.rand(num_items, generator=gen) > 0.25 if masked else None
    return tuple(None if t is None else t.to(DEVICE) for t in (scores, labels, groups, mask))


def calls(loss, batches):
    """(value, gradient) of each batch's forward + backward."""
    out = []
    for scores, labels, groups, mask in batches:
        x = scores.clone().requires_grad_(True)
        kwargs = {} if mask is None else {"mask": mask}
        value = loss(x, labels, groups, **kwargs)
        value.backward()
        out.append((value.detach(), x.grad))
    return out


# (loss, validate, dense, masked): each loss once, on the kernels it takes at 96 items or on the
# layout kernels (as past 2,048 items), with the data check (its status is one of the graph's
# outputs); AUC and LaA on both kernel paths and with a mask, AUC also without the check.
# ``MLLOSS_TEST_REPLAY=1`` runs any other test with every call replayed (tests/conftest.py).
CASES = [("AUCLoss", True, True, False), ("AUCLoss", True, False, False), ("AUCLoss", False, False, True),
         ("LaALoss", True, True, True), ("LaALoss", True, False, False), ("LaALoss(soft hardest)", True, False, False),
         ("LoALoss(balanced)", True, True, False), ("PDAOMLoss", True, False, True), ("bce+pdaom", True, True, False)]


@pytest.mark.parametrize("name,validate,dense,masked", CASES)
def test_replayed_calls_give_the_bits_of_calls_without_replay(name, validate, dense, masked, monkeypatch):
    """Batches of one shape with other scores, labels and groups (and masks): the first call runs
    as it is, the second captures, the third replays; every value and gradient is bit-identical to
    the same call without replay. ``dense=False``: the layout kernels, as past 2,048 items."""
    if not dense:
        from mlloss.kernels import dense as dense_kernels

        monkeypatch.setattr(dense_kernels, "MAX_ITEMS", 0)
    batches = [make_batch(name, seed, masked=masked) for seed in range(3)]
    expected = calls(LOSSES[name](validate_args=validate).to(DEVICE), batches)
    with replay_on():
        got = calls(LOSSES[name](validate_args=validate).to(DEVICE), batches)
        assert replay.captured_signatures() == 1
    for (value, grad), (want_value, want_grad) in zip(got, expected):
        assert torch.equal(value, want_value)
        assert torch.equal(grad, want_grad)


def test_an_earlier_calls_outputs_survive_later_replays():
    """Two calls of one signature before either backward: each keeps its own loss, gradient and
    statistics (the graph's outputs are copied out; ``parts`` are read from the statistics
    lazily, after the second call here)."""
    batches = [make_batch("AUCLoss", seed) for seed in range(4)]
    plain = LOSSES["AUCLoss"]()
    expected = []
    for scores, labels, groups, _ in batches[2:]:
        x = scores.clone().requires_grad_(True)
        value = plain(x, labels, groups)
        value.backward()
        expected.append((value.detach(), x.grad, plain.parts["valid_pairs"], plain.parts["groups_with_pairs"]))
    loss = LOSSES["AUCLoss"]()
    with replay_on():
        calls(loss, batches[:2])  # run, then capture
        inputs = [b[0].clone().requires_grad_(True) for b in batches[2:]]
        values, parts = [], []
        for x, (_, labels, groups, _) in zip(inputs, batches[2:]):
            values.append(loss(x, labels, groups))
            parts.append(loss.parts)
        sum(values).backward()
    for value, x, part, (want_value, want_grad, want_pairs, want_groups) in zip(values, inputs, parts, expected):
        assert torch.equal(value.detach(), want_value) and torch.equal(x.grad, want_grad)
        assert torch.equal(part["valid_pairs"], want_pairs) and torch.equal(part["groups_with_pairs"], want_groups)
    assert not torch.equal(expected[0][2], expected[1][2])  # the two batches differ in what is checked


def test_a_replayed_call_still_raises_for_bad_data():
    """The data check runs inside the graph and is read after each replay: a NaN score in a
    replayed call raises the error that names it, and the next good batch replays again."""
    loss = LOSSES["LaALoss"]()
    with replay_on():
        calls(loss, [make_batch("LaALoss", seed) for seed in range(2)])
        assert replay.captured_signatures() == 1
        scores, labels, groups, _ = make_batch("LaALoss", 7)
        scores[41] = float("nan")
        with pytest.raises(ValueError, match="41"):
            loss(scores, labels, groups)
        labels = labels.clone()
        labels[5, 1] = 3.0
        with pytest.raises(ValueError, match="label"):
            loss(make_batch("LaALoss", 8)[0], labels, groups)
        good = make_batch("LaALoss", 9)
        (value, grad), = calls(loss, [good])
    (want_value, want_grad), = calls(LOSSES["LaALoss"](), [good])
    assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_a_replayed_bce_plus_ranking_reads_both_checks_and_raises_for_either():
    """bce+pdaom replays its ranking term and reads that graph's status together with the
    cross-entropy's check (one read): an infinite logit, which only the cross-entropy's check
    sees (its sigmoid is 1), and a label of 2 raise the errors that name them; the next good
    batch replays again with the bits of a call without replay."""
    loss = LOSSES["bce+pdaom"]()
    with replay_on():
        calls(loss, [make_batch("bce+pdaom", seed) for seed in range(2)])
        assert replay.captured_signatures() == 1
        scores, labels, groups, _ = make_batch("bce+pdaom", 7)
        scores[41, 1] = float("inf")
        with pytest.raises(ValueError, match=r"scores must be finite; scores\[41, 1\] = inf"):
            loss(scores, labels, groups)
        scores, labels, groups, _ = make_batch("bce+pdaom", 8)
        labels[5, 0] = 2.0
        with pytest.raises(ValueError, match=r"labels must be binary \(0/1\); labels\[5, 0\] = 2.0"):
            loss(scores, labels, groups)
        good = make_batch("bce+pdaom", 9)
        (value, grad), = calls(loss, [good])
        assert replay.captured_signatures() == 1
    (want_value, want_grad), = calls(LOSSES["bce+pdaom"](), [good])
    assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_signatures_past_max_graphs_run_as_they_are():
    """The first ``max_graphs`` signatures to come twice keep their graphs; later ones run as
    they are, with no capture (batches of ever new sizes would otherwise capture a graph and
    release another at nearly every call), and give the same results."""
    batches = {n: [make_batch("AUCLoss", seed, n) for seed in range(3)] for n in (40, 50, 60)}
    expected = {n: calls(LOSSES["AUCLoss"](), b) for n, b in batches.items()}
    loss = LOSSES["AUCLoss"]()
    with replay_on(max_graphs=2):
        got = {n: calls(loss, b) for n, b in batches.items()}
        assert sorted(key[6][0][0] for key in replay._STATE.graphs) == [40, 50]  # the scores' lengths
    for n in batches:
        for (value, grad), (want_value, want_grad) in zip(got[n], expected[n]):
            assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_a_failed_capture_warns_once_and_runs_the_call_as_it_is(monkeypatch):
    def failing(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(replay, "_capture", failing)
    batches = [make_batch("AUCLoss", seed) for seed in range(4)]
    expected = calls(LOSSES["AUCLoss"](), batches)
    with replay_on():
        loss = LOSSES["AUCLoss"]()
        with pytest.warns(RuntimeWarning, match="could not capture a loss call in a CUDA graph.*not permitted"):
            got = calls(loss, batches[:2])
        with warnings_as_errors():
            got += calls(loss, batches[2:])  # no capture tried again, no second warning
        assert replay.captured_signatures() == 0
    for (value, grad), (want_value, want_grad) in zip(got, expected):
        assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_the_pytorch_tier_and_the_closed_forms_are_not_replayed():
    with replay_on():
        for backend in ("torch", "exact"):
            calls(mlloss.AUCLoss(surrogate="exponential", backend=backend), [make_batch("AUCLoss", s) for s in range(3)])
        assert replay.captured_signatures() == 0


def test_set_graph_replay_checks_its_arguments():
    """Bad arguments raise, naming the argument, and change nothing."""
    before = mlloss.graph_replay_enabled()
    with pytest.raises(ValueError, match="max_graphs must be >= 1; got 0"):
        mlloss.set_graph_replay(True, max_graphs=0)
    with pytest.raises(TypeError, match="enabled must be a bool; got 'yes'"):
        mlloss.set_graph_replay("yes")
    assert mlloss.graph_replay_enabled() == before


def test_calls_inside_a_compiled_graph_are_not_replayed():
    """Under ``torch.compile`` the loss is the opaque operator, which runs as it is: a compiled
    step's CUDA graphs (mode="reduce-overhead") keep their memory pool to themselves, and a graph
    of ours allocated in it would be a tensor they do not track."""
    loss = LOSSES["AUCLoss"](validate_args=False)

    def step(scores, labels, groups):
        return loss(scores, labels, groups)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    batches = [make_batch("AUCLoss", seed) for seed in range(3)]
    with replay_on():
        got = [compiled(scores, labels, groups) for scores, labels, groups, _ in batches]
        assert replay.captured_signatures() == 0
    expected = [step(scores, labels, groups) for scores, labels, groups, _ in batches]
    for value, want in zip(got, expected):
        assert torch.equal(value, want)


def test_calls_under_inference_mode_keep_graphs_of_their_own():
    """A validation loop under ``torch.inference_mode`` (Lightning's default) and training calls of
    the same shapes: tensors made in inference mode cannot be written outside it, so each mode
    captures its own graph, and both give the bits of calls without replay."""
    loss = LOSSES["AUCLoss"]()
    batches = [make_batch("AUCLoss", seed) for seed in range(3)]
    with torch.inference_mode():
        expected_eval = [LOSSES["AUCLoss"]()(scores, labels, groups) for scores, labels, groups, _ in batches]
    expected_train = calls(LOSSES["AUCLoss"](), batches)
    with replay_on():
        with torch.inference_mode():
            got_eval = [loss(scores, labels, groups) for scores, labels, groups, _ in batches]
        got_train = calls(loss, batches)
        assert replay.captured_signatures() == 2
    for value, want in zip(got_eval, expected_eval):
        assert torch.equal(value, want)
    for (value, grad), (want_value, want_grad) in zip(got_train, expected_train):
        assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_inputs_of_another_dtype_keep_graphs_of_their_own():
    """The same shapes in float32 and float64 scores (an evaluation in double precision), and
    bool and float labels: each dtype its own graph, and every call the bits of the call without
    replay (a graph captured for float32 scores would copy float64 ones into float32 inputs)."""
    scores, labels, groups, _ = make_batch("AUCLoss", 0)
    batches = [(scores, labels, groups, None)] * 3 + [(scores.double(), labels, groups, None)] * 3
    batches += [(scores, labels.bool(), groups, None)] * 3
    expected = calls(LOSSES["AUCLoss"](), batches)
    with replay_on():
        got = calls(LOSSES["AUCLoss"](), batches)
        assert replay.captured_signatures() == 3
    for (value, grad), (want_value, want_grad) in zip(got, expected):
        assert value.dtype == want_value.dtype and torch.equal(value, want_value) and torch.equal(grad, want_grad)
    assert expected[3][0].dtype == torch.float64 and expected[3][0].float().double() != expected[3][0]  # not a float32's
