"""Pieces shared by the paper recipes: summaries over seeds, the loss of models trained side by
side (``SideBySideLoss``), independent cells run in parallel processes, the optional matplotlib import, and the output files with their provenance (the command
that made them, its wall time and the machine's load average).

Recipes import this module from their own directory (``sys.path`` gets that directory first), so
that they run both as scripts and when loaded by path from the tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import math
import multiprocessing
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

RECIPES = Path(__file__).resolve().parent
REPOSITORY = RECIPES.parent


class SideBySideLoss:
    """The summed loss of M independent models trained side by side: scores (M, B), labels (M, B, K).

    One call of the loss with the models as groups (``reduction="sum"`` gives each model the
    gradient of its own loss), or with ``per_model`` one loss module per model, their losses
    summed: for balanced LoA, whose running label priors must not pool the models. Either way
    model m trains the same whichever models run beside it.

    Args:
        build: a new loss module (``reduction="sum"``), called once, or once per model.
        labels: the label columns the loss takes, from a (n, K) block of them.
        num_models: M.
        per_model: one loss module per model.
    """

    def __init__(self, build: Callable[[], nn.Module], labels: Callable[[Tensor], Tensor], num_models: int,
                 per_model: bool) -> None:
        self.losses = [build() for _ in range(num_models if per_model else 1)]
        self.labels = labels
        self.model_ids = torch.arange(num_models)

    def __call__(self, scores: Tensor, labels: Tensor) -> Tensor:
        if len(self.losses) > 1:
            return sum(loss(scores[m], self.labels(labels[m])) for m, loss in enumerate(self.losses))
        groups = self.model_ids.repeat_interleave(scores.shape[1])
        return self.losses[0](scores.reshape(-1), self.labels(labels.reshape(-1, labels.shape[2])), groups)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": sample_std(t)}


def sample_std(values: torch.Tensor) -> float:
    """Sample standard deviation, 0 for a single value."""
    return float(values.std()) if len(values) > 1 else 0.0


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def parse_with_quick(parser: argparse.ArgumentParser, argv: Sequence[str] | None, **quick: Any) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv[1:]``); with ``--quick`` the ``quick`` values are the
    defaults instead, so that options given on the command line still win (``--quick --epochs 3``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)


def check_ranges(parser: argparse.ArgumentParser, args: argparse.Namespace, *, counts: Sequence[str] = (),
                 positive: Sequence[str] = (), non_negative: Sequence[str] = ()) -> None:
    """``parser.error`` (naming the option and its value) for an option out of range, before any
    work: ``counts`` >= 1, ``positive`` finite and > 0, ``non_negative`` finite and >= 0; a list
    option (``nargs="+"``) entry by entry."""
    for names, holds, wanted in ((counts, lambda v: v >= 1, ">= 1"), (positive, lambda v: 0 < v < math.inf, "finite and > 0"),
                                 (non_negative, lambda v: 0 <= v < math.inf, "finite and >= 0")):
        for name in names:
            value = getattr(args, name)
            if not all(holds(v) for v in (value if isinstance(value, list) else [value])):
                parser.error(f"--{name.replace('_', '-')} must be {wanted}{' (each value)' if isinstance(value, list) else ''}; "
                             f"got {value}")


def check_seeds(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str], high: int = 2**32,
                why: str = "") -> None:
    """``parser.error`` (naming the option and its value) for a seed option outside [0, ``high``), a list
    option entry by entry, before any work. The default is recipes/ctr_cvr.py's range, [0, 2**32 - 1];
    seeds far outside it overflowed ``torch.Generator.manual_seed`` after the data had loaded, with an
    error that named no option. ``why`` says where a lower ``high`` comes from."""
    for name in names:
        value = getattr(args, name)
        if not all(0 <= v < high for v in (value if isinstance(value, list) else [value])):
            bound = "2**32 - 1" if high == 2**32 else f"{high - 1}"
            parser.error(f"--{name.replace('_', '-')} must be in [0, {bound}]{' (each value)' if isinstance(value, list) else ''}"
                         f"{why}; got {value}")


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# --------------------------------------------------------------------------- parallel cells


def run_cells(function: Callable, cells: Sequence[tuple], workers: int, threads: int) -> list:
    """``[function(*cell) for cell in cells]``, spread over ``workers`` processes when workers > 1.

    Every cell runs with ``threads`` intra-op threads wherever it runs and must seed its own
    generators, so the results do not depend on ``workers`` (tests check this bit for bit). The
    workers are spawned and load ``function``'s recipe file by path: recipes loaded under any
    module name (as the tests do) work too. Results come back in the order of ``cells``.
    """
    if workers <= 1 or len(cells) <= 1:
        torch.set_num_threads(threads)
        return [function(*cell) for cell in cells]
    recipe_path, name = inspect.getfile(function), function.__name__
    with ProcessPoolExecutor(
        min(workers, len(cells)), mp_context=multiprocessing.get_context("spawn"),
        initializer=_set_threads, initargs=(threads,),
    ) as pool:
        futures = [pool.submit(_call_in_recipe, recipe_path, name, cell) for cell in cells]
        return [future.result() for future in futures]


_LOADED_RECIPES: dict[str, ModuleType] = {}


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)


def _call_in_recipe(recipe_path: str, name: str, cell: tuple) -> object:
    """Worker side of ``run_cells``: load the recipe once per process, call ``name(*cell)``."""
    if recipe_path not in _LOADED_RECIPES:
        spec = importlib.util.spec_from_file_location(f"_recipe_{Path(recipe_path).stem}", recipe_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _LOADED_RECIPES[recipe_path] = module
    return getattr(_LOADED_RECIPES[recipe_path], name)(*cell)


# --------------------------------------------------------------------------- provenance and outputs


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages of the machine, or None where /proc is missing."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def command_line(recipe_file: str, argv: Sequence[str] | None) -> str:
    """The shell command that reruns a recipe with ``argv``, from the repository root."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        script = Path(recipe_file).resolve().relative_to(REPOSITORY)
    except ValueError:
        script = Path(recipe_file)
    return shlex.join(["python", str(script), *args])


