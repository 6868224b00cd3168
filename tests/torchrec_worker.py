"""Worker for tests/test_torchrec.py: one rank of a 2-process gloo job that shards a small model
with mlloss.integrations.torchrec.shard_model and records what the test compares with an
unsharded copy."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from mlloss.integrations.torchrec import TorchRecEmbedding, shard_model

CARDINALITIES = (10, 12, 7)
FIELDS = ("user", "item", "slot")
DIM = 8
BATCH = 16  # per rank
SPARSE_LR = 0.5


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = TorchRecEmbedding(CARDINALITIES, DIM, FIELDS)
        self.head = nn.Linear(len(FIELDS) * DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(ids)).squeeze(1)


def make_model() -> TinyModel:
    torch.manual_seed(0)
    return TinyModel()


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """(2 * BATCH, F) ids and targets; rank r takes rows [r * BATCH, (r + 1) * BATCH)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randint(0, c, (2 * BATCH,), generator=gen) for c in CARDINALITIES], dim=1)
    return ids, torch.randn(2 * BATCH, generator=gen)


def full_tables(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every table's full weight, gathered from this rank's shards of a DMP model (the
    other ranks' parts are zero; the test sums over ranks)."""
    out = {}
    for name, value in model.state_dict().items():
        if "embedding_bags" not in name:
            continue
        if hasattr(value, "local_shards"):
            full = torch.zeros(value.size())
            for shard in value.local_shards():
                index = tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
                full[index] = shard.tensor.detach()
            out[name] = full
        else:  # data-parallel replica: count it once
            out[name] = value.detach().clone() if dist.get_rank() == 0 else torch.zeros_like(value)
    return out


def run(rank: int, world_size: int, port: int, out_dir: str, sharding: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model = shard_model(make_model(), sharding, sparse_optimizer="sgd", sparse_lr=SPARSE_LR)
        ids, target = global_batch()
        local = slice(rank * BATCH, (rank + 1) * BATCH)
        before = full_tables(model)
        scores = model(ids[local])
        loss = nn.functional.mse_loss(scores, target[local])
        loss.backward()  # the fused SGD step runs here
        head_grad = model.module.head.weight.grad.detach().clone() if hasattr(model, "module") else None
        torch.save(
            {"scores": scores.detach(), "before": before, "after": full_tables(model), "head_grad": head_grad,
             "plan": str(model.plan)},
            os.path.join(out_dir, f"{sharding}-rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


def run_in_own_group(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Each rank asks for table-wise shards over a group of its own (``process_group``), then
    over a group of every rank; records the refusal and the second model's scores and rows."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        own = [dist.new_group([member]) for member in range(world_size)]  # every rank creates every group
        everyone = dist.new_group(list(range(world_size)))
        try:
            shard_model(make_model(), "table_wise", sparse_optimizer="sgd", process_group=own[rank])
            refusal = None
        except ValueError as error:
            refusal = str(error)
        model = shard_model(make_model(), "table_wise", sparse_optimizer="sgd", sparse_lr=SPARSE_LR,
                            process_group=everyone)
        ids, _ = global_batch()
        local = slice(rank * BATCH, (rank + 1) * BATCH)
        rows = {name: sum(shard.tensor.shape[0] for shard in value.local_shards())
                for name, value in model.state_dict().items() if hasattr(value, "local_shards")}
        torch.save({"refusal": refusal, "scores": model(ids[local]).detach(), "rows": rows},
                   os.path.join(out_dir, f"own-group-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
