"""Group-keeping batches of in-memory tensors, cut as slices on the device.

A training log that fits in memory needs no ``Dataset.__getitem__`` per row and no collate:
:class:`TensorBatches` keeps every column (ids, features, labels, group ids) as one tensor on the
training device, and every epoch gathers this rank's rows in the order of
:class:`~mlloss.data.GroupBatchSampler` with one ``index_select`` per column. Its batches are then
contiguous slices of those tensors, views that cost no copy, no host work beyond a few Python
calls and no host-to-device transfer. ``benchmarks/bench_recipe.py`` measures it against the
``DataLoader`` path.

It is an iterable of ``{column name: tensor}`` batches with ``len()``, so it can be handed to a
``for`` loop, or returned from a ``LightningDataModule``'s ``*_dataloader`` hooks
(:class:`mlloss.data.GroupDataModule` does that): Lightning accepts any iterable there and calls
``set_epoch`` of its ``sampler`` attribute every epoch, as it does for a ``DataLoader``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

import torch
from torch import Tensor

from mlloss.data.sampler import GroupBatchSampler

__all__ = ["TensorBatches"]


class TensorBatches:
    """Batches of ``columns`` that keep the rows of each group together, as slices on ``device``.

    Args:
        columns: ``{name: tensor}`` with the same first dimension N (rows); moved to ``device``
            once, here.
        groups: the (N,) integer group (user) ids; default ``columns[group_key]``.
        batch_size, shuffle, seed, drop_last, pad, num_replicas, rank: as for
            :class:`~mlloss.data.GroupBatchSampler` (which is ``self.sampler``).
        device: where the columns and the batches live (default: where they are).
        group_key: the column holding the group ids when ``groups`` is not given.

    ``len()`` and the batches are those of the sampler's current epoch (``set_epoch``); the
    epoch's gathered rows are cached until the epoch changes. A pad of ``pad="empty"`` is a batch
    of zero rows.
    """

    batch_sampler = None  # as a DataLoader with batch_size=None: Lightning reads both attributes

    def __init__(
        self,
        columns: Mapping[str, Tensor],
        batch_size: int,
        *,
        groups: Tensor | None = None,
        group_key: str = "groups",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: Literal["repeat", "empty"] = "repeat",
        num_replicas: int | None = None,
        rank: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not columns:
            raise ValueError("columns must hold at least one tensor")
        lengths = {name: value.shape[0] if value.dim() else None for name, value in columns.items()}
        if len(set(lengths.values())) != 1 or None in lengths.values():
            raise ValueError(f"columns must have the same first dimension (one row per item); got {lengths}")
        if groups is None:
            if group_key not in columns:
                raise ValueError(f"groups is None and columns has no {group_key!r} column; got {sorted(columns)}")
            groups = columns[group_key]
        self.columns = {name: value.to(device) if device is not None else value for name, value in columns.items()}
        self.sampler = GroupBatchSampler(groups.cpu(), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                         pad=pad, num_replicas=num_replicas, rank=rank)
        self._epoch_rows: tuple[int, dict[str, Tensor], list[tuple[int, int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use the group order of ``epoch`` (Lightning calls ``self.sampler.set_epoch`` itself)."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        rows, spans = self._gathered()
        for start, end in spans:
            yield {name: value[start:end] for name, value in rows.items()}

    def _gathered(self) -> tuple[dict[str, Tensor], list[tuple[int, int]]]:
        """This rank's rows of the epoch in batch order, and the batches as spans of them."""
        if self._epoch_rows is None or self._epoch_rows[0] != self.sampler.epoch:
            items, spans = self.sampler.epoch_spans()
            pieces, own_spans, offset = [], [], 0
            for start, end in spans:
                pieces.append(items[start:end])
                own_spans.append((offset, offset + end - start))
                offset += end - start
            index = torch.cat(pieces) if pieces else items[:0]
            some_column = next(iter(self.columns.values()))
            index = index.to(some_column.device, non_blocking=True)
            rows = {name: value.index_select(0, index) for name, value in self.columns.items()}
            self._epoch_rows = (self.sampler.epoch, rows, own_spans)
        return self._epoch_rows[1], self._epoch_rows[2]
