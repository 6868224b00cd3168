"""Data for mlloss experiments: a synthetic Ali-CCP-like impression log generator, loaders for
the real Ali-CCP and AliExpress click/conversion CSVs, and a batch sampler that keeps each group's
(user's) items in the same batch for per-group losses."""

from mlloss.data.sampler import GroupBatchSampler
from mlloss.data.synthetic import (
    DENSE_FEATURES,
    SPARSE_FIELDS,
    ImpressionData,
    SyntheticConfig,
    generate_impressions,
    split_by_time,
)
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
    "generate_impressions",
    "load_ali_ccp",
    "load_aliexpress",
    "split_by_time",
]
