"""Worker for tests/test_distributed.py: one rank of the file's 2-process gloo job (forked
from the test's process: ``ranks.ForkedRanks``). ``run`` runs every case in one process group,
each case saving its results to a file of its own (``{case}-rank{rank}.pt``)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import mlloss

LOSSES = {
    "auc": lambda **kw: mlloss.AUCLoss(**kw),
    "auc-exponential": lambda **kw: mlloss.AUCLoss(surrogate="exponential", **kw),
    "loa": lambda **kw: mlloss.LoALoss([1.0, 0.5], **kw),
    "balanced-loa": lambda **kw: mlloss.LoALoss("balanced", **kw),
    "laa": lambda **kw: mlloss.LaALoss(**kw),
    "laa-hardest": lambda **kw: mlloss.LaALoss(pairs="hardest", **kw),
    "pdaom": lambda **kw: mlloss.PDAOMLoss(**kw),
}
SPLITS = ((37, 23), (60, 0))  # uneven local batches, and a rank with no items at all


def global_batch():
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(60, 4, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 2, (60, 2), generator=gen).to(torch.float64)
    groups = torch.randint(0, 7, (60,), generator=gen)  # users whose items sit on both ranks
    return features, labels, groups


def global_mask() -> torch.Tensor:
    """Items a fixed-size batch would keep (the others filler rows): about two in three."""
    return torch.rand(60, generator=torch.Generator().manual_seed(2)) < 0.65


MASKED = ("auc", "laa", "pdaom")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def labels_for(name: str, labels: torch.Tensor) -> torch.Tensor:
    return labels[:, 0] if name in ("auc", "auc-exponential", "pdaom") else labels


def loss_and_grads(model, name, features, labels, groups, mask=None, **options):
    masked = {} if mask is None else {"mask": mask}
    loss = LOSSES[name](**options)(model(features)[:, 0], labels_for(name, labels), groups, **masked)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def loa_label_losses(model, features, labels, groups, **options) -> torch.Tensor:
    """LoA's per-label terms L_k (``parts["label_loss/k"]``) of one call."""
    loss = LOSSES["loa"](**options)
    loss(model(features)[:, 0], labels, groups)
    return torch.stack([loss.parts[f"label_loss/{k}"] for k in range(labels.shape[1])])


def bce_pdaom_loss_and_grads(model, features, labels, groups, **options):
    loss = mlloss.build_loss("bce+pdaom", lam=3.0, **options)(model(features)[:, 0], labels[:, 0], groups)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def cross_device_cases(rank: int, world: int) -> dict:
    """Every loss across the ranks under DDP, at each split of the batch."""
    features, labels, groups = global_batch()
    results = {}
    for split in SPLITS:
        begin = sum(split[:rank])
        local = slice(begin, begin + split[rank])
        for name in LOSSES:
            model = make_model()
            ddp = DistributedDataParallel(model)
            results[split, name] = loss_and_grads(
                ddp, name, features[local], labels[local], groups[local], cross_device=True
            )
        for name in MASKED:  # each rank's own mask, gathered with the batch; with and without groups
            for grouped in (True, False):
                ddp = DistributedDataParallel(make_model())
                results[split, name, "masked", grouped] = loss_and_grads(
                    ddp, name, features[local], labels[local], groups[local] if grouped else None,
                    global_mask()[local], cross_device=True,
                )
        results[split, "loa-parts"] = loa_label_losses(
            make_model(), features[local], labels[local], groups[local], cross_device=True
        )
        # the a_k of a balanced LoA: from the gathered labels, as forward takes them
        results[split, "mixing-weights"] = mlloss.LoALoss("balanced", cross_device=True).mixing_weights(labels[local])
    # BCE + PDAOM (Eq. 7 over N): the BCE is a per-rank mean, so ranks hold equal halves.
    half = features.shape[0] // world
    local = slice(rank * half, (rank + 1) * half)
    ddp = DistributedDataParallel(make_model())
    results["bce+pdaom"] = bce_pdaom_loss_and_grads(
        ddp, features[local], labels[local], groups[local], cross_device=True
    )
    return results


def metrics_cases(rank: int, world: int) -> dict:
    """The streaming metrics when rank 1 saw no batch at all: every rank computes them on rank 0's."""
    from mlloss.metrics import AUC, GroupAUC, MultiLabelAUC, MultipartiteAUC

    features, labels, groups = global_batch()
    scores = features[:, 0].float()
    metrics = {"auc": (AUC(), (scores, labels[:, 0])), "gauc": (GroupAUC(), (scores, labels[:, 0], groups)),
               "multilabel": (MultiLabelAUC(2), (scores, labels)),
               "multipartite": (MultipartiteAUC(grouped=True), (scores, labels, groups))}
    results = {}
    for name, (metric, batch) in metrics.items():
        if rank == 0:
            metric.update(*batch)
        results[name] = metric.compute()
    return results


