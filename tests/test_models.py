"""mlloss.models against the papers' definitions written out expert by expert and table by table.

The models run every expert (and every tower) of a level as one stacked MLP and every field's
table as one parameter, for a GPU step of few kernels; the references below loop over the
experts, gates, towers and tables one at a time, reading the same weights, in float64.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from mlloss.data import ImpressionData
from mlloss.models import CGC, MMoE, PLE, FieldEmbedding, SharedBottom, StackedLinear, mlp


def _linear(layer, x, g=None):
    """The g-th copy of a StackedLinear (or an nn.Linear when g is None), one input row block."""
    if g is None:
        return x @ layer.weight.T + layer.bias
    return x @ layer.weight[g] + layer.bias[g, 0]


def _mlp(sequential, x, g=None):
    for layer in sequential:
        x = torch.relu(x) if isinstance(layer, torch.nn.ReLU) else _linear(layer, x, g)
    return x


def _towers(backbone, task_inputs):
    return torch.stack([_mlp(backbone.towers, h, t)[:, 0] for t, h in enumerate(task_inputs)], dim=1)


def _extraction_level(level, task_inputs, shared_input):
    """One CGC/PLE level as in Tang et al. (2020), Fig. 4-5: task t's gate mixes its experts and
    the shared ones; the shared gate (if any) mixes all experts."""
    n_t, n_s, tasks = level.num_task_experts, level.num_shared_experts, level.num_tasks
    own = [[_mlp(level.experts, h, t * n_t + i) for i in range(n_t)] for t, h in enumerate(task_inputs)]
    shared = [_mlp(level.experts, shared_input, tasks * n_t + i) for i in range(n_s)]
    outputs = []
    for t, h in enumerate(task_inputs):
        gate = F.softmax(_linear(level.task_gates, h, t), dim=1)
        outputs.append(sum(gate[:, [e]] * out for e, out in enumerate(own[t] + shared)))
    if level.shared_gate is not None:
        gate = F.softmax(_linear(level.shared_gate, shared_input), dim=1)
        everything = [out for task in own for out in task] + shared
        outputs.append(sum(gate[:, [e]] * out for e, out in enumerate(everything)))
    return outputs


def _ple(backbone, x):
    hidden = [x] * (backbone.num_tasks + 1)
    for level in backbone.levels:
        hidden = _extraction_level(level, hidden[: backbone.num_tasks], hidden[-1])
    return _towers(backbone, hidden[: backbone.num_tasks])


def _mmoe(backbone, x):
    """Ma et al. (2018), Eq. 5-6: y_t = h_t(sum_e softmax(W_t x + b_t)_e f_e(x)) (the gates carry a bias)."""
    (level,) = backbone.levels
    experts = [_mlp(level.experts, x, e) for e in range(level.num_shared_experts)]
    mixed = []
    for t in range(backbone.num_tasks):
        gate = F.softmax(_linear(level.task_gates, x, t), dim=1)
        mixed.append(sum(gate[:, [e]] * out for e, out in enumerate(experts)))
    return _towers(backbone, mixed)


def _shared_bottom(backbone, x):
    h = _mlp(backbone.bottom, x)
    return _towers(backbone, [h] * backbone.num_tasks)


@pytest.mark.parametrize(
    ("make", "reference"),
    [
        (lambda: SharedBottom(7, 3, bottom_hidden=(6, 5), tower_hidden=(4,)), _shared_bottom),
        (lambda: MMoE(7, 2, num_experts=3, expert_hidden=(6, 5), tower_hidden=(4,)), _mmoe),
        (lambda: MMoE(7, 3, num_experts=1, expert_hidden=(5,), tower_hidden=(2, 3)), _mmoe),
        (lambda: CGC(7, 2, num_task_experts=2, num_shared_experts=1, expert_hidden=(6, 5)), _ple),
        (lambda: CGC(7, 3, num_task_experts=0, num_shared_experts=2, expert_hidden=(5,)), _ple),
        (lambda: PLE(7, 2, num_levels=3, num_task_experts=1, num_shared_experts=2, expert_hidden=(6, 5)), _ple),
        (lambda: PLE(7, 3, num_levels=2, num_task_experts=2, num_shared_experts=1, expert_hidden=(4,)), _ple),
    ],
    ids=["shared-bottom", "mmoe", "mmoe-1-expert", "cgc", "cgc-no-task-experts", "ple-3-levels", "ple-3-tasks"],
)
def test_backbones_equal_their_papers_expert_by_expert(make, reference):
    torch.manual_seed(0)
    backbone = make().double()
    for p in backbone.parameters():  # break the symmetry of the uniform init a little more
        p.data.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(9, 7, dtype=torch.float64, requires_grad=True)
    out = backbone(x)
    x_ref = x.detach().clone().requires_grad_()
    expected = reference(backbone, x_ref)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [x, *backbone.parameters()])
    grads_ref = torch.autograd.grad((expected * weights).sum(), [x_ref, *backbone.parameters()], allow_unused=True)
    for (name, _), got, want in zip([("x", None), *backbone.named_parameters()], grads, grads_ref):
        torch.testing.assert_close(got, torch.zeros_like(got) if want is None else want, rtol=1e-10, atol=1e-12,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_backbones_keep_the_parameter_count_of_one_module_per_expert():
    """Stacking changes the layout, not the model: as many weights as nn.Linear per expert/gate/tower."""
    def linear(i, o):
        return i * o + o

    mmoe = MMoE(10, 2, num_experts=4, expert_hidden=(8, 6), tower_hidden=(3,))
    expected = 4 * (linear(10, 8) + linear(8, 6)) + 2 * linear(10, 4) + 2 * (linear(6, 3) + linear(3, 1))
    assert sum(p.numel() for p in mmoe.parameters()) == expected
    ple = PLE(10, 2, num_levels=2, num_task_experts=1, num_shared_experts=2, expert_hidden=(6,), tower_hidden=(3,))
    level = 4 * linear(10, 6) + 2 * linear(10, 3) + linear(10, 4)  # experts, task gates, shared gate
    last = 4 * linear(6, 6) + 2 * linear(6, 3)
    assert sum(p.numel() for p in ple.parameters()) == level + last + 2 * (linear(6, 3) + linear(3, 1))


def test_stacked_linear_copies_are_nn_linear_layers():
    torch.manual_seed(0)
    stacked = StackedLinear(3, 5, 4)
    x = torch.randn(3, 6, 5)
    for g in range(3):
        layer = torch.nn.Linear(5, 4)
        with torch.no_grad():
            layer.weight.copy_(stacked.weight[g].T)
            layer.bias.copy_(stacked.bias[g, 0])
        torch.testing.assert_close(stacked(x)[g], layer(x[g]))
    bound = 5 ** -0.5  # nn.Linear's init
    assert stacked.weight.abs().max() <= bound and stacked.bias.abs().max() <= bound
    assert mlp(5, (4, 2), copies=3)(x).shape == (3, 6, 2)
    with pytest.raises(ValueError, match="copies"):
        StackedLinear(0, 5, 4)


@pytest.mark.parametrize("make,words", [
    (lambda: MMoE(8, 2, 3, (16, 0), (4,)), r"expert_hidden must be one or more integer widths >= 1; got \[16, 0\]"),
    (lambda: MMoE(8, 2, 3, (), (4,)), r"expert_hidden must be one or more integer widths >= 1; got \[\]"),
    (lambda: PLE(8, 2, expert_hidden=(0,)), r"expert_hidden must be one or more integer widths >= 1; got \[0\]"),
    (lambda: CGC(8, 2, tower_hidden=(0,)), r"tower_hidden must be integer widths >= 1; got \[0\]"),
    (lambda: SharedBottom(8, 2, bottom_hidden=(32, -1)), r"bottom_hidden must be one or more integer widths >= 1; got \[32, -1\]"),
    (lambda: MMoE(8, 2, 3, (16.0,), (4,)), r"expert_hidden must be one or more integer widths >= 1; got \[16.0\]"),
])
def test_towers_name_a_bad_width(make, words):
    # (mlp's message showed the tower's widths with the output's 1 appended, and named no argument)
    with pytest.raises(ValueError, match=words):
        make()
    assert MMoE(8, 2, 3, (16,), ())(torch.randn(5, 8)).shape == (5, 2)  # a tower may be one linear layer


def test_field_embedding_reads_each_fields_table():
    torch.manual_seed(0)
    cardinalities = [4, 7, 2]
    embedding = FieldEmbedding(cardinalities, dim=3)
    summed = FieldEmbedding(cardinalities, dim=3, combine="sum")
    summed.load_state_dict(embedding.state_dict())
    ids = torch.stack([torch.randint(c, (11,)) for c in cardinalities], dim=1)
    tables = embedding.tables()
    assert [t.shape[0] for t in tables] == cardinalities
    expected = torch.cat([table[ids[:, f]] for f, table in enumerate(tables)], dim=1)
    torch.testing.assert_close(embedding(ids), expected, rtol=0, atol=0)
    torch.testing.assert_close(summed(ids), expected.view(11, 3, 3).sum(1))
    embedding(ids).square().sum().backward()
    for f, grad in enumerate(embedding.tables(embedding.weight.grad)):
        rows = torch.zeros_like(grad).index_add_(0, ids[:, f], 2 * tables[f][ids[:, f]].detach())
        torch.testing.assert_close(grad, rows)


def test_field_embedding_loads_a_state_dict_with_one_table_per_field():
    old = {f"tables.{f}.weight": torch.randn(c, 3) for f, c in enumerate([4, 7, 2])}
    embedding = FieldEmbedding([4, 7, 2], dim=3)
    embedding.load_state_dict(old)
    for table, saved in zip(embedding.tables(), old.values()):
        assert torch.equal(table, saved)


def test_field_embedding_skips_a_partial_state_dict_of_per_field_tables():
    """Only some ``tables.<f>.weight``: not joined (there is no table to join them into), left to
    load_state_dict to report, not a KeyError from the hook."""
    embedding = FieldEmbedding([4, 7, 2], dim=3)
    before = embedding.weight.detach().clone()
    result = embedding.load_state_dict({"tables.0.weight": torch.randn(4, 3)}, strict=False)
    assert result.missing_keys == ["weight"] and result.unexpected_keys == ["tables.0.weight"]
    assert torch.equal(embedding.weight, before)


def test_a_compiled_field_embedding_rejects_an_id_equal_to_its_fields_size():
    """Compiled, the id check is a device assert: id 4 of a field of 4 ids is outside the table (it
    would read the next field's first row), as the eager check says."""
    embedding = FieldEmbedding([4, 7, 2], dim=3)
    ids = torch.tensor([[3, 6, 1], [4, 0, 0]])
    with pytest.raises(ValueError, match=r"ids\[:, 0\] must be in \[0, 4\); got 4"):
        embedding(ids)
    torch._dynamo.reset()
    compiled = torch.compile(embedding, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids[:1]), embedding(ids[:1]))
    with pytest.raises(RuntimeError):  # the device assert, on the CPU at once
        compiled(ids)


