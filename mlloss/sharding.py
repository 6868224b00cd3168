r"""TorchRec integration: id features through an ``EmbeddingBagCollection``, tables sharded with
``DistributedModelParallel`` under a small Lightning strategy.

Needs the ``torchrec`` extra. On a CPU-only machine plain ``pip install torchrec`` pulls the CUDA
build of fbgemm-gpu, which does not load; install the CPU build first and torchrec without its
dependencies (README, "TorchRec")::

    pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions tqdm
    pip install --no-deps torchrec==1.8.0

Pieces:

* :class:`TorchRecEmbedding` -- one TorchRec table per sparse field; a drop-in replacement of
  :class:`mlloss.towers.FieldEmbedding` (same ``output_dim``, same ``(B, F)`` id input, or a
  ``KeyedJaggedTensor``). Works in a plain single CPU process, with no process group.
* :func:`shard_model` -- wraps a model in ``DistributedModelParallel`` with every table sharded
  the same way (``"table_wise"``, ``"column_wise"`` or ``"data_parallel"``). Sharded tables
  are trained by a sparse optimizer fused into the backward pass (row-wise Adagrad by default;
  the CPU kernels support only the Adagrad family and SGD); the dense parameters, and
  ``"data_parallel"`` (replicated) tables, are wrapped in DDP by DMP itself and trained by the
  optimizer the caller builds over :func:`dense_parameters`.
* :class:`TorchRecStrategy` -- a Lightning DDP strategy that does not wrap the module a second
  time, expects the module to shard itself in ``configure_model`` (``self.model =
  self.trainer.strategy.shard(self.model)``), and saves and restores checkpoints with
  ``torch.distributed.checkpoint``: a checkpoint is a directory with every rank's shards of the
  model and of the fused sparse optimizer's state, plus ``meta.pt``, written by rank 0, with
  the rest of Lightning's checkpoint (loops, epoch, callbacks, and the dense optimizer's
  state, which is replicated), and the completion marker ``COMPLETE``. It is written under a
  temporary name and made visible when complete (:mod:`mlloss.checkpointing`,
  docs/checkpoints.md). Resuming needs the same world size and sharding.

Gradient scale. With equal local batches, a sharded table's rows receive the gradient of the
mean loss over all ranks' batches, as the DDP-averaged dense parameters do: one step of
sharded SGD equals one single-process step on the concatenated batch
(``tests/test_torchrec.py`` checks it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional

import torch
from torch import Tensor, nn

from ._extras import needs_extra

with needs_extra("lightning", "mlloss.sharding"):
    from pytorch_lightning.strategies import DDPStrategy

from .checkpointing import (  # noqa: E402 (after the extra's check)
    begin_directory,
    finish_directory,
    finish_interrupted_publish,
    incomplete_reason,
    remove_checkpoint,
    staging_path,
)

__all__ = [
    "SHARDING_TYPES",
    "SPARSE_OPTIMIZERS",
    "TorchRecEmbedding",
    "ids_to_kjt",
    "shard_model",
    "dense_parameters",
    "TorchRecStrategy",
]

SHARDING_TYPES = ("table_wise", "column_wise", "data_parallel")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam")
_METADATA_FILENAME = "meta.pt"


def _torchrec():
    """Import torchrec, or raise an ImportError that says how to install it."""
    try:
        import torchrec
    except ImportError as error:  # torchrec missing, or its fbgemm-gpu build failing to load
        raise ImportError(
            "mlloss.sharding needs TorchRec: pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions tqdm "
            "&& pip install --no-deps torchrec==1.8.0 (on a CUDA machine install fbgemm-gpu instead of "
            f"fbgemm-gpu-cpu); the import failed with: {error}"
        ) from error
    return torchrec


def ids_to_kjt(ids: Tensor, keys: Sequence[str]):
    """A ``KeyedJaggedTensor`` holding one id per row and key from a (B, F) id matrix whose
    column f belongs to ``keys[f]``."""
    torchrec = _torchrec()
    if ids.dim() != 2 or ids.shape[1] != len(keys):
        raise ValueError(f"ids must have shape (B, {len(keys)}) for keys {list(keys)}, got {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids must be int32 or int64, got {ids.dtype}")
    lengths = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)
    return torchrec.KeyedJaggedTensor(keys=list(keys), values=ids.t().reshape(-1), lengths=lengths)


class TorchRecEmbedding(nn.Module):
    """One sum-pooled TorchRec table of dimension ``dim`` per sparse field.

    ``forward(sparse)`` takes (B, F) ids (column f is field ``field_names[f]``) or a
    ``KeyedJaggedTensor`` keyed by the field names (several ids per row are then sum-pooled), and
    returns the (B, F * dim) concatenation of the field embeddings in ``field_names`` order,
    whatever order a sharded collection returns them in. The weights are initialised
    N(0, 0.05^2) like :class:`mlloss.towers.FieldEmbedding`.

    Args:
        cardinalities: number of ids of each field.
        dim: embedding dimension of every field.
        field_names: the feature keys (default ``f0, f1, ...``); table f is named ``t_<key>``.
        device: where the tables live; ``"meta"`` defers the allocation to
            :func:`shard_model`.
    """

    def __init__(
        self,
        cardinalities: Sequence[int],
        dim: int,
        field_names: Optional[Sequence[str]] = None,
        device: Optional[torch.device | str] = None,
    ) -> None:
        super().__init__()
        torchrec = _torchrec()
        if not cardinalities or any(c < 1 for c in cardinalities):
            raise ValueError(f"cardinalities must be positive, got {list(cardinalities)}")
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        keys = [f"f{i}" for i in range(len(cardinalities))] if field_names is None else [str(k) for k in field_names]
        if len(keys) != len(cardinalities) or len(set(keys)) != len(keys):
            raise ValueError(f"field_names must be {len(cardinalities)} distinct names, got {keys}")
        tables = [
            torchrec.EmbeddingBagConfig(
                name=f"t_{key}", embedding_dim=dim, num_embeddings=int(c), feature_names=[key],
                pooling=torchrec.PoolingType.SUM, init_fn=_normal_init,
            )
            for key, c in zip(keys, cardinalities)
        ]
        self.ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device(device or "cpu"))
        if self.ebc.embedding_bags[tables[0].name].weight.device.type != "meta":
            for config in tables:
                _normal_init(self.ebc.embedding_bags[config.name].weight.data)
        self.keys = keys
        self.output_dim = dim * len(keys)

    def forward(self, sparse) -> Tensor:
        kjt = ids_to_kjt(sparse, self.keys) if isinstance(sparse, Tensor) else sparse
        pooled = self.ebc(kjt)
        if hasattr(pooled, "wait"):  # a sharded collection returns an awaitable
            pooled = pooled.wait()
        if list(pooled.keys()) == self.keys:
            return pooled.values()
        by_key = pooled.to_dict()
        return torch.cat([by_key[key] for key in self.keys], dim=1)


def _normal_init(weight: Tensor) -> Tensor:
    with torch.no_grad():
        return weight.normal_(0.0, 0.05)


def _sparse_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    if name == "rowwise_adagrad":
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        return RowWiseAdagrad
    classes = {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    if name not in classes:
        raise ValueError(f"sparse_optimizer must be one of {SPARSE_OPTIMIZERS}, got {name!r}")
    return classes[name]


def shard_model(
    module: nn.Module,
    sharding: str = "table_wise",
    device: Optional[torch.device] = None,
    sparse_optimizer: str = "rowwise_adagrad",
    sparse_lr: float = 0.05,
    process_group: Optional[Any] = None,
):
    """Wrap ``module`` in TorchRec's ``DistributedModelParallel`` with every
    ``EmbeddingBagCollection`` table sharded as ``sharding``.

    The tables' current weights are copied into the shards (DMP would otherwise re-initialise
    them), so a sharded model starts from the same weights as the unsharded one. Sharded
    tables use the fused kernel with ``sparse_optimizer`` (``"adam"`` only on CUDA) applied in
    the backward pass. ``"data_parallel"`` tables are replicated, all-reduced by DDP and
    trained by the dense optimizer (``sparse_optimizer`` does not apply to them). Column-wise
    shards are ``dim / world_size`` columns wide (at least 4). Needs an initialised process
    group.
    """
    _torchrec()
    import torch.distributed as dist
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    if sharding not in SHARDING_TYPES:
        raise ValueError(f"sharding must be one of {SHARDING_TYPES}, got {sharding!r}")
    if not sparse_lr > 0:
        raise ValueError(f"sparse_lr must be > 0, got {sparse_lr}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("shard_model needs an initialised torch.distributed process group")
    device = torch.device(device or "cpu")
    if sparse_optimizer == "adam" and device.type != "cuda":
        raise ValueError(
            "sparse_optimizer='adam' needs CUDA: fbgemm's CPU kernels support rowwise_adagrad, adagrad and sgd"
        )
    collections = [m for m in module.modules() if isinstance(m, EmbeddingBagCollection)]
    if not collections:
        raise ValueError(f"{type(module).__name__} holds no torchrec EmbeddingBagCollection to shard")
    full_weights = {name: t.detach().clone() for name, t in module.state_dict().items() if t.device.type != "meta"}

    group = process_group or dist.group.WORLD
    world_size = dist.get_world_size(group)
    if sharding == "data_parallel":
        kernel = EmbeddingComputeKernel.DENSE
    else:
        kernel = EmbeddingComputeKernel.FUSED
        table_params = [p for ebc in collections for p in ebc.parameters()]
        _apply_optimizer_in_backward(_sparse_optimizer_class(sparse_optimizer), table_params, {"lr": sparse_lr})
    constraints = {
        config.name: ParameterConstraints(
            sharding_types=[sharding], compute_kernels=[kernel.value],
            min_partition=max(4, config.embedding_dim // world_size) if sharding == "column_wise" else None,
        )
        for ebc in collections
        for config in ebc.embedding_bag_configs()
    }
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    topology = Topology(world_size=world_size, compute_device=device.type, local_world_size=local_world_size)
    sharders = [EmbeddingBagCollectionSharder()]
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(module, sharders, group)
    model = DistributedModelParallel(module, device=device, plan=plan, sharders=sharders)
    _copy_into_shards(model, full_weights)
    return model


def _copy_into_shards(model: nn.Module, full_weights: dict[str, Tensor]) -> None:
    """Copy each full tensor of ``full_weights`` into ``model``'s local shards (or replicas)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for name, target in model.state_dict().items():
            if name not in full_weights:
                continue
            source = full_weights[name]
            if isinstance(target, ShardedTensor):
                for shard in target.local_shards():
                    index = tuple(
                        slice(offset, offset + size)
                        for offset, size in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
                    )
                    shard.tensor.copy_(source[index])
            else:
                target.copy_(source)


