"""Deprecated alias of :mod:`mlloss.integrations.lightning` (``RankingMetrics``)."""

from ._deprecation import warn_moved
from .integrations.lightning import *  # noqa: F401,F403

warn_moved("mlloss.lightning", "mlloss.integrations.lightning")
