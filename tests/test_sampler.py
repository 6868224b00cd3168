"""Tests of ``mlloss.data.GroupBatchSampler``: whole groups per batch, the documented split of
groups larger than a batch, batch-size bounds, seeded shuffling, data-parallel dealing (disjoint
groups, equal batch counts), errors, speed, the docs/sampler.md example, and the within-user pairs
it keeps compared with shuffled batches."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mlloss.data import GroupBatchSampler, SyntheticConfig, TensorBatches, generate_impressions, split_by_time
from mlloss.data import sampler as sampler_module

DOC = Path(__file__).resolve().parents[1] / "docs" / "sampler.md"


def random_groups(num_items: int, num_groups: int, seed: int = 0) -> torch.Tensor:
    """Unsorted, non-contiguous (negative and large) ids with long-tailed group sizes."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(10 * num_groups, generator=gen)[:num_groups] * 7919 - 50_000
    weights = torch.distributions.LogNormal(0.0, 1.2).sample((num_groups,))
    return ids[torch.multinomial(weights, num_items, replacement=True, generator=gen)]


def group_batches(batches: list[list[int]], groups: torch.Tensor) -> dict[int, list[int]]:
    """Group id -> the positions of the batches that hold its items."""
    where: dict[int, list[int]] = {}
    for b, batch in enumerate(batches):
        for g in groups[batch].unique().tolist():
            where.setdefault(g, []).append(b)
    return where


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_every_item_once_whole_groups_and_size_bounds(batch_size):
    groups = random_groups(3000, 200)
    sampler = GroupBatchSampler(groups, batch_size, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(groups)))
    sizes = dict(zip(*(t.tolist() for t in groups.unique(return_counts=True))))
    for g, where in group_batches(batches, groups).items():
        assert len(where) == -(-sizes[g] // batch_size), "a group spans ceil(size / batch_size) batches"
    for batch, following in itertools.pairwise(batches):
        assert 1 <= len(batch) <= batch_size
        first = groups[following]
        first_piece = int((first == first[0]).sum())  # the next batch's first group (or piece)
        assert len(batch) + first_piece > batch_size, "next fit: a batch closes only when the next group does not fit"
    assert 1 <= len(batches[-1]) <= batch_size


def test_a_group_larger_than_a_batch_is_split_into_consecutive_batch_size_pieces():
    groups = torch.tensor([5] * 25 + [2] * 3 + [9] * 10 + [4])  # sizes 25, 3, 10, 1 with batch 8
    batches = list(GroupBatchSampler(groups, 8, shuffle=False))
    # id order 2, 4, 5, 9: [3 items of 2, 1 of 4] | 5 in pieces 8, 8, 8, 1 | 9 in pieces 8, 2
    assert [groups[b].tolist() for b in batches] == [[2, 2, 2, 4], *[[5] * 8] * 3, [5], [9] * 8, [9] * 2]
    big = [i for b in batches for i in b if groups[i] == 5]
    assert big == list(range(25)), "pieces are consecutive and keep the items' order"


def test_packing_that_would_not_advance_is_an_error_not_a_hang():
    """_next_fit's doubling loop is bounded: a piece larger than a batch (which _pieces never makes)
    would leave next-fit at piece 0 for ever; the bound reports it (a bug that did so once grew the
    loop's list until the machine ran out of memory)."""
    assert sampler_module._next_fit(torch.tensor([3, 2, 3, 1]), 4).tolist() == [3, 2, 4]
    with pytest.raises(RuntimeError, match="did not reach the last of 2 pieces"):
        sampler_module._next_fit(torch.tensor([5, 1]), 4)


def test_within_a_group_the_input_order_is_kept():
    groups = random_groups(2000, 100, seed=1)
    for batch in GroupBatchSampler(groups, 128, seed=0):
        for g in groups[batch].unique():
            members = [i for i in batch if groups[i] == g]
            assert members == sorted(members)


def test_same_seed_and_epoch_give_the_same_batches_and_other_epochs_other_orders():
    groups = random_groups(3000, 300)
    a, b = GroupBatchSampler(groups, 100, seed=5), GroupBatchSampler(groups, 100, seed=5)
    assert list(a) == list(b)
    epoch0 = list(a)
    a.set_epoch(1)
    epoch1 = list(a)
    assert epoch1 != epoch0 and len(a) == len(epoch1)
    b.set_epoch(1)
    assert list(b) == epoch1
    assert list(GroupBatchSampler(groups, 100, seed=6)) != epoch0


def test_without_shuffle_groups_come_in_increasing_id_order_every_epoch():
    groups = random_groups(1000, 50)
    sampler = GroupBatchSampler(groups, 64, shuffle=False)
    order = torch.tensor([i for batch in sampler for i in batch])
    ids = groups[order]
    assert bool((ids[1:] >= ids[:-1]).all())
    sampler.set_epoch(4)
    assert torch.equal(torch.tensor([i for batch in sampler for i in batch]), order)


def test_integer_ids_of_any_kind_are_accepted():
    ids = [3, -1, 3, 10**12, -1]
    for groups in (ids, tuple(ids), torch.tensor(ids), torch.tensor(ids).numpy()):
        assert list(GroupBatchSampler(groups, 2, shuffle=False)) == [[1, 4], [0, 2], [3]]
    assert list(GroupBatchSampler(torch.tensor([3, -1, 3], dtype=torch.int32), 2, shuffle=False)) == [[1], [0, 2]]


def shards(groups: torch.Tensor, world: int, **kwargs) -> list[list[list[int]]]:
    return [list(GroupBatchSampler(groups, 50, seed=2, num_replicas=world, rank=r, **kwargs)) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_get_whole_disjoint_groups_every_item_once_and_equal_counts_with_empty_padding(world):
    groups = random_groups(2000, 150)
    ranks = shards(groups, world, pad="empty")
    assert len({len(r) for r in ranks}) == 1
    assert len(ranks[0]) == len(GroupBatchSampler(groups, 50, seed=2, num_replicas=world, rank=0, pad="empty"))
    assert sorted(i for r in ranks for batch in r for i in batch) == list(range(len(groups)))
    small = {int(g) for g, n in zip(*groups.unique(return_counts=True)) if n <= 50}  # larger ones are split
    owners = [set(groups[[i for batch in r for i in batch]].tolist()) & small for r in ranks]
    assert sum(map(len, owners)) == len(small), "each group is on one rank"
    assert sum(batch == [] for r in ranks for batch in r) < world


@pytest.mark.parametrize("world", [1, 2, 3])
def test_drop_last_drops_fewer_than_world_batches_and_keeps_ranks_disjoint(world):
    groups = random_groups(2000, 150)
    everything = list(GroupBatchSampler(groups, 50, seed=2))
    ranks = shards(groups, world, drop_last=True)
    assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) == len(everything) // world
    dealt = [batch for step in zip(*ranks) for batch in step]  # round-robin: rank r takes batches r, r + W, ...
    assert dealt == everything[: len(dealt)]


@pytest.mark.parametrize("world", [2, 3])
def test_repeat_padding_gives_short_ranks_the_epochs_first_batches(world):
    groups = random_groups(2000, 150)
    everything = list(GroupBatchSampler(groups, 50, seed=2))
    ranks = shards(groups, world)
    assert len({len(r) for r in ranks}) == 1
    dealt = [batch for step in zip(*ranks) for batch in step]
    assert dealt[: len(everything)] == everything
    assert dealt[len(everything) :] == everything[: len(dealt) - len(everything)]
    assert len(dealt) - len(everything) < world


def test_more_ranks_than_batches_repeats_or_empties():
    groups = torch.tensor([0, 0, 1])
    assert [list(GroupBatchSampler(groups, 10, num_replicas=3, rank=r)) for r in range(3)] == [[[0, 1, 2]]] * 3
    assert [list(GroupBatchSampler(groups, 10, num_replicas=3, rank=r, pad="empty")) for r in range(3)] == [
        [[0, 1, 2]], [[]], [[]]
    ]
    with pytest.raises(ValueError, match="drop_last=True leaves every rank without a batch"):  # was 0 batches each
        len(GroupBatchSampler(groups, 10, num_replicas=3, rank=1, drop_last=True))


def test_drop_last_with_fewer_batches_than_ranks_is_an_error_that_names_a_batch_size_that_works():
    # 4,000 rows packed into one batch of 8,192 on 2 ranks: drop_last left both ranks 0 batches, silently
    # (GroupDataModule's training batches; Lightning only warned, and the recipe crashed afterwards)
    users = torch.arange(100).repeat_interleave(40)
    for world in (2, 4):
        with pytest.raises(ValueError) as error:
            list(GroupBatchSampler(users, 8192, drop_last=True, num_replicas=world, rank=world - 1))
        assert (f"the 4000 items pack into 1 batch(es) of at most batch_size=8192 items, fewer than num_replicas={world}"
                in str(error.value))
        advised = int(re.search(r"at most (\d+) \(items / ranks\)", str(error.value)).group(1))
        assert advised == 4000 // world
        for epoch in range(3):  # the advised size gives every rank a batch, whatever the packing of the epoch
            counts = []
            for rank in range(world):
                sampler = GroupBatchSampler(users, advised, drop_last=True, num_replicas=world, rank=rank)
                sampler.set_epoch(epoch)
                counts.append(len(list(sampler)))
            assert min(counts) >= 1 and len(set(counts)) == 1
    with pytest.raises(ValueError, match="fewer items than ranks no batch_size helps"):
        len(GroupBatchSampler(torch.tensor([0, 1]), 1, drop_last=True, num_replicas=3, rank=0))
    assert len(GroupBatchSampler(torch.tensor([0, 1]), 1, drop_last=False, num_replicas=3, rank=0)) == 1


def test_group_data_module_refuses_a_training_split_of_fewer_batches_than_ranks():
    import types

    from mlloss.data import GroupDataModule

    columns = {"groups": torch.arange(100).repeat_interleave(40), "x": torch.zeros(4000)}
    module = GroupDataModule(columns, columns, batch_size=8192)
    module.trainer = types.SimpleNamespace(global_rank=1, world_size=2, current_epoch=0, max_epochs=3,
                                           reload_dataloaders_every_n_epochs=1,
                                           strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
    with pytest.raises(ValueError, match="batch_size=8192 items, fewer than num_replicas=2"):
        len(module.train_dataloader())
    assert len(module.val_dataloader()) == 1  # evaluation pads with an empty batch instead


def test_seed_and_epoch_are_checked_integers_and_numpy_integers_work():
    # np.int64 epochs (for epoch in np.arange(3)) and seeds failed on iteration with "an integer is
    # required"; seed=None, "7" or 0.5 were accepted and failed later without naming seed
    groups = torch.arange(40) // 2
    reference = GroupBatchSampler(groups, 6, seed=7)
    reference.set_epoch(3)
    sampler = GroupBatchSampler(groups, 6, seed=np.int64(7))
    sampler.set_epoch(np.int64(3))
    assert list(sampler) == list(reference) and type(sampler.seed) is int and type(sampler.epoch) is int
    for seed in (None, "7", 0.5, True, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match=re.escape(f"seed must be an integer in [-2**63, 2**64) (torch.Generator's "
                                                       f"seeds); got {seed!r}")):
            GroupBatchSampler(groups, 6, seed=seed)
    with pytest.raises(ValueError, match="seed must be .*got None"):
        TensorBatches({"groups": groups}, 6, seed=None)
    for epoch, wanted in ((-1, ">= 0"), (1.0, "an integer"), (None, "an integer"), ("2", "an integer")):
        with pytest.raises(ValueError, match=re.escape(f"epoch must be {wanted}; got {epoch!r}")):
            sampler.set_epoch(epoch)
    # seed + epoch is taken modulo 2**64, as torch.Generator.manual_seed reads a negative seed
    top = GroupBatchSampler(groups, 6, seed=2**64 - 1)
    top.set_epoch(1)
    assert list(top) == list(GroupBatchSampler(groups, 6, seed=0))
    assert list(GroupBatchSampler(groups, 6, seed=-1)) == list(GroupBatchSampler(groups, 6, seed=2**64 - 1))


def test_replicas_default_to_torch_distributed(monkeypatch):
    monkeypatch.setattr(sampler_module.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(sampler_module.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(sampler_module.dist, "get_rank", lambda: 3)
    sampler = GroupBatchSampler(torch.arange(10), 1, shuffle=False)
    assert (sampler.num_replicas, sampler.rank) == (4, 3)
    assert list(sampler) == [[3], [7], [1]]  # batches 3, 7 and the padding repeat of batch 11 % 10


@pytest.mark.parametrize("world", [1, 3])
def test_empty_input(world):
    for groups in ([], torch.empty(0, dtype=torch.long)):
        sampler = GroupBatchSampler(groups, 8, num_replicas=world, rank=world - 1)
        assert len(sampler) == 0 and list(sampler) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer; got 0"),
        ({"batch_size": 2.5}, "batch_size must be a positive integer; got 2.5"),
        ({"batch_size": True}, "batch_size must be a positive integer; got True"),
        ({"rank": 3, "num_replicas": 3}, r"rank must be in \[0, num_replicas=3\); got 3"),
        ({"num_replicas": 0}, "num_replicas must be >= 1; got 0"),
        ({"pad": "zeros"}, "pad must be one of .*got 'zeros'"),
        ({"groups": torch.zeros(2, 3, dtype=torch.long)}, r"groups must be 1-D .*got shape \(2, 3\)"),
        ({"groups": torch.tensor([0.5, 1.0])}, "groups must hold integer ids; got dtype torch.float32"),
        ({"groups": torch.tensor([True, False])}, "groups must hold integer ids; got dtype torch.bool"),
        # ids torch cannot convert: its messages ("too many dimensions 'str'", "Overflow when unpacking
        # long long") named neither groups nor the id
        ({"groups": [7, "u2", 7]}, r"groups must hold integer ids; got 'u2' \(str\) at index 1: map the ids"),
        ({"groups": np.array(["u1", "u2"])}, "groups must hold integer ids; got a NumPy array of dtype <U2: map the ids"),
        ({"groups": np.array([1, 2], dtype=object)}, "groups must hold integer ids; got a NumPy array of dtype object"),
        ({"groups": [1, 2**64 - 1]}, f"groups must hold integer ids in the int64 range; got {2**64 - 1} at index 1"),
    ],
)
def test_errors_name_the_argument_and_value(kwargs, message):
    arguments = {"groups": torch.tensor([0, 1]), "batch_size": 2, **kwargs}
    error = TypeError if "integer ids;" in message else ValueError  # a wrong dtype or type is a TypeError, as in the losses
    with pytest.raises(error, match=message):
        GroupBatchSampler(**arguments)


def test_an_epoch_of_a_million_items_in_twenty_thousand_groups_builds_in_well_under_a_second():
    groups = torch.randint(0, 20_000, (1_000_000,), generator=torch.Generator().manual_seed(0))
    sampler = GroupBatchSampler(groups, 1024, seed=0)
    sampler.set_epoch(1)
    start = time.perf_counter()
    num_batches = len(sampler)  # builds (and caches) the epoch's batches
    seconds = time.perf_counter() - start
    print(f"\n1M items, 20k groups: {num_batches} batches built in {seconds * 1000:.0f} ms")
    assert seconds < 1.0


def test_the_docs_example_runs():
    """The python block of docs/sampler.md's "Example" section, run as written."""
    section = DOC.read_text().split("## Example", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)
    exec(compile(code, str(DOC), "exec"), {})


def within_user_pairs(batches, users: torch.Tensor, clicks: torch.Tensor) -> float:
    """Mean over batches of the (click, no-click) pairs of the same user inside the batch."""
    total = 0.0
    for batch in batches:
        index = torch.as_tensor(batch, dtype=torch.long)
        user = torch.unique(users[index], return_inverse=True)[1]
        positives = torch.bincount(user, weights=clicks[index].double())
        total += float((positives * (torch.bincount(user) - positives)).sum())
    return total / len(batches)


def test_keeps_at_least_twenty_times_the_within_user_pairs_of_shuffled_batches():
    """Acceptance: the recipe's default synthetic data (training split), click label, batch 1,024."""
    train = split_by_time(generate_impressions(SyntheticConfig()))[0]
    shuffled = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).split(1024)
    grouped = list(GroupBatchSampler(train.user, 1024, seed=0))
    baseline = within_user_pairs(shuffled, train.user, train.click)
    kept = within_user_pairs(grouped, train.user, train.click)
    mean_size = len(train) / len(grouped)
    print(f"\nwithin-user click pairs per batch: shuffled {baseline:,.0f} ({len(shuffled)} batches), "
          f"GroupBatchSampler {kept:,.0f} ({len(grouped)} batches, mean size {mean_size:.0f}): {kept / baseline:.0f}x")
    assert kept >= 20 * baseline


# --------------------------------------------------------------------------- TensorBatches, GroupDataModule


def columns_of(num_items: int, num_groups: int, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"ids": torch.randint(0, 1000, (num_items, 3), generator=gen), "x": torch.randn(num_items, 4, generator=gen),
            "labels": torch.randint(0, 2, (num_items, 2), generator=gen).float(),
            "user": random_groups(num_items, num_groups, seed)}


@pytest.mark.parametrize(("world", "drop_last", "pad"), [(1, False, "repeat"), (3, False, "empty"), (3, True, "empty"),
                                                         (2, False, "repeat")])
def test_tensor_batches_are_the_samplers_batches_as_slices(world, drop_last, pad):
    """Every rank's batches hold exactly the rows of GroupBatchSampler's index batches, in order,
    for every column (empty pads included), epoch after epoch."""
    columns = columns_of(900, 70)
    for rank in range(world):
        options = dict(shuffle=True, seed=5, drop_last=drop_last, pad=pad, num_replicas=world, rank=rank)
        batches = TensorBatches(columns, 64, group_key="user", **options)
        sampler = GroupBatchSampler(columns["user"], 64, **options)
        for epoch in (0, 1):
            batches.set_epoch(epoch)
            sampler.set_epoch(epoch)
            got, want = list(batches), list(sampler)
            assert len(got) == len(batches) == len(want)
            for batch, index in zip(got, want):
                for name, value in columns.items():
                    assert torch.equal(batch[name], value[torch.tensor(index, dtype=torch.long)])


def test_tensor_batches_are_views_of_one_gather_per_epoch():
    columns = columns_of(500, 40)
    batches = TensorBatches(columns, 50, groups=columns["user"])
    first, second = list(batches), list(batches)
    assert all(a["x"].data_ptr() == b["x"].data_ptr() for a, b in zip(first, second)), "the epoch's rows are cached"
    assert all(b["x"]._base is not None for b in first), "batches are slices (views), not copies"


def test_tensor_batches_errors_name_the_argument():
    with pytest.raises(ValueError, match="same first dimension"):
        TensorBatches({"a": torch.zeros(3), "user": torch.zeros(4, dtype=torch.long)}, 2, group_key="user")
    with pytest.raises(ValueError, match="no 'groups' column"):
        TensorBatches({"a": torch.zeros(3)}, 2)
    with pytest.raises(ValueError, match="batch_size"):
        TensorBatches({"groups": torch.zeros(3, dtype=torch.long)}, 0)
    for groups in (torch.arange(2), torch.arange(5)):  # a short one dropped rows silently
        with pytest.raises(ValueError, match=r"groups must be a \(N,\) tensor with one id per row of columns \(N = 3\)"):
            TensorBatches({"a": torch.zeros(3)}, 2, groups=groups)
    # a NumPy or list column failed with an AttributeError ('numpy.ndarray' object has no attribute 'dim')
    for column in (np.zeros(3, dtype=np.int64), [0, 0, 1]):
        with pytest.raises(TypeError, match=rf"columns\['user'\] must be a torch.Tensor .*got {type(column).__name__}"):
            TensorBatches({"a": torch.zeros(3), "user": column}, 2, group_key="user")


def test_group_datamodule_checks_its_arguments_when_built():
    # each was accepted and failed only when Lightning loaded the split inside fit (a typo in
    # group_key, a validation split without the group column) or misbehaved there
    from mlloss.data import GroupDataModule

    train, val = columns_of(100, 10), columns_of(40, 5)
    cases = [
        (dict(batch_size="64"), ValueError, "batch_size must be a positive integer; got '64'"),
        (dict(batch_size=0), ValueError, "batch_size must be a positive integer; got 0"),
        (dict(batch_size=8, group_key="users"), ValueError, r"train has no 'users' column for the group ids"),
        (dict(batch_size=8, seed=0.5), ValueError, "seed must be an integer"),
        (dict(batch_size=8, fixed_size=1), TypeError, "fixed_size must be a bool"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            GroupDataModule(train, val, **{"group_key": "user", **kwargs})
    renamed = {"user_id" if key == "user" else key: value for key, value in val.items()}
    with pytest.raises(ValueError, match=r"val has no 'user' column for the group ids \(group_key='user'\)"):
        GroupDataModule(train, renamed, batch_size=8, group_key="user")
    with pytest.raises(TypeError, match="train must be a mapping of column names to tensors; got NoneType"):
        GroupDataModule(None, val, batch_size=8, group_key="user")
    assert str(GroupDataModule(train, val, batch_size=8, group_key="user")) == (
        "GroupDataModule(train=100 rows, val=40 rows, batch_size=8, group_key='user', seed=0, fixed_size=False)")


def test_group_data_module_without_a_validation_split_runs_no_validation():
    import pytorch_lightning as pl

    from mlloss.data import GroupDataModule

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer, self.validated = torch.nn.Linear(4, 1), 0

        def training_step(self, batch, batch_idx):
            return self.layer(batch["x"]).sum()

        def validation_step(self, batch, batch_idx):
            self.validated += 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Module()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, GroupDataModule(columns_of(200, 20, seed=4), batch_size=32, group_key="user"))
    assert trainer.global_step > 0 and module.validated == 0


def test_group_data_module_serves_every_row_once_for_evaluation_and_shuffles_training():
    from mlloss.data import GroupDataModule

    train, val = columns_of(600, 50, seed=1), columns_of(300, 30, seed=2)
    module = GroupDataModule(train, val, batch_size=64, group_key="user", seed=3)
    seen = torch.cat([batch["x"] for batch in module.val_dataloader()])
    assert torch.equal(seen.sort(0).values, val["x"].sort(0).values)
    order = [batch["user"] for batch in module.train_dataloader()]
    assert not torch.equal(torch.cat(order), train["user"])
    with pytest.raises(ValueError, match="'test'"):
        module.test_dataloader()


def test_group_data_module_leaves_batches_on_their_device_and_moves_others():
    """Lightning moves every batch through the datamodule's ``transfer_batch_to_device``: a batch
    of GroupDataModule is already on the device (the same tensors come back, no copy), any other
    batch is moved as Lightning moves it."""
    from mlloss.data import GroupDataModule

    module = GroupDataModule(columns_of(100, 10, seed=1), batch_size=32, group_key="user")
    batch = next(iter(module.train_dataloader()))
    moved = module.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert moved is batch
    meta = module.transfer_batch_to_device(batch, torch.device("meta"), 0)
    assert all(value.device.type == "meta" for value in meta.values())
    mixed = module.transfer_batch_to_device({"x": batch["x"], "note": ["a"]}, torch.device("cpu"), 0)
    assert mixed["note"] == ["a"] and torch.equal(mixed["x"], batch["x"])
