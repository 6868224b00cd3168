"""Label dictatorship (Lukasik et al. 2025, Prop. 6.1 / 6.2) shown on the losses themselves.

Two deterministic labels; label 1 is balanced (pi_1 = 0.5), label 2 is skewed (pi_2 = 0.05). One free
score per label combination (0,0), (0,1), (1,0), (1,1) is fitted to each loss. LoA(1,1) gives label 2
the effective weight 1/(pi_2(1-pi_2)) = 21 against label 1's 4, so it ranks (0,1) above (1,0); LaA
and balanced LoA give the two combinations the same score.
"""

from __future__ import annotations

import copy

import math
import re

import pytest
import torch

import mlloss

COMBINATIONS = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
COUNTS = torch.tensor([95, 5, 95, 5])  # pi_1 = 100/200 = 0.5, pi_2 = 10/200 = 0.05
COMBO = torch.repeat_interleave(torch.arange(4), COUNTS)
LABELS = COMBINATIONS[COMBO]
ZERO_ONE, ONE_ZERO = 1, 2


def squared_optimum(loss: torch.nn.Module) -> torch.Tensor:
    """Exact minimiser of a loss that is quadratic in the four free scores (squared surrogate).

    L(theta) = theta^T H theta / 2 + b^T theta + c; the minimum-norm solution of H theta = -b
    removes the one free direction (a common shift of all scores)."""
    def gradient(theta: torch.Tensor) -> torch.Tensor:
        theta = theta.clone().requires_grad_(True)
        (slope,) = torch.autograd.grad(loss(theta[COMBO], LABELS), theta)
        return slope

    origin = torch.zeros(4, dtype=torch.float64)
    slope = gradient(origin)
    # The gradient is affine in theta, so unit steps give the Hessian's columns exactly.
    hessian = torch.stack([gradient(unit) - slope for unit in torch.eye(4, dtype=torch.float64)], 1)
    # rtol: the shift direction's eigenvalue is rounding noise (~1e-15), which pinv's default cutoff can keep.
    optimum = -torch.linalg.pinv(hessian, rtol=1e-9, hermitian=True) @ slope
    # It is a stationary point of the real loss, not only of the quadratic model.
    assert gradient(optimum).abs().max() < 1e-10
    return optimum


def test_loa_ranks_the_skewed_label_first_while_laa_and_balanced_loa_tie():
    loa = squared_optimum(mlloss.LoALoss([1.0, 1.0], surrogate="squared"))
    laa = squared_optimum(mlloss.LaALoss(surrogate="squared"))
    balanced = squared_optimum(mlloss.LoALoss("balanced", surrogate="squared"))
    assert loa[ZERO_ONE] - loa[ONE_ZERO] > 0.1  # (0,1) above (1,0): label 2 dictates
    assert abs(laa[ZERO_ONE] - laa[ONE_ZERO]) < 1e-9
    assert abs(balanced[ZERO_ONE] - balanced[ONE_ZERO]) < 1e-9
    # Both still rank (1,1) first and (0,0) last.
    for optimum in (loa, laa, balanced):
        assert optimum[3] > max(optimum[1], optimum[2]) and optimum[0] < min(optimum[1], optimum[2])


