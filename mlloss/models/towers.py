"""Multi-task towers for recommender models, in plain PyTorch: the backbones and the model that
joins them to an embedding.

A model is an ``embedding`` of the sparse id fields, optionally extended by an
``interaction`` (pairwise dot products of the field embeddings), concatenated with the dense
features and fed to a multi-task ``backbone`` that returns one logit per task::

    model = MultiTaskModel(
        embedding=FieldEmbedding(cardinalities=[4000, 2000, 40], dim=16),
        interaction=DotInteraction(num_fields=3, dim=16),  # optional FM/DLRM-style dots
        backbone=MMoE(input_dim=3 * 16 + 3 + 4, num_tasks=2, num_experts=4,
                      expert_hidden=(64, 32), tower_hidden=(16,)),
        esmm=True,
    )
    logits = model(sparse_ids, dense)  # (B, 2)

Backbones (constructor arguments follow the papers' figures):

* :class:`SharedBottom` -- one shared bottom MLP, one tower per task (Caruana, 1997).
* :class:`MMoE` -- shared experts, one softmax gate per task (Ma et al., KDD 2018).
* :class:`CGC` -- task-specific plus shared experts, one gate per task over its own and the
  shared experts (Tang et al., RecSys 2020).
* :class:`PLE` -- stacked CGC extraction levels; at intermediate levels a shared gate over
  all experts feeds the next level's shared experts (Tang et al., RecSys 2020).

The embedding is any module with an ``output_dim`` attribute mapping the sparse input to
``(B, output_dim)``, so that it can be replaced without touching the towers: the embeddings and
the interaction are in ``embeddings.py`` (:class:`~mlloss.models.embeddings.FieldEmbedding`,
:class:`~mlloss.models.embeddings.DotInteraction`), TorchRec tables that can be sharded in
:mod:`mlloss.integrations.torchrec` (``TorchRecEmbedding``).

ESMM (Ma et al., SIGIR 2018): with ``esmm=True`` the second task's logit is read as the
post-click conversion rate pCVR and the model returns the logits of (pCTR, pCTCVR), with
pCTCVR = pCTR * pCVR, so that both outputs are trained on the entire impression space
against the labels (click, click AND purchase).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._validation import check_sizes

__all__ = [
    "mlp",
    "SharedBottom",
    "MMoE",
    "ExtractionLevel",
    "CGC",
    "PLE",
    "MultiTaskModel",
    "esmm_logits",
]


def mlp(input_dim: int, hidden: Sequence[int], dropout: float = 0.0, last_activation: bool = True) -> nn.Sequential:
    """Linear layers of widths ``hidden``, each followed by ReLU (and dropout if > 0);
    ``last_activation=False`` leaves the last layer linear."""
    if input_dim < 1 or not hidden or any(h < 1 for h in hidden):
        raise ValueError(f"mlp needs input_dim >= 1 and positive hidden widths; got {input_dim}, {list(hidden)}")
    layers: list[nn.Module] = []
    widths = [input_dim, *hidden]
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(w_in, w_out))
        if last_activation or i < len(hidden) - 1:
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def _task_towers(input_dim: int, num_tasks: int, tower_hidden: Sequence[int], dropout: float) -> nn.ModuleList:
    """One MLP per task ending in a single logit."""
    return nn.ModuleList(
        mlp(input_dim, [*tower_hidden, 1], dropout, last_activation=False) for _ in range(num_tasks)
    )


class SharedBottom(nn.Module):
    """Shared-bottom MLP followed by one tower per task: (B, input_dim) -> (B, num_tasks)."""

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        bottom_hidden: Sequence[int] = (128, 64),
        tower_hidden: Sequence[int] = (32,),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(num_tasks=num_tasks)
        self.bottom = mlp(input_dim, bottom_hidden, dropout)
        self.towers = _task_towers(bottom_hidden[-1], num_tasks, tower_hidden, dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.bottom(x)
        return torch.cat([tower(h) for tower in self.towers], dim=1)


class _GatedMixture(nn.Module):
    """A softmax gate over ``num_experts`` expert outputs: (B, in), (B, E, H) -> (B, H)."""

    def __init__(self, input_dim: int, num_experts: int) -> None:
        super().__init__()
        self.gate = nn.Linear(input_dim, num_experts)

    def forward(self, gate_input: Tensor, expert_outputs: Tensor) -> Tensor:
        weights = F.softmax(self.gate(gate_input), dim=1)
        return torch.einsum("be,beh->bh", weights, expert_outputs)


class MMoE(nn.Module):
    """Multi-gate mixture of experts: shared experts, one softmax gate and tower per task."""

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        num_experts: int = 4,
        expert_hidden: Sequence[int] = (64, 32),
        tower_hidden: Sequence[int] = (16,),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(num_tasks=num_tasks, num_experts=num_experts)
        self.experts = nn.ModuleList(mlp(input_dim, expert_hidden, dropout) for _ in range(num_experts))
        self.gates = nn.ModuleList(_GatedMixture(input_dim, num_experts) for _ in range(num_tasks))
        self.towers = _task_towers(expert_hidden[-1], num_tasks, tower_hidden, dropout)

    def forward(self, x: Tensor) -> Tensor:
        experts = torch.stack([expert(x) for expert in self.experts], dim=1)
        return torch.cat([tower(gate(x, experts)) for gate, tower in zip(self.gates, self.towers)], dim=1)


class ExtractionLevel(nn.Module):
    """One CGC/PLE extraction level.

    Takes ``num_tasks + 1`` inputs (one per task, then the shared one) and returns as many
    outputs. Task t's gate mixes task t's experts and the shared experts, reading input t.
    With ``shared_gate=True`` (PLE intermediate levels) a shared gate over all experts,
    reading the shared input, produces the shared output; otherwise the shared output is
    the shared input unchanged (it is not used downstream).
    """

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        num_task_experts: int,
        num_shared_experts: int,
        expert_hidden: Sequence[int],
        shared_gate: bool,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(num_tasks=num_tasks, num_task_experts=num_task_experts, num_shared_experts=num_shared_experts)
        self.num_tasks = num_tasks
        self.output_dim = expert_hidden[-1]

        def experts(count: int) -> nn.ModuleList:
            return nn.ModuleList(mlp(input_dim, expert_hidden, dropout) for _ in range(count))

        self.task_experts = nn.ModuleList(experts(num_task_experts) for _ in range(num_tasks))
        self.shared_experts = experts(num_shared_experts)
        per_task = num_task_experts + num_shared_experts
        self.task_gates = nn.ModuleList(_GatedMixture(input_dim, per_task) for _ in range(num_tasks))
        all_experts = num_tasks * num_task_experts + num_shared_experts
        self.shared_gate = _GatedMixture(input_dim, all_experts) if shared_gate else None

    def forward(self, inputs: Sequence[Tensor]) -> list[Tensor]:
        if len(inputs) != self.num_tasks + 1:
            raise ValueError(f"expected {self.num_tasks + 1} inputs (tasks + shared); got {len(inputs)}")
        shared_in = inputs[-1]
        shared = [expert(shared_in) for expert in self.shared_experts]
        outputs, all_experts = [], []
        for x, experts, gate in zip(inputs, self.task_experts, self.task_gates):
            own = [expert(x) for expert in experts]
            all_experts += own
            outputs.append(gate(x, torch.stack(own + shared, dim=1)))
        if self.shared_gate is None:
            outputs.append(shared_in)
        else:
            outputs.append(self.shared_gate(shared_in, torch.stack(all_experts + shared, dim=1)))
        return outputs


class PLE(nn.Module):
    """Progressive layered extraction: ``num_levels`` stacked extraction levels, then one
    tower per task. Every level but the last has a shared gate over all its experts."""

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        num_levels: int = 2,
        num_task_experts: int = 2,
        num_shared_experts: int = 2,
        expert_hidden: Sequence[int] = (64, 32),
        tower_hidden: Sequence[int] = (16,),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        check_sizes(num_levels=num_levels)
        dims = [input_dim] + [expert_hidden[-1]] * (num_levels - 1)
        self.levels = nn.ModuleList(
            ExtractionLevel(
                dim, num_tasks, num_task_experts, num_shared_experts, expert_hidden,
                shared_gate=level < num_levels - 1, dropout=dropout,
            )
            for level, dim in enumerate(dims)
        )
        self.towers = _task_towers(expert_hidden[-1], num_tasks, tower_hidden, dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = [x] * (len(self.towers) + 1)
        for level in self.levels:
            hidden = level(hidden)
        return torch.cat([tower(h) for tower, h in zip(self.towers, hidden)], dim=1)


class CGC(PLE):
    """Customized gate control: a single extraction level (PLE with ``num_levels=1``)."""

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        num_task_experts: int = 2,
        num_shared_experts: int = 2,
        expert_hidden: Sequence[int] = (64, 32),
        tower_hidden: Sequence[int] = (16,),
        dropout: float = 0.0,
    ) -> None:
        super().__init__(
            input_dim, num_tasks, 1, num_task_experts, num_shared_experts, expert_hidden, tower_hidden, dropout
        )


def esmm_logits(ctr_logit: Tensor, cvr_logit: Tensor) -> Tensor:
    """The logit of pCTCVR = sigmoid(ctr_logit) * sigmoid(cvr_logit), computed in log space."""
    log_p = F.logsigmoid(ctr_logit) + F.logsigmoid(cvr_logit)
    # log(1 - p) = log(-expm1(log p)); clamp keeps p < 1 so the logarithm stays finite.
    log_not_p = torch.log(-torch.expm1(log_p.clamp_max(-1e-7)))
    return log_p - log_not_p


class MultiTaskModel(nn.Module):
    """``backbone(cat(interaction(embedding(sparse)), dense))``: per-task logits (B, T).

    Args:
        embedding: module mapping the sparse input to (B, embedding.output_dim).
        backbone: multi-task module mapping (B, input_dim) to (B, T), where input_dim is
            the embedding's (or the interaction's) output_dim plus the number of dense features.
        interaction: optional module applied to the embedding output, such as
            :class:`DotInteraction`.
        esmm: read logits[:, 1] as pCVR and return logits[:, 1] as pCTCVR = pCTR * pCVR
            (ESMM); logits[:, 0] must be pCTR. Other columns are returned unchanged.
    """

    def __init__(
        self, embedding: nn.Module, backbone: nn.Module, interaction: nn.Module | None = None, esmm: bool = False
    ) -> None:
        super().__init__()
        if not hasattr(embedding, "output_dim"):
            raise TypeError(f"embedding must have an output_dim attribute; got {type(embedding).__name__}")
        self.embedding = embedding
        self.interaction = interaction
        self.backbone = backbone
        self.esmm = esmm

    def forward(self, sparse: Tensor, dense: Tensor | None = None) -> Tensor:
        x = self.embedding(sparse)
        if self.interaction is not None:
            x = self.interaction(x)
        if dense is not None:
            x = torch.cat([x, dense], dim=1)
        logits = self.backbone(x)
        if not self.esmm:
            return logits
        if logits.shape[1] < 2:
            raise ValueError(f"esmm needs at least 2 tasks (ctr, cvr); got {logits.shape[1]}")
        ctcvr = esmm_logits(logits[:, 0], logits[:, 1]).unsqueeze(1)
        return torch.cat([logits[:, :1], ctcvr, logits[:, 2:]], dim=1)
