"""A LightningCLI whose YAML picks the loss by ``class_path`` (docs/examples/lightning_cli.yaml).

``Ranker``'s ``loss`` argument is typed ``torch.nn.Module``, so any loss of the two labels
(click, purchase) that is called as ``loss(scores, labels, groups=...)`` can be chosen in the
config or on the command line, with its ``init_args``: ``LaALoss``, ``LoALoss`` (a single-label
loss such as ``AUCLoss`` needs one label column: ``labels[:, :1]``). Run::

    python docs/examples/lightning_cli.py fit --config docs/examples/lightning_cli.yaml
    python docs/examples/lightning_cli.py fit --config docs/examples/lightning_cli.yaml \\
        --model.loss=mlloss.LoALoss --model.loss.weights=balanced

Needs ``pip install "pytorch-lightning>=2.6" "jsonargparse[signatures]>=4.27.7"``.
"""

from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions

CONFIG = Path(__file__).with_name("lightning_cli.yaml")


class Ranker(pl.LightningModule):
    """One ranking score from the dense features, trained with the configured loss."""

    def __init__(self, loss: nn.Module, num_dense: int = 4, hidden: int = 32, lr: float = 3e-3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.loss, self.lr = loss, lr
        self.step_losses = []

    def training_step(self, batch, batch_idx):
        dense, labels, users = batch  # labels (B, 2): click, purchase; users: the groups
        loss = self.loss(self.net(dense), labels, groups=users)
        self.log("train/loss", loss)
        self.log_dict({f"train/{k}": v.double() for k, v in self.loss.parts.items()})  # same line for any loss
        self.step_losses.append(loss.item())  # for tests/test_integrations.py
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class ImpressionLog(pl.LightningDataModule):
    """The synthetic impression log, in batches of whole users (GroupBatchSampler)."""

    def __init__(self, num_users: int = 300, batch_size: int = 512, seed: int = 0):
        super().__init__()
        self.batch_size, self.seed = batch_size, seed
        log = generate_impressions(SyntheticConfig(num_users=num_users, num_items=500, mean_impressions=20,
                                                   click_rate=0.2, purchase_rate=0.05, seed=seed))
        dense = (log.dense - log.dense.mean(0)) / log.dense.std(0)
        self.data = TensorDataset(dense, torch.stack([log.click, log.purchase], dim=1), log.user)
        self.users = log.user

    def train_dataloader(self):
        # A new sampler every epoch (reload_dataloaders_every_n_epochs: 1): the packing, and so
        # len(loader), changes by a few batches between epochs, and Lightning reads len once.
        sampler = GroupBatchSampler(self.users, self.batch_size, seed=self.seed)
        sampler.set_epoch(self.trainer.current_epoch)
        return DataLoader(self.data, sampler=sampler, batch_size=None)


def main(steps=30, args=()):
    """Fit with the YAML config for ``steps`` steps (plus command-line ``args``); the losses per step."""
    argv = ["fit", "--config", str(CONFIG), f"--trainer.max_steps={steps}", *args]
    cli = LightningCLI(Ranker, ImpressionLog, args=argv, save_config_callback=None)
    return cli.model.step_losses


if __name__ == "__main__":
    LightningCLI(Ranker, ImpressionLog, save_config_callback=None)
