"""Data for mlloss experiments: a synthetic Ali-CCP-like impression log generator."""

from mlloss.data.synthetic import (
    DENSE_FEATURES,
    SPARSE_FIELDS,
    ImpressionData,
    SyntheticConfig,
    generate_impressions,
    split_by_time,
)

__all__ = [
    "DENSE_FEATURES",
    "SPARSE_FIELDS",
    "ImpressionData",
    "SyntheticConfig",
    "generate_impressions",
    "split_by_time",
]
