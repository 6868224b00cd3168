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


def pytest_configure(config):
    """Under ``TRITON_INTERPRET=1`` a kernel launch patches Triton's language once, not at every
    device function call (``triton_interpreter.py``: a third of the kernel tests' time).

    ``MLLOSS_TEST_REPLAY=1``: every eager Triton-tier call on the CPU replayed from a stand-in
    graph (``mlloss.ops.replay.stand_in_on_cpu``: the call's function run again on the graph's
    static inputs), to run any test with graph replay on; the results must not change (the tests
    that count a call's ops do). On a GPU ``MLLOSS_GRAPH_REPLAY=1`` replays real CUDA graphs."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton_interpreter import patch_the_language_once_per_launch

        patch_the_language_once_per_launch()
    if os.environ.get("MLLOSS_TEST_REPLAY") == "1":
        from mlloss.ops import replay

        replay._STATE.enabled, replay._STATE.stand_in = True, "rerun"
