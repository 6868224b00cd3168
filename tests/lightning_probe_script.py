"""Lightning DDP run for tests/test_lightning_probe.py: ``python lightning_probe_script.py OUT_DIR``.

Run as a script, its ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` re-launches it for
rank 1; the test forks both ranks' ``main`` in torchrun's environment (``ranks.ForkedRanks``). A
fixed scorer (no training step changes it: the learning rate is 0) rounds its scores to quarters,
so that many tie, over ``NUM_ITEMS`` (odd) items of users spread over both ranks. ``RankingMetrics``
evaluates them three ways, and every rank writes its results to ``OUT_DIR/rank<r>.json`` (after
each run):

- ``fit``: the validation of ``trainer.fit`` with Lightning's default ``DistributedSampler``, which
  repeats one item to even out the ranks (151 items each);
- ``test``: ``trainer.test`` on a shuffled DataLoader, so the repeated item is a random one;
- ``uneven``: ``use_distributed_sampler=False``, rank 0 holding 200 items (4 batches) and rank 1
  the other 101 (2 batches);
- ``mismatch``: the error message when rank 1's ``validation_step`` returns no groups.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset

from mlloss.integrations.lightning import RankingMetrics

LABEL_NAMES = ("click", "purchase")
NUM_ITEMS = 301
SPLIT = 200  # use_distributed_sampler=False: rank 0 takes the items before SPLIT, rank 1 the rest


def make_data() -> TensorDataset:
    """(features (N, 3), labels (N, 2) uint8, user ids (N,)): 25 users with items on both ranks; the
    last user has five items of one class (no GAUC pair), another a single item."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(NUM_ITEMS, 3, generator=gen)
    labels = (torch.rand(NUM_ITEMS, 2, generator=gen) < torch.tensor([0.4, 0.15])).to(torch.uint8)
    users = torch.randint(0, 25, (NUM_ITEMS,), generator=gen)
    users[-5:], labels[-5:] = 99, 0
    users[0] = 1000
    return TensorDataset(features, labels, users)


class Scorer(pl.LightningModule):
    """Scores rounded to quarters (ties); ``groups_on_rank_1=False`` breaks the contract on rank 1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)
        self.groups_on_rank_1 = True

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        return torch.round(self.net(features) * 4) / 4

    def training_step(self, batch, batch_idx):
        return self.scores(batch[0]).sum() * 0  # DDP needs a step; the scorer stays as it is

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        features, labels, users = batch
        outputs = {"scores": self.scores(features), "labels": labels, "groups": users}
        if self.global_rank == 1 and not self.groups_on_rank_1:
            del outputs["groups"]
        return outputs

    test_step = validation_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def trainer(**options) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=1,
                      callbacks=[RankingMetrics(LABEL_NAMES, print_report=False)], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **options)


def main(out_dir: Path) -> None:
    torch.set_num_threads(1)
    data, model, results = make_data(), Scorer(), {}
    padded = trainer()
    out = out_dir / f"rank{padded.global_rank}.json"

    def record(run: str, values) -> None:  # after each run: a later failure keeps the earlier results
        results[run] = values
        out.write_text(json.dumps(results, indent=1, sort_keys=True))

    padded.fit(model, DataLoader(data, batch_size=32), DataLoader(data, batch_size=64))
    record("fit", {name: float(value) for name, value in padded.callback_metrics.items() if name.startswith("val/")})
    record("test", padded.test(model, DataLoader(data, batch_size=40, shuffle=True), verbose=False)[0])
    sharded = trainer(use_distributed_sampler=False)
    shard = Subset(data, range(SPLIT) if sharded.global_rank == 0 else range(SPLIT, NUM_ITEMS))
    record("uneven", sharded.validate(model, DataLoader(shard, batch_size=64), verbose=False)[0])
    model.groups_on_rank_1 = False
    try:
        sharded.validate(model, DataLoader(shard, batch_size=64), verbose=False)
    except ValueError as error:
        record("mismatch", str(error))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
