"""Task columns: ``AUCLoss`` / ``PDAOMLoss`` on (N, K) scores, each column with its own label
column, in one call (``AUCLoss.task_columns``, the op's score columns), and ``bce+<ranking>``
objectives that use it for their K tasks.

Every value and gradient is checked against the float64 brute force of ``reference`` applied to
each column alone, on both tiers, on the Triton tier's dense kernels and on its layout kernels
(forced), with and without groups, a mask and weights. Under ``TRITON_INTERPRET=1`` the kernels
run on the CPU; ``MLLOSS_TEST_DEVICE=cuda`` runs the same tests on a GPU.
"""

from __future__ import annotations

import itertools
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch
import torch.nn.functional as F

import mlloss
from reference import hardest_loss, pair_loss

DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.triton)]
# (backend, kernels): the PyTorch tier, and the Triton tier's dense and layout kernels
TIERS = [("torch", "dense"), pytest.param("triton", "dense", marks=pytest.mark.triton),
         pytest.param("triton", "layout", marks=pytest.mark.triton)]


def batch(seed: int, n: int = 80, tasks: int = 2):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, tasks + 1, generator=gen, dtype=torch.float64)  # a third head, as the recipe's
    priors = torch.tensor([0.35, 0.12, 0.5][:tasks], dtype=torch.float64)
    labels = (torch.rand(n, tasks, generator=gen, dtype=torch.float64) < priors).to(torch.float64)
    groups = torch.randint(0, 9, (n,), generator=gen) * 7 - 20  # negative and sparse ids
    mask = torch.rand(n, generator=gen) < 0.8
    return logits, labels, groups, mask


def use_kernels(kind: str, monkeypatch) -> None:
    """The Triton tier's dense kernels (this batch size's own), or its layout kernels (forced)."""
    if kind == "layout":
        pytest.importorskip("triton")
        from mlloss.kernels import dense

        monkeypatch.setattr(dense, "MAX_ITEMS", 0)


def reference_columns(scores, labels, groups, mask, *, hardest: bool, weights=(1.0, 1.0, 1.0), temperature=None):
    """sum_k w_k L_k(scores[:, k]) over the items of the mask, each column alone (float64 brute force)."""
    keep = torch.ones(len(scores), dtype=torch.bool) if mask is None else mask
    groups = None if groups is None else groups[keep]
    total = 0.0
    for k in range(scores.shape[1]):
        s, y = scores[keep, k], labels[keep, k]
        term = (hardest_loss(s, y, groups, surrogate="exponential", reduction="sum", temperature=temperature)
                if hardest else pair_loss(s, y, groups))
        total = total + weights[k] * term
    return total


# the soft max-violation pairs always take the layout kernels: once on the Triton tier
CASES = [pytest.param(backend, kind, name, grouped, masked, marks=[pytest.mark.triton] if backend == "triton" else [])
         for (backend, kind), name, grouped, masked in itertools.product(
             (("torch", "dense"), ("triton", "dense"), ("triton", "layout")), ("auc", "pdaom", "soft pdaom"),
             (False, True), (False, True))
         if not (name == "soft pdaom" and kind == "dense" and backend == "triton")]
LOSSES = {"auc": lambda backend: mlloss.AUCLoss(backend=backend),
          "pdaom": lambda backend: mlloss.PDAOMLoss(backend=backend),
          "soft pdaom": lambda backend: mlloss.PDAOMLoss(temperature=0.5, backend=backend)}  # layout kernels only


