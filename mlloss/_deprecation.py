"""Deprecation aliases: old import paths keep working and say once where the name went.

One message for every alias, ``<old> is now <new>; the old name will be removed``
(a ``DeprecationWarning`` pointing at the importing line), in two forms:

* a moved module (``mlloss.towers``, ``mlloss.lightning``, ``mlloss.sharding``, ``mlloss.factory``,
  ``mlloss.ops.ranking``): the old file re-exports the new module's names and calls
  :func:`warn_moved` at its import; Python runs a module once, so it warns once;
* moved names of a module that stays (``mlloss.checkpointing.AtomicCheckpointIO``): the module sets
  ``__getattr__ = moved_names(__name__, {name: new module})``, which imports the new module on the
  first access of a name, warns, and stores the object in the old module, so that the name is
  found there afterwards without a second warning.

``tests/test_deprecations.py`` checks each alias: one warning, the same objects as the new path.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now ``new``. The default ``stacklevel`` names the line that imported
    the old module when called from that module's top level (Python skips its import machinery)."""
    warnings.warn(f"{old} is now {new}; the old name will be removed", DeprecationWarning, stacklevel=stacklevel)


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for the names of ``module`` that moved: ``moved`` maps
    each name to the module that now holds it (imported only when the name is asked for)."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(moved[name]), name)
        warn_moved(f"{module}.{name}", f"{moved[name]}.{name}")
        setattr(sys.modules[module], name, value)  # found without this hook from now on: one warning
        return value

    return __getattr__