def dense_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """The named parameters not trained by a fused (in-backward) sparse optimizer: the ones to
    give the dense optimizer."""
    for name, parameter in model.named_parameters():
        if not hasattr(parameter, "_in_backward_optimizers"):
            yield name, parameter


class TorchRecStrategy(DDPStrategy):
    """Lightning DDP for a module whose embedding tables are sharded by TorchRec.

    Usage, in the LightningModule::

        def configure_model(self):
            if isinstance(self.trainer.strategy, TorchRecStrategy):
                self.model = self.trainer.strategy.shard(self.model)

        def configure_optimizers(self):
            return torch.optim.Adam([p for _, p in dense_parameters(self)], lr=1e-3)

    and ``Trainer(strategy=TorchRecStrategy("table_wise"), devices=2, ...)``. The dense
    parameters are synchronised by the DDP wrapper inside DMP, so this strategy does not wrap
    the module again. Checkpoints are directories written with ``torch.distributed.checkpoint``
    under a temporary name and made visible when complete (see the module docstring); resume with
    ``trainer.fit(..., ckpt_path=mlloss.checkpointing.latest_complete_checkpoint(<folder>))``.

    Args:
        sharding: ``"table_wise"``, ``"column_wise"`` or ``"data_parallel"``.
        sparse_optimizer: the fused optimizer of the tables (see :func:`shard_model`).
        sparse_lr: its learning rate.
        **kwargs: passed to ``DDPStrategy`` (``process_group_backend``, ``timeout``, ...).
    """

    strategy_name = "torchrec"

    def __init__(
        self, sharding: str = "table_wise", sparse_optimizer: str = "rowwise_adagrad", sparse_lr: float = 0.05,
        **kwargs: Any,
    ) -> None:
        _torchrec()
        if sharding not in SHARDING_TYPES:
            raise ValueError(f"sharding must be one of {SHARDING_TYPES}, got {sharding!r}")
        _sparse_optimizer_class(sparse_optimizer)  # validates the name
        super().__init__(**kwargs)
        self.sharding = sharding
        self.sparse_optimizer = sparse_optimizer
        self.sparse_lr = sparse_lr
        self.sharded_model = None

    def shard(self, module: nn.Module):
        """Shard ``module``'s tables (call from ``LightningModule.configure_model``)."""
        self.sharded_model = shard_model(
            module, self.sharding, self.root_device, self.sparse_optimizer, self.sparse_lr
        )
        return self.sharded_model

    def _fused_optimizer(self):
        if self.sharded_model is None:
            raise RuntimeError(
                "TorchRecStrategy: the LightningModule did not shard its model; call "
                "`self.model = self.trainer.strategy.shard(self.model)` in configure_model"
            )
        return self.sharded_model.fused_optimizer

    def configure_ddp(self) -> None:
        self._fused_optimizer()  # DMP already wraps the dense parameters in DDP

    def model_to_device(self) -> None:
        if self.sharded_model is None:
            super().model_to_device()
            return
        # DMP already placed its shards and dense part on the device; move the module's other
        # parts (losses with buffers, metric states) there too.
        for child in self.lightning_module.children():
            if child is not self.sharded_model:
                child.to(self.root_device)

    def setup(self, trainer) -> None:
        from lightning_fabric.utilities.optimizer import _optimizers_to_device
        from pytorch_lightning.trainer.states import TrainerFn

        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self.configure_ddp()
            self.setup_optimizers(trainer)
        # Unlike DDPStrategy, no broadcast of the module states outside fitting: the tables
        # are sharded (ranks hold different tensors) and DMP keeps the replicas in sync.
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    # ---------------------------------------------------------------- checkpoints

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return self.lightning_module.state_dict()  # ShardedTensors for the sharded tables

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        pass  # load_checkpoint loaded it into the shards

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        import torch.distributed.checkpoint as dcp

        if storage_options is not None:
            raise TypeError("TorchRecStrategy.save_checkpoint does not take storage_options")
        path = Path(self.broadcast(str(filepath)))
        staging = staging_path(path)
        if self.is_global_zero:
            begin_directory(path)  # an empty <folder>/.partial/<name>
        self.barrier("TorchRecStrategy.save_checkpoint")
        checkpoint = dict(checkpoint)
        state = {"model": checkpoint.pop("state_dict"), "sparse_optimizer": self._fused_optimizer().state_dict()}
        dcp.save(state, checkpoint_id=staging)  # returns on rank 0 (the coordinator) once every shard is written
        if self.is_global_zero:
            with open(staging / _METADATA_FILENAME, "wb") as stream:
                torch.save(checkpoint, stream)
            # the marker last, then the swap into `path`
            finish_directory(staging, path, epoch=checkpoint.get("epoch"), global_step=checkpoint.get("global_step"),
                             world_size=self.world_size)
        self.barrier("TorchRecStrategy.save_checkpoint: published")

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp

        path = Path(self.broadcast(str(checkpoint_path)))
        if not (path / _METADATA_FILENAME).is_file():
            raise FileNotFoundError(
                f"{path} is not a TorchRecStrategy checkpoint (a directory with {_METADATA_FILENAME} and the shards)"
            )
        reason = incomplete_reason(path)
        if self.is_global_zero and reason is not None:
            print(f"note: {path} is not marked complete ({reason}); loading it as named", flush=True)
        state = {"model": self.lightning_module.state_dict(), "sparse_optimizer": self._fused_optimizer().state_dict()}
        try:
            dcp.load(state, checkpoint_id=path)  # in place, into this rank's shards
            self._load_module_state(state["model"])
            self._fused_optimizer().load_state_dict(state["sparse_optimizer"])
            checkpoint = torch.load(path / _METADATA_FILENAME, weights_only=False)
        except Exception as error:
            if hasattr(error, "add_note"):
                error.add_note(f"while loading the TorchRecStrategy checkpoint {path}")
            raise
        # Every rank has read it: a copy that a crash left at a temporary name takes its visible name.
        self.barrier("TorchRecStrategy.load_checkpoint")
        if self.is_global_zero:
            finish_interrupted_publish(path)
        self.barrier("TorchRecStrategy.load_checkpoint: published")
        return checkpoint

    def _load_module_state(self, state: dict[str, Any]) -> None:
        """Load the LightningModule's state: DMP's part through DMP (its keys carry no wrapper
        prefix), the rest through the module."""
        module, dmp = self.lightning_module, self.sharded_model
        prefix = next(name for name, child in module.named_modules() if child is dmp) + "."
        dmp.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        rest = {k: v for k, v in state.items() if not k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(rest, strict=False)
        missing = [key for key in missing if not key.startswith(prefix)]
        if module.strict_loading and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not match the module: missing {missing}, unexpected {unexpected}")

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            remove_checkpoint(filepath)  # and its temporary and retired copies
