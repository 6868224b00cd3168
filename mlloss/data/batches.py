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

Group-keeping batches vary in size (at most ``batch_size`` rows), and a step compiled for static
shapes (``torch.compile(mode="reduce-overhead")``, which records one CUDA graph per input shape)
re-records or recompiles for every new size. ``fixed_size=True`` pads every batch to exactly
``batch_size`` rows with filler rows (copies of the data's first row, so finite, valid inputs)
and adds a boolean ``"mask"`` column, True on the real rows: the step then always sees the same
shapes, and the mlloss losses given ``mask=batch["mask"]`` ignore the fillers (the model still
computes them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Literal

import torch
from torch import Tensor

from mlloss._validation import check_bool
from mlloss.data.sampler import GroupBatchSampler

__all__ = ["TensorBatches"]


def check_columns(columns: object, group_key: str | None, *, name: str = "columns") -> int:
    """The number of rows N of ``columns``, a non-empty ``{column name: tensor}`` mapping whose
    tensors share their first dimension; with ``group_key``, one of them holds the group ids. The
    errors name ``name`` (the argument, or a split) and the column."""
    if not isinstance(columns, Mapping):
        raise TypeError(f"{name} must be a mapping of column names to tensors; got {type(columns).__name__}")
    if not columns:
        raise ValueError(f"{name} must hold at least one tensor")
    for key, value in columns.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name}[{key!r}] must be a torch.Tensor (torch.as_tensor converts a NumPy array or a "
                            f"list); got {type(value).__name__}")
    lengths = {key: value.shape[0] if value.dim() else None for key, value in columns.items()}
    num_rows = next(iter(lengths.values()))
    if num_rows is None or len(set(lengths.values())) != 1:
        raise ValueError(f"{name} must have the same first dimension (one row per item); got {lengths}")
    if group_key is not None and group_key not in columns:
        raise ValueError(f"{name} has no {group_key!r} column for the group ids (group_key={group_key!r}); "
                         f"got the columns {sorted(columns)}")
    return num_rows


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
        fixed_size: every batch holds exactly ``batch_size`` rows (static shapes for CUDA graphs
            and compiled steps): the sampler's batch (the same rows in the same order as without
            it), then filler rows, copies of the columns' first row (finite, valid data, since the
            model runs on them).
        mask_key: with ``fixed_size``, the name of the extra ``(batch_size,)`` boolean column that
            is True on the batch's real rows and False on the fillers; pass it to the losses
            (``loss(scores, labels, groups, mask=batch["mask"])``), which then ignore the fillers.
            It must not be the name of one of ``columns``.

    ``len()`` and the batches are those of the sampler's current epoch (``set_epoch``); the
    epoch's gathered rows are cached until the epoch or an option of the sampler changes. A pad of
    ``pad="empty"`` is a batch of zero rows, or with ``fixed_size`` of ``batch_size`` fillers and an
    all-False mask. Without ``fixed_size`` there is no mask column.
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
        fixed_size: bool = False,
        mask_key: str = "mask",
    ) -> None:
        check_bool("fixed_size", fixed_size)
        num_rows = check_columns(columns, group_key if groups is None else None)
        if groups is None:
            groups = columns[group_key]
        elif not isinstance(groups, torch.Tensor) or groups.dim() != 1 or groups.shape[0] != num_rows:
            raise ValueError(f"groups must be a (N,) tensor with one id per row of columns (N = {num_rows}); "
                             f"got {tuple(groups.shape) if isinstance(groups, torch.Tensor) else type(groups).__name__}")
        if fixed_size and mask_key in columns:
            raise ValueError(f"mask_key {mask_key!r} is the name of one of the columns; pass another mask_key "
                             f"(columns: {sorted(columns)})")
        self.fixed_size = fixed_size
        self.mask_key = mask_key
        self.columns = {name: value.to(device) if device is not None else value for name, value in columns.items()}
        self.sampler = GroupBatchSampler(groups.cpu(), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                         pad=pad, num_replicas=num_replicas, rank=rank)
        self._epoch_rows: tuple[tuple, dict[str, Tensor], list[tuple[int, int]]] | None = None

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
        """This rank's rows of the epoch in batch order (with ``fixed_size``: each batch followed
        by its fillers, and the mask column), and the batches as spans of them."""
        key = self.sampler._cache_key()  # the epoch, and any change of the sampler's options
        if self._epoch_rows is None or self._epoch_rows[0] != key:
            items, spans = self.sampler.epoch_spans()
            some_column = next(iter(self.columns.values()))
            mask = None
            if self.fixed_size:
                index, mask, own_spans = self._fixed_size_index(items, spans)
                mask = mask.to(some_column.device, non_blocking=True)
            else:
                pieces, own_spans, offset = [], [], 0
                for start, end in spans:
                    pieces.append(items[start:end])
                    own_spans.append((offset, offset + end - start))
                    offset += end - start
                index = torch.cat(pieces) if pieces else items[:0]
            index = index.to(some_column.device, non_blocking=True)
            rows = {name: value.index_select(0, index) for name, value in self.columns.items()}
            if mask is not None:
                rows[self.mask_key] = mask
            self._epoch_rows = (key, rows, own_spans)
        return self._epoch_rows[1], self._epoch_rows[2]

    def _fixed_size_index(self, items: Tensor, spans: list[tuple[int, int]]) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
        """The epoch's row index with every batch padded to ``batch_size`` by row 0 (the filler),
        the matching (rows,) mask, True on real rows, and the batches' spans in both."""
        size = self.sampler.batch_size
        bounds = torch.tensor(spans, dtype=torch.long).reshape(-1, 2)
        position = torch.arange(size)
        mask = position < (bounds[:, 1] - bounds[:, 0]).unsqueeze(1)  # (batches, batch_size)
        # real row j of a batch is items[start + j]; fillers point at row 0 of the columns
        where = (bounds[:, :1] + position).masked_fill(~mask, 0)
        index = items.index_select(0, where.reshape(-1)).reshape(mask.shape).masked_fill(~mask, 0)
        own_spans = [(batch * size, (batch + 1) * size) for batch in range(len(spans))]
        return index.reshape(-1), mask.reshape(-1), own_spans
