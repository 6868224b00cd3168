r"""TorchRec integration: id features through an ``EmbeddingBagCollection``, its tables sharded
with ``DistributedModelParallel``. No Lightning: the Lightning strategy that shards a
LightningModule's tables and writes their checkpoints is the sibling ``torchrec_strategy.py``.

Needs TorchRec, imported on first use (importing this module imports neither torchrec nor
fbgemm-gpu). On a CPU-only machine plain ``pip install torchrec`` pulls the CUDA build of
fbgemm-gpu, which does not load; install the CPU build first and torchrec without its
dependencies (docs/install.md, docs/torchrec.md)::

    pip install fbgemm-gpu-cpu==1.8.0 tensordict pyre-extensions tqdm
    pip install --no-deps torchrec==1.8.0

Pieces:

* :class:`TorchRecEmbedding` -- one TorchRec table per sparse field; a drop-in replacement of
  :class:`mlloss.models.FieldEmbedding` (same ``output_dim``, same ``(B, F)`` id input, or a
  ``KeyedJaggedTensor``). Works in a plain single CPU process, with no process group.
* :func:`ids_to_kjt` -- a (B, F) id matrix as a ``KeyedJaggedTensor``.
* :func:`shard_model` -- wraps a model in ``DistributedModelParallel`` with every table sharded
  the same way (``"table_wise"``, ``"column_wise"`` or ``"data_parallel"``). Sharded tables
  are trained by a sparse optimizer fused into the backward pass (row-wise Adagrad by default;
  the CPU kernels support only the Adagrad family and SGD); the dense parameters, and
  ``"data_parallel"`` (replicated) tables, are wrapped in DDP by DMP itself and trained by the
  optimizer the caller builds over :func:`dense_parameters`.

Gradient scale. With equal local batches, a sharded table's rows receive the gradient of the
mean loss over all ranks' batches, as the DDP-averaged dense parameters do: one step of
sharded SGD equals one single-process step on the concatenated batch
(``tests/test_torchrec.py`` checks it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch
from torch import Tensor, nn

from .._validation import check_cardinalities, check_choice, check_field_ids, check_finite_number, check_sizes

__all__ = [
    "SHARDING_TYPES",
    "SPARSE_OPTIMIZERS",
    "TorchRecEmbedding",
    "ids_to_kjt",
    "shard_model",
    "dense_parameters",
]

SHARDING_TYPES = ("table_wise", "column_wise", "data_parallel")
SPARSE_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd", "adam")


def import_torchrec():
    """Import torchrec, or raise an ImportError that says how to install it."""
    try:
        import torchrec
    except ImportError as error:  # torchrec missing, or its fbgemm-gpu build failing to load
        raise ImportError(
            "mlloss.integrations.torchrec needs TorchRec: pip install fbgemm-gpu-cpu==1.8.0 tensordict "
            "pyre-extensions tqdm && pip install --no-deps torchrec==1.8.0 (on a CUDA machine install "
            f"fbgemm-gpu instead of fbgemm-gpu-cpu); the import failed with: {error}"
        ) from error
    return torchrec


def ids_to_kjt(ids: Tensor, keys: Sequence[str]):
    """A ``KeyedJaggedTensor`` holding one id per row and key from a (B, F) id matrix whose
    column f belongs to ``keys[f]``."""
    torchrec = import_torchrec()
    if ids.dim() != 2 or ids.shape[1] != len(keys):
        raise ValueError(f"ids must have shape (B, {len(keys)}) for keys {list(keys)}; got {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"ids must be int32 or int64; got {ids.dtype}")
    lengths = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)
    return torchrec.KeyedJaggedTensor(keys=list(keys), values=ids.t().reshape(-1), lengths=lengths)


class TorchRecEmbedding(nn.Module):
    """One sum-pooled TorchRec table of dimension ``dim`` per sparse field.

    ``forward(sparse)`` takes (B, F) ids (column f is field ``field_names[f]``) or a
    ``KeyedJaggedTensor`` holding (at least) the field names as keys, in any order (several ids
    per row are then sum-pooled; other keys are ignored), and returns the (B, F * dim)
    concatenation of the field embeddings in ``field_names`` order, whatever order a sharded
    collection returns them in. The weights are initialised N(0, 0.05^2) like
    :class:`mlloss.models.FieldEmbedding`. On the CPU an id outside its table is a ValueError
    naming its field, for both inputs; a weighted ``KeyedJaggedTensor`` is a ValueError (the
    tables sum-pool unweighted ids).

    The output has the tables' dtype, as FieldEmbedding's does (``.double()`` gives float64),
    but TorchRec pools in float32 whatever the tables' dtype: the values carry float32
    precision. Sharded tables are float32.

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
        torchrec = import_torchrec()
        cardinalities = check_cardinalities(cardinalities)
        check_sizes(dim=dim)
        keys = [f"f{i}" for i in range(len(cardinalities))] if field_names is None else [str(k) for k in field_names]
        if len(keys) != len(cardinalities) or len(set(keys)) != len(keys):
            raise ValueError(f"field_names must be {len(cardinalities)} distinct names; got {keys}")
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
        self.cardinalities = tuple(int(c) for c in cardinalities)
        self.output_dim = dim * len(keys)

    def forward(self, sparse) -> Tensor:
        if isinstance(sparse, Tensor):
            kjt = ids_to_kjt(sparse, self.keys)
            if not (sparse.is_cuda or torch.compiler.is_compiling()):  # FieldEmbedding's check on the CPU
                check_field_ids(sparse, self.cardinalities, "ids", self.keys)
        else:
            kjt = self._in_key_order(sparse)
            if kjt.weights_or_none() is not None:
                # The unsharded collection ignores the weights and a sharded one does not:
                # the same batch would give two models.
                raise ValueError(
                    "sparse is a weighted KeyedJaggedTensor, but TorchRecEmbedding's tables sum-pool "
                    "unweighted ids; pass the KeyedJaggedTensor without weights"
                )
            if not (kjt.values().is_cuda or torch.compiler.is_compiling()):
                self._check_keyed_ids(kjt)
        if kjt.stride() == 0:
            # A KeyedJaggedTensor of zero rows breaks TorchRec's unsharded collection (the short
            # rank's empty batch under DDP): embed one row of id 0 and keep none of it. The
            # (0, F * dim) output still depends on the tables, with a zero gradient, as
            # FieldEmbedding's does, so DDP sees every parameter used on every rank.
            one_row = torch.zeros(1, len(self.keys), dtype=torch.int64, device=kjt.values().device)
            return self.forward(one_row)[:0]
        pooled = self.ebc(kjt)
        if hasattr(pooled, "wait"):  # a sharded collection returns an awaitable
            pooled = pooled.wait()
        if list(pooled.keys()) == self.keys:
            embeddings = pooled.values()
        else:
            by_key = pooled.to_dict()
            embeddings = torch.cat([by_key[key] for key in self.keys], dim=1)
        return embeddings.to(self._table_dtype())  # TorchRec's collection returns float32

    def _in_key_order(self, kjt):
        """``kjt`` with exactly ``self.keys``, in that order. A sharded collection fixes the order
        of the features on its first call and reads every later batch in that order, whatever
        its keys say: a batch in another order would get the wrong tables' embeddings."""
        torchrec = import_torchrec()
        if not isinstance(kjt, torchrec.KeyedJaggedTensor):
            raise TypeError(f"sparse must be a (B, F) id tensor or a KeyedJaggedTensor; got {type(kjt).__name__}")
        keys = list(kjt.keys())
        if keys == self.keys:
            return kjt
        missing = [key for key in self.keys if key not in keys]
        if missing:
            raise ValueError(
                f"the KeyedJaggedTensor must hold the keys {self.keys} (the field names); "
                f"{missing} missing from its keys {keys}"
            )
        position = {key: index for index, key in enumerate(keys)}
        order = [position[key] for key in self.keys]
        permuted = kjt.permute(order)
        inverse = kjt.inverse_indices_or_none()
        if inverse is None:
            return permuted
        # a variable-batch KJT: ``permute`` drops its inverse indices (one row per key), which
        # map each key's ids back to the batch's rows; they follow the keys here
        inverse_keys, inverse_rows = inverse
        rows_by_key = dict(zip(inverse_keys, inverse_rows))
        return torchrec.KeyedJaggedTensor(
            keys=permuted.keys(), values=permuted.values(), weights=permuted.weights_or_none(),
            lengths=permuted.lengths(), stride_per_key_per_rank=permuted.stride_per_key_per_rank(),
            inverse_indices=(permuted.keys(), torch.stack([rows_by_key[key] for key in self.keys])),
        )

    def _check_keyed_ids(self, kjt) -> None:
        """FieldEmbedding's check of the ids, key by key, for a CPU ``kjt`` in field order (it
        reads the host): an id outside its table is an error naming the key. TorchRec's own
        error named no key, and a table-wise sharded table on the CPU embedded such an id
        without any error."""
        values, offsets = kjt.values(), kjt.offset_per_key()
        for key, cardinality, start, end in zip(self.keys, self.cardinalities, offsets[:-1], offsets[1:]):
            if end == start:
                continue
            low, high = values[start:end].aminmax()
            if low < 0 or high >= cardinality:
                raise ValueError(
                    f"the KeyedJaggedTensor's ids of key {key!r} must be in [0, {cardinality}); "
                    f"got {int(low) if low < 0 else int(high)}"
                )

    def _table_dtype(self) -> torch.dtype:
        weight = next(self.ebc.parameters(), None)
        return torch.float32 if weight is None else weight.dtype


