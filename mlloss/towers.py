"""Deprecated alias of :mod:`mlloss.models`: the towers are ``mlloss.models.towers``, the
embeddings ``mlloss.models.embeddings``."""

from ._deprecation import warn_moved
from .models.embeddings import *  # noqa: F401,F403
from .models.towers import *  # noqa: F401,F403

warn_moved("mlloss.towers", "mlloss.models (mlloss.models.towers and mlloss.models.embeddings)")
