"""Helpers shared by the recipe tests: load a recipe script as a module, compare run histories."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def load_recipe(name: str) -> ModuleType:
    """``recipes/<name>.py`` imported as a module (the recipes are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_recipe", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does: torch.compile looks the module up by name
    spec.loader.exec_module(module)
    return module


def without_timing(history: list[dict]) -> list[dict]:
    """A recipe's per-epoch history without the wall-clock entries, which differ between runs."""
    return [{k: v for k, v in row.items() if "second" not in k and "per_s" not in k} for row in history]