def test_loa_with_the_default_logistic_surrogate_ranks_the_skewed_label_first():
    theta = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    loss = mlloss.LoALoss([1.0, 1.0])
    optimiser = torch.optim.LBFGS([theta], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        value = loss(theta[COMBO], LABELS)
        value.backward()
        return value

    optimiser.step(closure)
    # Along theta_10 - theta_01 the loss trades w_1 phi(d) against w_2 phi(-d), w_k ~ a_k/(pi_k(1-pi_k)):
    # the optimum leans towards the label with the larger effective weight, label 2.
    assert theta[ZERO_ONE] > theta[ONE_ZERO] + 0.5


def test_balanced_loa_running_priors_match_the_data_and_reset_with_state_dict():
    loss = mlloss.LoALoss("balanced")
    scores = torch.zeros(200, dtype=torch.float64)
    half = 100
    loss(scores[:half], LABELS[:half])
    loss(scores[half:], LABELS[half:])
    priors = loss.seen_positives / loss.seen_items
    torch.testing.assert_close(priors, torch.tensor([0.5, 0.05], dtype=torch.float64))
    torch.testing.assert_close(loss.mixing_weights(LABELS), torch.tensor([0.25, 0.0475], dtype=torch.float64))
    restored = mlloss.LoALoss("balanced")
    restored.load_state_dict(loss.state_dict())
    restored.eval()  # evaluation uses the stored estimate and does not update it
    torch.testing.assert_close(restored.mixing_weights(LABELS[:10]), torch.tensor([0.25, 0.0475], dtype=torch.float64))
    assert restored.seen_items.item() == 200


@pytest.mark.parametrize("num_labels", [None, 2])
def test_mixing_weights_are_the_ones_forward_uses_and_change_nothing(num_labels):
    """In training mode forward adds the batch to the running priors before weighing it; mixing_weights
    gives those a_k without keeping the batch (a fresh module gave a_k = 0, or without num_labels raised
    about 'priors' nobody passed)."""
    loss = mlloss.LoALoss("balanced", num_labels=num_labels)
    first = LABELS  # pi = 0.5 and 0.05
    predicted = loss.mixing_weights(first)
    assert loss.seen_items.item() == 0 and loss.seen_positives.numel() == (num_labels or 0)
    loss(torch.zeros(first.shape[0], dtype=torch.float64), first)
    used = torch.stack([loss.parts[f"mixing_weight/{k}"] for k in range(2)]).cpu()
    torch.testing.assert_close(predicted, used, rtol=0, atol=0)
    torch.testing.assert_close(predicted, torch.tensor([0.25, 0.0475], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"running priors were estimated for 2 \(num_labels, .*got labels of shape \(4, 3\)"):
        loss.mixing_weights(torch.zeros(4, 3))
    assert loss.seen_items.item() == first.shape[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_loa_buffers_stay_float64_when_the_module_is_cast(dtype):
    # A half-precision model (.half(), a "16-true" / "bf16-true" Lightning precision) casts its
    # buffers: float16 counts overflowed after 65,504 items, the priors became 0 and the loss 0.
    weighted = mlloss.LoALoss([0.3, 1.7]).to(dtype)
    assert weighted.weights.dtype == torch.float64
    torch.testing.assert_close(weighted.mixing_weights(LABELS[:4]), torch.tensor([0.3, 1.7], dtype=torch.float64),
                               rtol=0, atol=0)
    balanced = mlloss.LoALoss("balanced", num_labels=2, priors=None).to(dtype)
    for _ in range(700):
        value = balanced(torch.randn(100, dtype=dtype), LABELS[:100])
    assert balanced.seen_items.dtype == torch.float64 and balanced.seen_items.item() == 70_000
    torch.testing.assert_close(balanced.seen_positives / balanced.seen_items,
                               LABELS[:100].double().mean(0), rtol=0, atol=0)
    assert value.item() > 0
    # a checkpoint in another dtype (or from another device) loads into the module's buffers
    restored = mlloss.LoALoss("balanced").float()
    restored.load_state_dict({name: t.float() for name, t in balanced.state_dict().items()})
    assert restored.seen_positives.dtype == restored.seen_items.dtype == torch.float64
    assert restored.seen_items.item() == 70_000


def test_labels_that_require_grad_leave_no_graph_in_the_running_priors():
    # Labels built from tensors that require grad (a label derived from a model's output, say)
    # chained every step's autograd graph into the count buffers: they required grad, grew one
    # node a step, and copy.deepcopy of the loss (an EMA or SWA copy of the model) failed.
    loss, plain = mlloss.LoALoss("balanced"), mlloss.LoALoss("balanced")
    for step in range(3):
        generator = torch.Generator().manual_seed(step)
        scores = torch.randn(60, dtype=torch.float64, generator=generator)
        labels = LABELS[torch.randperm(LABELS.shape[0], generator=generator)[:60]]
        value = loss(scores, labels.clone().requires_grad_())
        torch.testing.assert_close(value, plain(scores, labels), rtol=0, atol=0)
    assert not loss.seen_positives.requires_grad and loss.seen_positives.grad_fn is None
    assert torch.equal(loss.seen_positives, plain.seen_positives) and torch.equal(loss.seen_items, plain.seen_items)
    assert torch.equal(copy.deepcopy(loss).seen_positives, plain.seen_positives)
    assert not loss.mixing_weights(LABELS[:100].clone().requires_grad_()).requires_grad


def test_a_sized_loa_refuses_running_priors_of_another_size():
    # An unsized module takes the saved K; one sized by num_labels (or by a batch) refuses another K
    # as torch refuses any buffer of another shape. It used to resize itself to the saved K.
    saved = mlloss.LoALoss("balanced")
    saved(torch.zeros(100, dtype=torch.float64), LABELS[:100])
    fresh = mlloss.LoALoss("balanced")
    fresh.load_state_dict(saved.state_dict())
    assert torch.equal(fresh.seen_positives, saved.seen_positives)
    with pytest.raises(RuntimeError, match=r"size mismatch for seen_positives: .*torch.Size\(\[2\]\).*torch.Size\(\[3\]\)"):
        mlloss.LoALoss("balanced", num_labels=3).load_state_dict(saved.state_dict())


def test_a_refused_batch_leaves_the_running_priors_as_they_were():
    # The priors were updated before the checks ran: a batch refused for NaN scores or for the
    # wrong number of label names was counted all the same.
    loss = mlloss.LoALoss("balanced")
    loss(torch.zeros(100, dtype=torch.float64), LABELS[:100])
    seen = (loss.seen_positives.clone(), loss.seen_items.clone())
    bad_scores = torch.zeros(100, dtype=torch.float64)
    bad_scores[3] = float("nan")
    with pytest.raises(ValueError, match="scores must be finite"):
        loss(bad_scores, LABELS[100:200])
    assert torch.equal(loss.seen_positives, seen[0]) and torch.equal(loss.seen_items, seen[1])
    named = mlloss.LoALoss("balanced", label_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="label_names has 3 names but labels have 2 columns"):
        named(torch.zeros(100, dtype=torch.float64), LABELS[:100])
    assert named.seen_positives.numel() == 0 and named.seen_items.item() == 0


@pytest.mark.parametrize("num_labels", [None, 2])
def test_balanced_loa_adds_each_batch_to_the_same_count_buffers(num_labels):
    """The running counts are updated in place once they have their size: a training step captured
    in a CUDA graph (torch.cuda.graph, torch.compile's "reduce-overhead") reads and writes the
    buffers it was captured with, so each replay adds its batch. (Assigned new tensors, the replays
    kept reading the counts of the capture: on an H100 a replayed step's loss was 6.7e-5 to
    2.4e-3 (relative) from the eager one's.)"""
    loss = mlloss.LoALoss("balanced", num_labels=num_labels)
    loss(torch.zeros(100, dtype=torch.float64), LABELS[:100])  # the first batch sizes the counts
    buffers = (loss.seen_positives, loss.seen_items)
    for start in (100, 150):
        loss(torch.zeros(50, dtype=torch.float64), LABELS[start:start + 50])
        assert loss.seen_positives is buffers[0] and loss.seen_items is buffers[1]
    torch.testing.assert_close(buffers[0], LABELS[:200].sum(0).double(), rtol=0, atol=0)
    assert buffers[1].item() == 200
    assert dict(loss.named_buffers())["seen_positives"] is buffers[0]


def test_label_dictatorship_report_names_the_dominant_label():
    report = mlloss.label_dictatorship(LABELS, label_names=["click", "purchase"])
    torch.testing.assert_close(torch.tensor(report.priors, dtype=torch.float64), torch.tensor([0.5, 0.05], dtype=torch.float64))
    torch.testing.assert_close(
        torch.tensor(report.effective_weights, dtype=torch.float64), torch.tensor([4.0, 1 / 0.0475], dtype=torch.float64)
    )
    assert report.dominant == "purchase" and report.is_dictatorship
    assert report.dominance_ratio == pytest.approx((1 / 0.0475) / 4.0)
    assert "'purchase' dictates the LoA ranking" in str(report)
    assert report.as_dict()["prior/click"] == 0.5
    # With the balanced weights a_k = pi_k (1 - pi_k) no label dominates.
    balanced = mlloss.label_dictatorship(LABELS, report.balanced_weights)
    assert not balanced.is_dictatorship and balanced.dominance_ratio == pytest.approx(1.0)
    assert "no label dominates" in str(balanced)


def test_label_dictatorship_rejects_bad_arguments():
    with pytest.raises(ValueError, match="weights has 3 entries but labels have 2 columns"):
        mlloss.label_dictatorship(LABELS, [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="label_names has 1 names for 2 label columns"):
        mlloss.label_dictatorship(LABELS, label_names=["click"])
    with pytest.raises(ValueError, match="must be binary"):
        mlloss.label_dictatorship(LABELS * 2)


# --------------------------------------------------------------------------- labels without pairs


def assert_loggable(report: mlloss.DictatorshipReport) -> None:
    """as_dict() holds label names and finite numbers."""
    for key, value in report.as_dict().items():
        assert isinstance(value, str) or math.isfinite(value), (key, value)


def test_a_never_positive_label_has_no_pairs_and_no_say():
    """label_1 is never positive: LoALoss gives it L_1 = 0, so it neither dictates nor counts in the verdict."""
    report = mlloss.label_dictatorship(torch.tensor([[1, 0], [0, 0], [1, 0], [0, 0]]))
    assert report.dominant == "label_0"
    assert report.effective_weights == (4.0, 0.0) and report.shares == (1.0, 0.0)
    assert report.priors == (0.5, 0.0) and report.has_both_classes == (True, False)
    assert report.dominance_ratio == 1.0 and math.isnan(report.dominance_ratio_se)  # no other label to outweigh
    assert not report.is_dictatorship and report.takes_part == (True, False)
    rows = str(report).splitlines()
    assert rows[2].startswith("label_1") and "no pairs" in rows[2] and "0.0%" in rows[2]
    assert rows[-1] == "only 'label_0' takes part in the LoA ranking (a label needs both classes and a_k > 0): no label dictates"
    assert_loggable(report)


def test_an_always_positive_label_is_left_out_of_the_verdict():
    labels = torch.cat([LABELS, torch.ones(len(LABELS), 1)], 1)  # a third label, positive on every item
    report = mlloss.label_dictatorship(labels, label_names=["click", "purchase", "seen"])
    two_labels = mlloss.label_dictatorship(LABELS, label_names=["click", "purchase"])
    assert report.effective_weights[2] == 0.0 and report.shares[2] == 0.0
    assert report.effective_weights[:2] == two_labels.effective_weights and report.shares[:2] == two_labels.shares
    assert report.dominant == "purchase" and report.dominance_ratio == two_labels.dominance_ratio
    assert "no pairs" in str(report).splitlines()[3]
    assert_loggable(report)


def test_no_label_with_both_classes_names_no_dominant_label():
    report = mlloss.label_dictatorship(torch.tensor([[1, 0], [1, 0]]), label_names=["always", "never"])
    assert report.dominant is None and report.dominance_ratio == 1.0 and not report.is_dictatorship
    assert report.effective_weights == (0.0, 0.0) and report.shares == (0.0, 0.0)
    assert str(report).splitlines()[-1] == "no label takes part in the LoA ranking (a label needs both classes and a_k > 0)"
    assert "dominant" not in report.as_dict()
    assert_loggable(report)


def test_a_zero_mixing_weight_takes_a_label_out_of_the_ranking():
    report = mlloss.label_dictatorship(LABELS, [1.0, 0.0], label_names=["click", "purchase"])
    assert report.dominant == "click" and report.dominance_ratio == 1.0 and not report.is_dictatorship
    assert report.effective_weights == (4.0, 0.0) and report.has_both_classes == (True, True)
    assert report.takes_part == (True, False)
    assert "only 'click' takes part" in str(report)
    assert_loggable(report)


# --------------------------------------------------------------------------- threshold and uncertainty


def test_the_verdict_is_graded_and_the_threshold_is_the_users():
    report = mlloss.label_dictatorship(LABELS, label_names=["click", "purchase"])
    assert report.threshold == mlloss.diagnostics.DICTATORSHIP_RATIO == 2.0
    strict = mlloss.label_dictatorship(LABELS, label_names=["click", "purchase"], threshold=6)
    assert strict.threshold == 6.0 and strict.dominance_ratio == report.dominance_ratio
    assert not strict.is_dictatorship
    verdict = "'purchase' tilts the LoA ranking (ratio 5.26 ± 1.54 to the next label; dictates from 6)"
    assert str(strict).splitlines()[-1] == verdict
    # pi = 0.5 and 0.25: effective weights 4 and 16/3, ratio 4/3, between the tilt ratio (1.25) and the threshold.
    tilted = mlloss.label_dictatorship(torch.tensor([[1, 1], [1, 0], [0, 0], [0, 0]]))
    assert tilted.dominant == "label_1" and tilted.dominance_ratio == pytest.approx(4 / 3)
    assert "'label_1' tilts the LoA ranking (ratio 1.33 ± " in str(tilted) and not tilted.is_dictatorship
    # pi = 0.5 and 0.4: ratio 25/24, below the tilt ratio.
    level = mlloss.label_dictatorship(torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0], [1, 0]] + [[0, 1]] * 2 + [[0, 0]] * 3))
    assert level.dominance_ratio == pytest.approx(25 / 24)
    assert str(level).splitlines()[-1].startswith("no label dominates (largest/next: ratio 1.04 ± ")


def test_the_verdicts_boundaries_belong_to_the_documented_side():
    """Balanced labels (pi = 1/2, every pattern's weight exact): the grades start at their ratios
    ("tilts" from 1.25, "dictates" from the threshold), and a share of exactly 1/2 does not
    outweigh the others together (a dictator's share is above 1/2)."""
    labels = torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 1], [0, 1, 0]])
    even = mlloss.label_dictatorship(labels, weights=[2.0, 1.0, 1.0])  # effective weights 8, 4, 4
    assert even.dominance_ratio == 2.0 == even.threshold and even.shares[0] == 0.5
    assert not even.is_dictatorship and "it does not outweigh the others together" in str(even)
    tilt = mlloss.label_dictatorship(labels[:, :2], weights=[mlloss.diagnostics.TILT_RATIO, 1.0])
    assert tilt.dominance_ratio == mlloss.diagnostics.TILT_RATIO == 1.25
    assert str(tilt).splitlines()[-1].startswith("'label_0' tilts the LoA ranking (ratio 1.25 ")
    dictates = mlloss.label_dictatorship(labels[:, :2], weights=[2.0, 1.0])  # two labels: the ratio decides
    assert dictates.is_dictatorship and "'label_0' dictates the LoA ranking" in str(dictates)


