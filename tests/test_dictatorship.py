"""Label dictatorship (Lukasik et al. 2025, Prop. 6.1 / 6.2) shown on the losses themselves.

Two deterministic labels; label 1 is balanced (pi_1 = 0.5), label 2 is skewed (pi_2 = 0.05). One free
score per label combination (0,0), (0,1), (1,0), (1,1) is fitted to each loss. LoA(1,1) gives label 2
the effective weight 1/(pi_2(1-pi_2)) = 21 against label 1's 4, so it ranks (0,1) above (1,0); LaA
and balanced LoA give the two combinations the same score.
"""

from __future__ import annotations

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
    optimum = -torch.linalg.pinv(hessian) @ slope
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
