"""The install contract (README, Quickstart; docs/install.md): the core install is torch, numpy and torchmetrics.

Lightning and Triton are the extras ``mlloss[lightning]`` and ``mlloss[triton]``: without them
``import mlloss`` and every loss still work on the CPU, and the parts that need them raise an
ImportError that names the extra. A subprocess hides the extras' modules from the import system
(as if they were not installed) before anything imports them.

The editable install works from the folder that holds the clone: a clone named ``mlloss`` in the
working directory is a namespace package candidate, which only a regular ``mlloss`` package found
through ``sys.path`` (the compat-mode editable install's .pth entry) overrides.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HIDDEN = ("pytorch_lightning", "lightning", "lightning_fabric", "triton")
# The modules that need the lightning extra (mlloss._extras.MODULE_EXTRAS) and the old paths of two.
LIGHTNING_MODULES = (
    "mlloss.integrations.lightning",
    "mlloss.integrations.lightning_checkpoints",
    "mlloss.integrations.torchrec_strategy",
    "mlloss.lightning",
    "mlloss.sharding",
)

HIDE_EXTRAS = f"""
import importlib.abc, sys

HIDDEN = {HIDDEN!r}
LIGHTNING_MODULES = {LIGHTNING_MODULES!r}
ATTEMPTS = []


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            ATTEMPTS.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""

TRAIN_EVERY_LOSS = HIDE_EXTRAS + r"""
import json

import torch

ATTEMPTS.clear()  # what torch tried is torch's business; mlloss must try neither
import mlloss
from mlloss.ops.dispatch import resolve_tier
from mlloss.registry import LOSSES, SINGLE_LABEL

report = {"import_attempts": list(ATTEMPTS), "losses": {}, "errors": {}}
names = sorted(LOSSES) + [f"bce+{name}" for name in sorted(SINGLE_LABEL)]
gen = torch.Generator().manual_seed(0)
features = torch.randn(96, 6, generator=gen)
labels = (torch.rand(96, 2, generator=gen) < torch.sigmoid(features[:, :2])).float()
labels[:4] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])  # every pattern occurs
users = torch.arange(96) % 8
for name in names:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)  # steps of about lr, whatever the scale
    loss_fn = mlloss.build_loss(name)
    single = name == "bce" or name.startswith("bce+") or name in SINGLE_LABEL
    target = labels[:, 0] if single else labels
    values = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = loss_fn(model(features).squeeze(-1), target, users)
        loss.backward()
        optimizer.step()
        values.append(loss.item())
    changed = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    report["losses"][name] = {"values": values, "changed": changed}

scores, binary = torch.randn(16), (torch.arange(16) % 2).float()
attempts = {
    **{module: lambda module=module: __import__(module) for module in LIGHTNING_MODULES},
    # the TorchRec tables need no Lightning
    "mlloss.integrations.torchrec": lambda: __import__("mlloss.integrations.torchrec"),
    "mlloss.checkpointing": lambda: __import__("mlloss.checkpointing"),
    "AUCLoss(backend='triton')": lambda: mlloss.AUCLoss(backend="triton")(scores, binary),
    "AUCLoss(backend='triton', validate_args=False)":
        lambda: mlloss.AUCLoss(backend="triton", validate_args=False)(scores, binary),
    "PDAOMLoss(backend='triton', validate_args=False)":
        lambda: mlloss.PDAOMLoss(backend="triton", validate_args=False)(scores, binary),
}
for what, attempt in attempts.items():
    try:
        attempt()
    except ImportError as error:
        report["errors"][what] = [type(error).__name__, str(error)]
    else:
        report["errors"][what] = None
report["auto_tier_on_cuda"] = resolve_tier("auto", "logistic", "all", torch.device("cuda"))
report["loaded"] = sorted(m for m in sys.modules if m.partition(".")[0] in HIDDEN)
print("REPORT " + json.dumps(report))
"""


def run_python(code: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory) -> dict:
    result = run_python(TRAIN_EVERY_LOSS, tmp_path_factory.mktemp("no-extras"))
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("REPORT "))
    return json.loads(line[len("REPORT "):])


def test_import_mlloss_tries_neither_lightning_nor_triton(without_extras):
    assert without_extras["import_attempts"] == []


def test_every_loss_trains_a_plain_pytorch_model_without_the_extras(without_extras):
    # The subprocess trains every name of a fresh import's registry (this process's registry may
    # hold names that other tests registered).
    assert {"auc", "pdaom", "loa", "balanced-loa", "laa", "bce", "bce+auc", "bce+pdaom"} <= set(without_extras["losses"])
    for name, run in without_extras["losses"].items():
        assert all(map(lambda v: v == v and abs(v) != float("inf"), run["values"])), (name, run)
        assert run["changed"], f"{name}: the parameters did not change"
    assert without_extras["loaded"] == []


