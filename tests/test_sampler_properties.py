"""Property tests of ``mlloss.data.GroupBatchSampler`` against an independent reference: a plain
Python loop that follows docs/sampler.md word for word (groups in the order of
``torch.randperm(seed + epoch)`` over the sorted ids, each split into ``batch_size`` pieces, packed
next fit, batches dealt round-robin to the ranks, padded or dropped). On random group ids, batch
sizes, seeds, epochs, numbers of ranks and options, the sampler's batches must be the reference's,
and the documented guarantees must hold: every item exactly once per epoch (``pad="empty"``),
groups kept together, deterministic given seed and epoch, ranks disjoint and equal in length."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mlloss.data import GroupBatchSampler, TensorBatches


def reference_epoch(groups: list[int], batch_size: int, shuffle: bool, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's batches of all ranks, as docs/sampler.md describes them, one item at a time."""
    ids = sorted(set(groups))
    if shuffle:
        generator = torch.Generator().manual_seed((seed + epoch) % 2**64)
        order = [ids[g] for g in torch.randperm(len(ids), generator=generator).tolist()]
    else:
        order = ids
    batches: list[list[int]] = []
    current: list[int] = []
    for group in order:
        members = [i for i, g in enumerate(groups) if g == group]  # input order kept
        for start in range(0, len(members), batch_size):
            piece = members[start : start + batch_size]
            if len(current) + len(piece) > batch_size:
                batches.append(current)
                current = []
            current = current + piece
    if current:
        batches.append(current)
    return batches


def reference_rank(batches: list[list[int]], world: int, rank: int, drop_last: bool, pad: str) -> list[list[int]]:
    """Rank ``rank``'s batches: every ``world``-th one from ``rank``; short ranks padded or the tail dropped."""
    count = len(batches) // world if drop_last else -(-len(batches) // world)
    own = []
    for slot in range(rank, count * world, world):
        if slot < len(batches):
            own.append(batches[slot])
        else:
            own.append(batches[slot % len(batches)] if pad == "repeat" else [])
    return own


group_lists = st.lists(st.integers(-(2**62), 2**62) | st.integers(0, 6), min_size=1, max_size=60)


@settings(max_examples=100, deadline=None)
@given(groups=group_lists, batch_size=st.integers(1, 20), world=st.integers(1, 4), seed=st.integers(-(2**63), 2**64 - 1),
       epoch=st.integers(0, 2**40), shuffle=st.booleans(), drop_last=st.booleans(), pad=st.sampled_from(["repeat", "empty"]))
def test_batches_are_the_documented_ones_for_every_rank(groups, batch_size, world, seed, epoch, shuffle, drop_last, pad):
    everything = reference_epoch(groups, batch_size, shuffle, seed, epoch)
    if drop_last and len(everything) < world:
        with pytest.raises(ValueError, match="drop_last=True leaves every rank without a batch"):
            sampler = GroupBatchSampler(groups, batch_size, shuffle=shuffle, seed=seed, drop_last=True,
                                        num_replicas=world, rank=0)
            sampler.set_epoch(epoch)
            len(sampler)
        return
    ranks = []
    for rank in range(world):
        sampler = GroupBatchSampler(groups, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, pad=pad,
                                    num_replicas=world, rank=rank)
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert batches == reference_rank(everything, world, rank, drop_last, pad)
        again = GroupBatchSampler(groups, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, pad=pad,
                                  num_replicas=world, rank=rank)
        again.set_epoch(epoch)
        assert list(again) == batches, "deterministic given seed and epoch"
        ranks.append(batches)
    assert len({len(batches) for batches in ranks}) == 1, "every rank runs the same number of steps"
    dealt = [i for batches in ranks for batch in batches for i in batch]
    if not drop_last and pad == "empty":
        assert sorted(dealt) == list(range(len(groups))), "every item exactly once per epoch"
    if drop_last:
        assert len(dealt) == len(set(dealt)), "no item twice"
    for batches in ranks:
        for batch in batches:
            assert len(batch) <= batch_size
    if not drop_last and pad == "repeat":
        return  # the repeated batches that pad the short ranks put their groups on a second rank
    owner = {}
    for rank, batches in enumerate(ranks):
        for batch in batches:
            for i in batch:
                if groups.count(groups[i]) <= batch_size:  # a larger group is split into pieces
                    assert owner.setdefault(groups[i], rank) == rank, "a group is on one rank"


@settings(max_examples=40, deadline=None)
@given(groups=group_lists, batch_size=st.integers(1, 20), world=st.integers(1, 3), seed=st.integers(0, 2**32),
       epochs=st.lists(st.integers(0, 50), min_size=1, max_size=4), fixed_size=st.booleans())
def test_tensor_batches_follow_the_sampler_through_any_sequence_of_epochs(groups, batch_size, world, seed, epochs,
                                                                          fixed_size):
    """TensorBatches caches an epoch's gathered rows: after set_epoch in any order (resumed runs
    jump to an epoch) its real rows are the reference batches of that epoch."""
    rows = torch.arange(len(groups))
    for rank in range(world):
        batches = TensorBatches({"row": rows, "user": torch.tensor(groups)}, batch_size, group_key="user", seed=seed,
                                pad="empty", num_replicas=world, rank=rank, fixed_size=fixed_size)
        for epoch in epochs:
            batches.set_epoch(epoch)
            expected = reference_rank(reference_epoch(groups, batch_size, True, seed, epoch), world, rank, False, "empty")
            got = [batch["row"][batch["mask"]] if fixed_size else batch["row"] for batch in batches]
            assert [g.tolist() for g in got] == expected
            assert len(batches) == len(expected)
