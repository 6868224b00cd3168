"""mlloss.models against textbook models built from one ``nn.Module`` per expert, gate and tower.

The backbones run each level's experts, its task gates and the task towers as stacked layers
(:class:`~mlloss.models.StackedLinear`). The references here are the papers' figures in plain
PyTorch modules: MMoE (Ma et al., KDD 2018, Eq. 5-6), CGC and PLE (Tang et al., RecSys 2020,
Eq. 2-6, a shared gate over all experts at every level but the last), shared-bottom, and ESMM
(Ma et al., SIGIR 2018: pCTCVR = pCTR * pCVR). The stacked weights are copied into the references
one expert (gate, tower) at a time, and outputs and every gradient are compared in float64.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlloss.models import CGC, MMoE, PLE, DotInteraction, FieldEmbedding, MultiTaskModel, SharedBottom, StackedLinear


class RefMLP(nn.Module):
    """Linear layers of widths ``hidden``, each but (with ``last_activation=False``) the last
    followed by ReLU and dropout."""

    def __init__(self, input_dim, hidden, dropout=0.0, last_activation=True):
        super().__init__()
        widths = [input_dim, *hidden]
        self.linears = nn.ModuleList(nn.Linear(i, o) for i, o in zip(widths[:-1], widths[1:]))
        self.dropout = nn.Dropout(dropout)
        self.last_activation = last_activation

    def forward(self, x):
        for i, linear in enumerate(self.linears):
            x = linear(x)
            if self.last_activation or i < len(self.linears) - 1:
                x = self.dropout(torch.relu(x))
        return x


def _tower(input_dim, tower_hidden, dropout):
    return RefMLP(input_dim, [*tower_hidden, 1], dropout, last_activation=False)


class RefMMoE(nn.Module):
    """y_t = h_t(sum_e softmax(W_t x + b_t)_e f_e(x)) (the gates carry a bias, as the stacked ones)."""

    def __init__(self, input_dim, num_tasks, num_experts, expert_hidden, tower_hidden, dropout=0.0):
        super().__init__()
        self.experts = nn.ModuleList(RefMLP(input_dim, expert_hidden, dropout) for _ in range(num_experts))
        self.gates = nn.ModuleList(nn.Linear(input_dim, num_experts) for _ in range(num_tasks))
        self.towers = nn.ModuleList(_tower(expert_hidden[-1], tower_hidden, dropout) for _ in range(num_tasks))

    def forward(self, x):
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)  # (B, E, H)
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            weights = F.softmax(gate(x), dim=1)
            logits.append(tower((weights.unsqueeze(2) * experts).sum(1))[:, 0])
        return torch.stack(logits, dim=1)


class RefExtractionLevel(nn.Module):
    """One CGC/PLE level: task t's gate, reading t's input, mixes t's experts (reading t's input)
    and the shared experts (reading the shared input); the optional shared gate, reading the shared
    input, mixes every expert of the level."""

    def __init__(self, input_dim, num_tasks, num_task_experts, num_shared_experts, expert_hidden, shared_gate, dropout):
        super().__init__()
        def experts(n):
            return nn.ModuleList(RefMLP(input_dim, expert_hidden, dropout) for _ in range(n))
        self.task_experts = nn.ModuleList(experts(num_task_experts) for _ in range(num_tasks))
        self.shared_experts = experts(num_shared_experts)
        self.task_gates = nn.ModuleList(
            nn.Linear(input_dim, num_task_experts + num_shared_experts) for _ in range(num_tasks))
        self.shared_gate = (nn.Linear(input_dim, num_tasks * num_task_experts + num_shared_experts)
                            if shared_gate else None)

    def forward(self, task_inputs, shared_input):
        shared = [expert(shared_input) for expert in self.shared_experts]
        own = [[expert(h) for expert in experts] for experts, h in zip(self.task_experts, task_inputs)]
        outputs = []
        for gate, h, mine in zip(self.task_gates, task_inputs, own):
            weights = F.softmax(gate(h), dim=1)
            outputs.append(sum(weights[:, [e]] * out for e, out in enumerate(mine + shared)))
        if self.shared_gate is None:
            return outputs, None
        weights = F.softmax(self.shared_gate(shared_input), dim=1)
        everything = [out for mine in own for out in mine] + shared
        return outputs, sum(weights[:, [e]] * out for e, out in enumerate(everything))


class RefPLE(nn.Module):
    def __init__(self, input_dim, num_tasks, num_levels, num_task_experts, num_shared_experts, expert_hidden,
                 tower_hidden, dropout=0.0):
        super().__init__()
        dims = [input_dim] + [expert_hidden[-1]] * (num_levels - 1)
        self.levels = nn.ModuleList(
            RefExtractionLevel(dim, num_tasks, num_task_experts, num_shared_experts, expert_hidden,
                               shared_gate=level < num_levels - 1, dropout=dropout)
            for level, dim in enumerate(dims))
        self.towers = nn.ModuleList(_tower(expert_hidden[-1], tower_hidden, dropout) for _ in range(num_tasks))

    def forward(self, x):
        task_inputs, shared_input = [x] * len(self.towers), x
        for level in self.levels:
            task_inputs, shared_input = level(task_inputs, shared_input)
        return torch.stack([tower(h)[:, 0] for tower, h in zip(self.towers, task_inputs)], dim=1)


class RefSharedBottom(nn.Module):
    def __init__(self, input_dim, num_tasks, bottom_hidden, tower_hidden, dropout=0.0):
        super().__init__()
        self.bottom = RefMLP(input_dim, bottom_hidden, dropout)
        self.towers = nn.ModuleList(_tower(bottom_hidden[-1], tower_hidden, dropout) for _ in range(num_tasks))

    def forward(self, x):
        h = self.bottom(x)
        return torch.stack([tower(h)[:, 0] for tower in self.towers], dim=1)


# --- copying the stacked weights into the references ---------------------------------------------

def _linears(sequential):
    return [layer for layer in sequential if isinstance(layer, (nn.Linear, StackedLinear))]


def _copy_linear(pairs, ref: nn.Linear, layer, g=None):
    """ref <- copy g of the stacked ``layer`` (or the nn.Linear ``layer``); records the pair."""
    with torch.no_grad():
        if g is None:
            ref.weight.copy_(layer.weight)
            ref.bias.copy_(layer.bias)
        else:
            ref.weight.copy_(layer.weight[g].T)
            ref.bias.copy_(layer.bias[g, 0])
    pairs.append((ref, layer, g))


def _copy_mlp(pairs, ref: RefMLP, sequential, g=None):
    stacked = _linears(sequential)
    assert len(stacked) == len(ref.linears)
    for ref_linear, layer in zip(ref.linears, stacked):
        _copy_linear(pairs, ref_linear, layer, g)


def _copy_towers(pairs, ref, model):
    for t, tower in enumerate(ref.towers):
        _copy_mlp(pairs, tower, model.towers, t)


def _copy_level(pairs, ref: RefExtractionLevel, level):
    n_t = level.num_task_experts
    tasks = level.num_tasks
    for t, experts in enumerate(ref.task_experts):  # stacked order: task 0's, task 1's, ..., shared
        for i, expert in enumerate(experts):
            _copy_mlp(pairs, expert, level.experts, t * n_t + i)
    for i, expert in enumerate(ref.shared_experts):
        _copy_mlp(pairs, expert, level.experts, tasks * n_t + i)
    for t, gate in enumerate(ref.task_gates):
        _copy_linear(pairs, gate, level.task_gates, t)
    assert (ref.shared_gate is None) == (level.shared_gate is None)
    if ref.shared_gate is not None:
        _copy_linear(pairs, ref.shared_gate, level.shared_gate)


def _copy_ple(pairs, ref, model):
    assert len(ref.levels) == len(model.levels)
    for ref_level, level in zip(ref.levels, model.levels):
        _copy_level(pairs, ref_level, level)
    _copy_towers(pairs, ref, model)


def _copy_mmoe(pairs, ref, model):
    (level,) = model.levels
    for e, expert in enumerate(ref.experts):
        _copy_mlp(pairs, expert, level.experts, e)
    for t, gate in enumerate(ref.gates):
        _copy_linear(pairs, gate, level.task_gates, t)
    _copy_towers(pairs, ref, model)


def _copy_shared_bottom(pairs, ref, model):
    _copy_mlp(pairs, ref.bottom, model.bottom)
    _copy_towers(pairs, ref, model)


def _stacked_grad(layer, g, name):
    grad = getattr(layer, name).grad
    if g is None:
        return grad
    return grad[g].T if name == "weight" else grad[g, 0]


CASES = {
    "mmoe": (lambda d: MMoE(7, 2, num_experts=3, expert_hidden=(6, 5), tower_hidden=(4,), dropout=d),
             lambda d: RefMMoE(7, 2, 3, (6, 5), (4,), d), _copy_mmoe),
    "mmoe-3-tasks-linear-towers": (lambda d: MMoE(7, 3, num_experts=2, expert_hidden=(5,), tower_hidden=(), dropout=d),
                                   lambda d: RefMMoE(7, 3, 2, (5,), (), d), _copy_mmoe),
    "mmoe-1-task": (lambda d: MMoE(7, 1, num_experts=4, expert_hidden=(3,), tower_hidden=(2, 3), dropout=d),
                    lambda d: RefMMoE(7, 1, 4, (3,), (2, 3), d), _copy_mmoe),
    "cgc": (lambda d: CGC(7, 2, num_task_experts=2, num_shared_experts=1, expert_hidden=(6, 5), tower_hidden=(4,),
                          dropout=d),
            lambda d: RefPLE(7, 2, 1, 2, 1, (6, 5), (4,), d), _copy_ple),
    "cgc-as-mmoe": (lambda d: CGC(7, 2, num_task_experts=0, num_shared_experts=3, expert_hidden=(5,), dropout=d),
                    lambda d: RefMMoE(7, 2, 3, (5,), (16,), d), _copy_mmoe),
    "ple-2-levels": (lambda d: PLE(7, 2, num_levels=2, num_task_experts=1, num_shared_experts=2, expert_hidden=(6,),
                                   tower_hidden=(3,), dropout=d),
                     lambda d: RefPLE(7, 2, 2, 1, 2, (6,), (3,), d), _copy_ple),
    "ple-3-levels-3-tasks": (lambda d: PLE(5, 3, num_levels=3, num_task_experts=2, num_shared_experts=1,
                                           expert_hidden=(4, 3), tower_hidden=(2,), dropout=d),
                             lambda d: RefPLE(5, 3, 3, 2, 1, (4, 3), (2,), d), _copy_ple),
    "ple-no-task-experts": (lambda d: PLE(6, 2, num_levels=2, num_task_experts=0, num_shared_experts=2,
                                          expert_hidden=(4,), tower_hidden=(3,), dropout=d),
                            lambda d: RefPLE(6, 2, 2, 0, 2, (4,), (3,), d), _copy_ple),
    "shared-bottom": (lambda d: SharedBottom(7, 3, bottom_hidden=(6, 5), tower_hidden=(4, 2), dropout=d),
                      lambda d: RefSharedBottom(7, 3, (6, 5), (4, 2), d), _copy_shared_bottom),
}


def _pair(name, dropout=0.0):
    make, make_ref, copy_weights = CASES[name]
    torch.manual_seed(0)
    model = make(dropout).double()
    for p in model.parameters():  # wider weights than the init: softmax gates far from uniform
        p.data.add_(torch.randn_like(p) * 0.5)
    ref = make_ref(dropout).double()
    pairs = []
    copy_weights(pairs, ref, model)
    return model, ref, pairs


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("name", list(CASES))
def test_stacked_backbone_equals_one_module_per_expert(name, dropout):
    """Outputs and the gradients of the input and of every weight, in float64, in eval mode (the
    dropout layers then pass their input through, in the stacked model as in the reference)."""
    model, ref, pairs = _pair(name, dropout)
    model.eval()
    ref.eval()
    # every stacked weight is read by exactly one reference parameter
    assert sum(p.numel() for p in ref.parameters()) == sum(p.numel() for p in model.parameters())
    assert len({id(p) for r, _, _ in pairs for p in r.parameters()}) == len(list(ref.parameters()))

    x = torch.randn(11, model.input_dim, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out, expected = model(x), ref(x_ref)
    assert out.shape == (11, len(ref.towers))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)

    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
    for ref_linear, layer, g in pairs:
        for attr in ("weight", "bias"):
            torch.testing.assert_close(_stacked_grad(layer, g, attr), getattr(ref_linear, attr).grad,
                                       rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["mmoe", "ple-2-levels", "shared-bottom"])
def test_dropout_is_active_in_training_and_at_the_documented_places(name):
    """Training mode drops units (a different output per call, the eval output on average); the
    dropout layers sit where the reference has them: after each hidden ReLU, never on the logit."""
    model, ref, _ = _pair(name, dropout=0.3)
    x = torch.randn(4, model.input_dim, dtype=torch.float64)
    model.eval()
    evaluated = model(x)
    model.train()
    torch.manual_seed(1)
    first, second = model(x), model(x)
    assert not torch.equal(first, second) and not torch.equal(first, evaluated)
    torch.manual_seed(1)
    torch.testing.assert_close(model(x), first, rtol=0, atol=0)  # the seed fixes the masks
    for sequential in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        layers = list(sequential)
        relus = [i for i, layer in enumerate(layers) if isinstance(layer, nn.ReLU)]
        dropouts = [i for i, layer in enumerate(layers) if isinstance(layer, nn.Dropout)]
        assert dropouts == [i + 1 for i in relus] and all(layers[i].p == 0.3 for i in dropouts)
    assert isinstance(list(model.towers)[-1], StackedLinear)  # the logit: no ReLU, no dropout


def test_stacked_copies_draw_their_own_dropout_masks():
    """Each expert and tower of a stack drops its own units, as separate modules would: with every
    copy holding the same weights, the copies' outputs differ in training (one mask shared by the
    copies would keep them equal) and agree in eval mode."""
    torch.manual_seed(0)
    model = SharedBottom(6, 3, bottom_hidden=(5,), tower_hidden=(32,), dropout=0.5)
    mmoe = MMoE(6, 2, num_experts=3, expert_hidden=(32,), tower_hidden=(), dropout=0.5)
    with torch.no_grad():
        for stack in [*_linears(model.towers), *_linears(mmoe.levels[0].experts)]:
            stack.weight.copy_(stack.weight[:1].expand_as(stack.weight))
            stack.bias.copy_(stack.bias[:1].expand_as(stack.bias))
    x = torch.randn(4, 6)
    experts = mmoe.levels[0].experts
    h = x.expand(3, 4, 6)
    for train in (True, False):
        model.train(train)
        experts.train(train)
        logits, outputs = model(x), experts(h)
        assert torch.equal(logits[:, 0], logits[:, 1]) != train
        assert torch.equal(outputs[0], outputs[1]) != train


def test_esmm_is_the_product_of_the_ctr_and_cvr_probabilities():
    """MultiTaskModel(esmm=True) returns (pCTR, pCTCVR, other tasks) logits: sigmoid of the second
    column is sigmoid(ctr) * sigmoid(cvr) of the backbone's logits, in float64, and its gradient
    is that of logit(pCTR * pCVR)."""
    torch.manual_seed(0)
    cardinalities = [5, 6, 4]
    embedding = FieldEmbedding(cardinalities, 3)
    backbone = MMoE(3 * 3 + 3 + 2, 3, num_experts=2, expert_hidden=(5,), tower_hidden=(4,))
    model = MultiTaskModel(embedding, backbone, DotInteraction(3, 3), esmm=True).double()
    plain = MultiTaskModel(embedding, backbone, DotInteraction(3, 3)).double()
    ids = torch.stack([torch.randint(c, (9,)) for c in cardinalities], dim=1)
    dense = torch.randn(9, 2, dtype=torch.float64)
    out, logits = model(ids, dense), plain(ids, dense)
    p_ctr, p_cvr = torch.sigmoid(logits[:, 0]), torch.sigmoid(logits[:, 1])
    torch.testing.assert_close(torch.sigmoid(out[:, 1]), p_ctr * p_cvr, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(out[:, [0, 2]], logits[:, [0, 2]], rtol=0, atol=0)
    weights = torch.randn(9, dtype=torch.float64)
    grad = torch.autograd.grad((out[:, 1] * weights).sum(), backbone.levels[0].task_gates.weight)[0]
    want = torch.autograd.grad((torch.logit(p_ctr * p_cvr) * weights).sum(), backbone.levels[0].task_gates.weight)[0]
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


# --- module hygiene -------------------------------------------------------------------------------

def _model():
    cardinalities = [6, 9, 4]
    return MultiTaskModel(FieldEmbedding(cardinalities, 4), PLE(3 * 4 + 3 + 2, 2, num_levels=2, num_task_experts=1,
                                                                 num_shared_experts=2, expert_hidden=(5,),
                                                                 tower_hidden=(3,), dropout=0.2),
                          DotInteraction(3, 4), esmm=True)


def _batch():
    gen = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randint(c, (8,), generator=gen) for c in (6, 9, 4)], dim=1)
    return ids, torch.randn(8, 2, generator=gen)


def test_state_dict_deepcopy_and_pickle_give_the_same_model():
    torch.manual_seed(0)
    model = _model().eval()
    ids, dense = _batch()
    expected = model(ids, dense)
    torch.manual_seed(1)
    fresh = _model().eval()
    assert not torch.equal(fresh(ids, dense), expected)
    fresh.load_state_dict(model.state_dict())
    for other in [fresh, copy.deepcopy(model), pickle.loads(pickle.dumps(model))]:
        torch.testing.assert_close(other(ids, dense), expected, rtol=0, atol=0)
    assert set(model.state_dict()) == {name for name, _ in model.named_parameters()}  # buffers are constants


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_model_casts_its_weights_and_keeps_its_index_buffers(dtype):
    torch.manual_seed(0)
    model = _model().eval()
    ids, dense = _batch()
    expected = model.double()(ids, dense.double())
    cast = copy.deepcopy(model).to(dtype)
    assert all(p.dtype == dtype for p in cast.parameters())
    assert cast.embedding.offsets.dtype == torch.int64 and cast.backbone.levels[0].gated_experts.dtype == torch.int64
    out = cast(ids.int(), dense.to(dtype))  # int32 ids read the same rows
    assert out.dtype == dtype
    tolerance = {torch.float64: 1e-12, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


def _materialize_as_fsdp_does(model):
    """FSDP's deferred init (torch.distributed.fsdp._init_utils._materialize_meta_module): every
    module holding a parameter or a buffer of its own is moved with ``to_empty(recurse=False)``
    and its ``reset_parameters()`` called; one that has none fails the wrap."""
    with torch.no_grad():
        for module in model.modules():
            if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
                module.to_empty(device="cpu", recurse=False)
                for p in module.parameters(recurse=False):  # what uninitialised memory may hold
                    p.fill_(float("nan"))
                module.reset_parameters()


def test_deferred_init_on_the_meta_device_then_reset_parameters_initialises_every_weight():
    """Build on "meta", then materialise as FSDP does. Every parameter must be initialised as
    documented (StackedLinear as nn.Linear, the field tables N(0, 0.05^2)): with the same seed,
    the same weights as a model built on the CPU. StackedLinear and FieldEmbedding had no
    reset_parameters (their weights kept whatever memory ``to_empty`` gave them), nor had
    DotInteraction and ExtractionLevel, which hold buffers: FSDP(model) raised AttributeError."""
    torch.manual_seed(0)
    eager = _model()
    with torch.device("meta"):
        deferred = _model()
    torch.manual_seed(0)
    _materialize_as_fsdp_does(deferred)
    for (name, want), got in zip(eager.named_parameters(), deferred.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")
    for (name, want), got in zip(eager.named_buffers(), deferred.buffers()):
        assert torch.equal(got, want), name
    ids, dense = _batch()
    torch.testing.assert_close(deferred.eval()(ids, dense), eager.eval()(ids, dense), rtol=0, atol=0)


def test_a_model_made_on_the_meta_device_loads_a_state_dict_by_assignment():
    """``load_state_dict(sd, assign=True)`` into a model made on "meta" (loading without a copy)
    takes the loaded parameters; the index buffers, which no state dict holds, are rebuilt where
    they are. They stayed on "meta" and the forward failed ("Tensor on device meta")."""
    torch.manual_seed(0)
    eager = _model()
    with torch.device("meta"):
        deferred = _model()
    deferred.load_state_dict(eager.state_dict(), assign=True)
    assert not any(t.is_meta for t in [*deferred.parameters(), *deferred.buffers()])
    for (name, want), got in zip(eager.named_buffers(), deferred.buffers()):
        assert torch.equal(got, want), name
    ids, dense = _batch()
    torch.testing.assert_close(deferred.eval()(ids, dense), eager.eval()(ids, dense), rtol=0, atol=0)


def test_reset_parameters_draws_the_documented_initialisation():
    torch.manual_seed(0)
    embedding = FieldEmbedding([30_000, 20_000], 8)
    stacked = StackedLinear(4, 400, 50)
    with torch.no_grad():
        embedding.weight.fill_(7.0)
        stacked.weight.fill_(7.0)
        stacked.bias.fill_(7.0)
    embedding.reset_parameters()
    stacked.reset_parameters()
    assert abs(embedding.weight.mean().item()) < 1e-3 and abs(embedding.weight.std().item() - 0.05) < 1e-3
    bound = 400 ** -0.5  # nn.Linear's U(-1/sqrt(in), 1/sqrt(in)), for the weight and the bias
    for p in (stacked.weight, stacked.bias):
        assert p.abs().max() <= bound and p.abs().max() > 0.95 * bound
        assert abs(p.std().item() - bound / 3 ** 0.5) < 0.05 * bound  # the std of U(-b, b)


def test_training_steps_are_deterministic():
    def run():
        torch.manual_seed(0)
        model = _model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        ids, dense = _batch()
        for _ in range(3):
            optimizer.zero_grad()
            model(ids, dense).square().mean().backward()
            optimizer.step()
        return model.state_dict()

    first, second = run(), run()
    for name, value in first.items():
        assert torch.equal(value, second[name]), name


def test_field_embedding_handles_edge_batches_and_id_dtypes():
    torch.manual_seed(0)
    embedding = FieldEmbedding([4, 7, 2], 3)
    ids = torch.tensor([[0, 6, 1], [3, 0, 0]])
    for dtype in (torch.int32, torch.int16, torch.uint8):
        torch.testing.assert_close(embedding(ids.to(dtype)), embedding(ids), rtol=0, atol=0)
    assert embedding(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 9)
    assert MultiTaskModel(embedding, MMoE(9, 2))(torch.zeros(0, 3, dtype=torch.int32)).shape == (0, 2)
    with pytest.raises(ValueError, match=r"ids\[:, 1\] must be in \[0, 7\); got -1"):
        embedding(torch.tensor([[0, -1, 0]], dtype=torch.int8))
    with pytest.raises(ValueError, match=r"ids\[:, 2\] must be in \[0, 2\); got 1099511627776"):
        embedding(torch.tensor([[0, 0, 2**40]]))
    for bad in (ids.float(), ids.bool()):
        with pytest.raises(TypeError, match=rf"ids must be an integer tensor \(int64, int32, \.\.\.\); got dtype {bad.dtype}"):
            embedding(bad)
    # one parameter: a sparse optimizer's param group holds the whole embedding
    groups = [{"params": list(embedding.parameters()), "lr": 0.1}]
    assert [p.shape for p in groups[0]["params"]] == [(13, 3)]


@pytest.mark.parametrize("make,error,words", [
    (lambda: MMoE(8, 2, expert_hidden=64), ValueError, "expert_hidden must be a sequence of integer widths; got 64"),
    (lambda: MMoE(8, 2, tower_hidden=16), ValueError, "tower_hidden must be a sequence of integer widths; got 16"),
    (lambda: SharedBottom(8, 2, bottom_hidden=16), ValueError,
     "bottom_hidden must be a sequence of integer widths; got 16"),
    (lambda: PLE(8, 2, expert_hidden="64"), ValueError, "expert_hidden must be a sequence of integer widths; got '64'"),
    (lambda: FieldEmbedding(5, 2), ValueError, "cardinalities must be a sequence of integers; got 5"),
    (lambda: FieldEmbedding([3], 2, validate_args="no"), TypeError, "validate_args must be a bool; got 'no'"),
    (lambda: MultiTaskModel(FieldEmbedding([3], 2), MMoE(2, 2), esmm="no"), TypeError,
     "esmm must be a bool; got 'no'"),
    (lambda: MultiTaskModel(FieldEmbedding([3], 2), MMoE(2, 1), esmm=True), ValueError,
     r"esmm needs a backbone of at least 2 tasks \(ctr, cvr\); got num_tasks=1"),
])
def test_bad_constructor_arguments_are_named(make, error, words):
    # an int width failed in a loop with "'int' object is not iterable"; esmm="no" turned ESMM on
    with pytest.raises(error, match=words):
        make()


def test_sequences_of_numpy_and_torch_integers_are_sizes():
    np = pytest.importorskip("numpy")
    embedding = FieldEmbedding(np.array([3, 4]), 2)
    assert embedding.cardinalities == [3, 4] and FieldEmbedding(torch.tensor([3, 4]), 2).cardinalities == [3, 4]
    assert MMoE(8, 2, expert_hidden=np.array([6, 5]))(torch.randn(3, 8)).shape == (3, 2)


def test_field_tables_of_a_missing_gradient_are_an_error():
    embedding = FieldEmbedding([4, 7, 2], 3)
    assert [t.shape[0] for t in embedding.tables()] == [4, 7, 2]
    # was the parameter's own rows, read as a gradient
    with pytest.raises(ValueError, match=r"weight is None \(a \.grad before any backward\?\)"):
        embedding.tables(embedding.weight.grad)


@pytest.mark.parametrize("num_fields", [1, 2, 5])
def test_dot_interaction_appends_each_pair_of_fields_once(num_fields):
    """FM/DLRM: the input, then <e_i, e_j> for i < j in row-major order (no self-dots), and their
    gradient, against a loop over the pairs in float64."""
    torch.manual_seed(0)
    dim = 3
    interaction = DotInteraction(num_fields, dim).double()
    x = torch.randn(6, num_fields * dim, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    e = x_ref.view(6, num_fields, dim)
    dots = [(e[:, i] * e[:, j]).sum(1) for i in range(num_fields) for j in range(i + 1, num_fields)]
    expected = torch.cat([x_ref, torch.stack(dots, dim=1) if dots else x_ref[:, :0]], dim=1)
    out = interaction(x)
    assert out.shape[1] == interaction.output_dim == num_fields * dim + num_fields * (num_fields - 1) // 2
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-12, atol=1e-12)
