"""GroupDataModule under a real Lightning Trainer, as a user fits with it: every training row once per
epoch, validation every epoch, and a trainer that keeps the first epoch's loader refused; and the
documented properties of the synthetic log on a small configuration, and its seed range."""

from __future__ import annotations

import math

import pytest
import torch

from mlloss.data import SyntheticConfig, generate_impressions

pl = pytest.importorskip("pytorch_lightning")


def columns(num_rows: int, num_users: int, seed: int) -> dict[str, torch.Tensor]:
    """A log whose users pack into a number of batches that changes between epochs (batch 64):
    long-tailed user sizes, and a ``row`` column that says which row a batch row is."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.randn(num_users, generator=gen).exp()
    user = torch.multinomial(weights, num_rows, replacement=True, generator=gen)
    return {"x": torch.randn(num_rows, 3, generator=gen), "user": user, "row": torch.arange(num_rows)}


class RecordingModule(pl.LightningModule):
    """Records the ``row`` column of every training and validation batch, per epoch."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.trained: dict[int, list[torch.Tensor]] = {}
        self.validated: dict[int, list[torch.Tensor]] = {}

    def training_step(self, batch, batch_idx):
        self.trained.setdefault(self.current_epoch, []).append(batch["row"].clone())
        return self.layer(batch["x"]).sum()

    def validation_step(self, batch, batch_idx):
        self.validated.setdefault(self.current_epoch, []).append(batch["row"].clone())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(train, val, max_epochs: int, reload: int) -> RecordingModule:
    from mlloss.data import GroupDataModule

    module = RecordingModule()
    trainer = pl.Trainer(max_epochs=max_epochs, reload_dataloaders_every_n_epochs=reload, use_distributed_sampler=False,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, accelerator="cpu")
    trainer.fit(module, GroupDataModule(train, val, batch_size=64, group_key="user", seed=1))
    return module


def batch_counts(train: dict[str, torch.Tensor], epochs: int) -> list[int]:
    from mlloss.data import GroupBatchSampler

    sampler = GroupBatchSampler(train["user"], 64, seed=1)
    counts = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        counts.append(len(sampler))
    return counts


def test_group_data_module_trains_every_row_once_per_epoch_and_validates_every_epoch():
    train, val = columns(2000, 300, seed=4), columns(300, 40, seed=1)
    counts = batch_counts(train, 3)
    assert max(counts[1:]) > counts[0]  # a later epoch packs into more batches than the first
    module = fit(train, val, max_epochs=3, reload=1)
    orders = []
    for epoch in range(3):
        rows = torch.cat(module.trained[epoch])
        assert torch.equal(rows.sort().values, train["row"]), epoch
        seen = torch.cat(module.validated[epoch])
        assert torch.equal(seen.sort().values, val["row"]), epoch
        orders.append(rows)
    assert not torch.equal(orders[0], orders[1])  # shuffled again every epoch


def test_group_data_module_refuses_several_epochs_without_reloading():
    # Lightning read len() once: an epoch that packed into more batches than the first stopped before
    # its last users, one that packed into fewer skipped its validation, with no warning
    train, val = columns(2000, 300, seed=4), columns(300, 40, seed=1)
    with pytest.raises(ValueError, match=r"needs Trainer\(reload_dataloaders_every_n_epochs=1\) to train more than one "
                                         r"epoch; got reload_dataloaders_every_n_epochs=0 with max_epochs=3"):
        fit(train, val, max_epochs=3, reload=0)
    module = fit(train, val, max_epochs=1, reload=0)  # one epoch reads the loader once: nothing to reload
    assert torch.equal(torch.cat(module.trained[0]).sort().values, train["row"])


def test_synthetic_log_has_its_documented_properties():
    config = SyntheticConfig(num_users=400, num_items=300, mean_impressions=30, click_rate=0.1, purchase_rate=0.02,
                             seed=3)
    data = generate_impressions(config)
    assert bool((data.purchase <= data.click).all()) and bool((data.p_purchase <= data.p_click).all())
    # the expected rates are calibrated exactly; the drawn labels are Bernoulli draws around them
    assert data.p_click.double().mean().item() == pytest.approx(config.click_rate, rel=1e-6)
    assert data.p_purchase.double().mean().item() == pytest.approx(config.purchase_rate, rel=1e-6)
    n = len(data)
    for labels, rate in ((data.click, config.click_rate), (data.purchase, config.purchase_rate)):
        assert abs(labels.double().mean().item() - rate) < 5 * math.sqrt(rate * (1 - rate) / n)
    # rows sorted by (user, timestamp), timestamps in [0, 1), every user with at least one impression
    assert bool((data.timestamp >= 0).all()) and bool((data.timestamp < 1).all())
    user, time = data.user.tolist(), data.timestamp.tolist()
    assert all((u, t) <= (v, s) for u, t, v, s in zip(user, time, user[1:], time[1:]))
    assert torch.equal(data.user.unique(), torch.arange(config.num_users))
    assert torch.equal(data.sparse[:, 0], data.user)


def test_synthetic_seed_beyond_the_generators_range_is_named():
    # it was accepted, and generate_impressions failed with torch's "Overflow when unpacking long long"
    with pytest.raises(ValueError, match=r"SyntheticConfig.seed must be an int in \[0, 2\*\*64\) .*got 18446744073709551616"):
        SyntheticConfig(seed=2**64)
    largest = SyntheticConfig(num_users=5, num_items=10, seed=2**64 - 1)  # the largest seed torch takes
    assert len(generate_impressions(largest)) >= 5
