"""Batches that keep groups together, for losses and metrics computed within groups.

A per-user (per-query, per-session) loss such as ``build_loss("pdaom")`` or ``groups=`` of
``build_loss("auc")`` only sees the pairs of a user whose impressions share a batch. Shuffled
batches scatter every user over many batches, leaving few such pairs (docs/sampler.md measures
141 times fewer than here at batch size 1,024 on the synthetic log). :class:`GroupBatchSampler`
yields batches of item indices that hold whole groups:

* every epoch, the groups are put in a random order (seeded by ``seed + epoch``, like
  ``DistributedSampler``), the items sorted by group in that order (within a group, the items keep
  their input order) and packed greedily: consecutive groups go into the current batch while it
  has room for the whole group, otherwise a new batch starts ("next fit");
* a group larger than ``batch_size`` is split into consecutive pieces of ``batch_size`` items
  (full batches of their own) and a last piece of the rest, packed like a group;
* so every batch holds at most ``batch_size`` items, and every batch but the epoch's last holds
  more than ``batch_size`` minus the size of the next batch's first group (or piece);
* under data parallelism the epoch's batches, packed identically on every rank, are dealt
  round-robin: rank r takes batches r, r + R, r + 2R, ... of R replicas, so a group is never split
  across ranks (a larger-than-batch group's pieces may be). Ranks left one batch short are padded
  with a repeat of the epoch's first batches (``pad="repeat"``, for training) or with empty batches
  (``pad="empty"``, for evaluation: every item once, every rank the same number of steps), or with
  ``drop_last=True`` the last ``number of batches % R`` batches are dropped; an epoch that packs
  into fewer batches than ranks would then leave every rank with none, which is a ValueError.

The number of batches depends on the packing, so it can change by a few between epochs;
``len()`` is that of the current epoch (see docs/sampler.md for Lightning, which reads it once).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import Sampler

from mlloss._validation import check_bool, check_int, require_integer_ids

__all__ = ["GroupBatchSampler"]

PADS = ("repeat", "empty")
SEEDS = (-(2**63), 2**64)  # the range of torch.Generator.manual_seed
SEED_REQUIREMENT = "an integer in [-2**63, 2**64) (torch.Generator's seeds)"


def check_seed(seed: object) -> int:
    """``seed`` as an int in the range torch.Generator.manual_seed takes."""
    checked = check_int("seed", seed, minimum=SEEDS[0], requirement=SEED_REQUIREMENT)
    if not checked < SEEDS[1]:
        raise ValueError(f"seed must be {SEED_REQUIREMENT}; got {seed!r}")
    return checked


class GroupBatchSampler(Sampler[list[int]]):
    """Batches of item indices that keep each group's items together (see the module docstring).

    Use it as ``DataLoader(dataset, batch_sampler=sampler)``, or, for a dataset that takes a list
    of indices (``TensorDataset`` does), as ``DataLoader(dataset, sampler=sampler,
    batch_size=None)``, which fetches a batch in one indexing operation and allows the empty
    batches of ``pad="empty"``.

    Args:
        groups: the group id of every item, a 1-D tensor or sequence of integers (any values,
            any order).
        batch_size: target number of items per batch: batches hold at most this many.
        shuffle: put the groups in a new random order every epoch; if False, in increasing id order.
        seed: seed of the shuffling, an integer (Python's or NumPy's) in [-2**63, 2**64), the range of
            ``torch.Generator.manual_seed``; the order of epoch e is drawn from ``seed + e`` (modulo
            2**64, as ``manual_seed`` reads a negative seed).
        drop_last: drop the last ``number of batches % num_replicas`` batches of the epoch so that
            every rank gets the same number without padding (a no-op with one replica). An epoch
            of fewer batches than ``num_replicas`` (but at least one) would leave every rank
            without a batch: ``len()`` and iteration raise a ValueError that asks for a smaller
            ``batch_size``.
        pad: without ``drop_last``, how ranks one batch short are made up: ``"repeat"`` the
            epoch's first batches, or give them an ``"empty"`` batch (``[]``).
        num_replicas: number of data-parallel ranks; default: torch.distributed's world size when
            it is initialised, else 1.
        rank: this process's rank; default: torch.distributed's rank when initialised, else 0.
    """

    def __init__(
        self,
        groups: Tensor | Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        pad: Literal["repeat", "empty"] = "repeat",
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        batch_size = check_int("batch_size", batch_size, minimum=1, requirement="a positive integer")
        if pad not in PADS:
            raise ValueError(f"pad must be one of {PADS}; got {pad!r}")
        self.num_replicas, self.rank = _replicas(num_replicas, rank)
        sorted_ids, self._items_by_group = torch.sort(_group_ids(groups), stable=True)
        self._group_sizes = torch.unique_consecutive(sorted_ids, return_counts=True)[1]
        self.batch_size = batch_size
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_seed(seed)
        self.drop_last = check_bool("drop_last", drop_last)
        self.pad = pad
        self.epoch = 0
        self._cache: tuple[tuple, Tensor, list[int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        """Use the group order of ``epoch``, an integer >= 0 (Python's or NumPy's); call it before
        every epoch, as with ``DistributedSampler``."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        """Number of batches this rank yields in the current epoch."""
        return len(self._own_slots(len(self._epoch_plan()[1]) - 1))

    def __iter__(self) -> Iterator[list[int]]:
        items, spans = self.epoch_spans()
        order = items.tolist()
        for start, end in spans:
            yield order[start:end]

    def epoch_spans(self) -> tuple[Tensor, list[tuple[int, int]]]:
        """The current epoch's item order (of all ranks, an int64 tensor) and this rank's batches
        as ``(start, end)`` spans in it: batch i is ``items[start:end]``, an empty pad ``(0, 0)``.
        What :meth:`__iter__` yields, for loaders that gather an epoch's rows at once
        (:class:`mlloss.data.TensorBatches`)."""
        items, bounds = self._epoch_plan()
        num_batches = len(bounds) - 1
        spans = []
        for slot in self._own_slots(num_batches):
            if slot < num_batches or self.pad == "repeat":
                batch = slot % num_batches
                spans.append((bounds[batch], bounds[batch + 1]))
            else:
                spans.append((0, 0))
        return items, spans

    def _own_slots(self, num_batches: int) -> range:
        """This rank's positions in the epoch's batch list; positions past its end are padding."""
        if self.drop_last and 0 < num_batches < self.num_replicas:
            raise ValueError(self._too_few_batches(num_batches))
        per_rank = num_batches // self.num_replicas if self.drop_last else -(-num_batches // self.num_replicas)
        return range(self.rank, per_rank * self.num_replicas, self.num_replicas)

    def _too_few_batches(self, num_batches: int) -> str:
        """Why ``drop_last`` leaves every rank without a batch, and what to change."""
        num_items = len(self._items_by_group)
        problem = (f"drop_last=True leaves every rank without a batch in epoch {self.epoch}: the {num_items} items "
                   f"pack into {num_batches} batch(es) of at most batch_size={self.batch_size} items, fewer than "
                   f"num_replicas={self.num_replicas}, so drop_last drops them all")
        if num_items < self.num_replicas:
            return f"{problem}; with fewer items than ranks no batch_size helps: use fewer ranks or drop_last=False"
        # a batch holds at most batch_size items: batch_size <= items / ranks packs at least one batch per rank
        return (f"{problem}; use a smaller batch_size, at most {num_items // self.num_replicas} (items / ranks), "
                "or drop_last=False")

    def _cache_key(self) -> tuple:
        """Every attribute that :meth:`epoch_spans` depends on: a change of any re-packs the epoch
        (TensorBatches keys its gathered rows on it too)."""
        return (self.epoch, self.seed, self.shuffle, self.batch_size, self.drop_last, self.pad, self.num_replicas,
                self.rank)

    def _epoch_plan(self) -> tuple[Tensor, list[int]]:
        """The current epoch's item order and the offsets of its batches in it, for all ranks
        (batch b is ``items[bounds[b]:bounds[b + 1]]``), cached."""
        key = self._cache_key()
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, *self._pack_epoch())
        return self._cache[1:]

    def _pack_epoch(self) -> tuple[Tensor, list[int]]:
        """Order the groups for the epoch, lay their items out in that order, pack the pieces."""
        num_groups = len(self._group_sizes)
        if self.shuffle:
            seed = (self.seed + self.epoch) % 2**64  # as manual_seed reads a negative seed; seed + epoch may pass 2**64
            order = torch.randperm(num_groups, generator=torch.Generator().manual_seed(seed))
        else:
            order = torch.arange(num_groups)
        sizes = self._group_sizes.index_select(0, order)
        # item j of the epoch is item (j - start of its group in the epoch + start of the group in _items_by_group)
        group_start = torch.cumsum(self._group_sizes, 0) - self._group_sizes
        shift = group_start.index_select(0, order) - (torch.cumsum(sizes, 0) - sizes)
        source = torch.arange(len(self._items_by_group)) + torch.repeat_interleave(shift, sizes)
        items = self._items_by_group.index_select(0, source)
        batch_sizes = _next_fit(_pieces(sizes, self.batch_size), self.batch_size)
        return items, [0, *torch.cumsum(batch_sizes, 0).tolist()]


def _group_ids(groups: Tensor | Sequence[int]) -> Tensor:
    """``groups`` as a 1-D integer tensor, or an error naming what is wrong with it (the losses'
    dtype rule: integer ids, not float or bool)."""
    if isinstance(groups, np.ndarray):  # torch takes no negative strides (a reversed array)
        groups = np.ascontiguousarray(groups)
    try:
        ids = torch.as_tensor(groups).cpu()  # the epoch plan is built on the host
    except (TypeError, ValueError, RuntimeError):  # torch's messages name neither groups nor the value
        raise _not_integer_ids(groups) from None
    if ids.dim() != 1:
        raise ValueError(f"groups must be 1-D (one id per item); got shape {tuple(ids.shape)}")
    if ids.numel() == 0:
        return ids.long()
    require_integer_ids(ids, "groups")
    return ids


def _not_integer_ids(groups: Tensor | Sequence[int]) -> Exception:
    """The error for ``groups`` that torch cannot make a tensor of: string (or other non-integer)
    ids, a NumPy array of such a dtype, or integers outside int64, naming the first such id."""
    advice = "map the ids to integers first, e.g. numpy.unique(ids, return_inverse=True)[1]"
    if isinstance(groups, np.ndarray):
        return TypeError(f"groups must hold integer ids; got a NumPy array of dtype {groups.dtype}: {advice}")
    for index, value in enumerate(groups):
        if isinstance(value, (int, np.integer)) and not -(2**63) <= int(value) < 2**63:
            return ValueError(f"groups must hold integer ids in the int64 range; got {value} at index {index}")
        if not isinstance(value, (int, float, np.integer, np.floating)):
            return TypeError(f"groups must hold integer ids; got {value!r} ({type(value).__name__}) at index {index}: "
                             f"{advice}")
    return TypeError(f"groups must be a 1-D tensor, NumPy array or sequence of integer ids; got {type(groups).__name__}")


def _replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """(num_replicas, rank), defaulting to torch.distributed's when it is initialised."""
    initialised = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialised else 1
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    num_replicas = check_int("num_replicas", num_replicas, minimum=1)
    rank = check_int("rank", rank, minimum=0, requirement=f"an integer in [0, num_replicas={num_replicas})")
    if not rank < num_replicas:
        raise ValueError(f"rank must be in [0, num_replicas={num_replicas}); got {rank}")
    return num_replicas, rank


