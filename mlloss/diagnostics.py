r"""Which label dictates a loss-aggregated ranking (Lukasik et al. 2025, Prop. 5.2 and 6.1).

Loss aggregation with mixing weights a_k has the Bayes-optimal scorer
:math:`\sum_k \alpha_k \eta_k(x)` with effective weights :math:`\alpha_k = a_k / (\pi_k(1-\pi_k))`.
A skewed label (pi_k near 0 or 1) gets a large alpha_k and, when labels are (nearly)
deterministic, fixes the whole ranking: label dictatorship. ``label_dictatorship`` computes the
priors, the effective weights and their shares, and names the label that dominates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import _validation as check

# A label counts as dictating when its effective weight is at least this many times the next one.
DICTATORSHIP_RATIO = 2.0


@dataclass(frozen=True)
class DictatorshipReport:
    """Per-label priors and LoA weights, and the label that dominates (if any)."""

    label_names: tuple[str, ...]
    priors: tuple[float, ...]
    mixing_weights: tuple[float, ...]
    effective_weights: tuple[float, ...]  # a_k / (pi_k (1 - pi_k)); inf for a constant label
    shares: tuple[float, ...]  # effective weights normalised to sum to 1
    dominant: str  # name of the label with the largest effective weight
    dominance_ratio: float  # largest effective weight / second largest
    balanced_weights: tuple[float, ...]  # a_k = pi_k (1 - pi_k): equal effective weights

    @property
    def is_dictatorship(self) -> bool:
        return self.dominance_ratio >= DICTATORSHIP_RATIO

    def as_dict(self) -> dict[str, object]:
        """Flat numbers for a logger: ``prior/<name>``, ``effective_weight/<name>``, ..."""
        flat: dict[str, object] = {"dominant": self.dominant, "dominance_ratio": self.dominance_ratio}
        for k, name in enumerate(self.label_names):
            flat[f"prior/{name}"] = self.priors[k]
            flat[f"effective_weight/{name}"] = self.effective_weights[k]
            flat[f"share/{name}"] = self.shares[k]
        return flat

    def __str__(self) -> str:
        rows = ["label            prior   a_k    a_k/(pi(1-pi))  share"]
        for k, name in enumerate(self.label_names):
            rows.append(
                f"{name[:15]:<15} {self.priors[k]:6.4f} {self.mixing_weights[k]:6.3f} "
                f"{self.effective_weights[k]:14.4g}  {self.shares[k]:5.1%}"
            )
        verdict = (
            f"'{self.dominant}' dictates the LoA ranking ({self.dominance_ratio:.1f}x the next label); "
            f"LaALoss or LoALoss(weights='balanced') weigh labels as asked"
            if self.is_dictatorship
            else f"no label dominates (largest/next = {self.dominance_ratio:.2f})"
        )
        return "\n".join(rows + [verdict])


def label_dictatorship(
    labels: Tensor,
    weights: Sequence[float] | Tensor | None = None,
    *,
    label_names: Sequence[str] | None = None,
) -> DictatorshipReport:
    """Report the effective LoA weights of binary ``labels`` (N, K) under mixing ``weights``."""
    matrix = check.check_binary(check.label_matrix(labels, None))
    num_labels = matrix.shape[1]
    mixing = check.check_weights("weights", weights, strictly_positive=False)
    mixing = torch.ones(num_labels, dtype=torch.float64) if mixing is None else mixing
    check.check_weights_length("weights", mixing, num_labels)
    names = tuple(label_names) if label_names is not None else tuple(f"label_{k}" for k in range(num_labels))
    if len(names) != num_labels:
        raise ValueError(f"label_names has {len(names)} names for {num_labels} label columns: {names}")
    if matrix.shape[0] == 0:
        raise ValueError("labels are empty; priors need at least one item")
    priors = matrix.mean(0).cpu()
    spread = priors * (1 - priors)
    effective = torch.where(spread > 0, mixing / spread.clamp(min=1e-300), float("inf"))
    effective = torch.where(mixing > 0, effective, 0.0)
    shares = _shares(effective)
    ranked = torch.sort(effective, descending=True).values
    second = float(ranked[1]) if num_labels > 1 else float("nan")
    ratio = float(ranked[0] / ranked[1]) if num_labels > 1 and second > 0 else float("inf")
    return DictatorshipReport(
        label_names=names,
        priors=tuple(priors.tolist()),
        mixing_weights=tuple(mixing.tolist()),
        effective_weights=tuple(effective.tolist()),
        shares=tuple(shares.tolist()),
        dominant=names[int(torch.argmax(effective))],
        dominance_ratio=ratio if num_labels > 1 else 1.0,
        balanced_weights=tuple(spread.tolist()),
    )


def _shares(effective: Tensor) -> Tensor:
    infinite = torch.isinf(effective)
    if bool(infinite.any()):
        return infinite.to(torch.float64) / infinite.sum()
    return effective / effective.sum().clamp(min=1e-300)