def _normal_init(weight: Tensor) -> Tensor:
    with torch.no_grad():
        return weight.normal_(0.0, 0.05)


def sparse_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The optimizer class of the fused sparse optimizer ``name`` (one of SPARSE_OPTIMIZERS)."""
    check_choice("sparse_optimizer", name, SPARSE_OPTIMIZERS)
    if name == "rowwise_adagrad":
        from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

        return RowWiseAdagrad
    return {"adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD, "adam": torch.optim.Adam}[name]


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
    them), so a sharded model starts from the same weights as the unsharded one: each rank cuts
    its shards out of its own copy of the tables (build them with the same seed on every rank),
    and the replicated tensors (the dense part, ``"data_parallel"`` tables) are rank 0's, as
    DDP makes them. Sharded tables use the fused kernel with ``sparse_optimizer`` (``"adam"``
    only on CUDA) applied in the backward pass; fbgemm's fused kernels need embedding dims that
    are multiples of 4. ``"data_parallel"`` tables are replicated, all-reduced by DDP and
    trained by the dense optimizer (``sparse_optimizer`` does not apply to them; any dim).
    Column-wise shards are as wide as the widest multiple of 4 that cuts a table into at least
    ``world_size`` equal shards (``dim / world_size`` when that is a multiple of 4). Needs an
    initialised process group; ``process_group`` (default the job's) is the group the shards
    and DDP's replicas use: a group of every rank (e.g. one with another backend), since
    TorchRec places shards by global rank. The arguments and the tables' dims are checked
    before anything is attached to ``module``, and a failure while sharding detaches the fused
    optimizers again: the caller's module is left as it was.
    """
    import_torchrec()
    import torch.distributed as dist
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    check_choice("sharding", sharding, SHARDING_TYPES)
    optimizer_class = sparse_optimizer_class(sparse_optimizer)  # checked even where it does not apply
    check_finite_number("sparse_lr", sparse_lr, above=0)
    device = torch.device(device or "cpu")
    if sparse_optimizer == "adam" and device.type != "cuda":
        raise ValueError(
            "sparse_optimizer='adam' needs CUDA: fbgemm's CPU kernels support rowwise_adagrad, adagrad and sgd"
        )
    collections = [m for m in module.modules() if isinstance(m, EmbeddingBagCollection)]
    if not collections:
        raise ValueError(f"{type(module).__name__} holds no torchrec EmbeddingBagCollection to shard")
    configs = [config for ebc in collections for config in ebc.embedding_bag_configs()]
    _check_dims(configs, sharding)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("shard_model needs an initialised torch.distributed process group")
    group = process_group or dist.group.WORLD
    world_size = dist.get_world_size(group)
    if world_size != dist.get_world_size():
        raise ValueError(
            f"process_group must hold every rank of the job ({dist.get_world_size()}); got a group of "
            f"{world_size}: TorchRec places the shards by global rank, so tables cannot be sharded over a "
            f"subset of the ranks"
        )
    full_weights = {
        name: t.detach().clone() for name, t in module.state_dict().items()
        if isinstance(t, Tensor) and t.device.type != "meta"  # not a module's get_extra_state()
    }

    table_params = [p for ebc in collections for p in ebc.parameters()]
    if sharding == "data_parallel":
        kernel = EmbeddingComputeKernel.DENSE
    else:
        kernel = EmbeddingComputeKernel.FUSED
        # Only the attributes DMP reads to build the fused kernels: no hook that would step
        # these (soon replaced) tables in a backward pass of the unsharded module.
        _apply_optimizer_in_backward(optimizer_class, table_params, {"lr": sparse_lr}, register_hook=False)
    try:
        constraints = {
            config.name: ParameterConstraints(
                sharding_types=[sharding], compute_kernels=[kernel.value],
                min_partition=_column_shard_width(config.embedding_dim, world_size) if sharding == "column_wise"
                else None,
            )
            for config in configs
        }
        local_world_size = min(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), world_size)
        topology = Topology(world_size=world_size, compute_device=device.type, local_world_size=local_world_size)
        sharders = [EmbeddingBagCollectionSharder()]
        plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).collective_plan(
            module, sharders, group
        )
        # The shards and DDP's replicas use ``group`` (DMP would take the default group otherwise).
        env = None if process_group is None else ShardingEnv.from_process_group(process_group)
        model = DistributedModelParallel(module, env=env, device=device, plan=plan, sharders=sharders)
    except BaseException:
        _detach_fused_optimizers(table_params)  # the caller's tables train as before
        raise
    _copy_into_shards(model, full_weights, group)
    return model


