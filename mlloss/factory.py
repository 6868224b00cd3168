"""Deprecated alias: the registry is ``mlloss.registry`` and the cross-entropy losses are in
``mlloss.bce`` (this module held both). ``mlloss.build_loss`` and ``mlloss.BCELoss`` are unchanged."""

from ._deprecation import warn_moved
from .bce import INPUTS, BCELoss, BCEPlusRanking  # noqa: F401
from .registry import LOSSES, SINGLE_LABEL, build_loss, register_loss  # noqa: F401

warn_moved(
    "mlloss.factory",
    "mlloss.registry (build_loss, register_loss, LOSSES) and mlloss.bce (BCELoss, BCEPlusRanking)",
)
