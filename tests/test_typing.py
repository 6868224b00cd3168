"""The package's type hints hold: mypy checks ``mlloss/`` clean, and the wheel ships ``py.typed``
(PEP 561), so that users' type checkers read the hints of ``AUCLoss(...)``, ``build_loss(...)``,
``ranking_metrics(...)`` instead of treating the package as untyped.

The settings are pyproject.toml's ``[tool.mypy]`` (``mypy`` from the repository root runs the same
check). mypy's first run analyses torch too: about 30 s of a core.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_package_type_checks(tmp_path):
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra (docs/install.md)")
    stdout, stderr, status = api.run([
        "--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"),
        "--no-error-summary", str(REPO / "mlloss"),
    ])
    assert status == 0, f"mypy found errors in mlloss/:\n{stdout}{stderr}"


def test_the_wheel_ships_py_typed_and_every_module(tmp_path):
    """What `pip install .` installs: ``mlloss/py.typed`` beside every module of ``mlloss/``, and
    ``kernels/`` as ``mlloss/kernels/``. Built without isolation from the setuptools that torch
    requires (bdist_wheel is part of setuptools since 70.1)."""
    source = tmp_path / "source"  # a copy: setuptools builds in the source tree (build/, *.egg-info)
    for name in ("mlloss", "kernels"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheel").glob("mlloss-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "mlloss/py.typed" in names
    sources = {f"mlloss/{path.relative_to(REPO / 'mlloss').as_posix()}" for path in (REPO / "mlloss").rglob("*.py")}
    sources |= {f"mlloss/kernels/{path.relative_to(REPO / 'kernels').as_posix()}" for path in (REPO / "kernels").rglob("*.py")}
    assert sources - names == set(), f"missing from the wheel: {sorted(sources - names)}"