def test_with_more_labels_a_dictator_must_outweigh_the_others_together():
    """Four balanced labels (pi = 1/2) and a = (2, 1, 1, 1): effective weights (8, 4, 4, 4), ratio 2 but a share of
    40%. With deterministic labels the LoA Bayes score ranks (0, 1, 1, 1) (12) above (1, 0, 0, 0) (8): label_0
    does not decide the pairs it separates, so the report does not say it dictates."""
    labels = torch.cartesian_prod(*[torch.tensor([0, 1])] * 4)  # every pattern once: priors 1/2, no correlation
    report = mlloss.label_dictatorship(labels, [2.0, 1.0, 1.0, 1.0])
    assert report.effective_weights == (8.0, 4.0, 4.0, 4.0) and report.dominance_ratio == 2.0
    assert not report.is_dictatorship
    assert str(report).splitlines()[-1] == (
        "'label_0' tilts the LoA ranking (ratio 2.00 ± 0.00 to the next label, but a share of 40%: it does not "
        "outweigh the others together)"
    )
    # With a = (4, 1, 1, 1) its weight 16 beats the others' 12: it dictates, as asked (the priors are equal).
    asked = mlloss.label_dictatorship(labels, [4.0, 1.0, 1.0, 1.0])
    assert asked.is_dictatorship
    assert str(asked).splitlines()[-1].endswith("as its mixing weights a_k ask: its prior adds nothing to it")
    # Skewed priors that make the dictator get the advice to aggregate labels instead.
    assert str(mlloss.label_dictatorship(LABELS)).splitlines()[-1].endswith(
        "LaALoss or LoALoss(weights='balanced') weigh labels as asked"
    )