@pytest.mark.parametrize("backend,kind,name,grouped,masked", CASES)
def test_task_columns_equal_each_column_alone(backend, kind, name, grouped, masked, monkeypatch):
    use_kernels(kind, monkeypatch)
    logits, labels, groups, mask = batch(len(name) + 2 * grouped + masked)
    scores = logits[:, :2]
    groups, mask = (groups if grouped else None), (mask if masked else None)
    loss = LOSSES[name](backend)
    on_device = [None if t is None else t.to(DEVICE) for t in (labels, groups, mask)]
    x = scores.to(DEVICE).clone().requires_grad_(True)
    value = loss(x, *on_device)
    value.backward()
    y = scores.clone().requires_grad_(True)
    expected = reference_columns(y, labels, groups, mask, hardest=name != "auc",
                                 temperature=0.5 if name == "soft pdaom" else None)
    expected.backward()
    torch.testing.assert_close(value.detach().cpu(), expected.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=1e-8, atol=1e-12)
    assert x.grad.shape == scores.shape
    # parts: each column's own term and pairs, as a call on that column alone gives them
    for k in range(2):
        alone = LOSSES[name](backend)
        term = alone(scores[:, k].to(DEVICE), on_device[0][:, k], *on_device[1:])
        torch.testing.assert_close(loss.parts[f"label_loss/{k}"].cpu(), term.detach().cpu().double(), rtol=1e-9, atol=1e-12)
        assert float(loss.parts[f"valid_pairs/{k}"]) == float(alone.parts["valid_pairs"])
    assert float(loss.parts["valid_pairs"]) == sum(float(loss.parts[f"valid_pairs/{k}"]) for k in range(2))


