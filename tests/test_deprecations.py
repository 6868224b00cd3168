"""The old import paths (mlloss/_deprecation.py): each warns once, pointing at the importing line,
and gives the same objects as its new path. One fresh subprocess imports every old path (this
process may have imported them already, through a recipe), then imports it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# old path -> the new modules whose names it re-exports; None: the names listed in MOVED_NAMES.
ALIASES = {
    "mlloss.towers": ["mlloss.models.embeddings", "mlloss.models.towers"],
    "mlloss.factory": ["mlloss.registry", "mlloss.bce"],
    "mlloss.ops.ranking": ["mlloss.ops.dispatch"],
    "mlloss.lightning": ["mlloss.integrations.lightning"],
    "mlloss.sharding": ["mlloss.integrations.torchrec", "mlloss.integrations.torchrec_strategy"],
}
OPS_RANKING_NAMES = ["CLOSED_FORMS", "LEVEL_RESOLUTION", "MAX_PATTERN_COLUMNS", "TIERS", "PairLossResult",
                     "PairOptions", "pair_loss", "problem_levels", "resolve_tier"]
MOVED_NAMES = {"mlloss.checkpointing": ("mlloss.integrations.lightning_checkpoints",
                                        ["AtomicCheckpointIO", "BatchPause", "fault_test_callbacks"])}
NEEDS_LIGHTNING = {"mlloss.lightning", "mlloss.sharding", "mlloss.checkpointing"}

CHECK = r"""
import importlib, json, sys, warnings

ALIASES, OPS_RANKING_NAMES, MOVED_NAMES = json.loads(sys.argv[1])
report = {}


def run(code):
    namespace = {}
    exec(compile(code, "caller.py", "exec"), namespace)
    return namespace


def deprecations(caught, old):
    return [[str(w.message), w.filename] for w in caught
            if issubclass(w.category, DeprecationWarning) and str(w.message).startswith(old)]


for old, new_modules in ALIASES.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            first = run(f"import {old} as alias")["alias"]
        except ImportError as error:
            report[old] = {"skipped": str(error)}
            continue
        again = run(f"import {old} as alias")["alias"]
    names = {}
    for new in new_modules:
        module = importlib.import_module(new)
        wanted = getattr(module, "__all__", None) or OPS_RANKING_NAMES
        names.update({name: getattr(module, name) for name in wanted})
    report[old] = {
        "warnings": deprecations(caught, old),
        "different": sorted(name for name, value in names.items() if getattr(again, name) is not value),
        "names": len(names),
        "same_module": first is again,
    }

for old, (new, moved) in MOVED_NAMES.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            first = run(f"from {old} import {', '.join(moved)}")
        except ImportError as error:
            report[old] = {"skipped": str(error)}
            continue
        again = run(f"import {old} as alias\nvalues = [{', '.join('alias.' + name for name in moved)}]")
    module = importlib.import_module(new)
    report[old] = {
        "warnings": deprecations(caught, old),
        "different": sorted(name for i, name in enumerate(moved)
                            if not (first[name] is again["values"][i] is getattr(module, name))),
        "names": len(moved),
    }
print("REPORT " + json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    argument = json.dumps([ALIASES, OPS_RANKING_NAMES, MOVED_NAMES])
    result = subprocess.run([sys.executable, "-c", CHECK, argument], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_old_module_path_warns_once_and_gives_the_same_objects(report, old):
    result = report[old]
    if "skipped" in result:
        assert old in NEEDS_LIGHTNING, result["skipped"]
        pytest.skip(f"{old} needs pytorch-lightning: {result['skipped']}")
    assert len(result["warnings"]) == 1, result["warnings"]
    message, filename = result["warnings"][0]
    assert "the old name will be removed" in message and all(new in message for new in ALIASES[old])
    assert filename == "caller.py"  # the warning points at the line that imported the old path
    assert result["names"] > 0 and result["different"] == []


def test_moved_checkpointing_names_warn_once_each_and_are_the_same_objects(report):
    result = report["mlloss.checkpointing"]
    if "skipped" in result:
        pytest.skip(f"needs pytorch-lightning: {result['skipped']}")
    new, moved = MOVED_NAMES["mlloss.checkpointing"]
    assert [message.split(" is now ")[0] for message, _ in result["warnings"]] == \
        [f"mlloss.checkpointing.{name}" for name in moved]
    assert all(f" is now {new}." in message and filename == "caller.py" for message, filename in result["warnings"])
    assert result["different"] == []
