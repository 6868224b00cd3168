"""Deprecated alias of ``mlloss.ops.dispatch`` (the dispatcher was called ``ranking``)."""

from .._deprecation import warn_moved
from .dispatch import *  # noqa: F401,F403
from .dispatch import (  # noqa: F401 -- the names older code imported from here
    CLOSED_FORMS,
    LEVEL_RESOLUTION,
    MAX_PATTERN_COLUMNS,
    TIERS,
    PairLossResult,
    PairOptions,
    pair_loss,
    problem_levels,
    resolve_tier,
)
from .torch_tier import _owned_groups  # noqa: F401

warn_moved("mlloss.ops.ranking", "mlloss.ops.dispatch")