def test_field_embedding_rejects_an_id_outside_its_fields_table():
    embedding = FieldEmbedding([4, 7, 2], dim=3)
    ids = torch.tensor([[0, 0, 0], [3, 6, 1], [1, 2, 2]])  # field 2 has ids 0 and 1 only
    with pytest.raises(ValueError, match=r"ids\[:, 2\] must be in \[0, 2\); got 2"):
        embedding(ids)
    with pytest.raises(ValueError, match=r"ids\[:, 0\] must be in \[0, 4\); got -1"):
        embedding(torch.tensor([[-1, 0, 0]]))
    # Unchecked, id 4 of field 0 reads field 1's first row: the reason the check is on by default.
    unchecked = FieldEmbedding([4, 7, 2], dim=3, validate_args=False)
    assert torch.equal(unchecked(torch.tensor([[4, 0, 0]]))[0, :3], unchecked.tables()[1][0])


def test_impression_data_checks_the_ids_once():
    def data(sparse):
        n = len(sparse)
        return ImpressionData(sparse=torch.tensor(sparse), dense=torch.zeros(n, 1), click=torch.zeros(n),
                              purchase=torch.zeros(n), user=torch.zeros(n, dtype=torch.long), timestamp=torch.zeros(n),
                              field_names=("user", "item"), cardinalities=(3, 5), dense_names=("d",))

    assert len(data([[0, 4], [2, 0]])) == 2
    with pytest.raises(ValueError, match=r"sparse\[:, 1\] \('item'\) must be in \[0, 5\); got 5"):
        data([[0, 5], [2, 0]])
    with pytest.raises(ValueError, match=r"sparse must have shape \(N, 2\)"):
        data([[0, 1, 2]])