def _column_shard_width(dim: int, world_size: int) -> int:
    """The width of a ``dim``-wide table's column-wise shards on ``world_size`` ranks.

    TorchRec cuts a table into equal shards and fbgemm needs widths that are multiples of 4:
    the widest such width that makes at least ``world_size`` shards, so that every rank holds
    part of the table (``dim / world_size`` when that is a multiple of 4; 12 columns on 2 ranks
    make three shards of 4, one rank holding two). A table of fewer than ``4 * world_size``
    columns gets shards of 4, on fewer ranks than the job's.
    """
    widths = [width for width in range(4, dim + 1, 4) if dim % width == 0 and dim // width >= world_size]
    return max(widths, default=4)


def _check_dims(configs: Sequence[Any], sharding: str) -> None:
    """The tables of fbgemm's fused kernels (``table_wise``, ``column_wise``) must be a multiple
    of 4 columns wide; TorchRec asserts it deep inside DMP, in a message naming no argument."""
    if sharding == "data_parallel":
        return
    for config in configs:
        if config.embedding_dim % 4:
            raise ValueError(
                f"sharding={sharding!r} needs embedding dims that are multiples of 4 (fbgemm's fused kernels); "
                f"table {config.name!r} (features {list(config.feature_names)}) has embedding_dim "
                f"{config.embedding_dim}: use a multiple of 4, or sharding='data_parallel' (any dim)"
            )


def _detach_fused_optimizers(params: Sequence[nn.Parameter]) -> None:
    """Undo ``_apply_optimizer_in_backward(..., register_hook=False)`` on ``params``."""
    for param in params:
        for attribute in ("_in_backward_optimizers", "_optimizer_classes", "_optimizer_kwargs"):
            if hasattr(param, attribute):
                delattr(param, attribute)


def _copy_into_shards(model: nn.Module, full_weights: dict[str, Tensor], group: Any) -> None:
    """Copy each full tensor of ``full_weights`` into ``model``'s local shards, and rank 0's
    into the replicated tensors of every rank.

    DDP broadcast rank 0's dense tensors when DMP built it; copying each rank's own values over
    them would leave replicas that differ on ranks whose models were initialised differently
    (no common seed), and DDP, which only averages gradients, would keep them different.
    """
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    with torch.no_grad():
        for name, target in model.state_dict().items():  # the same names, in the same order, on every rank
            if not isinstance(target, Tensor):  # a module's get_extra_state()
                continue
            if isinstance(target, ShardedTensor):
                if name not in full_weights:
                    continue
                for shard in target.local_shards():
                    index = tuple(
                        slice(offset, offset + size)
                        for offset, size in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
                    )
                    shard.tensor.copy_(full_weights[name][index])
            else:
                if name in full_weights:
                    target.copy_(full_weights[name])
                # the collectives write a dense buffer: a strided view (a buffer ``base[::2]``)
                # goes through a contiguous copy
                dense = target.contiguous()
                dist.broadcast(dense, group_src=0, group=group)
                if dense.data_ptr() != target.data_ptr():
                    target.copy_(dense)


def dense_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """The named parameters not trained by a fused (in-backward) sparse optimizer: the ones to
    give the dense optimizer."""
    for name, parameter in model.named_parameters():
        if not hasattr(parameter, "_in_backward_optimizers"):
            yield name, parameter