def advised_losses(report: mlloss.DictatorshipReport) -> dict[str, torch.nn.Module]:
    """The loss calls the verdict advises, run as printed (a bare ``LaALoss`` is its default weights)."""
    verdict = str(report).splitlines()[-1]
    calls = re.findall(r"\b(?:LaALoss|LoALoss)\([^()]*\)", verdict)
    losses = {call.split("(")[0]: eval(call, {"LaALoss": mlloss.LaALoss, "LoALoss": mlloss.LoALoss}) for call in calls}
    if re.search(r"\bLaALoss or\b", verdict):
        losses["LaALoss"] = mlloss.LaALoss()
    return losses


def skewed_labels(priors: list[float], n: int = 20000) -> torch.Tensor:
    return (torch.rand(n, len(priors), generator=torch.Generator().manual_seed(0)) < torch.tensor(priors)).int()


@pytest.mark.parametrize(
    "labels, asked",
    [
        (LABELS, [1.5, 1.0]),
        (skewed_labels([0.5, 0.03]), [3.0, 1.0]),  # the reviewer's case: advised 'balanced', which weighs 1:1
        (skewed_labels([0.5, 0.3, 0.02]), [2.0, 0.0, 1.0]),  # a_k = 0: LaALoss cannot leave a label out
        (LABELS, [2.0, 2.0]),  # equal a_k: 'balanced' is right
    ],
)
def test_the_advised_losses_weigh_the_labels_as_the_mixing_weights_ask(labels, asked):
    """A dictator made by the priors gets advice whose losses run and give effective weights proportional
    to the asked a_k (LoA: a_k' / (pi_k (1 - pi_k)), Prop. 5.2; LaA: w_k, Prop. 5.4). The advice was
    LaALoss or LoALoss('balanced') whatever the a_k: both weigh every label alike, not as asked."""
    report = mlloss.label_dictatorship(labels, asked)
    assert report.is_dictatorship and report.dominance_ratio > report._asked_ratio()
    advised = advised_losses(report)
    assert set(advised) == ({"LaALoss", "LoALoss"} if min(asked) > 0 else {"LoALoss"})
    asked = torch.tensor(asked, dtype=torch.float64)
    loa_weights = advised["LoALoss"].mixing_weights(labels)
    effective = torch.tensor(mlloss.label_dictatorship(labels, loa_weights).effective_weights, dtype=torch.float64)
    scale = effective[0] / asked[0]  # label 0 takes part in every case
    torch.testing.assert_close(effective, scale * asked, rtol=1e-3, atol=0)  # 4 significant digits printed
    if "LaALoss" in advised:
        laa_weights = advised["LaALoss"].weights
        laa_weights = torch.ones_like(asked) if laa_weights is None else laa_weights
        torch.testing.assert_close(laa_weights / laa_weights[0], asked / asked[0], rtol=1e-12, atol=0)


