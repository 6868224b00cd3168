"""The Lightning side of crash-safe checkpoints: Lightning's checkpoint I/O writing through
:func:`mlloss.checkpointing.save_atomically`, and the fault-test callback. Layout and protocol:
docs/checkpoints.md.

* :class:`AtomicCheckpointIO` -- Lightning's ``TorchCheckpointIO`` writing each checkpoint file
  atomically: ``Trainer(plugins=[AtomicCheckpointIO()])``; it writes local paths only (and
  ``file://`` URLs): the atomic rename needs a local file system;
* :class:`BatchPause` and :func:`fault_test_callbacks` -- the test hook
  ``MLLOSS_TEST_BATCH_PAUSE=<seconds>@<epoch>:<batch>`` (docs/checkpoints.md, "Fault tests"):
  pauses training after that batch (``trainer.current_epoch`` and ``batch_idx``, both from 0).

Needs the ``lightning`` extra. The atomic writes and the resolver of the newest complete checkpoint
are framework-free, in :mod:`mlloss.checkpointing`; TorchRec's sharded checkpoint directories are
written by the sibling ``torchrec_strategy.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .._extras import needs_extra
from ..checkpointing import BATCH_PAUSE_ENV, remove_checkpoint, save_atomically

with needs_extra("lightning", "mlloss.integrations.lightning_checkpoints"):
    import pytorch_lightning as pl
    from fsspec.core import split_protocol, url_to_fs  # Lightning's file systems
    from lightning_fabric.plugins import TorchCheckpointIO

__all__ = ["AtomicCheckpointIO", "BatchPause", "fault_test_callbacks"]

LOCAL_PROTOCOLS = ("file", "local")  # fsspec's LocalFileSystem.protocol


def _local_path(path: str | os.PathLike) -> Path | None:
    """``path`` as the local file that Lightning's loading (fsspec) reads for it, or None for a URL
    of another file system: a plain path as it is; a URL of fsspec's local file system by fsspec's
    reading (``file:///x``, also ``file:/x`` and ``local:///x``, which a split at ``://`` wrote
    as the relative path ``./file:/x`` or refused, while loading read ``/x``)."""
    text = os.fspath(path)
    protocol = split_protocol(text)[0]
    if protocol is None and not text.startswith(tuple(f"{name}:" for name in LOCAL_PROTOCOLS)):
        return Path(path)
    return Path(url_to_fs(text)[1]) if protocol in (None, *LOCAL_PROTOCOLS) else None


def _writable_path(path: str | os.PathLike, method: str) -> Path:
    """``path`` as a local path; ValueError naming ``method`` and ``path`` for a URL of another file
    system (``s3://``, ``gs://``, ...), which has no atomic rename."""
    local = _local_path(path)
    if local is None:
        raise ValueError(f"AtomicCheckpointIO.{method}: path {os.fspath(path)!r} is a URL of a remote file system; "
                         "AtomicCheckpointIO writes local files only (its atomic rename needs a local file system): "
                         "use a local path, or Lightning's TorchCheckpointIO for remote storage")
    return local


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` that writes each checkpoint file through
    :func:`save_atomically` (temporary file in the checkpoint's folder, fsync, ``os.replace``)
    instead of Lightning's ``_atomic_save`` (a copy in memory, written through a temporary file in
    the system's temporary folder, moved without fsync). ``Trainer(plugins=[AtomicCheckpointIO()])``.
    It writes and removes local paths only (a ``file://`` URL is its path; another URL, ``s3://``
    and the like, raises ValueError); loading, Lightning's, reads any URL. Loading names the path
    in its errors."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options")
        save_atomically(checkpoint, _writable_path(path, "save_checkpoint"))

    def load_checkpoint(self, path, map_location: Optional[Any] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        local = _local_path(path)
        if local is not None and local.is_dir():
            raise IsADirectoryError(f"{path} is a directory: a checkpoint of TorchRecStrategy (or another "
                                    f"strategy's), which {type(self).__name__} does not read")
        try:
            return super().load_checkpoint(path if local is None else local, map_location=map_location,
                                           weights_only=weights_only)
        except FileNotFoundError:
            raise
        except Exception as error:
            raise RuntimeError(f"could not load the checkpoint {path}: {type(error).__name__}: {error}") from error

    def remove_checkpoint(self, path) -> None:
        remove_checkpoint(_writable_path(path, "remove_checkpoint"))


class BatchPause(pl.Callback):
    """The fault-test hook ``MLLOSS_TEST_BATCH_PAUSE=<seconds>@<epoch>:<batch>``: after training
    batch ``batch`` of epoch ``epoch`` (``trainer.current_epoch`` and ``batch_idx``), print a line
    to stderr and sleep, so that a test can kill the process in the middle of an epoch. A training
    step that takes several batches (a ``dataloader_iter`` step) reports its last one: the pause
    comes after the first step that reaches ``batch``, once."""

    def __init__(self, seconds: float, epoch: int, batch: int) -> None:
        self.seconds, self.epoch, self.batch = seconds, epoch, batch
        self.paused = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.paused and trainer.current_epoch == self.epoch and batch_idx >= self.batch:
            self.paused = True
            print(f"{BATCH_PAUSE_ENV}: pausing {self.seconds:g} s after batch {batch_idx} of epoch {self.epoch} "
                  f"(global step {trainer.global_step}, rank {trainer.global_rank})", file=sys.stderr, flush=True)
            time.sleep(self.seconds)


def fault_test_callbacks() -> list[pl.Callback]:
    """``[BatchPause(...)]`` when ``MLLOSS_TEST_BATCH_PAUSE`` is set, else ``[]``."""
    spec = os.environ.get(BATCH_PAUSE_ENV)
    if not spec:
        return []
    try:
        seconds, _, at = spec.partition("@")
        epoch, _, batch = at.partition(":")
        return [BatchPause(float(seconds), int(epoch), int(batch))]
    except ValueError:
        raise ValueError(f"{BATCH_PAUSE_ENV} must be <seconds>@<epoch>:<batch>; got {spec!r}") from None
