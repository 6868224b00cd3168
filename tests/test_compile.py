"""``torch.compile(fullgraph=True)`` of a model step that calls each loss.

Under ``torch.compile`` every loss is one opaque ``torch.library`` op (``mlloss::pair_loss``, and
``mlloss::binary_cross_entropy`` for BCE) with a fake implementation and an autograd formula
(in eager mode the same implementation runs without the dispatcher, ``ops.fused``), so Dynamo
captures the step in one graph, AOTAutograd derives its backward, and batches with
other labels and groups but the same N reuse the graph. The compiled step must give eager's
loss and parameter gradients. Backend ``aot_eager`` (graph capture and AOTAutograd without
C++ code generation, which takes tens of seconds per graph on a small CPU), plus one Inductor
case. With MLLOSS_TEST_DEVICE=cuda (and TRITON_INTERPRET=0) the same steps run on CUDA tensors:
the compiled Triton kernels inside a captured graph, and Inductor's own CUDA code.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import mlloss

DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
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
    "LaALoss(triton, hardest)": lambda: mlloss.LaALoss(pairs="hardest", backend="triton"),
    "LaALoss(triton, soft hardest)": lambda: mlloss.LaALoss(pairs="hardest", temperature=0.5, backend="triton"),
}
SINGLE_LABEL = {"AUCLoss", "PDAOMLoss", "AUCLoss(exponential closed form)", "bce+pdaom", "AUCLoss(triton)"}


def batches(count: int = 3):
    """Batches of the same size with different labels and groups, on DEVICE."""
    for seed in range(count):
        gen = torch.Generator().manual_seed(seed)
        features = torch.randn(NUM_ITEMS, 4, generator=gen)
        labels = torch.randint(0, 2, (NUM_ITEMS, 2), generator=gen).to(torch.float32)
        groups = torch.randint(0, 5 + seed, (NUM_ITEMS,), generator=gen) * 13
        yield features.to(DEVICE), labels.to(DEVICE), groups.to(DEVICE)


def run_steps(loss_name: str, compile_with=None):
    """(loss values, parameter gradients) of a few training steps, compiled or eager."""
    if loss_name.endswith("(triton)") or "triton," in loss_name:
        pytest.importorskip("triton")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(DEVICE)
    loss = LOSSES[loss_name]().to(DEVICE)

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
def test_compiled_step_is_one_graph_equal_to_eager_without_recompiles(loss_name: str, monkeypatch) -> None:
    """And compiling it prints no Dynamo warning about the library's code: every pairwise loss's
    first compile warned (torch 2.13) of the lru_cache it traced through in dispatch.py's pair_loss,
    "silent incorrectness is a potential risk", in users' logs."""
    import warnings

    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    monkeypatch.setattr(dynamo_utils, "warn_once_cache", set())  # Dynamo warns once per process: as if first
    counter = CompileCounterWithBackend("aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values, grads, compiles = run_steps(loss_name, compile_with=counter)
    package = os.path.dirname(mlloss.__file__)
    about_us = [str(w.message) for w in caught if package in str(w.message) or w.filename.startswith(package)]
    assert not about_us, about_us
    eager_values, eager_grads, _ = run_steps(loss_name)
    # Compiled on the first batch (fullgraph: one graph or an error), never again for the others.
    assert compiles[0] >= 1 and compiles[1:] == compiles[:1] * 2, f"{loss_name}: compilations after each batch {compiles}"
    for got, expected in zip(values + grads, eager_values + eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


PARTS_LOSSES = {
    "bce": lambda: mlloss.build_loss("bce"),
    "bce+pdaom": lambda: mlloss.build_loss("bce+pdaom"),
    "bce+auc(lam per task)": lambda: mlloss.build_loss("bce+auc", lam=[1.0, 3.0]),
    "LaALoss": lambda: mlloss.LaALoss(),
}


@pytest.mark.parametrize("loss_name", list(PARTS_LOSSES))
def test_parts_read_inside_a_compiled_step_equal_eager_parts(loss_name: str) -> None:
    """``loss.parts`` read in the step (a LightningModule logging them from a compiled
    training_step) compiles into the one graph and holds the eager parts: the cross-entropy
    objectives' parts raised Dynamo's "Failed to trace builtin operator callable with argument
    types ['dict']" under fullgraph (a graph break without it)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1 if loss_name == "LaALoss" else 2).to(DEVICE)
    loss = PARTS_LOSSES[loss_name]().to(DEVICE)

    def step(features, labels, groups):
        scores = model(features)
        value = loss(scores[:, 0] if loss_name == "LaALoss" else scores, labels, groups)
        return value, dict(loss.parts.items())

    compiled = torch.compile(step, fullgraph=True, dynamic=False, backend="aot_eager")
    for features, labels, groups in batches(2):
        value, parts = compiled(features, labels, groups)
        eager_value, eager_parts = step(features, labels, groups)
        assert sorted(parts) == sorted(eager_parts) and len(parts) >= 2
        torch.testing.assert_close(value, eager_value, rtol=1e-6, atol=1e-7)
        for name in parts:
            torch.testing.assert_close(parts[name], eager_parts[name], rtol=1e-6, atol=1e-7)


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
    weight = torch.randn(2, 4).to(DEVICE).requires_grad_(True)
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


@pytest.mark.parametrize("loss_name", ["bce+pdaom", "LaALoss", "LoALoss"])
def test_dynamic_shapes_compile_with_the_loss_options_as_symbols(loss_name: str) -> None:
    """``dynamic=True`` turns a module's float attributes (margin, lam) into symbols: they reach
    the op as symbolic arguments, and batches of another size reuse the graph."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    loss = LOSSES[loss_name]().to(DEVICE)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss, fullgraph=True, dynamic=True, backend=counter)
    compiles = []
    for num_items in (40, 48, 56):
        gen = torch.Generator().manual_seed(num_items)
        labels = torch.randint(0, 2, (num_items, 2), generator=gen).to(torch.float32).to(DEVICE)
        groups = torch.randint(0, 4, (num_items,), generator=gen).to(DEVICE)
        scores = torch.randn(num_items, *((2,) if loss_name == "bce+pdaom" else ()), generator=gen).to(DEVICE)
        got, expected = scores.clone().requires_grad_(True), scores.clone().requires_grad_(True)
        value = compiled(got, labels, groups)
        value.backward()
        loss(expected, labels, groups).backward()
        torch.testing.assert_close(value, loss(scores, labels, groups), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-6, atol=1e-7)
        compiles.append(counter.frame_count)
    assert compiles[0] >= 1 and compiles[1:] == compiles[:1] * 2, f"compilations after each batch {compiles}"


def cuda_graph_splitters_of_compiled_step(step, inputs: tuple, dynamic: bool) -> list[str]:
    """The graph nodes that would keep Inductor's CUDA graphs from holding the whole step: nodes
    holding a CPU tensor and ops Inductor calls cudagraph-unsafe (``is_cudagraph_unsafe_fx_node``:
    host reads, data-dependent allocations, ops so tagged), in the forward and backward graphs of
    ``step`` compiled (fullgraph) and run forward + backward on ``inputs``, meta tensors: the meta
    device stands in for CUDA (on the CPU every tensor is a CPU tensor). Either makes Inductor
    skip the step's CUDA graphs (torch < 2.9) or split the step into several around it (graph
    partitions): ``mode="reduce-overhead"`` loses part or all of what it is for."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor import utils as inductor_utils

    unsafe = getattr(inductor_utils, "is_cudagraph_unsafe_fx_node", lambda node: False)  # torch >= 2.9
    found: list[str] = []

    def record(kind: str):
        def compiler(graph: torch.fx.GraphModule, example_inputs):
            for node in graph.graph.nodes:
                value = node.meta.get("val")
                for tensor in value if isinstance(value, (tuple, list)) else (value,):
                    if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                        found.append(f"{kind} {node.op} {node.name}: {node.target} holds a CPU tensor")
                if node.op == "call_function" and unsafe(node):
                    found.append(f"{kind} {node.name}: {node.target} is cudagraph-unsafe")
            return graph.forward
        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=record("forward"), bw_compiler=record("backward"))
    value = torch.compile(step, fullgraph=True, dynamic=dynamic, backend=backend)(*inputs)
    value.backward()
    assert value.is_meta
    return found


# And a lam other than 1. (One lam per task column is left out: its weights are a constant the
# traced step builds on the scores' device, which fake propagation on the meta device refuses:
# there a factory call returns a real meta tensor.)
CPU_FREE_LOSSES = {**LOSSES, "bce+auc(lam=0.5)": lambda: mlloss.build_loss("bce+auc", lam=0.5)}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("loss_name", list(CPU_FREE_LOSSES))
def test_compiled_step_on_a_device_holds_no_cuda_graph_splitter(loss_name: str, dynamic: bool) -> None:
    """No CPU tensor and no cudagraph-unsafe op in a compiled step with any loss
    (``cuda_graph_splitters_of_compiled_step``).
    ``dynamic=True`` is where one came from: Dynamo passes a module's float attributes as float64
    CPU scalars, and ``lam * term`` kept bce+pdaom's lam in the forward and backward graphs."""
    if "triton" in loss_name:
        pytest.importorskip("triton")
    model = torch.nn.Linear(4, 1).to("meta")
    loss = CPU_FREE_LOSSES[loss_name]().to("meta")
    single = loss_name in SINGLE_LABEL or loss_name.startswith("bce+")

    def step(features, labels, groups):
        return loss(model(features)[:, 0], labels[:, 0] if single else labels, groups)

    inputs = (torch.empty(NUM_ITEMS, 4, device="meta"), torch.empty(NUM_ITEMS, 2, device="meta"),
              torch.empty(NUM_ITEMS, dtype=torch.int64, device="meta"))
    splitters = cuda_graph_splitters_of_compiled_step(step, inputs, dynamic)
    assert model.weight.grad.is_meta
    assert not splitters, f"{loss_name}, dynamic={dynamic}: CUDA graph splitters in the compiled graphs: {splitters}"


@pytest.mark.parametrize("loss, fixed", [("laa", False), ("bce+pdaom", True)])
def test_the_recipes_compiled_step_is_one_cuda_graph(loss: str, fixed: bool) -> None:
    """recipes/ctr_cvr.py's training step as ``--compile`` compiles it holds nothing that would
    split its CUDA graphs (``cuda_graph_splitters_of_compiled_step``): its model and objective, the
    ranking head's ``lam`` (laa) and BCEPlusRanking's (bce+pdaom) included; without
    ``--fixed-batches`` (the batch size dynamic), and with it (padded batches and their mask,
    static: ``--compile reduce-overhead --fixed-batches``, the one-graph step of docs/recipe.md)."""
    from mlloss.data import SyntheticConfig, TensorBatches, generate_impressions, split_by_time
    from recipe_util import load_recipe

    recipe = load_recipe("ctr_cvr")
    args = recipe.parse_args(["--loss", loss, "--num-users", "50", "--num-items", "40", "--no-checkpoint"])
    train = split_by_time(generate_impressions(SyntheticConfig(num_users=50, num_items=40, mean_impressions=20)))[0]
    objective = recipe.MultiTaskObjective(loss, None, validate_args=False)
    model = recipe.build_model(args, train, len(recipe.TASKS) + objective.uses_ranking_head)
    module = recipe.CtrCvrModule(model, objective, args.lr, args.weight_decay).to("meta")
    batch = next(iter(TensorBatches(train.columns(), 128, group_key="user", seed=0, fixed_size=fixed)))
    assert ("mask" in batch) == fixed
    splitters = cuda_graph_splitters_of_compiled_step(module.batch_loss, ({k: v.to("meta") for k, v in batch.items()},),
                                                      dynamic=not fixed)
    assert not splitters, f"--loss {loss}: CUDA graph splitters in the compiled graphs: {splitters}"


def test_dynamic_shapes_compile_balanced_loa_with_its_running_priors() -> None:
    """``LoALoss("balanced")`` in training mode adds each batch to its running label counts and checks
    that the batch has as many label columns as they do. Under ``dynamic=True`` both sizes are
    symbols: Dynamo 2.11 evaluated ``numel() not in (0, K)`` as true with both sizes 2 and raised
    the check's ValueError on the first batch. Compiled, it follows an eager twin on batches of three
    sizes: the same losses, gradients and running counts."""
    torch._dynamo.reset()
    compiled_loss, eager_loss = (mlloss.LoALoss("balanced", num_labels=2).to(DEVICE) for _ in range(2))
    compiled = torch.compile(compiled_loss, fullgraph=True, dynamic=True, backend="aot_eager")
    for num_items in (40, 48, 56):
        gen = torch.Generator().manual_seed(num_items)
        labels = torch.randint(0, 2, (num_items, 2), generator=gen).to(torch.float32).to(DEVICE)
        scores = torch.randn(num_items, generator=gen).to(DEVICE)
        got, expected = scores.clone().requires_grad_(True), scores.clone().requires_grad_(True)
        value, eager_value = compiled(got, labels), eager_loss(expected, labels)
        (value + eager_value).backward()
        torch.testing.assert_close(value, eager_value, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(compiled_loss.seen_positives, eager_loss.seen_positives, rtol=0, atol=0)
        torch.testing.assert_close(compiled_loss.seen_items, eager_loss.seen_items, rtol=0, atol=0)
    assert eager_loss.seen_items.item() == 40 + 48 + 56


@pytest.mark.parametrize("loss_name", ["AUCLoss", "LaALoss", "bce+pdaom", "AUCLoss(triton)"])
def test_the_op_and_its_autograd_give_the_eager_bits(loss_name: str, monkeypatch) -> None:
    """Eager calls run the op's implementation in an ``autograd.Function``; compiled code calls the
    op, whose registered autograd formula must give the same loss and gradient, bit for bit."""
    if "triton" in loss_name:
        pytest.importorskip("triton")
    features, labels, groups = next(batches(1))
    scores = features[:, :2] if loss_name == "bce+pdaom" else features[:, 0]
    labels = labels[:, 0] if loss_name in SINGLE_LABEL - {"bce+pdaom"} else labels
    results = []
    for through_op in (False, True):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: through_op)
        x = scores.clone().requires_grad_(True)
        value = LOSSES[loss_name]().to(DEVICE)(x, labels, groups)
        (3 * value).backward()
        results.append((value.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_fake_and_meta_tensors_take_the_ops_fake() -> None:
    """Shape propagation (FakeTensorMode, the meta device) gets the outputs' shapes and dtypes
    from the ops' fakes, gradients included, without running a kernel or reading a value."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for loss, shape, labels_shape in (
        (mlloss.AUCLoss(), (64,), (64,)), (mlloss.LaALoss(), (64,), (64, 2)), (mlloss.build_loss("bce"), (64, 2), (64, 2))
    ):
        with FakeTensorMode():
            scores = torch.randn(shape, requires_grad=True)
            value = loss(scores, torch.randint(0, 2, labels_shape).float(), torch.randint(0, 4, (64,)))
            value.backward()
        assert value.shape == () and value.dtype == torch.float32 and scores.grad.shape == shape
        scores = torch.randn(shape, device="meta", requires_grad=True)
        value = loss(scores, torch.ones(labels_shape, device="meta"))
        value.backward()
        assert value.is_meta and value.shape == () and scores.grad.shape == shape


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs: MLLOSS_TEST_DEVICE=cuda on a GPU")
def test_reduce_overhead_step_with_laa_over_label_columns_builds_its_tables_outside_the_graph_pool() -> None:
    """LaA over several label columns caches its level tables per weights and device; built during
    the CUDA graph warm-up of torch.compile(mode="reduce-overhead"), they were allocated from the
    graph's pool and the warm-up raised "tensor(s) in the cudagraph pool not tracked as outputs"
    (the recipe's laa step on an H100). Replays equal eager steps on batches of other labels."""
    from mlloss.ops import dispatch

    torch._dynamo.reset()
    dispatch._pattern_tables.cache_clear()  # built on this test's first call, inside the warm-up
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(DEVICE)
    loss = mlloss.LaALoss(backend="triton", validate_args=False)

    def step(features, labels, groups, mask):
        return loss(model(features)[:, 0], labels, groups, mask)

    compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
    for features, labels, groups in batches(5):
        mask = torch.arange(NUM_ITEMS, device=DEVICE) % 7 != 3
        model.zero_grad(set_to_none=True)
        value = compiled(features, labels, groups, mask)
        value.backward()
        got = (value.detach().clone(), model.weight.grad.clone())
        model.zero_grad(set_to_none=True)
        expected = step(features, labels, groups, mask)
        expected.backward()
        torch.testing.assert_close(got[0], expected.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got[1], model.weight.grad, rtol=1e-5, atol=1e-7)