def test_the_advice_prints_the_weights_to_paste_and_they_undo_the_dictatorship():
    """pi = (0.5, 0.05) and a = (1.5, 1): effective weights 6 and 21.05, so plain LoA ranks (0,1) above (1,0)
    although the user asked label 1 to count 1.5 times label 2; the advised losses rank (1,0) first."""
    report = mlloss.label_dictatorship(LABELS, [1.5, 1.0], label_names=["click", "purchase"])
    assert str(report).splitlines()[-1] == (
        "'purchase' dictates the LoA ranking (ratio 3.51 ± 1.02 to the next label; threshold 2); "
        "LaALoss(weights=[1.5, 1]) or LoALoss(weights=[0.375, 0.0475]) (a_k pi_k (1 - pi_k) at these priors) "
        "weigh labels as asked"
    )
    asked = squared_optimum(mlloss.LoALoss([1.5, 1.0], surrogate="squared"))
    assert asked[ZERO_ONE] - asked[ONE_ZERO] > 0.1  # the priors override the request
    advised = advised_losses(report)
    laa = squared_optimum(mlloss.LaALoss(advised["LaALoss"].weights, surrogate="squared"))
    loa = squared_optimum(mlloss.LoALoss(advised["LoALoss"].weights, surrogate="squared"))
    for optimum in (laa, loa):
        assert optimum[ONE_ZERO] - optimum[ZERO_ONE] > 0.1


