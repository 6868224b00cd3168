"""Multi-task objectives, models that output probabilities, and ``parts`` that log the same way
for every loss."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

import mlloss
from mlloss.registry import LOSSES, SINGLE_LABEL
from reference import hardest_loss, pair_loss
from triton_interpreter import warnings_as_errors

NAMES = sorted(LOSSES) + [f"bce+{name}" for name in sorted(SINGLE_LABEL)]
MULTI_LABEL = {"loa", "balanced-loa", "laa"}


def batch(seed: int = 0, n: int = 60, tasks: int = 2):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, tasks, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (n, tasks), generator=gen).to(torch.float64)
    groups = torch.randint(0, 6, (n,), generator=gen)
    return logits, labels, groups


def value_and_grad(fn, x):
    x = x.clone().requires_grad_(True)
    value = fn(x)
    value.backward()
    return value.detach(), x.grad


@pytest.mark.parametrize("ranking", ["pdaom", "auc"])
def test_one_objective_per_task_with_a_weight_per_task(ranking):
    logits, labels, groups = batch()
    lam = [1.0, 0.25]
    value, grad = value_and_grad(lambda z: mlloss.build_loss(f"bce+{ranking}", lam=lam)(z, labels, groups), logits)

    def expected(z):
        total = 0.0
        for k in range(2):
            p = torch.sigmoid(z[:, k])
            if ranking == "pdaom":  # Sun et al. Eq. 7 over N: sum over users of exp(-(min pos - max neg))
                term = hardest_loss(p, labels[:, k], groups, surrogate="exponential", reduction="sum") / len(z)
            else:
                term = pair_loss(p, labels[:, k], groups)
            total = total + F.binary_cross_entropy_with_logits(z[:, k], labels[:, k]) + lam[k] * term
        return total

    ref_value, ref_grad = value_and_grad(expected, logits)
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-9, atol=1e-12)


def test_probability_outputs_equal_the_logit_model_they_come_from():
    # A head ending in a sigmoid gives p = sigmoid(z): declared as probabilities, the objective
    # and its gradient with respect to z are the logit model's.
    logits, labels, groups = batch(1)
    as_logits = value_and_grad(lambda z: mlloss.build_loss("bce+pdaom")(z, labels, groups), logits)
    as_probabilities = value_and_grad(
        lambda z: mlloss.build_loss("bce+pdaom", inputs="probabilities")(torch.sigmoid(z), labels, groups), logits
    )
    torch.testing.assert_close(as_probabilities[0], as_logits[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(as_probabilities[1], as_logits[1], rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("name", ["bce", "bce+auc"])
def test_probabilities_of_exactly_0_and_1_follow_torchs_cross_entropy(name):
    """A saturated sigmoid head gives probabilities of exactly 0 and 1: torch's cross-entropy
    clamps the log at -100 and the slope's denominator p (1 - p) at 1e-12, so the loss and the
    gradient stay finite (0 where p equals the label, about 1e12 / N where it is the other one)."""
    probabilities = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 0.3], [1.0, 0.8], [0.6, 0.0], [0.2, 1.0]],
                                 dtype=torch.float64)
    labels = torch.tensor([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0]],
                          dtype=torch.float64)
    loss = mlloss.build_loss(name, inputs="probabilities", lam=0.0) if name != "bce" else mlloss.BCELoss(
        inputs="probabilities")
    value, grad = value_and_grad(lambda p: loss(p, labels), probabilities)
    expected, expected_grad = value_and_grad(
        lambda p: sum(F.binary_cross_entropy(p[:, k], labels[:, k]) for k in range(2)), probabilities)
    assert grad.isfinite().all() and grad[0, 0] == 0 and grad[1, 0] > 1e11
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=0)
    # 1e-8: torch's CPU kernel takes its 1e-12 as a float32 (9.9999999600e-13), the loss as a float64
    torch.testing.assert_close(grad, expected_grad, rtol=1e-8, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inputs", ["logits", "probabilities"])
def test_half_precision_scores_change_form_for_the_ranking_term_in_float32(inputs, dtype):
    # The ranking term of half-precision scores is that of their sigmoid (or logit) taken in float32:
    # a bfloat16 sigmoid keeps 8 bits (ties the scores did not have), and a float16 logit clamps
    # 1 - 1e-7 to 1 (inf).
    logits, labels, groups = batch(2, n=200, tasks=1)
    scores = (logits[:, 0] if inputs == "logits" else torch.sigmoid(3 * logits[:, 0])).to(dtype)
    if inputs == "probabilities":
        scores[:2] = torch.tensor([0.0, 1.0])  # clamped to [1e-7, 1 - 1e-7]
    loss = mlloss.build_loss("bce+auc", inputs=inputs, ranking_input="logit" if inputs == "probabilities" else "probability")
    loss(scores.clone().requires_grad_(True), labels[:, 0], groups)
    wide = scores.to(torch.float64)
    low, high = torch.tensor([1e-7, 1 - 1e-7], dtype=torch.float32).tolist()  # the clamp, in float32
    ranked = torch.sigmoid(wide) if inputs == "logits" else torch.logit(wide.clamp(low, high))
    torch.testing.assert_close(loss.parts["ranking"].double(), pair_loss(ranked, labels[:, 0], groups), rtol=1e-5, atol=0)


def test_inputs_of_the_other_kind_raise_or_warn(monkeypatch):
    monkeypatch.setattr(mlloss._validation, "_probability_like_batches", 0)  # counted per process
    logits, labels, groups = batch(2)
    with pytest.raises(ValueError, match=r"scores must be probabilities in \[0, 1\] \(inputs='probabilities'\); scores\["):
        mlloss.build_loss("bce+pdaom", inputs="probabilities")(logits, labels, groups)
    probabilities = torch.sigmoid(logits)
    loss = mlloss.build_loss("bce+pdaom")
    # One batch of logits in [0, 1] is no evidence (a fresh model's can be); PROBABILITY_WARNING_BATCHES in a row are.
    batches = mlloss._validation.PROBABILITY_WARNING_BATCHES
    with warnings_as_errors():
        for _ in range(batches - 1):
            loss(probabilities, labels, groups)
        loss(logits, labels, groups)  # a batch with a negative logit starts the count again
        for _ in range(batches - 1):
            loss(probabilities, labels, groups)
    with pytest.warns(UserWarning, match=f"every logit of the last {batches} batches lies in \\[0, 1\\].*inputs='probabilities'") as caught:
        loss(probabilities, labels, groups)
    assert [warning.filename for warning in caught] == [__file__]  # the line that passed the batch
    with warnings_as_errors():  # without the data check there is nothing to warn about
        mlloss.build_loss("bce+pdaom", validate_args=False)(probabilities, labels, groups)


def test_laa_refuses_a_non_integer_single_column_unless_told_it_is_real_valued():
    logits, _, groups = batch(3)
    scores = logits[:, 0]
    probabilities = torch.rand(len(scores), dtype=torch.float64)  # passed as labels by mistake
    with pytest.raises(ValueError, match=r"single label column must hold whole numbers.*; labels\[0\] = [0-9.e-]+\. .*real_levels=True"):
        mlloss.LaALoss()(scores, probabilities, groups)
    ratings = torch.randint(0, 5, (len(scores),)).to(torch.float64)
    torch.testing.assert_close(mlloss.LaALoss()(scores, ratings, groups), pair_loss(scores, ratings, groups, cost="linear"))
    value = mlloss.LaALoss(real_levels=True)(scores, probabilities, groups)
    torch.testing.assert_close(value, pair_loss(scores, probabilities, groups, cost="linear"), rtol=1e-10, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_parts_are_scalars_that_log_dict_takes_for_every_loss(name):
    pytest.importorskip("pytorch_lightning")
    import pytorch_lightning as pl

    logits, labels, groups = batch(4, tasks=1)
    logged = {}

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(3, 1)
            self.loss = mlloss.build_loss(name)

        def training_step(self, batch, batch_idx):
            features, y, g = batch
            scores = self.net(features)
            value = self.loss(scores[:, 0], y if name in MULTI_LABEL else y[:, 0], g)
            self.log_dict({f"train/{key}": part for key, part in self.loss.parts.items()}, batch_size=len(y))
            logged.update(self.loss.parts)
            return value

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    features = torch.randn(len(labels), 3)
    y = torch.cat([labels, 1 - labels], 1) if name in MULTI_LABEL else labels
    dataset = torch.utils.data.TensorDataset(features.float(), y.float(), groups)
    loader = torch.utils.data.DataLoader(dataset, batch_size=len(dataset))
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), loader)
    assert logged and all(value.dim() == 0 for value in logged.values())
    assert ("bce" in logged) == name.startswith("bce")
    assert ("valid_pairs" in logged) == (name != "bce")


@pytest.mark.parametrize("name", NAMES)
def test_parts_keep_no_autograd_graph_alive(name):
    """A loss keeps its last call's ``parts`` until the next call; they hold statistics, not the
    differentiable loss. (BCELoss and bce+<name> kept the loss and ranking terms: the step's
    autograd graph stayed alive, and a later step captured in a CUDA graph reused its nodes' eager
    streams and failed: "operation would make the legacy stream depend on a capturing blocking
    stream", seen on an H100.)"""
    logits, labels, groups = batch(2, tasks=2)
    loss = mlloss.build_loss(name)
    weights = torch.ones(2, requires_grad=True)
    activations = logits.double() * weights  # the mul's backward saves logits; its output...
    activations = activations.exp()  # ...is saved by the exp's backward: alive as long as the graph is
    probe = weakref.ref(activations)
    scores = activations if name.startswith("bce") else activations[:, 0]
    y = labels[:, :2] if name.startswith("bce") or name in MULTI_LABEL else labels[:, 0]
    value = loss(scores, y, groups)
    expected = {key: part.clone() for key, part in loss.parts.items()}
    del activations, scores, value
    gc.collect()
    assert probe() is None, f"{name}: its parts kept the autograd graph (and so its activations) alive"
    assert {key: part for key, part in loss.parts.items()}.keys() == expected.keys()
    for key, part in loss.parts.items():
        assert torch.equal(part, expected[key]), key


class _OwnForwardPDAOM(mlloss.PDAOMLoss):
    """A PDAOM whose own forward makes BCEPlusRanking call it once per task (its generic path)."""

    def forward(self, scores, labels, groups=None, mask=None):
        return super().forward(scores, labels, groups, mask)


def _objective(kind: str, lam, validate: bool, backend: str) -> torch.nn.Module:
    if kind == "per-task calls":
        ranking = _OwnForwardPDAOM(validate_args=validate, backend=backend)
        return mlloss.BCEPlusRanking(ranking, lam=lam, ranking_input="logit")
    extra = {"surrogate": "exponential"} if kind == "bce+auc" else {}
    return mlloss.build_loss(kind, lam=lam, ranking_input="logit", validate_args=validate, backend=backend, **extra)


# (kind, validate_args): a ranking module called once per task is the user's own and keeps its
# own checks, which refuse its overflowing term before BCEPlusRanking weighs it
ZERO_LAM_CASES = [(kind, validate) for kind in ("bce+pdaom", "bce+auc") for validate in (True, False)] + [("per-task calls", False)]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.triton)])
@pytest.mark.parametrize("kind,validate", ZERO_LAM_CASES)
@pytest.mark.parametrize("lam", [0.0, [0.0, 0.0]])
def test_a_ranking_weight_of_zero_leaves_the_cross_entropy_alone(backend, kind, validate, lam):
    # Task 0 holds a reversed pair 800 logits apart: its exponential ranking term overflows float64.
    # With lam 0 for every task the objective is the cross-entropy; the equal lams scaled the summed
    # terms, 0 * inf = NaN, which raised OverflowError (checks on) or gave a NaN loss and gradient.
    scores = torch.tensor([[-400.0, 0.1], [400.0, -0.2], [0.0, 0.3], [1.0, 0.4], [2.0, -1.0], [-3.0, 2.0]],
                          dtype=torch.float64)
    labels = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.float64)
    expected, expected_grad = value_and_grad(lambda z: mlloss.BCELoss()(z, labels), scores)
    value, grad = value_and_grad(lambda z: _objective(kind, lam, validate, backend)(z, labels), scores)
    assert torch.equal(value, expected) and torch.equal(grad, expected_grad)
    if not validate:  # the term is there to overflow: a lam that counts meets it (with the checks on: the next test)
        assert not torch.isfinite(_objective(kind, [1.0, 0.0], validate, backend)(scores, labels))


@pytest.mark.parametrize("kind", ["bce+pdaom", "bce+auc"])
def test_an_overflowing_ranking_term_that_counts_is_refused(kind):
    scores = torch.tensor([[-400.0, 0.1], [400.0, -0.2], [0.0, 0.3], [1.0, 0.4]], dtype=torch.float64)
    labels = torch.tensor([[1, 1], [0, 0], [1, 0], [0, 1]], dtype=torch.float64)
    for lam in (1.0, [1.0, 0.0]):
        with pytest.raises(OverflowError, match="the pairwise loss is not finite"):
            _objective(kind, lam, True, "torch")(scores, labels)
