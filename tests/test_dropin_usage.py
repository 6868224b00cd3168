"""The losses inside other people's training code: the calls a recommender's existing loop makes
that the library's own loops do not (torch.func transforms, mixed precision, a column of a
multi-task output, mixing weights held as tensors, models built on the meta device, configs
with a wrong option). Each value is checked against a float64 brute force over every pair,
written here from docs/loss-spec.md."""

from __future__ import annotations

import copy
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

import mlloss

BACKENDS = ["auto", pytest.param("triton", marks=pytest.mark.triton)]


def brute_auc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Bipartite logistic AUC loss, mean over the groups with a valid pair, every pair formed."""
    scores, labels = scores.to(torch.float64), labels.to(torch.float64).reshape(-1)
    groups = torch.zeros_like(labels, dtype=torch.int64) if groups is None else groups
    per_group = []
    for group in torch.unique(groups):
        member = groups == group
        positive, negative = scores[member & (labels == 1)], scores[member & (labels == 0)]
        if len(positive) and len(negative):
            margins = positive[:, None] - negative[None, :]
            per_group.append(torch.log1p(torch.exp(-margins)).mean())
    return torch.stack(per_group).mean()


def batch(n: int = 24, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=gen) < 0.4).to(torch.float32)
    labels[:2] = torch.tensor([1.0, 0.0])
    return torch.randn(n, generator=gen, dtype=torch.float64), labels, torch.randint(0, 3, (n,), generator=gen)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_func_grad_and_jacrev_give_the_brute_force_gradient(backend):
    # Found by review: torch.func.grad raised torch's "must override the setup_context staticmethod",
    # which asks the user to change mlloss's own autograd.Function.
    scores, labels, groups = batch()
    loss = mlloss.AUCLoss(backend=backend)
    leaf = scores.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(brute_auc(leaf, labels, groups), leaf)
    by_grad = torch.func.grad(lambda s: loss(s, labels, groups))(scores)
    by_jacrev = torch.func.jacrev(lambda s: loss(s, labels, groups))(scores)
    torch.testing.assert_close(by_grad, expected, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(by_jacrev, expected, rtol=1e-9, atol=1e-12)
    # and with respect to a model's parameters (functional_call), as meta-learning loops take it
    model = torch.nn.Linear(3, 1).double()
    features = torch.randn(scores.shape[0], 3, dtype=torch.float64)
    params = {name: p.detach() for name, p in model.named_parameters()}
    grads = torch.func.grad(lambda p: loss(torch.func.functional_call(model, p, (features,)), labels, groups))(params)
    brute_auc(model(features)[:, 0], labels, groups).backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_kept_from_a_finished_torch_func_transform_gives_the_plain_loss(backend):
    # Eager calls skip torch.autograd.Function.apply's Python wrapper (mlloss.ops.fused), so they
    # unwrap such tensors themselves, as that wrapper does: a closure that keeps its argument for
    # later (a logging hook) hands the loss a wrapper whose transform has ended.
    scores, labels, groups = batch()
    loss = mlloss.AUCLoss(backend=backend)
    kept = []

    def keeping(s):
        kept.append(s)
        return loss(s, labels, groups)

    torch.func.grad(keeping)(scores)
    value = loss(kept[0], labels, groups)
    torch.testing.assert_close(value, brute_auc(scores, labels, groups), rtol=1e-9, atol=1e-12)
    leaf = scores.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(brute_auc(leaf, labels, groups), leaf)
    leaf = scores.clone().requires_grad_(True)
    (by_loss,) = torch.autograd.grad(loss(leaf, labels, groups), leaf)
    torch.testing.assert_close(by_loss, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "transform,message",
    [
        (lambda f, s: torch.vmap(f)(torch.stack([s, s])), "do not support torch.vmap"),
        (lambda f, s: torch.func.jvp(f, (s,), (torch.ones_like(s),)), "forward-mode AD"),
        (lambda f, s: torch.func.hessian(f)(s), "forward-mode AD"),
        (lambda f, s: torch.func.grad(lambda t: torch.func.grad(f)(t).sum())(s), "second derivatives"),
    ],
    ids=["vmap", "jvp", "hessian", "grad-of-grad"],
)
def test_unsupported_torch_func_transforms_say_so(transform, message):
    scores, labels, groups = batch()
    loss = mlloss.AUCLoss()
    with pytest.raises(RuntimeError, match=message):
        transform(lambda s: loss(s, labels, groups), scores)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bf16_autocast_column_of_a_multitask_head_gets_the_gradient(backend):
    # The loss called inside and outside the autocast region, on the second column of a (N, 2) head:
    # the value is the brute force's on the same rounded scores, and only that column's weights move.
    scores, labels, groups = batch()
    features = torch.randn(scores.shape[0], 4)
    loss = mlloss.AUCLoss(backend=backend)
    for inside in (True, False):
        head = torch.nn.Linear(4, 2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            column = head(features)[:, 1]
            value = loss(column, labels, groups) if inside else None
        value = loss(column, labels, groups) if value is None else value
        assert column.dtype == torch.bfloat16 and value.dtype == torch.float32
        rounded = column.detach().double().requires_grad_(True)
        reference = brute_auc(rounded, labels, groups)
        reference.backward()
        value.backward()
        torch.testing.assert_close(value.double(), reference.detach(), rtol=1e-6, atol=1e-7)
        assert head.weight.grad[0].abs().sum() == 0 and head.weight.grad[1].abs().sum() > 0
        # the bf16 head's backward rounds its gradient: compare with the brute force's at bf16 precision
        expected = (rounded.grad[:, None] * features.double()).sum(0)
        torch.testing.assert_close(head.weight.grad[1].double(), expected, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("build", [mlloss.LoALoss, mlloss.LaALoss], ids=["LoALoss", "LaALoss"])
def test_mixing_weights_that_require_grad_are_refused(build):
    # Found by review: a Parameter was accepted and never learned (the loss does not differentiate its
    # weights), and the module then held a graph node: copy.deepcopy (EMA, SWA's AveragedModel) raised
    # "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol".
    with pytest.raises(TypeError, match=r"weights must be constants .*requires grad.*weights\.detach\(\)"):
        build(torch.nn.Parameter(torch.tensor([1.0, 2.0])))
    copy.deepcopy(build(torch.nn.Parameter(torch.tensor([1.0, 2.0])).detach()))


def test_mixing_weights_are_copied_not_shared_with_the_callers_tensor():
    # Found by review: float64 weights were the caller's tensor itself, so an in-place change of it
    # (a schedule written into the same tensor) silently changed the loss of a module already built.
    scores, labels, groups = batch()
    two_labels = torch.stack([labels, 1 - labels], dim=1)
    weights = torch.tensor([1.0, 3.0], dtype=torch.float64)
    loss = mlloss.LoALoss(weights)
    weights.mul_(10)
    expected = brute_auc(scores, two_labels[:, 0], groups) + 3.0 * brute_auc(scores, two_labels[:, 1], groups)
    torch.testing.assert_close(loss(scores, two_labels, groups), expected, rtol=1e-9, atol=1e-12)


def test_losses_with_weights_build_under_the_meta_device():
    # Found by review: a model built under ``torch.device("meta")`` (large-model initialisation, then
    # load_state_dict(..., assign=True)) failed in LoALoss/LaALoss.__init__ with
    # "Tensor.item() cannot be called on meta tensors".
    class Ranker(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3, 1, dtype=torch.float64)
            self.loa = mlloss.LoALoss([1.0, 3.0])
            self.laa = mlloss.LaALoss([1.0, 3.0])

    with torch.device("meta"):
        model = Ranker()
    model.load_state_dict(Ranker().state_dict(), assign=True)
    scores, labels, groups = batch()
    two_labels = torch.stack([labels, 1 - labels], dim=1)
    expected = brute_auc(scores, two_labels[:, 0], groups) + 3.0 * brute_auc(scores, two_labels[:, 1], groups)
    torch.testing.assert_close(model.loa(scores, two_labels, groups), expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="weights must hold values; got a meta tensor"):
        mlloss.LoALoss(torch.ones(2, device="meta"))


def test_loa_materialised_from_the_meta_device_holds_its_constants_and_empty_counts():
    # Found by review: to_empty() (FSDP's deferred init, Lightning's empty_init) left the weights,
    # the priors and the running counts uninitialised (about 1e-310: the loss about 0), and
    # load_state_dict restores only the counts (the constants are not in the state dict).
    constructions = {  # name: LoALoss's (weights, other options)
        "fixed": ([1.0, 3.0], {}),
        "balanced": ("balanced", {"num_labels": 2}),
        "given priors": ("balanced", {"priors": [0.4, 0.05]}),
    }
    scores, labels, groups = batch()
    two_labels = torch.stack([labels, (torch.arange(len(labels)) % 5 == 0).float()], dim=1)
    for name, (weights, options) in constructions.items():
        fresh = mlloss.LoALoss(weights, **options)
        with torch.device("meta"):
            materialised = mlloss.LoALoss(weights, **options)
        materialised.to_empty(device="cpu")
        for buffer in ("weights", "priors", "seen_positives", "seen_items"):
            got, expected = getattr(materialised, buffer), getattr(fresh, buffer)
            assert got is None if expected is None else torch.equal(got, expected), (name, buffer)
        torch.testing.assert_close(materialised(scores, two_labels, groups), fresh(scores, two_labels, groups), rtol=0, atol=0)
    # the fixed weights' loss, against the brute force
    with torch.device("meta"):
        loa = mlloss.LoALoss([1.0, 3.0])
    loa.to_empty(device="cpu")
    expected = brute_auc(scores, two_labels[:, 0], groups) + 3.0 * brute_auc(scores, two_labels[:, 1], groups)
    torch.testing.assert_close(loa(scores, two_labels, groups), expected, rtol=1e-9, atol=1e-12)


def test_balanced_loa_made_on_the_meta_device_loads_a_state_dict_by_assignment():
    # load_state_dict(sd, assign=True) (loading without a copy) takes the running counts; the weights
    # and priors, which no state dict holds, are rebuilt beside them (they stayed on "meta").
    scores, labels, groups = batch()
    two_labels = torch.stack([labels, (torch.arange(len(labels)) % 5 == 0).float()], dim=1)
    trained = mlloss.LoALoss("balanced", priors=[0.3, 0.1])
    trained(scores, two_labels, groups)  # running counts to load
    with torch.device("meta"):
        loaded = mlloss.LoALoss("balanced", priors=[0.3, 0.1])
    loaded.load_state_dict(trained.state_dict(), assign=True)
    for name, buffer in loaded.named_buffers():
        assert not buffer.is_meta and torch.equal(buffer, getattr(trained, name)), name
    torch.testing.assert_close(loaded.eval()(scores, two_labels, groups), trained.eval()(scores, two_labels, groups),
                               rtol=0, atol=0)


def test_balanced_loa_in_training_mode_under_inference_mode_keeps_normal_buffers():
    # Found by review: the running counts became inference tensors, so a later in-place write failed
    # ("Inplace update to inference tensor outside InferenceMode"): load_state_dict, DDP's broadcast.
    loss = mlloss.LoALoss("balanced", num_labels=2)
    scores, labels, _ = batch()
    two_labels = torch.stack([labels, 1 - labels], dim=1)
    with torch.inference_mode():
        loss(scores, two_labels)
    assert not loss.seen_items.is_inference() and not loss.seen_positives.is_inference()
    torch.testing.assert_close(loss.seen_positives, two_labels.sum(0).double(), rtol=0, atol=0)
    loss.load_state_dict(mlloss.LoALoss("balanced", num_labels=2).state_dict())
    assert float(loss.seen_items) == 0.0


@pytest.mark.parametrize(
    "name,options,message",
    [
        ("auc", {"lam": 1.0},
         r"build_loss\('auc'\) got unknown option\(s\) 'lam'; it takes surrogate, .*'lam' is an option of 'bce\+<name>'"),
        ("bce+auc", {"lamda": 1.0},
         r"build_loss\('bce\+auc'\) got unknown option\(s\) 'lamda'; it takes lam, ranking_input, inputs, surrogate"),
        ("pdaom", {"pairs": "all"},
         r"build_loss\('pdaom'\) got unknown option\(s\) 'pairs'; it takes surrogate, margin, temperature"),
    ],
)
def test_build_loss_names_the_unknown_option_and_what_the_loss_takes(name, options, message):
    # Before: "AUCLoss.__init__() got an unexpected keyword argument 'lam'", which names neither the
    # config's loss name nor the options it takes.
    with pytest.raises(TypeError, match=message):
        mlloss.build_loss(name, **options)