def test_the_table_prints_whole_names_and_any_mixing_weight():
    """Names were cut to 15 characters (two labels printed as 'purchase_within'), a_k printed as 6.3f
    (1e-4 as 0.000, 1e300 with 300 digits) and the ratio as .2f (300 digits again)."""
    labels = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    names = ["purchase_within_7d", "purchase_within_30d", "refund", "never"]
    report = mlloss.label_dictatorship(labels, [1e-4, 1e300, 3.0, 1.0], label_names=names)
    assert str(report).splitlines() == [
        "label                prior        a_k    a_k/(pi(1-pi))  share",
        "purchase_within_7d  0.5000   0.0001000         0.0004   0.0%",
        "purchase_within_30d 0.2500  1.000e+300     5.333e+300  100.0%",
        "refund              0.2500       3.000             16   0.0%",
        "never               0.0000       1.000       no pairs   0.0%",
        (
            "'purchase_within_30d' dictates the LoA ranking (ratio 3.33e+299 ± 3.14e+299 to the next label; "
            "threshold 2), as its mixing weights a_k ask: its prior adds nothing to it"
        ),
    ]


def test_short_names_keep_the_fixed_layout_and_a_wider_a_k_widens_its_column():
    """The README's layout (names padded to 15, a_k to 6) holds for short names and a_k like 1.000; a
    longer a_k (0.2500) widens its column and keeps two spaces after the prior."""
    assert str(mlloss.label_dictatorship(LABELS, label_names=["click", "purchase"])).splitlines()[:3] == [
        "label            prior   a_k    a_k/(pi(1-pi))  share",
        "click           0.5000  1.000              4  16.0%",
        "purchase        0.0500  1.000          21.05  84.0%",
    ]
    assert str(mlloss.label_dictatorship(LABELS, [0.25, 1.0], label_names=["click", "purchase"])).splitlines()[:3] == [
        "label            prior    a_k    a_k/(pi(1-pi))  share",
        "click           0.5000  0.2500              1   4.5%",
        "purchase        0.0500   1.000          21.05  95.5%",
    ]