@pytest.mark.parametrize("make,words", [
    (lambda: MMoE(8, num_tasks=2.5), "num_tasks must be an integer; got 2.5"),
    (lambda: MMoE(8, 2, num_experts=4.0), "num_experts must be an integer; got 4.0"),
    (lambda: PLE(8, 2, num_levels=2.0), "num_levels must be an integer; got 2.0"),
    (lambda: PLE(8, 2, 2, 1.5), "num_task_experts must be an integer; got 1.5"),  # was 'copies ... got 5.0'
    (lambda: CGC(8, 2, num_task_experts=True), "num_task_experts must be an integer; got True"),  # was accepted
    (lambda: PLE(8, 2, num_task_experts=-1), "num_task_experts must be >= 0; got -1"),
    (lambda: SharedBottom(8, True), "num_tasks must be an integer; got True"),
    (lambda: FieldEmbedding([3], dim=2.5), "dim must be an integer; got 2.5"),
    (lambda: FieldEmbedding([3, 4.7], dim=2), r"cardinalities\[1\] must be an integer; got 4.7"),
    (lambda: MMoE(8.0, 2), "input_dim must be an integer; got 8.0"),
    (lambda: MMoE(8, 2, dropout=-0.3), r"dropout must be a number in \[0, 1\); got -0.3"),
    (lambda: SharedBottom(8, 2, dropout=1.0), r"dropout must be a number in \[0, 1\); got 1.0"),
])
def test_sizes_must_be_integers_and_dropout_a_probability(make, words):
    # a float or bool count passed `value < 1` and failed deep in torch (a float cardinality was
    # truncated); a negative dropout meant no dropout at all
    with pytest.raises(ValueError, match=words):
        make()
    assert MMoE(8, 2, dropout=0.5)(torch.randn(3, 8)).shape == (3, 2)


