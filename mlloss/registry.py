"""Build losses by name, so that a config line can swap one objective for another.

Names: ``"auc"``, ``"loa"``, ``"balanced-loa"``, ``"laa"``, ``"pdaom"``, ``"bce"``, and
``"bce+<name>"`` for a single-label pairwise loss added to binary cross-entropy with weight
``lam``, the objective of Sun et al. Eq. 7 (``"bce+pdaom"``) and its all-pairs analogue
(``"bce+auc"``). ``register_loss`` adds a name. The losses themselves live in ``losses``
(pairwise) and ``bce`` (cross-entropy).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from .bce import BCELoss, BCEPlusRanking
from .losses import AUCLoss, LaALoss, LoALoss, PDAOMLoss

__all__ = ["LOSSES", "SINGLE_LABEL", "build_loss", "register_loss"]


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
    """The loss called ``name`` built with ``kwargs``; ``"bce+<name>"`` also takes ``lam``,
    ``ranking_input`` and ``inputs`` (see ``BCEPlusRanking``), the rest go to the pairwise loss."""
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
        options = {key: kwargs.pop(key) for key in ("lam", "ranking_input", "inputs") if key in kwargs}
        return BCEPlusRanking(LOSSES[ranking_name](**kwargs), **options)
    if key not in LOSSES:
        known = sorted(LOSSES) + [f"bce+{n}" for n in sorted(SINGLE_LABEL)]
        raise ValueError(f"unknown loss name {name!r}; known: {', '.join(known)}")
    return LOSSES[key](**kwargs)
