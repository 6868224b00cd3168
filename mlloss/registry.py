"""Build losses by name, so that a config line can swap one objective for another.

Names: ``"auc"``, ``"loa"``, ``"balanced-loa"``, ``"laa"``, ``"pdaom"``, ``"bce"``, and
``"bce+<name>"`` for a single-label pairwise loss added to binary cross-entropy with weight
``lam``, the objective of Sun et al. Eq. 7 (``"bce+pdaom"``) and its all-pairs analogue
(``"bce+auc"``). ``register_loss`` adds a name. The losses themselves live in ``losses``
(pairwise) and ``bce`` (cross-entropy).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from ._validation import check_bool
from .bce import BCELoss, BCEPlusRanking
from .losses import AUCLoss, LaALoss, LoALoss, PDAOMLoss

__all__ = ["LOSSES", "SINGLE_LABEL", "build_loss", "register_loss"]


def _balanced_loa(**options) -> LoALoss:
    """``LoALoss(weights="balanced")``; a ``weights`` option would silently make it a plain LoA."""
    if "weights" in options:
        raise ValueError(
            f"'balanced-loa' sets weights='balanced'; got weights={options['weights']!r}: "
            "use build_loss('loa', weights=...) for fixed mixing weights"
        )
    return LoALoss(weights="balanced", **options)


LOSSES: dict[str, Callable[..., nn.Module]] = {
    "auc": AUCLoss,
    "pdaom": PDAOMLoss,
    "loa": LoALoss,
    "balanced-loa": _balanced_loa,
    "laa": LaALoss,
    "bce": BCELoss,
}
# Pairwise losses that take one binary label and so combine with BCE on the same logits.
SINGLE_LABEL = {"auc", "pdaom"}
# The options "bce+<name>" takes for itself (BCEPlusRanking's); the others go to the pairwise loss.
COMBINED_OPTIONS = ("lam", "ranking_input", "inputs")


def register_loss(
    name: str, factory: Callable[..., nn.Module], *, single_label: bool = False, replace: bool = False
) -> None:
    """Make ``build_loss(name, ...)`` call ``factory(...)``.

    Names match as ``build_loss`` reads them: stripped and in lower case. ``single_label=True``
    (one binary label, like ``"auc"``) also makes ``"bce+<name>"``. A name that is taken, a
    built-in one too, raises unless ``replace=True``."""
    key = _key(name)
    if not key or "+" in key:
        raise ValueError(f"a loss name must be a non-empty string without '+'; got {name!r}")
    if not callable(factory) or isinstance(factory, nn.Module):
        raise TypeError(f"factory must build the loss (a loss class, or a function that returns one); got {factory!r}")
    check_bool("single_label", single_label)
    check_bool("replace", replace)
    if key in LOSSES and not replace:
        taken = getattr(LOSSES[key], "__name__", None) or repr(LOSSES[key])
        raise ValueError(f"the loss name {key!r} is taken (by {taken}); pass replace=True to replace it")
    LOSSES[key] = factory
    if single_label:
        SINGLE_LABEL.add(key)
    else:
        SINGLE_LABEL.discard(key)


def _key(name: object) -> str:
    """A loss name as the registry holds it."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string; got {type(name).__name__}")
    return name.strip().lower()


def build_loss(name: str, **kwargs) -> nn.Module:
    """The loss called ``name`` built with ``kwargs``; ``"bce+<name>"`` also takes ``lam``,
    ``ranking_input`` and ``inputs`` (see ``BCEPlusRanking``), the rest go to the pairwise loss."""
    key = _key(name)
    if key.startswith("bce+"):
        ranking_name = key[len("bce+"):]
        if ranking_name not in SINGLE_LABEL:
            raise ValueError(
                f"'bce+' combines with a single-label pairwise loss ({', '.join(sorted(SINGLE_LABEL))}); "
                f"got name={name!r}"
            )
        options = {option: kwargs.pop(option) for option in COMBINED_OPTIONS if option in kwargs}
        _check_options(name, LOSSES[ranking_name], kwargs, also=COMBINED_OPTIONS)
        return BCEPlusRanking(LOSSES[ranking_name](**kwargs), **options)
    if key not in LOSSES:
        known = sorted(LOSSES) + [f"bce+{n}" for n in sorted(SINGLE_LABEL)]
        raise ValueError(f"unknown loss name {name!r}; known: {', '.join(known)}")
    _check_options(name, LOSSES[key], kwargs)
    return LOSSES[key](**kwargs)


def _check_options(name: str, factory: Callable[..., nn.Module], options: dict, also: tuple[str, ...] = ()) -> None:
    """Raise, naming the loss and what it takes, for an option ``factory`` has no parameter for
    (a config's typo, or ``lam`` given to a loss without ``"bce+"``). Factories that take
    ``**kwargs`` (``"balanced-loa"``, a user's) or whose signature cannot be read are trusted."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    accepted = [parameter.name for parameter in parameters if parameter.kind in named]
    unknown = [option for option in options if option not in accepted]
    if not unknown:
        return
    combined = [option for option in unknown if option in COMBINED_OPTIONS]  # given to a loss without "bce+"
    hint = ""
    if combined:
        hint = (f" ({', '.join(map(repr, combined))} {'is an option' if len(combined) == 1 else 'are options'} "
                "of 'bce+<name>', e.g. build_loss('bce+pdaom', lam=...))")
    raise TypeError(
        f"build_loss({name!r}) got unknown option(s) {', '.join(map(repr, unknown))}; "
        f"it takes {', '.join(list(also) + accepted)}{hint}"
    )
