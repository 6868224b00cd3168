"""The shared data type of :mod:`mlloss.data`: :class:`ImpressionData`, a log of impressions with
click and purchase labels.

The synthetic generator (``synthetic.py``) and the real-data loaders (``tabular.py``) return it;
``batches.py`` and ``datamodule.py`` serve its :meth:`ImpressionData.columns` to a model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from .._validation import check_field_ids

__all__ = ["ImpressionData"]

EMBEDDING_INDEX_DTYPES = (torch.int64, torch.int32)  # what torch.nn.Embedding takes as indices


@dataclass(frozen=True)
class ImpressionData:
    """A log of N impressions with click and purchase labels.

    The synthetic generator sorts rows by (user, timestamp); the real-data loaders in
    :mod:`mlloss.data.tabular` keep each file's row order.

    The shapes, the dtypes (the kinds below: integer ids, floating-point values) and the id ranges
    are checked once, at construction, so that the models need not check every batch; a field
    of another dtype is a TypeError naming it and its dtype.

    Attributes:
        sparse: (N, F) int64 ids (int32 accepted: the index dtypes of ``torch.nn.Embedding``),
            one column per name in ``field_names``; column f takes values in
            ``[0, cardinalities[f])``.
        dense: (N, D) float32 features (a floating-point dtype), one column per name in
            ``dense_names``.
        click: (N,) float32 0/1 click labels (a floating-point dtype).
        purchase: (N,) float32 0/1 purchase labels (a floating-point dtype); purchase implies
            click (the generator guarantees it; the real-data loaders do not check it).
        user: (N,) int64 non-negative group ids for GAUC (an integer dtype): users (the ``user``
            sparse column of the synthetic log, field ``101`` of Ali-CCP) or searches
            (AliExpress ``search_id``).
        timestamp: (N,) float32 times in [0, 1) (a floating-point dtype); for real data the
            row's position in its file divided by the file's number of rows.
        field_names: names of the sparse columns.
        cardinalities: number of distinct ids of each sparse column.
        dense_names: names of the dense columns.
        p_click: (N,) float32 true P(click | impression), or None where unknown (real data);
            a floating-point dtype, as ``p_purchase``.
        p_purchase: (N,) float32 true P(purchase | impression) = P(click) * P(purchase | click),
            or None where unknown (real data).
        item_field: name of the sparse column that holds the item id (for item-popularity
            baselines), or None where the data has no item id column.
    """

    sparse: Tensor
    dense: Tensor
    click: Tensor
    purchase: Tensor
    user: Tensor
    timestamp: Tensor
    field_names: tuple[str, ...]
    cardinalities: tuple[int, ...]
    dense_names: tuple[str, ...]
    p_click: Tensor | None = None
    p_purchase: Tensor | None = None
    item_field: str | None = None

    def __post_init__(self) -> None:
        if len(self.cardinalities) != len(self.field_names):
            raise ValueError(
                f"ImpressionData: {len(self.field_names)} field_names but "
                f"{len(self.cardinalities)} cardinalities"
            )
        if self.sparse.dim() != 2 or self.sparse.shape[1] != len(self.cardinalities):
            raise ValueError(f"ImpressionData.sparse must have shape (N, {len(self.cardinalities)}); "
                             f"got {tuple(self.sparse.shape)}")
        self._check_dtypes()
        num_rows = self.sparse.shape[0]
        for name in ("click", "purchase", "user", "timestamp", "p_click", "p_purchase"):
            value = getattr(self, name)
            if value is not None and (value.dim() != 1 or value.shape[0] != num_rows):
                raise ValueError(f"ImpressionData.{name} must have shape ({num_rows},), one entry per row of "
                                 f"sparse; got {tuple(value.shape)}")
        if self.dense.dim() != 2 or self.dense.shape != (num_rows, len(self.dense_names)):
            raise ValueError(f"ImpressionData.dense must have shape ({num_rows}, {len(self.dense_names)}) for "
                             f"dense_names {self.dense_names}; got {tuple(self.dense.shape)}")
        if num_rows and int(self.user.min()) < 0:
            raise ValueError(f"ImpressionData.user must hold non-negative ids; got {int(self.user.min())}")
        # Checked once here, so that the models need not check every batch.
        check_field_ids(self.sparse, self.cardinalities, "ImpressionData.sparse", self.field_names)
        if self.item_field is not None and self.item_field not in self.field_names:
            raise ValueError(
                f"ImpressionData.item_field={self.item_field!r} is not one of field_names {self.field_names}"
            )

    def _check_dtypes(self) -> None:
        """Integer ids (``sparse`` in the dtypes ``nn.Embedding`` indexes with), floating-point
        features, labels and times: a fractional id would otherwise pass the range check and
        reach the models, which do not check it."""
        if self.sparse.dtype not in EMBEDDING_INDEX_DTYPES:
            raise TypeError(f"ImpressionData.sparse must hold integer ids of dtype torch.int64 (or torch.int32); "
                            f"got dtype {self.sparse.dtype}")
        if self.user.is_floating_point() or self.user.is_complex() or self.user.dtype == torch.bool:
            raise TypeError(f"ImpressionData.user must hold integer ids (torch.int64); got dtype {self.user.dtype}")
        for name in ("dense", "click", "purchase", "timestamp", "p_click", "p_purchase"):
            value = getattr(self, name)
            if value is not None and not value.is_floating_point():
                raise TypeError(f"ImpressionData.{name} must be a floating-point tensor (torch.float32); "
                                f"got dtype {value.dtype}")

    def __len__(self) -> int:
        return self.click.shape[0]

    @property
    def labels(self) -> Tensor:
        """(N, 2) float32 labels ``(click, purchase)``."""
        return torch.stack([self.click, self.purchase], dim=1)

    def columns(self) -> dict[str, Tensor]:
        """The training columns as ``{name: tensor}``: ``sparse``, ``dense``, ``labels`` (N, 2) and
        ``user``, what :class:`mlloss.data.TensorBatches` and ``GroupDataModule`` take."""
        return {"sparse": self.sparse, "dense": self.dense, "labels": self.labels, "user": self.user}

    def subset(self, index: Tensor) -> ImpressionData:
        """The impressions selected by an index or boolean mask, in that order (None fields stay None)."""
        columns = {f.name: getattr(self, f.name) for f in fields(self)}
        selected: dict[str, Any] = {k: v[index] for k, v in columns.items() if isinstance(v, Tensor)}
        return replace(self, **selected)
