"""TensorBatches(fixed_size=True): every batch padded to batch_size rows with filler rows and a
boolean mask column, the real rows being exactly those of the unpadded batches (docs/sampler.md,
"Fixed-size batches"); and what TensorBatches and GroupDataModule cache, and the argument checks
of GroupBatchSampler."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from mlloss.data import GroupBatchSampler, TensorBatches


def random_groups(num_items: int, num_groups: int, seed: int) -> torch.Tensor:
    """Group ids in a random order, with group sizes from 1 to about 4 times the mean."""
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(num_groups, generator=gen) ** 3 + 0.05
    return torch.multinomial(weights, num_items, replacement=True, generator=gen) * 7 + 3


def columns_of(num_items: int, num_groups: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(0, 1000, (num_items, 3), generator=gen), "x": torch.randn(num_items, 4, generator=gen),
            "labels": torch.randint(0, 2, (num_items, 2), generator=gen).float(),
            "user": random_groups(num_items, num_groups, seed)}


def both(columns, batch_size, **options) -> tuple[TensorBatches, TensorBatches]:
    plain = TensorBatches(columns, batch_size, group_key="user", **options)
    fixed = TensorBatches(columns, batch_size, group_key="user", fixed_size=True, **options)
    return plain, fixed


def is_a_data_row(rows: dict[str, torch.Tensor], columns: dict[str, torch.Tensor]) -> torch.Tensor:
    """(len(rows),) bool: row i of ``rows`` equals some row of ``columns`` in every column."""
    match = None
    for name, value in columns.items():
        same = (rows[name].reshape(len(rows[name]), 1, -1) == value.reshape(1, len(value), -1)).all(-1)
        match = same if match is None else match & same
    return match.any(1)


CASES = [  # (seed, batch_size, world, drop_last, pad)
    (0, 64, 1, False, "repeat"),
    (1, 50, 1, False, "empty"),
    (2, 64, 3, False, "empty"),
    (3, 33, 3, True, "empty"),
    (4, 128, 2, False, "repeat"),
    (5, 40, 4, True, "repeat"),
    (6, 300, 4, False, "empty"),  # few batches: most ranks get an empty pad
]


@pytest.mark.parametrize(("seed", "batch_size", "world", "drop_last", "pad"), CASES)
def test_real_rows_are_the_unpadded_batches_and_every_batch_has_batch_size_rows(seed, batch_size, world, drop_last, pad):
    columns = columns_of(700, 60, seed=seed)
    empties = 0
    for rank in range(world):
        options = dict(shuffle=True, seed=seed, drop_last=drop_last, pad=pad, num_replicas=world, rank=rank)
        plain, fixed = both(columns, batch_size, **options)
        for epoch in (0, 1, 2):
            plain.set_epoch(epoch)
            fixed.set_epoch(epoch)
            want, got = list(plain), list(fixed)
            assert len(got) == len(fixed) == len(want) == len(plain)
            for exact, padded in zip(want, got):
                assert set(padded) == {*columns, "mask"} and set(exact) == set(columns), "mask only with fixed_size"
                mask = padded["mask"]
                assert mask.dtype == torch.bool and mask.shape == (batch_size,)
                real = len(exact["x"])
                assert int(mask.sum()) == real
                assert mask[:real].all() and not mask[real:].any(), "the real rows come first"
                for name in columns:
                    assert padded[name].shape == (batch_size, *columns[name].shape[1:])
                    assert torch.equal(padded[name][mask], exact[name]), name
                    assert torch.equal(padded[name][~mask], columns[name][:1].expand_as(padded[name][~mask])), name
                empties += real == 0
    if pad == "empty" and (seed, world) == (6, 4):
        assert empties > 0, "the case is meant to cover empty pads"


def test_an_empty_pad_becomes_batch_size_fillers_with_an_all_false_mask():
    columns = columns_of(200, 20, seed=7)
    # 200 rows in batches of 150 or fewer: 2 or 3 batches, so rank 3 of 4 gets an empty pad
    plain, fixed = both(columns, 150, pad="empty", num_replicas=4, rank=3)
    (exact,), (padded,) = list(plain), list(fixed)
    assert len(exact["x"]) == 0
    assert padded["mask"].shape == (150,) and not padded["mask"].any()
    assert is_a_data_row(padded, columns).all(), "fillers are finite, valid data rows"
    assert torch.isfinite(padded["x"]).all()


def test_filler_rows_are_rows_of_the_data():
    columns = columns_of(400, 30, seed=8)
    _, fixed = both(columns, 64, seed=8)
    batches = list(fixed)
    fillers = {name: torch.cat([batch[name][~batch["mask"]] for batch in batches]) for name in columns}
    assert len(fillers["x"]) > 0, "group-keeping batches of 64 leave room for fillers"
    assert is_a_data_row(fillers, columns).all()


def test_batches_are_views_of_one_tensor_per_epoch_gathered_once():
    columns = columns_of(500, 40, seed=9)
    _, fixed = both(columns, 50, seed=9)
    for epoch in (0, 1):
        fixed.set_epoch(epoch)
        first, second = list(fixed), list(fixed)
        for name in (*columns, "mask"):
            storages = {batch[name].untyped_storage().data_ptr() for batch in first}
            assert len(storages) == 1, f"{name}: batches of an epoch share one gathered tensor"
            assert all(batch[name]._base is not None and batch[name].is_contiguous() for batch in first), name
            assert all(a[name].data_ptr() == b[name].data_ptr() for a, b in zip(first, second)), "cached per epoch"
            offsets = [batch[name].storage_offset() for batch in first]
            step = columns[name][0].numel() * 50 if name != "mask" else 50
            assert offsets == [i * step for i in range(len(first))], f"{name}: consecutive slices"


def test_set_epoch_changes_the_order_consistently():
    columns = columns_of(600, 50, seed=10)
    plain, fixed = both(columns, 64, seed=10)

    def real_users(batches):
        return torch.cat([batch["user"][batch["mask"]] for batch in batches])

    orders = []
    for epoch in (0, 1, 0):
        plain.set_epoch(epoch)
        fixed.set_epoch(epoch)
        order = real_users(list(fixed))
        assert torch.equal(order, torch.cat([batch["user"] for batch in plain])), "the same order as without fixed_size"
        assert torch.equal(order.sort().values, columns["user"].sort().values), "every row once"
        orders.append(order)
    assert not torch.equal(orders[0], orders[1]), "another epoch, another order"
    assert torch.equal(orders[0], orders[2]), "the same epoch, the same order"


def test_other_mask_keys_and_errors():
    columns = columns_of(100, 10, seed=11)
    batch = next(iter(TensorBatches(columns, 32, group_key="user", fixed_size=True, mask_key="real")))
    assert "real" in batch and "mask" not in batch and batch["real"].dtype == torch.bool
    with pytest.raises(ValueError, match="mask_key 'x'"):
        TensorBatches(columns, 32, group_key="user", fixed_size=True, mask_key="x")
    with_mask = {**columns, "mask": torch.ones(100, dtype=torch.bool)}
    with pytest.raises(ValueError, match="mask_key 'mask'"):
        TensorBatches(with_mask, 32, group_key="user", fixed_size=True)
    unpadded = next(iter(TensorBatches(with_mask, 32, group_key="user")))  # no mask column is added without fixed_size
    assert torch.equal(unpadded["mask"], with_mask["mask"][: len(unpadded["x"])])
    for value in (1, "yes", None):
        with pytest.raises(TypeError, match="fixed_size must be a bool"):
            TensorBatches(columns, 32, group_key="user", fixed_size=value)


def test_group_data_module_pads_training_batches_only():
    from mlloss.data import GroupDataModule

    train, val, test = columns_of(600, 50, seed=12), columns_of(300, 30, seed=13), columns_of(200, 20, seed=14)
    module = GroupDataModule(train, val, test, batch_size=64, group_key="user", seed=3, fixed_size=True)
    exact = GroupDataModule(train, val, test, batch_size=64, group_key="user", seed=3)
    padded = list(module.train_dataloader())
    assert all(len(batch["x"]) == 64 and batch["mask"].shape == (64,) for batch in padded)
    assert any(not batch["mask"].all() for batch in padded)
    for got, want in zip(padded, exact.train_dataloader(), strict=True):
        for name in train:
            assert torch.equal(got[name][got["mask"]], want[name])
    for split in ("val", "test"):
        batches = list(module.batches(split))
        assert all("mask" not in batch for batch in batches), split
        assert sum(len(batch["x"]) for batch in batches) == len(module.splits[split]["x"]), split
        assert [len(b["x"]) for b in batches] == [len(b["x"]) for b in exact.batches(split)], split
    with pytest.raises(TypeError, match="fixed_size must be a bool"):
        GroupDataModule(train, batch_size=64, group_key="user", fixed_size="train")


# --------------------------------------------------------------------------- caches, arguments


def test_tensor_batches_follow_a_change_of_the_samplers_options():
    # the gathered rows were cached on the epoch alone: after sampler.batch_size = 10 the batches
    # were still those of 4 while len() was the sampler's
    batches = TensorBatches({"groups": torch.arange(40) // 2}, batch_size=4, seed=0)
    list(batches)
    for option, value in (("batch_size", 10), ("seed", 5), ("shuffle", False)):
        setattr(batches.sampler, option, value)
        got = [batch["groups"].tolist() for batch in batches]
        assert got == [(torch.arange(40) // 2)[index].tolist() for index in batches.sampler], option
        assert len(got) == len(batches), option


def test_group_data_module_rebuilds_the_batches_for_another_trainer():
    # the batches of the first trainer (rank 0 of 2) were served to a later 1-process trainer: half the rows
    from mlloss.data import GroupDataModule

    columns = {"groups": torch.arange(100) // 2, "row": torch.arange(100)}
    module = GroupDataModule(columns, columns, batch_size=8)

    def trainer(rank, world):
        return types.SimpleNamespace(global_rank=rank, world_size=world, current_epoch=0,
                                     strategy=types.SimpleNamespace(root_device=torch.device("cpu")))

    module.trainer = trainer(0, 2)
    assert sum(len(batch["row"]) for batch in module.val_dataloader()) == 52
    module.trainer = trainer(0, 1)
    assert sorted(i for batch in module.val_dataloader() for i in batch["row"].tolist()) == list(range(100))
    assert module.batches("val") is module.batches("val"), "the same trainer reuses its batches"


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"shuffle": "False"}, TypeError, "shuffle must be a bool; got 'False'"),
    ({"drop_last": "False"}, TypeError, "drop_last must be a bool; got 'False'"),
    ({"num_replicas": 2.0}, ValueError, "num_replicas must be an integer; got 2.0"),
    ({"num_replicas": 2, "rank": 1.0}, ValueError, r"rank must be an integer in \[0, num_replicas=2\); got 1.0"),
])
def test_sampler_options_must_have_their_type(options, error, message):
    # "False" was read as True, and a float num_replicas failed inside range()
    with pytest.raises(error, match=message):
        GroupBatchSampler(list(range(20)), 4, **options)


def test_sampler_takes_numpy_integers_and_reversed_arrays():
    # np.int64(4) was refused with "must be a positive integer"; a reversed array failed in torch
    expected = [[9, 8, 7, 6], [5, 4, 3, 2], [1, 0]]
    assert list(GroupBatchSampler(np.arange(10)[::-1], np.int64(4), shuffle=False)) == expected
    sampler = GroupBatchSampler(list(range(10)), 4, num_replicas=np.int64(2), rank=np.int64(1))
    assert (sampler.num_replicas, sampler.rank, sampler.batch_size) == (2, 1, 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sampler_takes_group_ids_on_the_gpu():
    groups = torch.randint(0, 30, (200,), generator=torch.Generator().manual_seed(0))
    for shuffle in (True, False):
        on_gpu = GroupBatchSampler(groups.cuda(), 16, shuffle=shuffle, seed=1)
        assert list(on_gpu) == list(GroupBatchSampler(groups, 16, shuffle=shuffle, seed=1))


def test_group_data_module_evaluates_every_row_once_over_the_ranks_in_user_order():
    """Validation and test under data parallelism (3 ranks): every row exactly once over the ranks
    (a rank short of batches gets an empty one, not a repeated one, which would count its rows
    twice in the metrics), the same number of steps on every rank, each rank's users in id order
    and the same batches every epoch."""
    from collections import Counter
    from types import SimpleNamespace

    from mlloss.data import GroupDataModule

    groups = torch.randint(0, 40, (300,), generator=torch.Generator().manual_seed(0))
    split = {"row": torch.arange(300), "groups": groups}
    for name in ("val", "test"):
        seen, steps = Counter(), set()
        for rank in range(3):
            per_epoch = []
            for epoch in (0, 3):
                module = GroupDataModule(split, val=split, test=split, batch_size=64)
                module.trainer = SimpleNamespace(global_rank=rank, world_size=3, current_epoch=epoch,
                                                 strategy=SimpleNamespace(root_device=torch.device("cpu")))
                per_epoch.append([batch["row"] for batch in module.batches(name)])
            assert all(torch.equal(a, b) for a, b in zip(*per_epoch, strict=True)), (name, rank)
            steps.add(len(per_epoch[0]))
            rows = torch.cat(per_epoch[0])
            seen.update(rows.tolist())
            assert bool((groups[rows].diff() >= 0).all()), (name, rank, "users in id order")
        assert len(steps) == 1 and seen == Counter(range(300)), (name, steps)
