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
    Triton's debug mode, never checks (a quarter of the rest).

    ``MLLOSS_TEST_REPLAY=1``: every eager Triton-tier call on the CPU replayed from a stand-in
    graph (``mlloss.ops.replay.stand_in_on_cpu``: the call's function run again on the graph's
    static inputs), to run any test with graph replay on; the results must not change (the tests
    that count a call's ops do). On a GPU ``MLLOSS_GRAPH_REPLAY=1`` replays real CUDA graphs."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton_interpreter import patch_the_language_once_per_launch, skip_the_unchecked_overflow_arithmetic

        patch_the_language_once_per_launch()
        skip_the_unchecked_overflow_arithmetic()
    if os.environ.get("MLLOSS_TEST_REPLAY") == "1":
        from mlloss.ops import replay

        replay._STATE.enabled, replay._STATE.stand_in = True, "rerun"
