"""What each module imports: the core (losses, metrics, models, data, checkpoints) imports no
framework, no plotting library and not triton, and each integration nothing beyond the extras that
``mlloss._extras.MODULE_EXTRAS`` gives it and what those import themselves (Lightning brings
torchmetrics, hence matplotlib; Lightning and TorchRec bring triton through torch). Imports run in
fresh subprocesses, whose ``sys.modules`` is read after each step: one for the core, one for
Lightning and then TorchRec, one for TorchRec without Lightning."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlloss._extras import EXTRA_MODULES, MODULE_EXTRAS

REPO = Path(__file__).resolve().parents[1]
WATCHED = tuple(sorted({name for names in EXTRA_MODULES.values() for name in names} | {"lightning", "matplotlib"}))
CORE = ("mlloss", "mlloss.models", "mlloss.data", "mlloss.metrics", "mlloss.checkpointing", "mlloss.evaluation",
        "mlloss.integrations")

REPORT = f"""
import json, sys

def report(label):
    print(label + " " + json.dumps(sorted({{m.partition(".")[0] for m in sys.modules}} & set({WATCHED!r}))))
"""


def loaded(steps: dict[str, str]) -> dict[str, set[str]]:
    """Run each step's code in turn in one fresh interpreter; the WATCHED top-level modules in
    ``sys.modules`` after each step."""
    script = REPORT + "".join(f"{code}\nreport({label!r})\n" for label, code in steps.items())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [line.partition(" ") for line in result.stdout.splitlines()]
    return {label: set(json.loads(value)) for label, _, value in lines if label in steps}


def installed(extras: tuple[str, ...]) -> bool:
    return all(importlib.util.find_spec(EXTRA_MODULES[extra][0]) is not None for extra in extras)


def test_the_core_imports_no_framework_no_plotting_and_not_triton():
    # One interpreter for all: if together they load none of WATCHED, each alone loads none.
    assert loaded({"core": "\n".join(f"import {module}" for module in CORE)})["core"] == set()


# The modules that need the same extras, imported together (if together they add nothing to what
# the extras load, none alone does).
BY_EXTRAS = {extras: [m for m, e in sorted(MODULE_EXTRAS.items()) if e == extras] for extras in MODULE_EXTRAS.values()}


def _framework(extras: tuple[str, ...]) -> str:
    return "\n".join(f"import {name}" for extra in extras for name in EXTRA_MODULES[extra])


def _modules(extras: tuple[str, ...]) -> str:
    return "\n".join(f"import {m}" for m in BY_EXTRAS[extras])


@pytest.fixture(scope="module")
def integrations() -> dict[str, set[str]]:
    """Each integration's imports, from two fresh interpreters (each spends ~9 s importing the
    frameworks): one imports Lightning, the modules that need it, then TorchRec and the modules
    that need both (what each step adds is checked against the framework step before it); the
    other, without Lightning, the TorchRec tables (imported, then used) and the modules that
    need TorchRec. Labels: ``framework:<extras>``, ``modules:<extras>``, ``tables-import``, ``tables-use``."""
    with_lightning, without = {}, {}
    for extras in (("lightning",), ("lightning", "torchrec")):
        if installed(extras):
            with_lightning |= {f"framework:{'+'.join(extras)}": _framework(extras),
                               f"modules:{'+'.join(extras)}": _modules(extras)}
    if installed(("torchrec",)):
        without = {
            "tables-import": "import torch\nfrom mlloss.integrations.torchrec import TorchRecEmbedding, ids_to_kjt",
            "tables-use": "ids_to_kjt(torch.zeros(2, 2, dtype=torch.long), ['a', 'b'])\n"
                          "TorchRecEmbedding([3, 4], 2)(torch.zeros(2, 2, dtype=torch.long))",
            "framework:torchrec": _framework(("torchrec",)), "modules:torchrec": _modules(("torchrec",)),
        }
    return {label: names for steps in (with_lightning, without) if steps for label, names in loaded(steps).items()}


@pytest.mark.parametrize("extras", sorted(BY_EXTRAS), ids="+".join)
def test_each_integration_imports_only_its_extras(extras, integrations):
    if not installed(extras):
        pytest.skip(f"{BY_EXTRAS[extras]} need {extras}")
    label = "+".join(extras)
    assert integrations[f"modules:{label}"] - integrations[f"framework:{label}"] == set(), \
        f"{BY_EXTRAS[extras]} imported more than {extras}"
    if "lightning" not in extras:  # imported before Lightning could
        assert not integrations[f"modules:{label}"] & set(EXTRA_MODULES["lightning"])


def test_torchrec_tables_need_torchrec_but_not_lightning(integrations):
    if not installed(("torchrec",)):
        pytest.skip("TorchRec is not installed (docs/install.md)")
    assert integrations["tables-import"] == set()  # torchrec is imported on first use
    use = integrations["tables-use"]
    assert {"torchrec", "fbgemm_gpu"} <= use and not use & {"pytorch_lightning", "lightning_fabric"}
