r"""Which label dictates a loss-aggregated ranking (Lukasik et al. 2025, Prop. 5.2 and 6.1).

Loss aggregation with mixing weights a_k has the Bayes-optimal scorer
:math:`\sum_k \alpha_k \eta_k(x)` with effective weights :math:`\alpha_k = a_k / (\pi_k(1-\pi_k))`.
A skewed label (pi_k near 0 or 1) gets a large alpha_k and, when labels are (nearly)
deterministic, fixes the whole ranking: label dictatorship. ``label_dictatorship`` computes the
priors, the effective weights and their shares, and says how much the top label outweighs the next.

A label *takes part* in the LoA ranking when it has both classes (0 < pi_k < 1) and a_k > 0. A label
that is never (or always) positive has no (positive, negative) pair: ``LoALoss`` gives it the loss
L_k = 0, so its effective weight is 0 and it has no say in the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import _validation as check

# Default threshold: a label dictates when its effective weight is at least this many times the next one
# (and more than all the others together).
DICTATORSHIP_RATIO = 2.0
# Below this ratio no label dominates; from it up to the threshold the top label tilts the ranking.
TILT_RATIO = 1.25

# The printed table: the name, prior and a_k columns are at least this wide, and wider for longer entries.
_NAME_WIDTH = 15
_PRIOR_WIDTH = 6
_MIXING_WIDTH = 6
_TAKING_PART = "a label needs both classes and a_k > 0"


@dataclass(frozen=True)
class DictatorshipReport:
    """Per-label priors and LoA weights, and how much the top label outweighs the next.

    Attributes:
        label_names: one name per label column.
        priors: pi_k, the fraction of items positive for label k.
        mixing_weights: the LoA mixing weights a_k.
        effective_weights: alpha_k = a_k / (pi_k (1 - pi_k)), the weight of label k in the Bayes-optimal
            score; 0 for a label that takes no part (without both classes, printed "no pairs", or a_k = 0).
        shares: the effective weights normalised to sum to 1; 0 for a label that takes no part, and all 0
            when no label takes part.
        dominant: the label with the largest effective weight; ``None`` when no label takes part.
        dominance_ratio: the largest effective weight over the next one, among the labels that take part
            (finite, >= 1); 1.0 by convention when fewer than two labels take part (none to outweigh).
        balanced_weights: a_k = pi_k (1 - pi_k), which give every label with both classes the same
            effective weight (0 for a label without both classes).
        dominance_ratio_se: the standard error of ``dominance_ratio`` from the sampling error of the priors
            (delta method, see :func:`label_dictatorship`); NaN when fewer than two labels take part.
        threshold: the ratio from which the dominant label is said to dictate the ranking (if its share is
            also above 1/2).
    """

    label_names: tuple[str, ...]
    priors: tuple[float, ...]
    mixing_weights: tuple[float, ...]
    effective_weights: tuple[float, ...]
    shares: tuple[float, ...]
    dominant: str | None
    dominance_ratio: float
    balanced_weights: tuple[float, ...]
    dominance_ratio_se: float
    threshold: float

    @property
    def has_both_classes(self) -> tuple[bool, ...]:
        """Per label, whether it has both classes (0 < prior < 1), hence (positive, negative) pairs."""
        return tuple(0.0 < prior < 1.0 for prior in self.priors)

    @property
    def takes_part(self) -> tuple[bool, ...]:
        """Per label, whether it takes part in the LoA ranking (both classes and a_k > 0)."""
        return tuple(weight > 0 for weight in self.effective_weights)

    @property
    def is_dictatorship(self) -> bool:
        """Whether the dominant label's effective weight is at least ``threshold`` times the next one and
        more than all the others' together (a share above 1/2; with two labels the ratio implies it)."""
        return self.dominance_ratio >= self.threshold and self._dominant_share() > 0.5

    def _dominant_share(self) -> float:
        return max(self.shares, default=0.0)

    def _asked_ratio(self) -> float:
        """The mixing weights' own ratio a_top / a_next for the dominant label and the next one."""
        ranked = sorted(range(len(self.effective_weights)), key=lambda k: -self.effective_weights[k])
        return self.mixing_weights[ranked[0]] / self.mixing_weights[ranked[1]]

    def as_dict(self) -> dict[str, object]:
        """Flat values for a logger: ``dominant`` (left out when it is ``None``), ``dominance_ratio``,
        ``prior/<name>``, ``effective_weight/<name>`` and ``share/<name>``; all finite."""
        flat: dict[str, object] = {} if self.dominant is None else {"dominant": self.dominant}
        flat["dominance_ratio"] = self.dominance_ratio
        for k, name in enumerate(self.label_names):
            flat[f"prior/{name}"] = self.priors[k]
            flat[f"effective_weight/{name}"] = self.effective_weights[k]
            flat[f"share/{name}"] = self.shares[k]
        return flat

    def __str__(self) -> str:
        # Whole names (two names may share their first 15 characters) and a_k to 4 significant digits
        # (a fixed-point column printed 1e-4 as 0.000 and 1e300 with 300 digits).
        name_width = max([_NAME_WIDTH, *(len(name) for name in self.label_names)])
        mixing = [_significant(weight) for weight in self.mixing_weights]
        mixing_width = max([_MIXING_WIDTH, *(len(text) + 1 for text in mixing)])  # two spaces after the prior
        priors = [_prior(prior) for prior in self.priors]
        prior_width = max([_PRIOR_WIDTH, *(len(text) for text in priors)])
        header = f"{'label':<{name_width}} {'prior':>{prior_width}} {'a_k':>{mixing_width - 1}}    a_k/(pi(1-pi))  share"
        rows = [self._row(k, name_width, f"{priors[k]:>{prior_width}}", f"{mixing[k]:>{mixing_width}}")
                for k in range(len(self.label_names))]
        return "\n".join([header, *rows, self._verdict()])

    def _row(self, k: int, name_width: int, prior: str, mixing: str) -> str:
        weight = f"{self.effective_weights[k]:14.4g}" if self.has_both_classes[k] else f"{'no pairs':>14}"
        return f"{self.label_names[k]:<{name_width}} {prior} {mixing} {weight}  {self.shares[k]:5.1%}"

    def _advice(self) -> str:
        """The losses whose Bayes-optimal scorer weighs the labels by the asked a_k (up to a common factor).

        LaA's scorer is sum_k w_k eta_k whatever the priors (Prop. 5.4), so w_k = a_k; LoA's effective
        weight is a_k' / (pi_k (1 - pi_k)) (Prop. 5.2), so a_k' = a_k pi_k (1 - pi_k), which
        ``LoALoss("balanced")`` gives only when the a_k are all equal. LaA needs w_k > 0."""
        if len(set(self.mixing_weights)) == 1:
            return "LaALoss or LoALoss(weights='balanced') weigh labels as asked"
        loa = [weight * spread for weight, spread in zip(self.mixing_weights, self.balanced_weights)]
        advice = f"LoALoss(weights={_listed(loa)}) (a_k pi_k (1 - pi_k) at these priors)"
        if min(self.mixing_weights) > 0:
            return f"LaALoss(weights={_listed(self.mixing_weights)}) or {advice} weigh labels as asked"
        return f"{advice} weighs labels as asked"

    def _verdict(self) -> str:
        if self.dominant is None:
            return f"no label takes part in the LoA ranking ({_TAKING_PART})"
        if sum(self.takes_part) < 2:
            return f"only '{self.dominant}' takes part in the LoA ranking ({_TAKING_PART}): no label dictates"
        ratio = f"ratio {_decimals(self.dominance_ratio)} ± {_decimals(self.dominance_ratio_se)}"
        if self.is_dictatorship:
            verdict = f"'{self.dominant}' dictates the LoA ranking ({ratio} to the next label; threshold {self.threshold:g})"
            if self.dominance_ratio <= self._asked_ratio() * (1 + 1e-9):
                return f"{verdict}, as its mixing weights a_k ask: its prior adds nothing to it"
            return f"{verdict}; {self._advice()}"
        if self.dominance_ratio >= self.threshold:
            return (
                f"'{self.dominant}' tilts the LoA ranking ({ratio} to the next label, but a share of "
                f"{self._dominant_share():.0%}: it does not outweigh the others together)"
            )
        if self.dominance_ratio >= TILT_RATIO:
            return f"'{self.dominant}' tilts the LoA ranking ({ratio} to the next label; dictates from {self.threshold:g})"
        return f"no label dominates (largest/next: {ratio}; dictates from {self.threshold:g})"