def _pieces(sizes: Tensor, batch_size: int) -> Tensor:
    """Sizes of the pieces of groups of ``sizes``, in order: a group of up to ``batch_size`` items
    is one piece, a larger one ``batch_size``-item pieces and then the rest."""
    counts = (sizes + batch_size - 1) // batch_size
    first_piece = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    piece_of_group = torch.arange(len(first_piece)) - first_piece
    return (torch.repeat_interleave(sizes, counts) - piece_of_group * batch_size).clamp(max=batch_size)


def _next_fit(sizes: Tensor, capacity: int) -> Tensor:
    """Numbers of items of the batches that next-fit packing of pieces of ``sizes`` (each at most
    ``capacity``) makes: a batch takes the following pieces while they fit.

    ``next_start[i]`` is the first piece that does not fit in a batch starting at piece i; the
    batches start at 0, next_start[0], next_start[next_start[0]], ... which binary lifting
    (next_start applied 2^k times, k = 0, 1, ...) finds in O(P log P) tensor operations."""
    ends = torch.cumsum(sizes, 0)
    starts = ends - sizes
    num_pieces = len(sizes)
    jumps = [torch.cat([torch.searchsorted(ends, starts + capacity, right=True), torch.tensor([num_pieces])])]
    # Each batch takes at least one piece, so 2^k batches from piece 0 reach the end once 2^k >= P:
    # at most bit_length(P) doublings. The bound turns a next_start that does not advance into an
    # error instead of a loop that grows the list until memory runs out.
    for _ in range(num_pieces.bit_length()):
        if jumps[-1][0] >= num_pieces:
            break
        jumps.append(jumps[-1].index_select(0, jumps[-1]))
    if jumps[-1][0] < num_pieces:
        raise RuntimeError(f"next-fit packing did not reach the last of {num_pieces} pieces (capacity {capacity}): "
                           "a batch that takes no piece; please report this with the group sizes")
    steps = torch.arange(2 ** (len(jumps) - 1))  # at least the number of batches
    batch_start = torch.zeros_like(steps)
    for k, jump in enumerate(jumps[:-1]):
        batch_start = torch.where(((steps >> k) & 1).bool(), jump.index_select(0, batch_start), batch_start)
    batch_start = batch_start[batch_start < num_pieces]
    item_start = torch.cat([starts.index_select(0, batch_start), ends[-1:]])
    return torch.diff(item_start)
