"""Every test starts from the same random state, whatever ran before it in its process: the suite
runs its files on several pytest-xdist workers (README), so which tests precede a test, and what
they drew from the global generators, depends on the scheduling."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded_global_generators():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
