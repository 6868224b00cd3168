"""Standalone Lightning DDP run for tests/test_lightning.py: ``python lightning_ddp_script.py OUT_DIR``.

Run as a script, its ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` re-launches it for
rank 1; the test forks both ranks' ``main`` in torchrun's environment instead (``ranks.ForkedRanks``),
where Lightning starts no process of its own. It trains a tiny ranker with
``LaALoss(cross_device=True)`` for ``EPOCHS`` epochs on synthetic data whose users have items on
both ranks, with ``RankingMetrics`` logging the validation metrics. Rank 0 then writes

- ``OUT_DIR/metrics.json``: ``trainer.callback_metrics`` as floats;
- ``OUT_DIR/run.pt``: the initial and final parameters and the final model's scores on the whole
  validation set.

Sharding: ``use_distributed_sampler=False`` and each rank takes the items ``rank, rank + W, ...``
(``shard``). Validation (``NUM_VAL`` odd) is split without padding or duplication, so that the
metrics are those of the validation set (Lightning's ``DistributedSampler`` would repeat an item to
even out the ranks, which ``RankingMetrics`` leaves out: tests/test_lightning_probe.py runs that
path). Training has the same number of batches on every rank (every rank must call a
``cross_device`` loss, and DDP's backward, the same number of times).

The test imports this module (``Ranker``, ``make_data``, ``shard``) for its single-process checks.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from mlloss import LaALoss
from mlloss.integrations.lightning import RankingMetrics

LABEL_NAMES = ("click", "purchase")
NUM_FEATURES = 6
NUM_TRAIN = 256  # 2 ranks x 4 steps x 32 items
NUM_VAL = 301  # odd: rank 0 gets 151 items, rank 1 gets 150
BATCH_SIZE = 32
VAL_BATCH_SIZE = 64
EPOCHS = 2
LR = 0.5
WORLD = 2


def make_data(num_items: int, seed: int, dtype: torch.dtype = torch.float64) -> TensorDataset:
    """(features (N, F), labels (N, 2) click/purchase, user ids (N,)); purchase implies click."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(num_items, NUM_FEATURES, generator=gen, dtype=torch.float64)
    click = torch.rand(num_items, generator=gen, dtype=torch.float64) < torch.sigmoid(features[:, 0] - 0.5)
    purchase = click & (torch.rand(num_items, generator=gen, dtype=torch.float64) < torch.sigmoid(features[:, 1] - 1))
    labels = torch.stack([click, purchase], dim=1).to(dtype)
    users = torch.randint(0, 12, (num_items,), generator=gen)  # random: every user has items on both ranks
    return TensorDataset(features.to(dtype), labels, users)


def shard(dataset: Dataset, rank: int, world_size: int) -> Subset:
    """Items rank, rank + W, rank + 2W, ...: every item on exactly one rank, none repeated."""
    return Subset(dataset, range(rank, len(dataset), world_size))


class Ranker(pl.LightningModule):
    """A one-score ranker trained with LaALoss over (click, purchase), pairs inside each user."""

    def __init__(self, *, cross_device: bool = False, dtype: torch.dtype = torch.float64, lr: float = LR) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        ).to(dtype)
        self.loss = LaALoss(cross_device=cross_device)
        self.lr = lr
        self.train_data = make_data(NUM_TRAIN, seed=1, dtype=dtype)
        self.val_data = make_data(NUM_VAL, seed=2, dtype=dtype)
        self.score_dtypes: set[torch.dtype] = set()

    def training_step(self, batch, batch_idx):
        features, labels, users = batch
        scores = self.net(features)
        self.score_dtypes.add(scores.dtype)
        loss = self.loss(scores, labels, groups=users)
        self.log("train/laa", loss)
        self.log_dict({f"train/{name}": value.double() for name, value in self.loss.parts.items()})
        return loss

    def validation_step(self, batch, batch_idx):
        features, labels, users = batch
        return {"scores": self.net(features), "labels": labels, "groups": users}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(shard(self.train_data, self.global_rank, self.trainer.world_size), batch_size=BATCH_SIZE)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(shard(self.val_data, self.global_rank, self.trainer.world_size), batch_size=VAL_BATCH_SIZE)


def main(out_dir: Path) -> None:
    torch.set_num_threads(1)
    model = Ranker(cross_device=True)
    initial = {name: value.clone() for name, value in model.net.state_dict().items()}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy="ddp",
        use_distributed_sampler=False,  # exact sharding by `shard` instead of a padding DistributedSampler
        max_epochs=EPOCHS,
        callbacks=[RankingMetrics(LABEL_NAMES)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(model)
    if trainer.is_global_zero:
        out_dir.mkdir(parents=True, exist_ok=True)
        model.eval()
        with torch.no_grad():
            features, labels, users = model.val_data.tensors
            scores = model.net(features)[:, 0]
        metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
        torch.save(
            {"initial": initial, "final": model.net.state_dict(), "scores": scores, "labels": labels, "users": users},
            out_dir / "run.pt",
        )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/lightning_ddp_script.py OUT_DIR (where metrics.json and run.pt go)")
    main(Path(sys.argv[1]))
