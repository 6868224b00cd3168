"""Deprecated alias: the TorchRec tables and their sharding are :mod:`mlloss.integrations.torchrec`
(no Lightning), the Lightning strategy :mod:`mlloss.integrations.torchrec_strategy`."""

from ._deprecation import warn_moved
from .integrations.torchrec import *  # noqa: F401,F403
from .integrations.torchrec_strategy import *  # noqa: F401,F403

warn_moved(
    "mlloss.sharding",
    "mlloss.integrations.torchrec (TorchRecEmbedding, ids_to_kjt, shard_model, dense_parameters, SHARDING_TYPES, "
    "SPARSE_OPTIMIZERS) and mlloss.integrations.torchrec_strategy (TorchRecStrategy)",
)