def dtype_cases(rank: int, world: int) -> dict:
    """int16 labels across ranks (the backends gather none: they are widened), group ids of
    another dtype on each rank (int32 on rank 0, int64 on rank 1: gathered as int64), and ranks
    whose labels differ in dtype (refused by name before the gather)."""
    features, labels, groups = global_batch()
    local = slice(0, 37) if rank == 0 else slice(37, 60)
    scores = features[local, 0]
    results = {"int16": mlloss.AUCLoss(cross_device=True)(scores, labels[local, 0].to(torch.int16), groups[local])}
    ids = groups[local].to(torch.int32) if rank == 0 else groups[local]
    results["mixed ids"] = mlloss.AUCLoss(cross_device=True)(scores, labels[local, 0], ids)
    mixed = labels[local, 0].bool() if rank == 0 else labels[local, 0]
    try:
        mlloss.AUCLoss(cross_device=True)(scores, mixed, groups[local])
        results["mixed"] = None
    except ValueError as error:
        results["mixed"] = str(error)
    poisoned = scores.clone()
    if rank == 1:
        poisoned[2] = float("nan")  # position 37 + 2 of the gathered batch
    try:
        mlloss.AUCLoss(cross_device=True)(poisoned, labels[local, 0], groups[local])
        results["nan"] = None
    except ValueError as error:
        results["nan"] = str(error)
    # ranks that disagree on the batch's form, each refused by name before the gather
    everything = torch.ones(len(scores), dtype=torch.bool)
    disagreements = {
        "mask": lambda: mlloss.AUCLoss(cross_device=True)(scores, labels[local, 0], groups[local],
                                                          mask=everything if rank == 0 else None),
        "groups": lambda: mlloss.AUCLoss(cross_device=True)(scores, labels[local, 0], groups[local] if rank == 0 else None),
        "columns": lambda: mlloss.LaALoss(cross_device=True)(scores, labels[local] if rank == 0 else labels[local, :1],
                                                             groups[local]),
    }
    for name, call in disagreements.items():
        try:
            call()
            results[name] = None
        except ValueError as error:
            results[name] = str(error)
    return results


def error_cases(rank: int, world: int) -> dict:
    """A batch that only rank 1 gets wrong (labels of the wrong length; (N, 2) scores), a share of the pairs that
    only its owner finds not finite (rank 0's user 0), a bce+auc batch in whose scores only rank 1
    has infinities, then a good batch: which error each rank raised, and the good batch's loss.
    (A rank left waiting times out and fails the test.)"""
    scores, labels, groups = error_batch(rank)
    results = {}
    calls = {
        "refused": lambda: mlloss.AUCLoss(cross_device=True)(scores, labels if rank == 0 else labels[:1], groups),
        # (N, 2) scores on rank 1 (task columns, which cross_device refuses): refused before the checks of the batch
        "columns": lambda: mlloss.PDAOMLoss(cross_device=True)(*((scores, labels) if rank == 0 else
                                                                 (torch.stack([scores, scores], 1), torch.stack([labels, labels], 1))),
                                                               groups),
        # users 0 and 1 are equal work: rank 0 computes user 0's pairs, rank 1 user 1's
        "overflow": lambda: mlloss.AUCLoss(cross_device=True)(scores * (1e308 if rank == 0 else 1.0), labels, groups),
        # the cross-entropy, a per-rank term, refuses rank 1's infinities before the ranking term's gather
        "bce": lambda: mlloss.build_loss("bce+auc", cross_device=True)(scores / (1 - rank), labels, groups),
        "good": lambda: mlloss.AUCLoss(cross_device=True)(scores, labels, groups),
    }
    for name, call in calls.items():
        try:
            results[name] = call()
        except Exception as error:  # the test reads which kind each rank raised
            results[name] = f"{type(error).__name__}: {error}"
    return results


def error_batch(rank: int):
    """Rank r's (scores, labels, groups): user r's two items, one positive and one negative."""
    scores = torch.tensor([-1.0, 1.0], dtype=torch.float64) * (rank + 1)
    return scores, torch.tensor([1.0, 0.0]), torch.full((2,), rank)


def run(rank: int, out_dir: str) -> None:
    """Every case of tests/test_distributed.py on one process group; the error cases run last
    (every rank raises and the job goes on, so nothing after them depends on it). A collective
    waits at most 60 s: a rank left waiting fails the test instead of hanging it for 30 minutes."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # the group from the environment
    world = dist.get_world_size()
    try:
        cases = {"losses": cross_device_cases, "metrics": metrics_cases, "dtype": dtype_cases, "errors": error_cases}
        for case, compute in cases.items():
            torch.save(compute(rank, world), os.path.join(out_dir, f"{case}-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
