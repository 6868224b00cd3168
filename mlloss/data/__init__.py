"""Data for mlloss experiments: the shared impression-log type ``ImpressionData``
(``impressions.py``), a synthetic Ali-CCP-like impression log generator (``synthetic.py``),
loaders for the real Ali-CCP and AliExpress click/conversion CSVs (``tabular.py``), a batch
sampler that keeps each group's (user's) items in the same batch for per-group losses
(``sampler.py``), in-memory batches cut as slices on the device (``batches.py``) and a
LightningDataModule serving them (``datamodule.py``, imported on first use: it needs the
lightning extra).

``GroupDataModule`` is left out of ``__all__`` so that ``from mlloss.data import *`` works without
Lightning; import it by name (``from mlloss.data import GroupDataModule``)."""

from mlloss.data.batches import TensorBatches
from mlloss.data.impressions import ImpressionData
from mlloss.data.sampler import GroupBatchSampler
from mlloss.data.synthetic import DENSE_FEATURES, SPARSE_FIELDS, SyntheticConfig, generate_impressions, split_by_time
from mlloss.data.tabular import (
    ALI_CCP_DENSE_FEATURES,
    ALI_CCP_SPARSE_FIELDS,
    ALIEXPRESS_DENSE_FEATURES,
    ALIEXPRESS_SPARSE_FIELDS,
    load_ali_ccp,
    load_aliexpress,
)

__all__ = [
    "ALI_CCP_DENSE_FEATURES",
    "ALI_CCP_SPARSE_FIELDS",
    "ALIEXPRESS_DENSE_FEATURES",
    "ALIEXPRESS_SPARSE_FIELDS",
    "DENSE_FEATURES",
    "SPARSE_FIELDS",
    "GroupBatchSampler",
    "ImpressionData",
    "SyntheticConfig",
    "TensorBatches",
    "generate_impressions",
    "load_ali_ccp",
    "load_aliexpress",
    "split_by_time",
]


def __getattr__(name: str):
    if name == "GroupDataModule":  # needs Lightning: imported when asked for
        from mlloss.data.datamodule import GroupDataModule

        return GroupDataModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
