"""A LightningDataModule of group-keeping batches on the training device (needs the lightning extra).

:class:`GroupDataModule` serves the train, validation and test splits of an in-memory log as
:class:`~mlloss.data.TensorBatches`: every user's rows in one batch, the tensors moved to the
strategy's device once, batches cut as slices there, and under data parallelism each rank its own
batches (round-robin, see :class:`~mlloss.data.GroupBatchSampler`):

* training: users shuffled every epoch (``seed + epoch``); the last ``batches % ranks`` batches
  are dropped so that every rank runs the same number of steps (a split that packs into fewer
  batches than ranks would give every rank none: a ValueError asks for a smaller ``batch_size``);
* validation and test: users in id order, every row once; a rank left one batch short gets an
  empty batch, so that a collective forward (a sharded embedding) is joined by every rank.

With ``fixed_size=True`` the training batches are padded to exactly ``batch_size`` rows, with a
``"mask"`` column that is True on the real rows (``TensorBatches(fixed_size=True)``): one shape
for every step, as a compiled step replaying a CUDA graph wants; pass ``mask=batch["mask"]`` to
the loss. Validation and test batches stay exact (metrics take every row of a batch).

The number of batches depends on how the shuffled users pack, so it changes by a few between
epochs, and Lightning reads a loader's length when it loads it: build the trainer with
``reload_dataloaders_every_n_epochs=1`` (cheap here: no copy of the data; without it a later epoch
would stop before its last batches or skip its validation, so a fit of more than one epoch is a
ValueError) and ``use_distributed_sampler=False`` (the batches are sharded already).
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from mlloss._extras import needs_extra
from mlloss._validation import check_bool, check_int, check_str
from mlloss.data.batches import TensorBatches, check_columns
from mlloss.data.sampler import check_seed

with needs_extra("lightning", "mlloss.data.GroupDataModule"):
    import pytorch_lightning as pl

__all__ = ["GroupDataModule"]

SPLITS = ("train", "val", "test")


class GroupDataModule(pl.LightningDataModule):
    """Train/val/test :class:`~mlloss.data.TensorBatches` of ``{column: tensor}`` splits.

    Args:
        train, val, test: ``{column name: (N, ...) tensor}`` of each split (``val``/``test`` may be
            None), one of whose columns holds the group ids.
        batch_size: most rows per batch (per rank).
        group_key: the column of the group (user) ids.
        seed: seed of the training order.
        fixed_size: pad every training batch to ``batch_size`` rows with filler rows and add a
            boolean ``"mask"`` column, True on the real rows (see
            :class:`~mlloss.data.TensorBatches`), so that every training step sees the same shapes
            (one CUDA graph for ``torch.compile(mode="reduce-overhead")``); give the loss
            ``mask=batch["mask"]``. Validation and test batches are never padded.
    """

    def __init__(
        self,
        train: Mapping[str, Tensor],
        val: Mapping[str, Tensor] | None = None,
        test: Mapping[str, Tensor] | None = None,
        *,
        batch_size: int,
        group_key: str = "groups",
        seed: int = 0,
        fixed_size: bool = False,
    ) -> None:
        super().__init__()
        # checked here, not when Lightning first loads a split's batches inside fit
        self.batch_size = check_int("batch_size", batch_size, minimum=1, requirement="a positive integer")
        self.group_key = check_str("group_key", group_key)
        self.seed = check_seed(seed)
        self.fixed_size = check_bool("fixed_size", fixed_size)
        self.splits = {"train": train, "val": val, "test": test}
        for split, columns in self.splits.items():
            if columns is not None or split == "train":
                check_columns(columns, group_key, name=split)
        # each split's batches with the (rank, world size, device) they were built for
        self._batches: dict[str, tuple[tuple, TensorBatches]] = {}

    def __repr__(self) -> str:
        # Lightning's own __str__ iterates a loader that is no DataLoader as a list of DataLoaders
        # (here it would iterate the batches, and fail)
        rows = ", ".join(f"{split}={next(iter(columns.values())).shape[0]} rows"
                         for split, columns in self.splits.items() if columns is not None)
        return (f"{type(self).__name__}({rows}, batch_size={self.batch_size}, group_key={self.group_key!r}, "
                f"seed={self.seed}, fixed_size={self.fixed_size})")

    __str__ = __repr__

    def batches(self, split: str) -> TensorBatches:
        """The split's batches for this trainer's rank, world size and device (built once per split,
        and again when a later trainer has another rank, world size or device)."""
        columns = self.splits.get(split) if split in SPLITS else None
        if columns is None:
            raise ValueError(f"split must be one of the splits given, {[s for s in SPLITS if self.splits[s] is not None]}; "
                             f"got {split!r}")
        trainer = self.trainer
        placement = (trainer.global_rank, trainer.world_size, trainer.strategy.root_device) if trainer else (0, 1, None)
        if split not in self._batches or self._batches[split][0] != placement:
            rank, world, device = placement
            training = split == "train"
            self._batches[split] = placement, TensorBatches(
                columns, self.batch_size, group_key=self.group_key, shuffle=training, seed=self.seed,
                drop_last=training, pad="empty", num_replicas=world, rank=rank, device=device,
                fixed_size=training and self.fixed_size,
            )
        batches = self._batches[split][1]
        batches.set_epoch(self.trainer.current_epoch if self.trainer else 0)
        return batches

    def train_dataloader(self) -> TensorBatches:
        self._check_reloaded_every_epoch()
        return self.batches("train")

    def _check_reloaded_every_epoch(self) -> None:
        """Refuse a fit of several epochs whose trainer keeps the first epoch's loader: Lightning reads
        ``len()`` once, and an epoch that packs into more batches is cut short (its last users never
        train), one that packs into fewer skips the epoch-end validation, both without a word."""
        trainer = self.trainer
        if trainer is None:
            return
        reload_every = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]  # set by Lightning, undeclared
        if reload_every == 1:
            return
        max_epochs = trainer.max_epochs
        if max_epochs is not None and 0 <= max_epochs - trainer.current_epoch <= 1:
            return  # one epoch left: the loader is read for that epoch only
        raise ValueError(
            f"GroupDataModule needs Trainer(reload_dataloaders_every_n_epochs=1) to train more than one epoch; got "
            f"reload_dataloaders_every_n_epochs={reload_every} with max_epochs={max_epochs}: "
            "the number of batches changes between epochs and Lightning reads it when it loads the batches, so "
            "later epochs would skip rows or their validation (reloading is cheap here: no copy of the data)"
        )

    def val_dataloader(self) -> TensorBatches | list:
        # Without a validation split: no batches, so Lightning runs no validation loop (a module
        # with a validation_step would otherwise stop fit on the missing split).
        return [] if self.splits["val"] is None else self.batches("val")

    def test_dataloader(self) -> TensorBatches:
        return self.batches("test")

    def transfer_batch_to_device(self, batch: Mapping[str, Tensor], device, dataloader_idx: int) -> Mapping[str, Tensor]:
        """A batch is a slice of columns already on the strategy's device: nothing to move (Lightning
        would walk the batch every step); anything else goes through Lightning's transfer."""
        if isinstance(batch, Mapping) and all(isinstance(v, Tensor) and v.device == device for v in batch.values()):
            return batch
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