@pytest.mark.parametrize("threshold", [1.0, 0.5, -3, math.inf, math.nan, True, "2", None])
def test_label_dictatorship_rejects_a_bad_threshold(threshold):
    with pytest.raises(ValueError, match=f"threshold must be a finite number > 1; got {re.escape(repr(threshold))}"):
        mlloss.label_dictatorship(LABELS, threshold=threshold)


def test_the_ratio_standard_error_is_the_delta_method_on_the_priors():
    """With pi_1 = 1/2 the first label's weight is flat in its prior, so only pi_2's binomial error counts:
    se(R) = R |d log alpha_2 / d pi_2| sqrt(pi_2 (1 - pi_2) / N) = R (1 - 2 pi_2) / sqrt(N pi_2 (1 - pi_2))."""
    report = mlloss.label_dictatorship(LABELS)
    pi = 0.05
    assert report.dominance_ratio_se == pytest.approx(report.dominance_ratio * (1 - 2 * pi) / math.sqrt(200 * pi * (1 - pi)))
    assert "ratio 5.26 ± 1.54 to the next label" in str(report)


def multinomial_draws(n: int, probabilities: torch.Tensor, draws: int, generator: torch.Generator) -> torch.Tensor:
    """(draws, C) category counts of n items, as a chain of binomials (each given the items left)."""
    left = torch.full((draws,), float(n), dtype=torch.float64)
    counts, mass_left = [], 1.0
    for p in probabilities[:-1].tolist():
        counts.append(torch.binomial(left, torch.full_like(left, min(p / mass_left, 1.0)), generator=generator))
        left, mass_left = left - counts[-1], mass_left - p
    return torch.stack(counts + [left], 1)


