"""Build losses by name, so that a config line can swap one objective for another.

Names: ``"auc"``, ``"loa"``, ``"balanced-loa"``, ``"laa"``, ``"pdaom"``, ``"bce"``, and
``"bce+<name>"`` for a single-label pairwise loss added to binary cross-entropy with weight
``lam``, the objective of Sun et al. Eq. 7 (``"bce+pdaom"``) and its all-pairs analogue
(``"bce+auc"``). ``register_loss`` adds a name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from . import _validation as check
from .losses import AUCLoss, LaALoss, LoALoss, PDAOMLoss
from .ops.pointwise import binary_cross_entropy


class BCELoss(nn.Module):
    """Binary cross-entropy on logits, mean over items; ``groups`` is ignored. An empty batch
    gives 0. ``validate_args``: check for non-finite logits and labels other than 0/1 (one host
    read per call), as the pairwise losses do."""

    def __init__(self, *, validate_args: bool = True) -> None:
        super().__init__()
        if not isinstance(validate_args, bool):
            raise TypeError(f"validate_args must be a bool; got {validate_args!r}")
        self.validate_args = validate_args

    def forward(self, logits: Tensor, labels: Tensor, groups: Tensor | None = None) -> Tensor:
        logits = check.scores_vector(logits, finite=False)
        labels = check.label_columns(labels, logits.shape[0])
        check.require_single_column(labels, "BCELoss")
        return binary_cross_entropy(logits, labels, validate=self.validate_args)


class BCEPlusRanking(nn.Module):
    r"""Cross-entropy plus ``lam`` times a pairwise term.

    With a ranking loss of ``reduction="mean"`` (``"bce+auc"``) this is
    ``mean_i CE_i + lam * ranking``. With ``reduction="sum"`` (PDAOM, ``"bce+pdaom"``) it is Sun et
    al. Eq. 7, ``sum_i CE_i + lam * sum_u phi_u``, divided by the number of items N so that the
    cross-entropy keeps its usual mean scale: ``mean_i CE_i + lam * sum_u phi_u / N``. ``lam`` is
    then the paper's lambda and does not have to change with the batch size (the paper's best was
    10 on its data; on ours ``docs/results.md`` finds 1 neutral and 10 harmful). N counts the
    items over all ranks when the ranking loss has ``cross_device=True``.

    With ``ranking_input="probability"`` (default) the pairwise term sees f = sigmoid(logits), as in
    Eq. 7, where PDAOM's surrogate acts on predicted probabilities; ``"logit"`` feeds it the logits.
    ``parts`` holds the two terms as added (the ranking term already divided by N for
    ``reduction="sum"``).
    """

    def __init__(self, ranking: nn.Module, lam: float = 1.0, ranking_input: str = "probability") -> None:
        super().__init__()
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0:
            raise ValueError(f"lam must be a number >= 0; got {lam!r}")
        self.ranking = ranking
        self.lam = float(lam)
        self.ranking_input = check.check_choice("ranking_input", ranking_input, ("probability", "logit"))
        self.bce = BCELoss(validate_args=getattr(ranking, "validate_args", True))
        self.parts: dict[str, Tensor] = {}

    def forward(self, logits: Tensor, labels: Tensor, groups: Tensor | None = None) -> Tensor:
        bce = self.bce(logits, labels)
        ranking_scores = torch.sigmoid(logits) if self.ranking_input == "probability" else logits
        ranking = self.ranking(ranking_scores, labels, groups)
        if getattr(self.ranking, "reduction", "mean") == "sum":  # Eq. 7 over N: see the class docstring
            ranking = ranking / max(getattr(self.ranking, "num_items", logits.shape[0]), 1)
        self.parts = {"bce": bce.detach(), "ranking": ranking.detach()}
        return bce + self.lam * ranking

    def extra_repr(self) -> str:
        return f"lam={self.lam}, ranking_input={self.ranking_input!r}"


LOSSES: dict[str, Callable[..., nn.Module]] = {
    "auc": AUCLoss,
    "pdaom": PDAOMLoss,
    "loa": LoALoss,
    "balanced-loa": partial(LoALoss, weights="balanced"),
    "laa": LaALoss,
    "bce": BCELoss,
}
# Pairwise losses that take one binary label and so combine with BCE on the same logits.
SINGLE_LABEL = {"auc", "pdaom"}


def register_loss(name: str, factory: Callable[..., nn.Module], *, single_label: bool = False) -> None:
    """Make ``build_loss(name, ...)`` call ``factory(...)``."""
    if not isinstance(name, str) or not name or "+" in name:
        raise ValueError(f"a loss name must be a non-empty string without '+'; got {name!r}")
    LOSSES[name] = factory
    if single_label:
        SINGLE_LABEL.add(name)


def build_loss(name: str, **kwargs) -> nn.Module:
    """The loss called ``name`` built with ``kwargs``; ``"bce+<name>"`` also takes ``lam`` and
    ``ranking_input`` (see ``BCEPlusRanking``), the rest go to the pairwise loss."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string; got {type(name).__name__}")
    key = name.strip().lower()
    if key.startswith("bce+"):
        ranking_name = key[len("bce+"):]
        if ranking_name not in SINGLE_LABEL:
            raise ValueError(
                f"'bce+' combines with a single-label pairwise loss ({', '.join(sorted(SINGLE_LABEL))}); "
                f"got name={name!r}"
            )
        lam = kwargs.pop("lam", 1.0)
        ranking_input = kwargs.pop("ranking_input", "probability")
        return BCEPlusRanking(LOSSES[ranking_name](**kwargs), lam=lam, ranking_input=ranking_input)
    if key not in LOSSES:
        known = sorted(LOSSES) + [f"bce+{n}" for n in sorted(SINGLE_LABEL)]
        raise ValueError(f"unknown loss name {name!r}; known: {', '.join(known)}")
    return LOSSES[key](**kwargs)