@pytest.mark.parametrize("module", LIGHTNING_MODULES)
def test_lightning_parts_name_the_lightning_extra(without_extras, module):
    kind, message = without_extras["errors"][module]
    assert kind == "ModuleNotFoundError"
    new_module = {"mlloss.lightning": "mlloss.integrations.lightning",
                  "mlloss.sharding": "mlloss.integrations.torchrec_strategy"}.get(module, module)
    assert 'pip install "mlloss[lightning]"' in message and new_module in message


@pytest.mark.parametrize("module", ["mlloss.integrations.torchrec", "mlloss.checkpointing"])
def test_framework_free_parts_import_without_lightning(without_extras, module):
    assert without_extras["errors"][module] is None


@pytest.mark.parametrize("what", ["AUCLoss(backend='triton')", "AUCLoss(backend='triton', validate_args=False)",
                                  "PDAOMLoss(backend='triton', validate_args=False)"])
def test_the_triton_backend_names_the_triton_extra(without_extras, what):
    kind, message = without_extras["errors"][what]
    assert kind == "ModuleNotFoundError"
    assert 'pip install "mlloss[triton]"' in message and 'backend="triton"' in message


def test_auto_backend_falls_back_to_pytorch_without_triton(without_extras):
    assert without_extras["auto_tier_on_cuda"] == "torch"


def test_an_unrelated_missing_module_is_not_blamed_on_an_extra():
    from mlloss._extras import needs_extra

    with pytest.raises(ModuleNotFoundError) as caught:
        with needs_extra("triton", "here"):
            import mlloss_no_such_module  # noqa: F401
    assert "mlloss[" not in str(caught.value) and caught.value.name == "mlloss_no_such_module"


def test_checkout_wins_over_a_clone_folder_named_mlloss_in_the_working_directory(tmp_path):
    """What the compat-mode editable install (README, docs/install.md) does, run from the folder holding the clone:
    its .pth entry appends the checkout to sys.path, after the working directory, whose folder
    ``mlloss`` (the clone; here an empty stand-in) is only a namespace package candidate."""
    (tmp_path / "mlloss").mkdir()
    code = HIDE_EXTRAS + f"""
import json
sys.path.append({str(REPO)!r})
import mlloss, mlloss.kernels
print(json.dumps([mlloss.__file__, mlloss.kernels.__file__, callable(getattr(mlloss, "build_loss", None))]))
"""
    result = run_python(code, tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    package, kernels, has_build_loss = json.loads(result.stdout.splitlines()[-1])
    assert Path(package) == REPO / "mlloss" / "__init__.py"
    assert Path(kernels) == REPO / "kernels" / "__init__.py"
    assert has_build_loss


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (REPO / "README.md").read_text()
    commands = [block.strip() for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S)]
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (REPO / ".ci" / "run").read_text().splitlines()
    for command in commands:
        for install in re.findall(r'pip install [^&]*-e "[^"]*"[^&]*', command):
            assert "--config-settings editable_mode=compat" in install, install


def test_the_files_the_suite_starts_first_exist():
    # conftest.SLOWEST_FILES orders the suite by measured times: a renamed file would drop to the end unnoticed.
    import conftest

    assert set(conftest.SLOWEST_FILES) <= {path.name for path in (REPO / "tests").glob("test_*.py")}


def pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_no_extra_installs_libauc_with_its_requirements():
    """LibAUC 2.0.1 requires torchvision, torch-geometric, transformers and OpenCV, and pip resolves
    them with a torch of their choosing (on a CPU machine with torch 2.13: torch 2.14 with the CUDA
    libraries): an extra that lists it replaces the user's torch. The bench extra holds what its
    losses import; LibAUC itself goes in with --no-deps (docs/install.md)."""
    extras = pyproject()["project"]["optional-dependencies"]
    listing = {name: [re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() for requirement in requirements]
               for name, requirements in extras.items()}
    assert all("libauc" not in names for names in listing.values()), listing
    assert {"scikit-learn", "pandas", "scipy", "tqdm"} <= set(listing["bench"])  # what libauc.losses imports
    assert "pip install --no-deps libauc==2.0.1" in (REPO / "docs" / "install.md").read_text()


def test_pyproject_lists_every_package_of_the_source_tree():
    """setuptools installs only the packages pyproject.toml names: a new subpackage (mlloss/metrics/)
    missing there would be absent from a `pip install .` while an editable install still finds it."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    found = {"mlloss." + ".".join(p.parent.relative_to(REPO / "mlloss").parts) if p.parent != REPO / "mlloss" else "mlloss"
             for p in (REPO / "mlloss").rglob("__init__.py") if "__pycache__" not in p.parts}
    found |= {"mlloss.kernels"} | {"mlloss.kernels." + ".".join(p.parent.relative_to(REPO / "kernels").parts)
                                   for p in (REPO / "kernels").rglob("__init__.py") if p.parent != REPO / "kernels"}
    assert found - listed == set(), f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