def label_dictatorship(
    labels: Tensor,
    weights: Sequence[float] | Tensor | None = None,
    *,
    label_names: Sequence[str] | None = None,
    threshold: float = DICTATORSHIP_RATIO,
) -> DictatorshipReport:
    r"""Report the effective LoA weights of binary ``labels`` (N, K) under mixing ``weights``.

    The dominance ratio is the largest effective weight over the next one, among the labels that take
    part (both classes and a_k > 0): how many times more a unit of the top label's class probability
    counts than one of the next label's in the Bayes-optimal LoA score :math:`\sum_k \alpha_k \eta_k(x)`
    (Prop. 5.2). With two deterministic labels any ratio above 1 lets the top label decide every pair on
    which they disagree (Prop. 6.1); with more labels the top label decides every pair it separates when
    its effective weight exceeds the others' together (its share is above 1/2), whatever the ratio. With
    noisy labels the larger the ratio, the closer the LoA ranking is to ranking by the top label alone.
    ``threshold`` is therefore a convention, not a test: the default 2 says a label dictates when it counts
    at least twice as much as any other and more than all the others together. The report says "tilts"
    from ``TILT_RATIO`` (1.25) up to the threshold (or above it, for a label that does not outweigh the
    others together), and "no label dominates" below. A dictating label is either asked for (its ratio is
    no more than the mixing weights' own a_top / a_next) or made by the priors, and the verdict says which;
    for one made by the priors it names the losses that weigh the labels as the a_k ask: ``LaALoss`` with
    w_k = a_k, or ``LoALoss`` with a_k pi_k (1 - pi_k) (``weights="balanced"`` when the a_k are all equal).

    The priors are estimated from the N items, so the ratio is uncertain. ``dominance_ratio_se`` is its
    first-order (delta-method) standard error: with :math:`g_k = (1 - 2\pi_k) / (\pi_k (1 - \pi_k))`, the
    derivative of :math:`-\log \alpha_k` in :math:`\pi_k`, and the multinomial covariance of the two priors,
    :math:`\mathrm{Cov}(\hat\pi_j, \hat\pi_k) = (\pi_{jk} - \pi_j \pi_k) / N` (:math:`\pi_{jk}` the rate of
    items positive for both), :math:`\mathrm{se}(R) = R\, \mathrm{sd}(g_{top} \hat\pi_{top} - g_{next}
    \hat\pi_{next})`. It treats a_k as fixed and vanishes to first order when both priors are 1/2.

    Args:
        labels: 0/1 labels of shape (N, K), or (N,) for one label; N >= 1.
        weights: the mixing weights a_k >= 0, shape (K,); all ones (plain ``LoALoss()``) when omitted.
        label_names: K names for the report; ``label_<k>`` when omitted.
        threshold: the dominance ratio from which a label is said to dictate; a finite number > 1.

    Raises:
        ValueError: on non-binary or empty labels, weights or names of the wrong length or negative or
            non-finite weights, or a threshold that is not a finite number > 1.
    """
    matrix = check.check_binary(check.label_matrix(labels, None)).cpu()
    num_labels = matrix.shape[1]
    mixing = check.check_weights("weights", weights, strictly_positive=False)
    mixing = torch.ones(num_labels, dtype=torch.float64) if mixing is None else mixing
    check.check_weights_length("weights", mixing, num_labels)
    names = check.check_label_names("label_names", label_names) or tuple(f"label_{k}" for k in range(num_labels))
    if len(names) != num_labels:
        raise ValueError(f"label_names has {len(names)} names for {num_labels} label columns: {names}")
    threshold = _check_threshold(threshold)
    if matrix.shape[0] == 0:
        raise ValueError("labels are empty; priors need at least one item")
    priors = matrix.mean(0)
    spread = priors * (1 - priors)
    takes_part = (spread > 0) & (mixing > 0)
    effective = torch.where(takes_part, mixing / torch.where(takes_part, spread, 1.0), 0.0)
    total = effective.sum()
    shares = effective / total if total > 0 else effective
    top, ratio, ratio_se = _dominance(matrix, effective)
    return DictatorshipReport(
        label_names=names,
        priors=tuple(priors.tolist()),
        mixing_weights=tuple(mixing.tolist()),
        effective_weights=tuple(effective.tolist()),
        shares=tuple(shares.tolist()),
        dominant=None if top is None else names[top],
        dominance_ratio=ratio,
        balanced_weights=tuple(spread.tolist()),
        dominance_ratio_se=ratio_se,
        threshold=threshold,
    )