@pytest.mark.parametrize("backend,kind", TIERS)
def test_weighted_task_columns_in_float32_and_three_tasks(backend, kind, monkeypatch):
    use_kernels(kind, monkeypatch)
    logits, labels, groups, _ = batch(7, n=120, tasks=3)
    weights = torch.tensor([0.5, 0.0, 3.0], dtype=torch.float64)  # a task of weight 0 adds nothing
    loss = mlloss.AUCLoss(backend=backend)
    logits = logits[:, :3]
    x = logits.float().to(DEVICE).requires_grad_(True)
    result = loss.task_columns(x, labels.to(DEVICE), groups.to(DEVICE), weights=weights.to(DEVICE))
    result.loss.backward()
    assert result.loss.dtype == torch.float32 and x.grad.dtype == torch.float32
    y = logits.clone().requires_grad_(True)
    expected = reference_columns(y, labels, groups, None, hardest=False, weights=weights.tolist())
    expected.backward()
    torch.testing.assert_close(result.loss.detach().cpu().double(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad.cpu().double(), y.grad, rtol=1e-4, atol=1e-6)
    assert torch.equal(x.grad[:, 1].cpu(), torch.zeros(120))  # weight 0: no gradient at all


@pytest.mark.parametrize("backend", BACKENDS)
def test_task_columns_are_deterministic(backend):
    logits, labels, groups, mask = batch(3, n=300)
    loss = mlloss.AUCLoss(backend=backend)
    runs = []
    for _ in range(2):
        x = logits[:, :2].float().to(DEVICE).requires_grad_(True)
        loss(x, labels.to(DEVICE), groups.to(DEVICE), mask.to(DEVICE)).backward()
        runs.append(x.grad)
    assert torch.equal(*runs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ranking", ["auc", "pdaom"])
@pytest.mark.parametrize("lam", [1.0, 0.5, (2.0, 0.25)])
def test_bce_plus_ranking_in_one_call_equals_the_paper_objective(backend, ranking, lam):
    # sum_k [mean_i CE_ik + lam_k * ranking_k], ranking_k each task's term on sigmoid(logits[:, k])
    # (PDAOM: Sun et al. Eq. 7 over the items of the mask), against the brute force.
    logits, labels, groups, mask = batch(11, n=90)
    scores = logits[:, :2]
    objective = mlloss.build_loss(f"bce+{ranking}", lam=lam, backend=backend)
    x = scores.to(DEVICE).clone().requires_grad_(True)
    value = objective(x, labels.to(DEVICE), groups.to(DEVICE), mask.to(DEVICE))
    value.backward()
    lams = lam if isinstance(lam, tuple) else (lam, lam)

    def expected(z):
        total = 0.0
        items = int(mask.sum())
        for k in range(2):
            p = torch.sigmoid(z[mask, k])
            if ranking == "pdaom":
                term = hardest_loss(p, labels[mask, k], groups[mask], surrogate="exponential", reduction="sum") / items
            else:
                term = pair_loss(p, labels[mask, k], groups[mask])
            total = total + F.binary_cross_entropy_with_logits(z[mask, k], labels[mask, k]) + lams[k] * term
        return total

    y = scores.clone().requires_grad_(True)
    reference = expected(y)
    reference.backward()
    torch.testing.assert_close(value.detach().cpu(), reference.detach(), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=1e-8, atol=1e-12)
    # the parts a per-task loop gives: bce/k, ranking/k, valid_pairs/k and the totals
    assert {"bce", "ranking", "valid_pairs", "groups_with_pairs", "bce/0", "bce/1", "ranking/0", "ranking/1",
            "valid_pairs/0", "valid_pairs/1"} <= set(objective.parts)
    torch.testing.assert_close(objective.parts["ranking"], objective.parts["ranking/0"] + objective.parts["ranking/1"])


def test_a_ranking_subclass_with_its_own_forward_is_called_per_task():
    # A user's AUCLoss subclass that changes forward must keep its forward: bce+ calls it per task.
    class Scaled(mlloss.AUCLoss):
        def forward(self, scores, labels, groups=None, mask=None):
            return 3.0 * super().forward(scores, labels, groups, mask)

    logits, labels, groups, _ = batch(17)
    objective = mlloss.BCEPlusRanking(Scaled(), lam=1.0)
    value = objective(logits[:, :2], labels, groups)
    per_task = sum(F.binary_cross_entropy_with_logits(logits[:, k], labels[:, k])
                   + 3.0 * pair_loss(torch.sigmoid(logits[:, k]), labels[:, k], groups) for k in range(2))
    torch.testing.assert_close(value, per_task, rtol=1e-10, atol=0)
    assert not objective._takes_task_columns() and mlloss.build_loss("bce+auc")._takes_task_columns()


def test_task_columns_check_their_inputs_and_name_the_entry():
    loss = mlloss.AUCLoss()
    logits, labels, groups, _ = batch(5)
    with pytest.raises(ValueError, match=r"one binary label column per score column.*\(80, 2\).*\(80, 3\)"):
        loss(logits[:, :2], torch.cat([labels, labels[:, :1]], 1))
    with pytest.raises(ValueError, match=r"one binary label column per score column; got scores of shape \(80, 2\) "
                                         r"and labels of shape \(80,\)"):
        loss(logits[:, :2], labels[:, 0])  # one label vector for two task columns
    bad = logits[:, :2].clone()
    bad[17, 1] = float("nan")
    with pytest.raises(ValueError, match=r"scores must be finite; scores\[17, 1\] = nan"):
        loss(bad, labels)
    wrong = labels.clone()
    wrong[4, 1] = 2.0
    with pytest.raises(ValueError, match=r"labels\[4, 1\]"):
        loss(logits[:, :2], wrong)
    with pytest.raises(ValueError, match=r"weights must have one entry per score column, shape \(2,\); got \(3,\)"):
        loss.task_columns(logits[:, :2], labels, weights=torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"cross_device=True\) takes one score column per call"):
        mlloss.AUCLoss(cross_device=True)(logits[:, :2], labels)
    with pytest.raises(ValueError, match=r"scores must have shape \(N,\) or \(N, 1\)"):
        mlloss.LoALoss()(logits[:, :2], labels)  # LoA ranks one score by several labels


@pytest.mark.triton
def test_task_columns_compile_fullgraph_and_match_eager():
    pytest.importorskip("triton")
    if sys.platform == "win32":
        pytest.skip("torch.compile")
    logits, labels, groups, mask = (t.to(DEVICE) for t in batch(13, n=64))
    objective = mlloss.build_loss("bce+auc", lam=(1.0, 0.5), backend="triton")

    def step(z, y, g, m):
        return objective(z, y, g, m)

    eager_x = logits[:, :2].clone().requires_grad_(True)
    step(eager_x, labels, groups, mask).backward()
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    x = logits[:, :2].clone().requires_grad_(True)
    compiled(x, labels, groups, mask).backward()
    torch.testing.assert_close(x.grad, eager_x.grad, rtol=1e-12, atol=0)


def _autograd_nodes(loss: torch.Tensor) -> list[str]:
    """The names of the autograd nodes between ``loss`` and the leaves it depends on."""
    names, stack = [], [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or type(node).__name__ == "AccumulateGrad":
            continue
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ranking", ["auc", "pdaom"])
@pytest.mark.parametrize("tasks,masked,lam,dtype", [(2, True, (2.0, 0.25), torch.float64), (2, False, 0.5, torch.float32),
                                                    (1, True, 3.0, torch.float64), (2, True, 1.0, torch.bfloat16)])
def test_bce_plus_ranking_in_one_op_equals_its_terms_composed(backend, ranking, tasks, masked, lam, dtype):
    # The objective as one op (ops.bce_ranking: the cross-entropy, the sigmoid, the ranking term and
    # the sum in one autograd node) against the same terms as separate ops: values, gradients, parts.
    logits, labels, groups, mask = batch(23, n=90, tasks=tasks)
    scores = logits[:, :tasks].to(dtype)
    results = []
    for one_op in (True, False):
        objective = mlloss.build_loss(f"bce+{ranking}", lam=lam, backend=backend)
        assert objective._in_one_op()
        if not one_op:
            objective._in_one_op = lambda: False  # the terms composed, as for any other ranking module
        x = scores.to(DEVICE).clone().requires_grad_(True)
        value = objective(x, labels.to(DEVICE), groups.to(DEVICE), mask.to(DEVICE) if masked else None)
        nodes = _autograd_nodes(value)
        value.backward()
        results.append((value.detach(), x.grad, {k: v.cpu() for k, v in objective.parts.items()}, nodes))
    (value, grad, parts, nodes), (composed_value, composed_grad, composed_parts, composed_nodes) = results
    assert nodes == ["FusedGradientBackward"] and len(composed_nodes) > 1, (nodes, composed_nodes)
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(value, composed_value, rtol=rtol, atol=0)
    # bfloat16: the composed terms' gradients are rounded to bfloat16 each before they are summed,
    # the op's once after: a bfloat16 ulp (2^-8 relative) apart
    grad_tolerance = {torch.float64: (1e-12, 0), torch.float32: (1e-5, 1e-7), torch.bfloat16: (2**-7, 1e-5)}[dtype]
    torch.testing.assert_close(grad, composed_grad, rtol=grad_tolerance[0], atol=grad_tolerance[1])
    assert grad.dtype == dtype and parts.keys() == composed_parts.keys()
    for name in parts:
        torch.testing.assert_close(parts[name], composed_parts[name], rtol=rtol, atol=0, msg=name)
    if masked:  # the rows left out get exactly zero
        assert not grad[~mask.to(DEVICE)].any()


def test_bce_plus_ranking_takes_one_op_only_where_it_stands_for_the_calls():
    assert mlloss.build_loss("bce+pdaom")._in_one_op() and mlloss.build_loss("bce+auc", inputs="probabilities")._in_one_op()
    # the logit of probabilities, a ranking across processes, another library's ranking module: composed
    assert not mlloss.build_loss("bce+auc", inputs="probabilities", ranking_input="logit")._in_one_op()
    assert not mlloss.BCEPlusRanking(mlloss.AUCLoss(cross_device=True))._in_one_op()
    assert not mlloss.BCEPlusRanking(mlloss.LaALoss())._in_one_op()

    class OwnColumns(mlloss.AUCLoss):
        def task_columns(self, *args, **kwargs):
            return super().task_columns(*args, **kwargs)

    assert not mlloss.BCEPlusRanking(OwnColumns())._in_one_op()