class Provenance:
    """What made a result: the command, when and how long it ran, and the machine's load."""

    def __init__(self, recipe_file: str, argv: Sequence[str] | None, workers: int, threads: int) -> None:
        self.command = command_line(recipe_file, argv)
        self.workers, self.threads = workers, threads
        self.start = time.perf_counter()
        self.load_at_start = load_average()

    def finish(self) -> dict:
        """The provenance as JSON-ready values, with the wall time and load average up to now."""
        return {
            "command": self.command, "workers": self.workers, "threads_per_worker": self.threads,
            "cores": available_cores(), "runtime_s": time.perf_counter() - self.start,
            "load_average_start": self.load_at_start, "load_average_end": load_average(),
        }


def provenance_markdown(provenance: dict) -> str:
    """One paragraph naming the command, its wall time and the load average around it."""
    def load(values: list[float] | None) -> str:
        return "n/a" if values is None else " / ".join(f"{v:.2f}" for v in values)

    return (
        f"Produced by `{provenance['command']}` in {provenance['runtime_s']:.0f} s of wall time "
        f"({provenance['workers']} worker process(es) x {provenance['threads_per_worker']} thread(s), "
        f"{provenance['cores']} cores; load average 1/5/15 min {load(provenance['load_average_start'])} "
        f"at start, {load(provenance['load_average_end'])} at end)."
    )


def write_outputs(output_dir: Path, results: dict, markdown: str, provenance: Provenance) -> dict:
    """Add the provenance to ``results`` and write ``results.md`` (provenance paragraph first) and
    ``results.json`` to ``output_dir``; returns ``results``."""
    results["provenance"] = provenance.finish()
    results["runtime_s"] = results["provenance"]["runtime_s"]
    text = f"{provenance_markdown(results['provenance'])}\n\n{markdown}"
    output_dir.mkdir(parents=True, exist_ok=True)
    print(text)
    (output_dir / "results.md").write_text(text)
    (output_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {output_dir / 'results.json'} ({results['runtime_s']:.0f}s)")
    return results


def config_dict(args: object) -> dict:
    """An argparse namespace as JSON-ready values (paths as strings)."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