def _significant(value: float) -> str:
    """``value`` to 4 significant digits, trailing zeros kept (1.000, 0.04750, 1.000e-05), no bare point."""
    return f"{value:#.4g}".removesuffix(".")


def _prior(value: float) -> str:
    """A prior to 4 decimals (0.0500), or to 2 significant digits below 5e-5 (3.0e-05), where 4 decimals
    would print a label with positives (a rare purchase, the label that dictates) as 0.0000."""
    return f"{value:.1e}" if 0 < value < 5e-5 else f"{value:.4f}"


def _decimals(value: float) -> str:
    """Two decimals for an ordinary ratio (5.26); 3 significant digits from a million on (3.33e+299, where
    two decimals would print 300 digits)."""
    return f"{value:.2f}" if abs(value) < 1e6 else f"{value:.3g}"


def _listed(values: Sequence[float]) -> str:
    """A Python list of ``values`` to 4 significant digits, for advice the user can paste."""
    return "[" + ", ".join(f"{value:.4g}" for value in values) + "]"


def _check_threshold(threshold: object) -> float:
    return check.check_finite_number("threshold", threshold, above=1)


def _dominance(matrix: Tensor, effective: Tensor) -> tuple[int | None, float, float]:
    """The index of the largest effective weight (``None`` if all are 0), its ratio to the next positive
    one and the ratio's standard error (1.0 and NaN with fewer than two positive weights)."""
    order = torch.sort(effective, descending=True, stable=True).indices.tolist()
    taking_part = int((effective > 0).sum())
    if taking_part < 2:
        return (order[0] if taking_part else None), 1.0, math.nan
    top, second = order[0], order[1]
    ratio = float(effective[top] / effective[second])
    return top, ratio, ratio * _log_ratio_se(matrix[:, [top, second]])


def _log_ratio_se(pair: Tensor) -> float:
    """Delta-method standard error of log(alpha_top / alpha_next) from the priors of the (N, 2) columns
    ``pair`` (top label first), each with both classes."""
    priors = pair.mean(0)
    covariance = pair.T @ pair / pair.shape[0] - torch.outer(priors, priors)  # of one item's labels
    slope = (1 - 2 * priors) / (priors * (1 - priors))  # d(-log alpha_k) / d pi_k
    gradient = torch.stack([slope[0], -slope[1]])
    variance = gradient @ covariance @ gradient / pair.shape[0]
    return math.sqrt(max(float(variance), 0.0))
