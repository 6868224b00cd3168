"""Every test starts from the same random state, whatever ran before it in its process: the suite
runs its files on several pytest-xdist workers (README), so which tests precede a test, and what
they drew from the global generators, depends on the scheduling."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded_global_generators():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _closed_forms_wherever_they_fit(request, monkeypatch):
    """``backend="exact"`` and ``"auto"`` on the CPU take a closed form only where it is the
    cheaper exact path (``torch_tier._closed_form_pays``, a cost model fitted to the CPU's
    timings), which on a test's few items is mostly the blocked sum. The tests written for the
    closed forms (their edge cases, their equality with the blocked sum) must run them whatever
    the costs say: every test takes the closed form wherever its tables fit, except those marked
    ``cost_model``, which test the choice itself."""
    if request.node.get_closest_marker("cost_model") is None:
        from mlloss.ops import torch_tier

        monkeypatch.setattr(torch_tier, "_closed_form_pays",
                            lambda surrogate, tables, valid_pairs: torch_tier.closed_form_cost(surrogate, tables) is not None)


def pytest_configure(config):
    """Under ``TRITON_INTERPRET=1`` a kernel launch patches Triton's language once, not at every
    device function call (``triton_interpreter.py``: a third of the kernel tests' time), and
    integer arithmetic skips the overflow bounds that the interpreter computes and, without
    Triton's debug mode, never checks (a quarter of the rest). Under pytest-xdist the files run
    in collection order, the slowest first (``SLOWEST_FILES``).

    ``MLLOSS_TEST_REPLAY=1``: every eager Triton-tier call on the CPU replayed from a stand-in
    graph (``mlloss.ops.replay.stand_in_on_cpu``: the call's function run again on the graph's
    static inputs), to run any test with graph replay on; the results must not change (the tests
    that count a call's ops do). On a GPU ``MLLOSS_GRAPH_REPLAY=1`` replays real CUDA graphs."""
    if hasattr(config.option, "loadscopereorder"):  # xdist: the files in collection order (SLOWEST_FILES)
        config.option.loadscopereorder = False
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton_interpreter import patch_the_language_once_per_launch, skip_the_unchecked_overflow_arithmetic

        patch_the_language_once_per_launch()
        skip_the_unchecked_overflow_arithmetic()
    if os.environ.get("MLLOSS_TEST_REPLAY") == "1":
        from mlloss.ops import replay

        replay._STATE.enabled, replay._STATE.stand_in = True, "rerun"


# The files of 8 s of test time or more, the slowest first (seconds summed over their tests on 2
# cores, `--durations=0`, 28 November 2026: from 111 down to 8; the 29 others take 71 s together),
# started in this order so that the two workers finish together: the longest first, as a scheduler
# of jobs of known length would, leaves only short files for the end. pytest-xdist's loadfile
# otherwise hands out the files with the most tests first, and long files of few tests
# (subprocesses, compiles) came last, where one worker waited on the other.
SLOWEST_FILES = (
    "test_triton_kernels.py", "test_benchmarks_smoke.py", "test_kernel_sass.py", "test_checkpoints.py",
    "test_cuda_specializations.py", "test_numerics_probe.py", "test_triton_backend.py", "test_typing.py", "test_recipe_ctr_cvr.py",
    "test_import_hygiene.py", "test_host_path.py", "test_dense_kernels.py", "test_recipe_step.py", "test_compile.py",
    "test_readme_commands.py", "test_triton_fuzz.py", "test_paper_recipes.py", "test_tiers.py",
    "test_contiguous_groups.py", "test_integrations.py", "test_graph_replay.py", "test_task_columns.py",
    "test_install.py", "test_deprecations.py", "test_launch.py", "test_losses.py",
)


def pytest_collection_modifyitems(config, items):
    """The slowest files first, the others in collection order (a stable sort)."""
    first = {name: position for position, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))
