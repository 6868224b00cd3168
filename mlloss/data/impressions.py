"""The shared data type of :mod:`mlloss.data`: :class:`ImpressionData`, a log of impressions with
click and purchase labels.

The synthetic generator (``synthetic.py``) and the real-data loaders (``tabular.py``) return it;
``batches.py`` and ``datamodule.py`` serve its :meth:`ImpressionData.columns` to a model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from .._validation import check_field_ids

__all__ = ["ImpressionData"]


@dataclass(frozen=True)
class ImpressionData:
    """A log of N impressions with click and purchase labels.

    The synthetic generator sorts rows by (user, timestamp); the real-data loaders in
    :mod:`mlloss.data.tabular` keep each file's row order.

    Attributes:
        sparse: (N, F) int64 ids, one column per name in ``field_names``; column f takes
            values in ``[0, cardinalities[f])``.
        dense: (N, D) float32 features, one column per name in ``dense_names``.
        click: (N,) float32 0/1 click labels.
        purchase: (N,) float32 0/1 purchase labels; purchase implies click (the generator
            guarantees it; the real-data loaders do not check it).
        user: (N,) int64 non-negative group ids for GAUC: users (the ``user`` sparse column
            of the synthetic log, field ``101`` of Ali-CCP) or searches (AliExpress ``search_id``).
        timestamp: (N,) float32 times in [0, 1); for real data the row's position in its
            file divided by the file's number of rows.
        field_names: names of the sparse columns.
        cardinalities: number of distinct ids of each sparse column.
        dense_names: names of the dense columns.
        p_click: (N,) float32 true P(click | impression), or None where unknown (real data).
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
        return replace(self, **{k: v[index] for k, v in columns.items() if isinstance(v, Tensor)})
