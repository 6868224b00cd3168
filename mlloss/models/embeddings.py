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

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .._validation import check_cardinalities, check_sizes

__all__ = ["FieldEmbedding", "DotInteraction"]


class FieldEmbedding(nn.Module):
    """One ``dim``-dimensional embedding table per sparse field (one id per field and row).

    ``forward(ids)`` with ids (B, F) returns the concatenation (B, F * dim), or with
    ``combine="sum"`` the sum over fields (B, dim).
    """

    def __init__(self, cardinalities: Sequence[int], dim: int, combine: str = "concat") -> None:
        super().__init__()
        if combine not in ("concat", "sum"):
            raise ValueError(f"combine must be 'concat' or 'sum'; got {combine!r}")
        check_cardinalities(cardinalities)
        check_sizes(dim=dim)
        self.tables = nn.ModuleList(nn.Embedding(c, dim) for c in cardinalities)
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.05)
        self.combine = combine
        self.output_dim = dim * len(cardinalities) if combine == "concat" else dim

    def forward(self, ids: Tensor) -> Tensor:
        if ids.dim() != 2 or ids.shape[1] != len(self.tables):
            raise ValueError(f"ids must have shape (B, {len(self.tables)}); got {tuple(ids.shape)}")
        vectors = [table(ids[:, f]) for f, table in enumerate(self.tables)]
        return torch.cat(vectors, dim=1) if self.combine == "concat" else torch.stack(vectors).sum(0)


class DotInteraction(nn.Module):
    """Appends the pairwise dot products of the field embeddings (as in FM and DLRM).

    Reads (B, num_fields * dim) concatenated field embeddings and returns
    (B, num_fields * dim + num_fields * (num_fields - 1) / 2): the input followed by
    <e_i, e_j> for i < j. An MLP alone learns such multiplicative user-item matches poorly.
    """

    def __init__(self, num_fields: int, dim: int) -> None:
        super().__init__()
        check_sizes(num_fields=num_fields, dim=dim)
        self.num_fields, self.dim = num_fields, dim
        rows, cols = torch.triu_indices(num_fields, num_fields, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.output_dim = num_fields * dim + rows.numel()

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.num_fields * self.dim:
            raise ValueError(f"x must have shape (B, {self.num_fields * self.dim}); got {tuple(x.shape)}")
        e = x.view(-1, self.num_fields, self.dim)
        dots = torch.bmm(e, e.transpose(1, 2))[:, self.rows, self.cols]
        return torch.cat([x, dots], dim=1)