def test_the_ratio_standard_error_matches_a_parametric_bootstrap_of_correlated_labels():
    """Resample N items from the label combinations' frequencies: the spread of the ratio matches the reported
    standard error, the covariance of the two correlated priors included."""
    # (y1, y2) = (0,0), (0,1), (1,0), (1,1): pi_1 = 0.3, pi_2 = 0.1, both positive on 8% of the items.
    frequencies = torch.tensor([0.68, 0.02, 0.22, 0.08], dtype=torch.float64)
    n = 4000
    counts = (frequencies * n).round().long()
    report = mlloss.label_dictatorship(COMBINATIONS[torch.repeat_interleave(torch.arange(4), counts)])
    draws = multinomial_draws(n, frequencies, 20000, torch.Generator().manual_seed(0)) / n
    pi_1, pi_2 = draws[:, 2] + draws[:, 3], draws[:, 1] + draws[:, 3]
    ratios = (pi_1 * (1 - pi_1)) / (pi_2 * (1 - pi_2))  # alpha_2 / alpha_1 with a_1 = a_2 = 1
    assert report.dominant == "label_1"
    assert report.dominance_ratio_se == pytest.approx(float(ratios.std()), rel=0.02)
    independent = report.dominance_ratio * math.sqrt(((0.4 / 0.21) ** 2 * 0.21 + (0.8 / 0.09) ** 2 * 0.09) / n)
    assert abs(report.dominance_ratio_se - independent) > 0.1 * independent  # the covariance term matters here


def test_a_rare_label_prints_its_prior_not_zero():
    """Priors were printed to 4 decimals: a purchase rate of 3 in 100,000, the label that dictates, read
    0.0000 beside an effective weight of 3e4."""
    labels = torch.zeros(100_000, 2, dtype=torch.long)
    labels[:50_000, 0] = 1
    labels[:3, 1] = 1
    report = mlloss.label_dictatorship(labels, label_names=["click", "purchase"])
    header, *rows = str(report).splitlines()[:3]
    prior_end = header.index("prior") + len("prior")
    for row, prior in zip(rows, [0.5, 3 / 100_000]):
        printed = row.split()[1]
        assert row.index(printed) + len(printed) == prior_end  # right-aligned under its header
        assert float(printed) == pytest.approx(prior, rel=0.05)
