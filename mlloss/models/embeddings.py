"""Embeddings of the sparse id fields, the first stage of a :class:`~mlloss.models.MultiTaskModel`.

* :class:`FieldEmbedding` -- one table per sparse field (one id per field and row), in plain
  PyTorch;
* :class:`DotInteraction` -- appends the pairwise dot products of the field embeddings (FM, DLRM).

An embedding is any module with an ``output_dim`` attribute mapping the sparse input to
``(B, output_dim)``: :class:`mlloss.integrations.torchrec.TorchRecEmbedding` is a drop-in
replacement of :class:`FieldEmbedding` backed by TorchRec tables that can be sharded. The
multi-task backbones that read the embeddings are in ``towers.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_bool, check_cardinalities, check_field_ids, check_sizes
from .._constants import ConstantBuffers

__all__ = ["FieldEmbedding", "DotInteraction"]


class _Default(enum.Enum):
    PARAMETER = enum.auto()  # tables()' default: the parameter's rows


class FieldEmbedding(ConstantBuffers):
    """One ``dim``-dimensional embedding table per sparse field (one id per field and row).

    ``forward(ids)`` with integer ids (B, F) (int64, int32, ...), ``ids[:, f]`` in
    ``[0, cardinalities[f])``, returns the concatenation (B, F * dim), or with ``combine="sum"``
    the sum over fields (B, dim).

    The tables are stored as one parameter ``weight`` (sum(cardinalities), dim), field f's
    rows after the fields before it (``tables()`` gives each field's rows), so that a step
    costs one gather and one backward whatever the number of fields; they are drawn from
    N(0, 0.05^2) (:meth:`reset_parameters`, as ``TorchRecEmbedding``'s). Ids are checked against
    their field's table (``validate_args=False`` skips that, for data checked once): on the
    CPU with a ValueError naming the field, on a GPU without waiting for it (a device assert).
    """

    sizes: Tensor  # constant buffers (constant_buffers)
    offsets: Tensor

    def __init__(
        self, cardinalities: Sequence[int], dim: int, combine: str = "concat", validate_args: bool = True
    ) -> None:
        super().__init__()
        if combine not in ("concat", "sum"):
            raise ValueError(f"combine must be 'concat' or 'sum'; got {combine!r}")
        self.cardinalities = check_cardinalities(cardinalities)
        check_sizes(dim=dim)
        self.weight = nn.Parameter(torch.empty(sum(self.cardinalities), dim))
        self.reset_parameters()
        self.register_constant_buffers()  # sizes, offsets
        self.combine = combine
        self.validate_args = check_bool("validate_args", validate_args)
        self.output_dim = dim * len(self.cardinalities) if combine == "concat" else dim
        self.register_load_state_dict_pre_hook(_join_per_field_tables)

    def reset_parameters(self) -> None:
        """Draws the tables from N(0, 0.05^2). FSDP's deferred init (a model made on the meta
        device, ``to_empty``) calls it: without it the tables held uninitialised memory."""
        nn.init.normal_(self.weight, std=0.05)

    def constant_buffers(self) -> dict[str, Tensor]:
        sizes = torch.tensor(self.cardinalities)
        return {"sizes": sizes, "offsets": sizes.cumsum(0) - sizes}  # each field's first row in ``weight``

    def tables(self, weight: Tensor | None | Literal[_Default.PARAMETER] = _Default.PARAMETER) -> tuple[Tensor, ...]:
        """Each field's rows of ``weight`` (default: the parameter; e.g. its ``.grad``), as views.
        A ``weight`` of None is an error: ``tables(embedding.weight.grad)`` before a backward
        returned the parameter's rows as if they were the gradient."""
        if weight is _Default.PARAMETER:
            weight = self.weight
        elif weight is None:
            raise ValueError("weight is None (a .grad before any backward?); call tables() for the parameter's rows")
        return torch.split(weight, self.cardinalities)

    def forward(self, ids: Tensor) -> Tensor:
        if ids.dim() != 2 or ids.shape[1] != len(self.cardinalities):
            raise ValueError(f"ids must have shape (B, {len(self.cardinalities)}); got {tuple(ids.shape)}")
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            # float ids failed inside F.embedding, naming no argument; bool ids read rows 0 and 1
            raise TypeError(f"ids must be an integer tensor (int64, int32, ...); got dtype {ids.dtype}")
        if self.validate_args:
            self._check_ids(ids)
        vectors = F.embedding(ids + self.offsets, self.weight)  # (B, F, dim)
        return vectors.flatten(1) if self.combine == "concat" else vectors.sum(1)

    def _check_ids(self, ids: Tensor) -> None:
        if ids.is_cuda or torch.compiler.is_compiling():  # no host read: a device assert
            in_range = (ids >= 0) & (ids < self.sizes)
            torch._assert_async(in_range.all(), "FieldEmbedding: an id is outside its field's table")
        else:
            check_field_ids(ids, self.cardinalities, "ids")


def _join_per_field_tables(module: FieldEmbedding, state_dict: dict, prefix: str, *args) -> None:
    """Loads a state dict saved with one ``tables.<f>.weight`` per field (before the tables
    were stored as one parameter)."""
    keys = [f"{prefix}tables.{f}.weight" for f in range(len(module.cardinalities))]
    if f"{prefix}weight" not in state_dict and all(key in state_dict for key in keys):
        state_dict[f"{prefix}weight"] = torch.cat([state_dict.pop(key) for key in keys])


class DotInteraction(ConstantBuffers):
    """Appends the pairwise dot products of the field embeddings (as in FM and DLRM).

    Reads (B, num_fields * dim) concatenated field embeddings and returns
    (B, num_fields * dim + num_fields * (num_fields - 1) / 2): the input followed by
    <e_i, e_j> for i < j. An MLP alone learns such multiplicative user-item matches poorly.
    """

    pick: Tensor  # a constant buffer (constant_buffers)

    def __init__(self, num_fields: int, dim: int) -> None:
        super().__init__()
        check_sizes(num_fields=num_fields, dim=dim)
        self.num_fields, self.dim = num_fields, dim
        self.register_constant_buffers()  # pick
        self.output_dim = num_fields * dim + self.pick.shape[1]

    def reset_parameters(self) -> None:
        """Nothing to draw: no parameters, and ``pick`` is a constant that every move (``to_empty``)
        rebuilds. FSDP's deferred init calls it on each module holding a parameter or a buffer,
        and failed with an AttributeError here."""

    def constant_buffers(self) -> dict[str, Tensor]:
        rows, cols = torch.triu_indices(self.num_fields, self.num_fields, offset=1)
        # picks <e_i, e_j>, i < j, out of all F * F dots: a matmul, whose backward is one too
        pick = torch.zeros(self.num_fields * self.num_fields, rows.numel())
        pick[rows * self.num_fields + cols, torch.arange(rows.numel())] = 1.0
        return {"pick": pick}

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.num_fields * self.dim:
            raise ValueError(f"x must have shape (B, {self.num_fields * self.dim}); got {tuple(x.shape)}")
        e = x.view(-1, self.num_fields, self.dim)
        dots = torch.bmm(e, e.transpose(1, 2)).flatten(1) @ self.pick
        return torch.cat([x, dots], dim=1)
