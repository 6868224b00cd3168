"""``torch.compile(fullgraph=True)`` of a model step that calls each loss.

Every loss is one opaque ``torch.library`` op (``mlloss::pair_loss``, and
``mlloss::binary_cross_entropy`` for BCE) with a fake implementation and an autograd formula,
so Dynamo captures the step in one graph, AOTAutograd derives its backward, and batches with
other labels and groups but the same N reuse the graph. The compiled step must give eager's
loss and parameter gradients. Backend ``aot_eager`` (graph capture and AOTAutograd without
C++ code generation, which takes tens of seconds per graph on a small CPU), plus one Inductor
case.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mlloss

NUM_ITEMS = 48
LOSSES = {
    "AUCLoss": lambda: mlloss.AUCLoss(),
    "LaALoss": lambda: mlloss.LaALoss(),
    "LoALoss": lambda: mlloss.LoALoss([1.0, 0.5]),
    "LoALoss(balanced)": lambda: mlloss.LoALoss("balanced", num_labels=2),
    "PDAOMLoss": lambda: mlloss.PDAOMLoss(),
    "AUCLoss(exponential closed form)": lambda: mlloss.AUCLoss(surrogate="exponential"),
    "LaALoss(hinge closed form)": lambda: mlloss.LaALoss(surrogate="hinge"),
    "bce+pdaom": lambda: mlloss.build_loss("bce+pdaom"),
    "AUCLoss(triton)": lambda: mlloss.AUCLoss(backend="triton"),
    "LoALoss(triton, hardest)": lambda: mlloss.LoALoss(pairs="hardest", backend="triton"),
}
SINGLE_LABEL = {"AUCLoss", "PDAOMLoss", "AUCLoss(exponential closed form)", "bce+pdaom", "AUCLoss(triton)"}


def batches(count: int = 3):
    """Batches of the same size with different labels and groups."""
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        features = torch.randn(NUM_ITEMS, 4, generator=gen)
        labels = torch.randint(0, 2, (NUM_ITEMS, 2), generator=gen).to(torch.float32)
        groups = torch.randint(0, 5 + seed, (NUM_ITEMS,), generator=gen) * 13
        yield features, labels, groups


def run_steps(loss_name: str, compile_with=None):
    """(loss values, parameter gradients) of a few training steps, compiled or eager."""
    if loss_name.endswith("(triton)") or "triton," in loss_name:
        pytest.importorskip("triton")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    loss = LOSSES[loss_name]()

    def step(features, labels, groups):
        return loss(model(features), labels, groups)

    fn = torch.compile(step, fullgraph=True, dynamic=False, backend=compile_with) if compile_with else step
    values, grads, compiles = [], [], []
    for features, labels, groups in batches():
        labels = labels[:, 0] if loss_name in SINGLE_LABEL else labels
        model.zero_grad()
        value = fn(features, labels, groups)
        value.backward()
        values.append(value.detach())
        grads.append(model.weight.grad.clone())
        compiles.append(getattr(compile_with, "frame_count", 0))
    return values, grads, compiles


@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_compiled_step_is_one_graph_equal_to_eager_without_recompiles(loss_name: str) -> None:
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    values, grads, compiles = run_steps(loss_name, compile_with=counter)
    eager_values, eager_grads, _ = run_steps(loss_name)
    # Compiled on the first batch (fullgraph: one graph or an error), never again for the others.
    assert compiles[0] >= 1 and compiles[1:] == compiles[:1] * 2, f"{loss_name}: compilations after each batch {compiles}"
    for got, expected in zip(values + grads, eager_values + eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_inductor_compiles_a_step_with_a_grouped_loss() -> None:
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    values, grads, compiles = run_steps("LaALoss", compile_with=counter)
    eager_values, eager_grads, _ = run_steps("LaALoss")
    assert compiles[1:] == compiles[:1] * 2
    for got, expected in zip(values + grads, eager_values + eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_inductor_compiles_bce_of_transposed_logits() -> None:
    """(B, T) logits are often a transposed (T, B) tensor (mlloss.models' stacked towers): the
    op's gradient has the contiguous layout its fake implementation promises, which Inductor
    asserts."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    weight = torch.randn(2, 4, requires_grad=True)
    loss = mlloss.BCELoss()

    def step(features, labels):
        logits = (weight @ features.T).T  # (N, 2), strides (1, N)
        return loss(logits, labels)

    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    for features, labels, _ in batches(2):
        assert not (weight @ features.T).T.is_contiguous()
        expected_grad = torch.autograd.grad(step(features, labels), weight)[0]
        value = compiled(features, labels)
        torch.testing.assert_close(value, step(features, labels), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(torch.autograd.grad(value, weight)[0], expected_grad, rtol=1e-5, atol=1e-7)
