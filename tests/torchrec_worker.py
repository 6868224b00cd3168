"""Worker for tests/test_torchrec.py: one rank of a 2-process
gloo job that shards a small model with mlloss.integrations.torchrec.shard_model (or trains it
under TorchRecStrategy) and records what the test compares with an unsharded copy."""

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


class TinyModelWithExtraState(TinyModel):
    """A module whose state_dict holds a non-tensor entry (``get_extra_state``)."""

    def get_extra_state(self) -> dict:
        return {"version": 1}

    def set_extra_state(self, state: dict) -> None:
        pass


def replica_model(rank: int) -> TinyModel:
    """The replicated model of the edge cases: rank r's values, a strided buffer among them (a
    view ``base[::2]``, which a broadcast must not write as dense bytes), and extra state."""
    model = TinyModelWithExtraState()
    model.register_buffer("every_other", (torch.arange(8.0) + 100 * rank)[::2])
    return model


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


def run_shard_model_cases(rank: int, out_dir: str) -> None:
    """Every ``shard_model`` case of tests/test_torchrec.py in one process group, each saved to a
    file of its own: one step of each sharding type, a process group given by the caller, the
    edge cases and a cross-device ranking loss."""
    from mlloss.integrations.torchrec import SHARDING_TYPES

    dist.init_process_group("gloo")  # the group from the environment (ranks.ForkedRanks)
    world_size = dist.get_world_size()
    try:
        for sharding in SHARDING_TYPES:
            torch.save(_one_step(rank, sharding), os.path.join(out_dir, f"{sharding}-rank{rank}.pt"))
        torch.save(_in_own_group(rank, world_size), os.path.join(out_dir, f"own-group-rank{rank}.pt"))
        torch.save(_edge_cases(rank), os.path.join(out_dir, f"edge-rank{rank}.pt"))
        torch.save(_ranking_loss_steps(rank), os.path.join(out_dir, f"ranking-rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _one_step(rank: int, sharding: str) -> dict:
    """One fused SGD step of ``make_model()`` sharded ``sharding``-wise: the scores, the full
    tables before and after it, the dense head's gradient and the plan."""
    model = shard_model(make_model(), sharding, sparse_optimizer="sgd", sparse_lr=SPARSE_LR)
    ids, target = global_batch()
    local = slice(rank * BATCH, (rank + 1) * BATCH)
    before = full_tables(model)
    scores = model(ids[local])
    loss = nn.functional.mse_loss(scores, target[local])
    loss.backward()  # the fused SGD step runs here
    head_grad = model.module.head.weight.grad.detach().clone() if hasattr(model, "module") else None
    return {"scores": scores.detach(), "before": before, "after": full_tables(model), "head_grad": head_grad,
            "plan": str(model.plan)}


def _in_own_group(rank: int, world_size: int) -> dict:
    """Each rank asks for table-wise shards over a group of its own (``process_group``), then
    over a group of every rank: the refusal and the second model's scores and rows."""
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
    return {"refusal": refusal, "scores": model(ids[local]).detach(), "rows": rows}


# --------------------------------------------------------------------------- edge cases of shard_model


def _outcome(compute):
    """``compute()``, or the text of the error it raised (the ranks fail alike: each scenario's
    collectives run on both or on neither)."""
    try:
        return compute()
    except Exception as error:  # recorded for the test to read
        return f"{type(error).__name__}: {error}"


def keyed_ids(keys, ids: torch.Tensor):
    """A KeyedJaggedTensor with keys ``keys`` (a permutation of FIELDS, maybe with more keys),
    one id per row: FIELDS[f]'s ids are column f of ``ids``, other keys get id 0."""
    import torchrec

    columns = [ids[:, FIELDS.index(key)] if key in FIELDS else torch.zeros_like(ids[:, 0]) for key in keys]
    return torchrec.KeyedJaggedTensor(keys=list(keys), values=torch.cat(columns),
                                      lengths=torch.ones(len(keys) * len(ids), dtype=torch.int32))


def weighted_keyed_ids(ids: torch.Tensor):
    """:func:`keyed_ids` in FIELDS order with a weight of 2 + row on every id."""
    import torchrec

    unweighted = keyed_ids(FIELDS, ids)
    weights = (2.0 + torch.arange(len(ids), dtype=torch.float32)).repeat(len(FIELDS))
    return torchrec.KeyedJaggedTensor(keys=unweighted.keys(), values=unweighted.values(),
                                      lengths=unweighted.lengths(), weights=weights)


KEY_ORDERS = {  # the first call fixes a sharded collection's feature order
    "swapped first": ("slot", "user", "item"),
    "in order": FIELDS,
    "swapped again": ("item", "slot", "user"),
    "extra key": ("extra", "item", "user", "slot"),
}


def _edge_cases(rank: int) -> dict:
    """On each rank: a table-wise sharded embedding fed KeyedJaggedTensors in other
    key orders, one with an id outside its table and one with weights; the replicas of a model
    built with a seed of each rank's own; 12-column tables cut column-wise over 2 ranks; a table
    of 6 columns, table-wise (refused) and data-parallel; and a sharding that fails after the
    fused optimizers were attached."""
    ids, _ = global_batch()
    local = ids[rank * BATCH: (rank + 1) * BATCH]
    result = {}

    embedding = shard_model(make_model().embedding, "table_wise", sparse_optimizer="sgd")
    result["orders"] = {name: _outcome(lambda: embedding(keyed_ids(keys, local)).detach())
                        for name, keys in KEY_ORDERS.items()}
    result["orders"]["missing key"] = _outcome(lambda: embedding(keyed_ids(("user", "slot"), local)))
    outside = local.clone()
    outside[0, FIELDS.index("slot")] = CARDINALITIES[FIELDS.index("slot")]  # one past the table's last row
    result["id_outside_its_table"] = _outcome(lambda: embedding(keyed_ids(FIELDS, outside)).detach())
    result["weighted"] = _outcome(lambda: embedding(weighted_keyed_ids(local)).detach())

    torch.manual_seed(rank)  # an unseeded script: each rank initialises its own way
    replicated = shard_model(replica_model(rank), "data_parallel")
    result["replicas"] = {name: value.detach().clone() for name, value in replicated.state_dict().items()
                          if isinstance(value, torch.Tensor)}

    torch.manual_seed(0)
    wide = shard_model(TorchRecEmbedding(CARDINALITIES, 12, FIELDS), "column_wise", sparse_optimizer="sgd")
    result["column_wise_12"] = {"scores": wide(local).detach(), "shards": {
        name: [(list(s.metadata.shard_offsets), list(s.metadata.shard_sizes)) for s in value.local_shards()]
        for name, value in wide.state_dict().items() if hasattr(value, "local_shards")}}

    torch.manual_seed(0)
    result["dim_6_table_wise"] = _outcome(lambda: shard_model(TorchRecEmbedding((5, 4), 6, ("a", "b")), "table_wise"))
    torch.manual_seed(0)
    narrow = shard_model(TorchRecEmbedding((5, 4), 6, ("a", "b")), "data_parallel")
    result["dim_6_data_parallel"] = narrow(torch.tensor([[1, 2], [4, 3]])).detach()

    result["failed_sharding"] = _fail_while_sharding()
    return result


def _fail_while_sharding() -> dict:
    """shard_model with a DistributedModelParallel that fails: what the caller's tables keep."""
    from torchrec.distributed import model_parallel

    def fail(*args, **kwargs):
        raise RuntimeError("DMP failed")

    module = make_model()
    built = model_parallel.DistributedModelParallel
    model_parallel.DistributedModelParallel = fail
    try:
        error = _outcome(lambda: shard_model(module, "table_wise", sparse_optimizer="sgd", sparse_lr=1.0))
    finally:
        model_parallel.DistributedModelParallel = built
    table = module.embedding.ebc.embedding_bags["t_user"].weight
    before = table.detach().clone()
    module(torch.tensor([[1, 2, 3]])).sum().backward()  # no optimizer step
    return {"error": error, "table_changed": not torch.equal(table.detach(), before),
            "fused": [n for n, p in module.named_parameters() if hasattr(p, "_in_backward_optimizers")]}


# --------------------------------------------------------------------------- TorchRecStrategy


def _sharded_lightning_module() -> type:
    """A LightningModule class of ``make_model()``, sharded by TorchRecStrategy in ``configure_model``,
    its dense parameters trained by SGD on the mean squared error (Lightning imported when asked for)."""
    import pytorch_lightning as pl

    from mlloss.integrations.torchrec import dense_parameters

    class ShardedModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = make_model()

        def configure_model(self) -> None:
            if self.trainer.strategy.sharded_model is None:
                self.model = self.trainer.strategy.shard(self.model)

        def configure_optimizers(self):
            return torch.optim.SGD([p for _, p in dense_parameters(self)], lr=SPARSE_LR)

        def training_step(self, batch, batch_index):
            ids, target = batch
            return nn.functional.mse_loss(self.model(ids), target)

    return ShardedModule


def run_strategy_cases(rank: int, ports: tuple[int, ...], out_dir: str) -> None:
    """The TorchRecStrategy cases in one job, each on a process group of its own that Lightning
    sets up (from the environment ranks.ForkedRanks gives) and this worker destroys; the groups
    after the first on ports of their own."""
    world_size = int(os.environ["WORLD_SIZE"])
    run_strategy_with_a_parameter_outside(rank, world_size, out_dir)
    os.environ["MASTER_PORT"] = str(ports[0])
    run_strategy_checkpoint_failures(rank, world_size, out_dir)
    run_strategy_resume(rank, world_size, out_dir, ports[1:])


def run_strategy_resume(rank: int, world_size: int, out_dir: str, ports: tuple[int, ...]) -> None:
    """Four Lightning steps under TorchRecStrategy (fused SGD, which keeps no optimizer state) of a
    module whose learnable ``scale`` and unsized balanced ``LoALoss`` are registered before the
    sharded model: uninterrupted, and as two steps, a checkpoint and two more steps resumed from it.
    Records each run's final state (the tables gathered from this rank's shards)."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from mlloss import LoALoss
    from mlloss.integrations.torchrec_strategy import TorchRecStrategy

    class Resumable(_sharded_lightning_module()):
        def __init__(self) -> None:
            pl.LightningModule.__init__(self)  # these before the model: DMP's state_dict renamed them
            self.scale = nn.Parameter(torch.ones(()))
            self.loa = LoALoss("balanced", cross_device=True)  # its counts take their size from the checkpoint
            self.model = make_model()

        def training_step(self, batch, batch_index):
            ids, target = batch
            scores = self.model(ids) * self.scale
            labels = torch.stack([target > 0, target > 1], 1).long()
            return self.loa(scores, labels) + nn.functional.mse_loss(scores, target)

    ids, target = global_batch()
    checkpoint = os.path.join(out_dir, "resume.ckpt")
    results = {}
    for port, (run, steps, resume) in zip(ports, (("whole", 4, None), ("first", 2, None), ("resumed", 4, checkpoint))):
        os.environ["MASTER_PORT"] = str(port)  # a process group of its own per run (ranks could meet the last one's store)
        trainer = pl.Trainer(
            accelerator="cpu", devices=world_size, max_steps=steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
            strategy=TorchRecStrategy("table_wise", sparse_optimizer="sgd", sparse_lr=SPARSE_LR),
        )
        module = Resumable()
        try:
            trainer.fit(module, DataLoader(TensorDataset(ids, target), batch_size=BATCH), ckpt_path=resume)
            if run == "first":
                trainer.save_checkpoint(checkpoint)
            results[run] = {"tables": full_tables(module.model), "head": module.model.state_dict()["head.weight"].detach().clone(),
                            "scale": module.scale.detach().clone(), "seen": module.loa.seen_positives.clone(),
                            "items": module.loa.seen_items.clone(), "step": trainer.global_step}
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    torch.save(results, os.path.join(out_dir, f"resume-rank{rank}.pt"))


def run_strategy_with_a_parameter_outside(rank: int, world_size: int, out_dir: str) -> None:
    """Two Lightning training steps with TorchRecStrategy of a module whose learnable ``scale``
    lies outside the sharded model and starts at a value of each rank's own; records its
    gradient at each step and its final value. Lightning sets up the process group."""
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from mlloss.integrations.torchrec_strategy import TorchRecStrategy

    class ScaledModel(_sharded_lightning_module()):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.full((), 1.0 + rank))  # rank 0's value is 1
            self.scale_grads: list[torch.Tensor] = []

        def training_step(self, batch, batch_index):
            ids, target = batch
            return nn.functional.mse_loss(self.model(ids) * self.scale, target)

        def on_before_optimizer_step(self, optimizer) -> None:
            self.scale_grads.append(self.scale.grad.detach().clone())

    module = ScaledModel()
    ids, target = global_batch()  # the distributed sampler gives rank r the rows r, r + 2, ...
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        strategy=TorchRecStrategy("table_wise", sparse_optimizer="sgd", sparse_lr=SPARSE_LR),
    )
    try:
        trainer.fit(module, DataLoader(TensorDataset(ids, target), batch_size=BATCH))
        torch.save({"scale_grads": module.scale_grads, "scale": module.scale.detach().clone()},
                   os.path.join(out_dir, f"strategy-rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_strategy_checkpoint_failures(rank: int, world_size: int, out_dir: str) -> None:
    """One Lightning step under TorchRecStrategy, then checkpoint writes whose rank-0 part fails (a
    full disk while starting the directory, then while finishing it), then one that succeeds:
    records each rank's outcome. Every rank must raise, not wait for rank 0 in a barrier (the
    60-second timeout stands in for the default 30 minutes)."""
    import datetime
    import errno

    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    from mlloss.integrations import torchrec_strategy

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device (injected)")

    ids, target = global_batch()
    trainer = pl.Trainer(
        accelerator="cpu", devices=world_size, max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        strategy=torchrec_strategy.TorchRecStrategy("table_wise", sparse_optimizer="sgd", sparse_lr=SPARSE_LR,
                                                    timeout=datetime.timedelta(seconds=60)),
    )
    outcomes = {}
    try:
        trainer.fit(_sharded_lightning_module()(), DataLoader(TensorDataset(ids, target), batch_size=BATCH))
        for step in ("begin_directory", "finish_directory", None):
            original = getattr(torchrec_strategy, step) if step else None
            if step and rank == 0:
                setattr(torchrec_strategy, step, full_disk)
            try:
                trainer.save_checkpoint(os.path.join(out_dir, f"{step}.ckpt"))
                outcomes[step] = None
            except Exception as error:
                outcomes[step] = f"{type(error).__name__}: {error}"
            finally:
                if step:
                    setattr(torchrec_strategy, step, original)
        torch.save(outcomes, os.path.join(out_dir, f"checkpoint-failures-rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# --------------------------------------------------------------------------- a cross-device ranking loss


RANKING_ROWS = (20, 12)  # rank r's rows of global_batch(): uneven local batches


def ranking_model() -> nn.Module:
    """TorchRec tables under an MMoE of two tasks (mlloss.models), seeded."""
    from mlloss.models import MMoE, MultiTaskModel

    torch.manual_seed(0)
    embedding = TorchRecEmbedding(CARDINALITIES, DIM, FIELDS)
    return MultiTaskModel(embedding, MMoE(embedding.output_dim, 2, num_experts=3, expert_hidden=(8,), tower_hidden=(4,)))


def ranking_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ids of global_batch(), two label columns and user ids (users span both ranks)."""
    ids, _ = global_batch()
    gen = torch.Generator().manual_seed(4)
    labels = (torch.rand(len(ids), 2, generator=gen) < 0.4).float()
    return ids, labels, torch.randint(0, 4, (len(ids),), generator=gen)


def _ranking_loss_steps(rank: int) -> dict:
    """For table-wise and column-wise shards: one step of ``LaALoss(cross_device=True)`` on the
    first logit of a sharded :func:`ranking_model`, the tables trained by fused SGD: the loss, the
    tables after the step and the dense gradients."""
    from mlloss import LaALoss

    ids, labels, groups = ranking_batch()
    start = sum(RANKING_ROWS[:rank])
    local = slice(start, start + RANKING_ROWS[rank])
    result = {}
    for sharding in ("table_wise", "column_wise"):
        model = shard_model(ranking_model(), sharding, sparse_optimizer="sgd", sparse_lr=SPARSE_LR)
        loss = LaALoss(cross_device=True)(model(ids[local])[:, 0], labels[local], groups[local])
        loss.backward()
        gradients = {name.removeprefix("module."): p.grad.detach().clone() for name, p in model.named_parameters()
                     if "embedding_bags" not in name}
        result[sharding] = {"loss": loss.detach(), "after": full_tables(model), "gradients": gradients}
    return result
