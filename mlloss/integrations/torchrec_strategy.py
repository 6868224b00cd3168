"""The Lightning strategy of the TorchRec integration: :class:`TorchRecStrategy`, Lightning's DDP
for a LightningModule whose embedding tables :func:`mlloss.integrations.torchrec.shard_model`
shards, with sharded checkpoints written crash-safely.

Needs both the ``lightning`` extra and TorchRec. Its siblings: the tables, the sharding and the
optimizers are ``torchrec.py`` (no Lightning); the atomic writes and the resolver of the newest
complete checkpoint are :mod:`mlloss.checkpointing` (no Lightning); Lightning's checkpoint I/O for
plain files is ``lightning_checkpoints.py``.

The strategy does not wrap the module a second time, expects the module to shard itself in
``configure_model`` (``self.model = self.trainer.strategy.shard(self.model)``), and saves and
restores checkpoints with ``torch.distributed.checkpoint``: a checkpoint is a directory with
every rank's shards of the model and of the fused sparse optimizer's state, plus ``meta.pt``,
written by rank 0, with the rest of Lightning's checkpoint (loops, epoch, callbacks, the dense
optimizer's state and the module's state outside the sharded model, all replicated), and the
completion marker ``COMPLETE``. It is
written under a temporary name and made visible when complete (docs/checkpoints.md). Resuming
needs the same world size and sharding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._extras import needs_extra
from .._validation import check_choice, check_finite_number
from ..checkpointing import (
    METADATA_FILENAME,
    begin_directory,
    finish_directory,
    finish_interrupted_publish,
    incomplete_reason,
    remove_checkpoint,
    staging_path,
)
from .torchrec import SHARDING_TYPES, import_torchrec, shard_model, sparse_optimizer_class

with needs_extra("lightning", "mlloss.integrations.torchrec_strategy"):
    from pytorch_lightning import LightningModule
    from pytorch_lightning.strategies import DDPStrategy

__all__ = ["TorchRecStrategy"]


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
    the module again. The LightningModule's trainable parameters outside the sharded model (a
    learnable task weighting in the loss, say) would be synchronised by nobody: the strategy
    broadcasts rank 0's values of them when fitting starts and averages their gradients over
    the ranks after every backward pass, as DDP does (one all-reduce of them all).
    Checkpoints are directories written with ``torch.distributed.checkpoint``
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
        import_torchrec()
        check_choice("sharding", sharding, SHARDING_TYPES)
        sparse_optimizer_class(sparse_optimizer)  # validates the name
        check_finite_number("sparse_lr", sparse_lr, above=0)
        super().__init__(**kwargs)
        self.sharding = sharding
        self.sparse_optimizer = sparse_optimizer
        self.sparse_lr = sparse_lr
        self.sharded_model = None
        self._outside_parameters: list[nn.Parameter] = []

    def shard(self, module: nn.Module):
        """Shard ``module``'s tables (call from ``LightningModule.configure_model``)."""
        self.sharded_model = shard_model(
            module, self.sharding, self.root_device, self.sparse_optimizer, self.sparse_lr
        )
        return self.sharded_model

    def _sharded(self) -> nn.Module:
        if self.sharded_model is None:
            raise RuntimeError(
                "TorchRecStrategy: the LightningModule did not shard its model; call "
                "`self.model = self.trainer.strategy.shard(self.model)` in configure_model"
            )
        return self.sharded_model

    def _module(self) -> LightningModule:
        module = self.lightning_module
        if module is None:
            raise RuntimeError("TorchRecStrategy: no LightningModule is attached yet (the trainer attaches it in fit)")
        return module

    def _fused_optimizer(self):
        return self._sharded().fused_optimizer

    def configure_ddp(self) -> None:
        """DMP already wraps the dense parameters in DDP; the module's trainable parameters
        outside DMP start from rank 0's values here, and :meth:`post_backward` averages their
        gradients."""
        inside = {id(parameter) for parameter in self._sharded().parameters()}
        self._outside_parameters = [
            parameter for parameter in self._module().parameters()
            if parameter.requires_grad and id(parameter) not in inside
        ]
        with torch.no_grad():
            for parameter in self._outside_parameters:  # the same order on every rank
                dist.broadcast(parameter, src=0)

    def post_backward(self, closure_loss: Tensor) -> None:
        super().post_backward(closure_loss)
        self._average_outside_gradients()

    def _average_outside_gradients(self) -> None:
        """Average the gradients of the parameters outside DMP over the ranks, in one
        all-reduce, as DDP averages the ones inside. A parameter without a gradient on a rank
        counts as a zero gradient there (as in DDP); it keeps none where no rank has one.
        Under gradient accumulation the sum of averaged micro-batch gradients is the average
        of the summed ones, so averaging after every backward pass is exact."""
        parameters = self._outside_parameters
        if not parameters:
            return
        dtype = torch.float32
        for parameter in parameters:
            dtype = torch.promote_types(dtype, parameter.dtype)
        device = parameters[0].device
        has_gradient = torch.tensor([p.grad is not None for p in parameters], dtype=dtype, device=device)
        gradients = [torch.zeros(p.numel(), dtype=dtype, device=device) if p.grad is None
                     else p.grad.reshape(-1).to(dtype) for p in parameters]
        flat = torch.cat([has_gradient, *gradients])
        dist.all_reduce(flat)
        ranks_with_gradient = flat[: len(parameters)].tolist()
        sums = flat[len(parameters):].split([p.numel() for p in parameters])
        for parameter, total, ranks in zip(parameters, sums, ranks_with_gradient):
            if ranks == 0:
                continue
            mean = (total / self.world_size).view_as(parameter).to(parameter.dtype)
            if parameter.grad is None:
                parameter.grad = mean
            else:
                parameter.grad.copy_(mean)

    def model_to_device(self) -> None:
        if self.sharded_model is None:
            super().model_to_device()
            return
        # DMP already placed its shards and dense part on the device; move the module's other
        # parts (its own parameters, losses with buffers, metric states) there too.
        with self._without_dmp() as module:
            module.to(self.root_device)

    def setup(self, trainer) -> None:
        from lightning_fabric.utilities.optimizer import _optimizers_to_device
        from pytorch_lightning.trainer.states import TrainerFn

        assert self.accelerator is not None and self.model is not None  # attached by the trainer, as in Lightning's strategies
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
        dmp_state, rest = self._module_state()
        return {**rest, **dmp_state}

    def _dmp_prefix(self) -> str:
        """DMP's prefix in the LightningModule's state dict (``"model."``)."""
        module, dmp = self._module(), self._sharded()
        return next(name for name, child in module.named_modules() if child is dmp) + "."

    def _module_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The LightningModule's state dict in two parts: DMP's (ShardedTensors for the sharded
        tables, its keys prefixed) and the rest (the module's own parameters and buffers, the
        losses' running counts: the same on every rank).

        DMP's ``state_dict`` prefixes every key of the dict it is handed, so within the module's
        ``state_dict`` the keys gathered before it (the module's own parameters, children
        registered before the sharded model) came out under its prefix and did not load back.
        Its part is taken on its own, and the rest with DMP left out for the while."""
        dmp_state = self._sharded().state_dict(prefix=self._dmp_prefix())
        with self._without_dmp() as module:
            rest = module.state_dict()
        return dmp_state, rest

    @contextmanager
    def _without_dmp(self) -> Iterator[LightningModule]:
        """The LightningModule with its DMP child set to ``None`` for the while (``state_dict``,
        ``to`` and the like skip a ``None`` child)."""
        module, dmp = self._module(), self._sharded()
        parent_name, _, name = self._dmp_prefix()[:-1].rpartition(".")
        parent = module.get_submodule(parent_name)
        parent._modules[name] = None
        try:
            yield module
        finally:
            parent._modules[name] = dmp

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        pass  # load_checkpoint loaded it into the shards

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        import torch.distributed.checkpoint as dcp

        if storage_options is not None:
            raise TypeError("TorchRecStrategy.save_checkpoint does not take storage_options")
        path = Path(self.broadcast(str(filepath)))
        staging = staging_path(path)
        self._on_rank_zero_together(lambda: begin_directory(path), f"start the checkpoint {path}")  # an empty .partial/<name>
        checkpoint = dict(checkpoint)
        # DMP's shards go to DCP; the rest of the module's state to meta.pt (rank 0's), which loads it
        # through the module's load_state_dict (a balanced LoALoss built without num_labels takes its size).
        prefix, module_state = self._dmp_prefix(), checkpoint.pop("state_dict")
        checkpoint[_REST_KEY] = {k: v for k, v in module_state.items() if not k.startswith(prefix)}
        state = self._dcp_state({k: v for k, v in module_state.items() if k.startswith(prefix)})
        dcp.save(state, checkpoint_id=staging)  # returns on rank 0 (the coordinator) once every shard is written

        def finish() -> None:
            with open(staging / METADATA_FILENAME, "wb") as stream:
                torch.save(checkpoint, stream)
            # the marker last, then the swap into `path`
            finish_directory(staging, path, epoch=checkpoint.get("epoch"), global_step=checkpoint.get("global_step"),
                             world_size=self.world_size)

        self._on_rank_zero_together(finish, f"finish the checkpoint {path}")

    def _on_rank_zero_together(self, step: Any, what: str) -> None:
        """Run ``step`` on rank 0, the others waiting for it, and raise on every rank if it raised:
        a barrier would keep the others waiting for the collective timeout (30 minutes by default)
        after rank 0's error (a full disk, say)."""
        error = None
        if self.is_global_zero:
            try:
                step()
            except Exception as caught:  # raised below, after the others know
                error = caught
        if not self.reduce_boolean_decision(error is None, all=True):
            if error is not None:
                raise error
            raise RuntimeError(f"TorchRecStrategy.save_checkpoint: rank 0 could not {what} (its error is raised there)")

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp

        path = Path(self.broadcast(str(checkpoint_path)))
        if not (path / METADATA_FILENAME).is_file():
            raise FileNotFoundError(
                f"{path} is not a TorchRecStrategy checkpoint (a directory with {METADATA_FILENAME} and the shards)"
            )
        reason = incomplete_reason(path)
        if self.is_global_zero and reason is not None:
            print(f"note: {path} is not marked complete ({reason}); loading it as named", flush=True)
        try:
            checkpoint = torch.load(path / METADATA_FILENAME, weights_only=False)
            dmp_state, rest = self._module_state()
            if _REST_KEY not in checkpoint:  # written before 2026-11-29: the whole module's state in DCP
                dmp_state |= rest
            state = self._dcp_state(dmp_state)
            dcp.load(state, checkpoint_id=path)  # in place, into this rank's shards
            self._load_module_state({**checkpoint.pop(_REST_KEY, {}), **state["model"]})
            if "sparse_optimizer" in state:
                self._fused_optimizer().load_state_dict(state["sparse_optimizer"])
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

    def _dcp_state(self, dmp_state: dict[str, Any]) -> dict[str, Any]:
        """What DCP saves and loads: DMP's state and the fused sparse optimizer's, if it keeps any
        tensor (SGD keeps none: DCP then writes nothing under its key, and would refuse to load it)."""
        optimizer_state = self._fused_optimizer().state_dict()
        has_tensors = any(isinstance(leaf, Tensor) for leaf in _leaves(optimizer_state))
        return {"model": dmp_state, **({"sparse_optimizer": optimizer_state} if has_tensors else {})}

    def _load_module_state(self, state: dict[str, Any]) -> None:
        """Load the LightningModule's state: DMP's part through DMP (its keys carry no wrapper
        prefix), the rest through the module."""
        module, dmp, prefix = self._module(), self._sharded(), self._dmp_prefix()
        dmp.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        rest = {k: v for k, v in state.items() if not k.startswith(prefix)}
        missing, unexpected = module.load_state_dict(rest, strict=False)
        missing = [key for key in missing if not key.startswith(prefix)]
        if module.strict_loading and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not match the module: missing {missing}, unexpected {unexpected}")

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            remove_checkpoint(filepath)  # and its temporary and retired copies


_REST_KEY = "module_state_outside_dmp"  # meta.pt's entry: the module's state but DMP's


def _leaves(tree: Any) -> Any:
    """The leaves of nested dicts and lists."""
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _leaves(value)
    else:
        yield tree
