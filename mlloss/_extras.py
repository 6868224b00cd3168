"""Install-time layout: the optional extras and the error that names them; the kernels folder.

The core install brings torch, numpy and torchmetrics: every loss, metric and model, on any
device, with the PyTorch tiers. The rest is optional (pyproject.toml), and only the modules of
:data:`MODULE_EXTRAS` import it:

* ``mlloss[lightning]`` (``pytorch-lightning``): the Lightning integrations,
  :mod:`mlloss.integrations.lightning` (``RankingMetrics``),
  :mod:`mlloss.integrations.lightning_checkpoints` (``AtomicCheckpointIO``), and
  :mod:`mlloss.data.datamodule` (``GroupDataModule``);
* TorchRec (installed by hand, docs/install.md; ``mlloss[torchrec]`` brings its pure-Python
  needs): :mod:`mlloss.integrations.torchrec`, imported on first use of its functions;
  :mod:`mlloss.integrations.torchrec_strategy` needs it and Lightning;
* ``mlloss[triton]`` (``triton``): the fused kernels, ``backend="triton"``. ``backend="auto"``
  picks them on CUDA when triton is installed (CUDA builds of torch bring it) and falls back to
  the PyTorch tier silently when it is not.

The deprecated aliases ``mlloss.lightning`` and ``mlloss.sharding`` import what their new modules
import (``mlloss.sharding``: both TorchRec modules, hence Lightning).

:func:`needs_extra` turns the missing module of an extra into an ImportError that names the extra.
:func:`link_source_tree_kernels` makes ``mlloss.kernels`` importable from a source checkout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

# The top-level modules that each extra installs.
EXTRA_MODULES = {
    "lightning": ("pytorch_lightning", "lightning_fabric"),
    "torchrec": ("torchrec", "fbgemm_gpu"),
    "triton": ("triton",),
}

# The modules of mlloss that need an extra, and which; no other module imports an extra's modules
# (tests/test_import_hygiene.py). TorchRec is imported when a function of the module first needs it.
MODULE_EXTRAS = {
    "mlloss.integrations.lightning": ("lightning",),
    "mlloss.integrations.lightning_checkpoints": ("lightning",),
    "mlloss.integrations.torchrec": ("torchrec",),
    "mlloss.integrations.torchrec_strategy": ("lightning", "torchrec"),
    "mlloss.data.datamodule": ("lightning",),
}


@contextlib.contextmanager
def needs_extra(extra: str, needed_by: str) -> Iterator[None]:
    """Re-raise a missing module of ``extra`` as a ModuleNotFoundError that says which extra to
    install; other import errors pass through unchanged."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in EXTRA_MODULES[extra]:
            raise
        raise ModuleNotFoundError(
            f"{needed_by} needs the optional package {missing!r}, which is not installed; "
            f'install it with: pip install "mlloss[{extra}]"',
            name=error.name,
        ) from error


def link_source_tree_kernels(package: str, init_file: str) -> None:
    """In a source checkout, import the top-level ``kernels/`` folder as ``<package>.kernels``.

    An installed mlloss has ``mlloss/kernels`` (pyproject.toml maps the folder there), and so has
    the default editable install (its import hook maps it). A checkout put on ``sys.path`` by
    hand, or by a compat-mode editable install (``--config-settings editable_mode=compat``: a
    plain .pth entry, which unlike the import hook wins over a folder named ``mlloss`` in the
    working directory), has not. ``kernels/__init__.py`` imports nothing (not triton).
    """
    folder = Path(init_file).absolute().parent
    source = folder.parent / "kernels" / "__init__.py"
    name = f"{package}.kernels"
    if (folder / "kernels").exists() or name in sys.modules or not source.is_file():
        return
    if not (folder.parent / "pyproject.toml").is_file():
        return
    spec = importlib.util.spec_from_file_location(name, source, submodule_search_locations=[str(source.parent)])
    assert spec is not None and spec.loader is not None  # a .py file that exists
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    setattr(sys.modules[package], "kernels", module)  # as importing the submodule would