@pytest.mark.parametrize("make", [
    lambda: MMoE(10, 2, num_experts=3, expert_hidden=(8,)),
    lambda: PLE(10, 2, num_task_experts=1, num_shared_experts=1, expert_hidden=(8,)),
    lambda: SharedBottom(10, 2, bottom_hidden=(8,)),
])
def test_backbones_name_input_dim_for_an_input_of_another_shape(make):
    # MMoE failed inside a batched matmul with the stacked experts' shapes, and read a 1-D
    # input as an internal (T + 1, B, input_dim) stack
    backbone = make()
    for shape in [(4, 9), (10,), (2, 4, 10)]:
        with pytest.raises(ValueError, match=rf"x must have shape \(B, 10\) \(input_dim=10\); got {re.escape(str(shape))}"):
            backbone(torch.randn(shape))
    assert backbone(torch.randn(4, 10)).shape == (4, 2)


@pytest.mark.parametrize("validate_args", [True, False])
@pytest.mark.parametrize("backbone", ["mmoe", "ple"])
def test_a_model_compiles_as_one_graph_equal_to_eager(backbone, validate_args):
    """``--compile`` in the recipe: forward and backward of the whole model in one graph (the id
    check becomes a device assert), equal to eager."""
    from mlloss.models import DotInteraction, MultiTaskModel

    torch.manual_seed(0)
    cardinalities = [5, 7, 3]
    head = (MMoE(3 * 4 + 3 + 2, 2, num_experts=3, expert_hidden=(8,), tower_hidden=(4,)) if backbone == "mmoe"
            else PLE(3 * 4 + 3 + 2, 2, num_levels=2, num_task_experts=1, num_shared_experts=2, expert_hidden=(8,)))
    model = MultiTaskModel(FieldEmbedding(cardinalities, 4, validate_args=validate_args), head, DotInteraction(3, 4))
    ids = torch.stack([torch.randint(c, (10,)) for c in cardinalities], dim=1)
    dense = torch.randn(10, 2)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    expected = model(ids, dense)
    expected_grads = torch.autograd.grad(expected.square().sum(), list(model.parameters()))
    out = compiled(ids, dense)
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want)
    if validate_args:
        with pytest.raises(RuntimeError):  # the device assert, on the CPU at once
            compiled(ids.clone().fill_(6), dense)


def test_a_model_made_on_the_meta_device_and_loaded_equals_the_original():
    # FSDP-style deferred init: build on "meta", to_empty(), load_state_dict. The index buffers
    # (field offsets, DotInteraction's pick, the gates' expert lists) are not in the state_dict:
    # they held uninitialised memory after to_empty (offsets [94374747191920, ...]), and the model
    # crashed or read other fields' rows. They are rebuilt on every move now.
    from mlloss.models import DotInteraction, MultiTaskModel

    def make():
        embedding = FieldEmbedding([50, 60, 80], dim=4)
        return MultiTaskModel(embedding, PLE(3 * 4 + 3, num_tasks=2, num_levels=2, expert_hidden=(8,)),
                              DotInteraction(3, 4))

    torch.manual_seed(0)
    original = make()
    with torch.device("meta"):
        deferred = make()
    deferred.to_empty(device="cpu")
    deferred.load_state_dict(original.state_dict())
    for name, buffer in original.named_buffers():
        assert torch.equal(dict(deferred.named_buffers())[name], buffer), name
    ids = torch.stack([torch.randint(50, (16,)), torch.randint(60, (16,)), torch.randint(80, (16,))], dim=1)
    torch.testing.assert_close(deferred(ids), original(ids), rtol=0, atol=0)
    assert deferred.double().backbone.levels[0].gated_experts.dtype == torch.int64  # moves keep index dtypes
