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
* :class:`MMoE` -- shared experts, one softmax gate per task (Ma et al., KDD 2018): a CGC
  without task-specific experts.
* :class:`CGC` -- task-specific plus shared experts, one gate per task over its own and the
  shared experts (Tang et al., RecSys 2020).
* :class:`PLE` -- stacked CGC extraction levels (:class:`ExtractionLevel`); at intermediate
  levels a shared gate over all experts feeds the next level's shared experts (Tang et al.,
  RecSys 2020).

The experts of a level, its task gates and the task towers are each one stack of same-shaped
layers (:class:`StackedLinear`, ``mlp(..., copies=G)``) run with one batched matmul per layer:
a training step issues the same few kernels for 2 experts or 16, which keeps a GPU busy at
recommender batch sizes, where launching kernels, not computing them, is the cost.
tests/test_models.py checks every backbone against its paper written out expert by expert.

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

from .._validation import check_bool, check_finite_number, check_int, check_sizes, check_widths
from .._constants import ConstantBuffers

__all__ = [
    "mlp",
    "StackedLinear",
    "SharedBottom",
    "MMoE",
    "ExtractionLevel",
    "CGC",
    "PLE",
    "MultiTaskModel",
    "esmm_logits",
]


def mlp(
    input_dim: int, hidden: Sequence[int], dropout: float = 0.0, last_activation: bool = True, copies: int | None = None
) -> nn.Sequential:
    """Linear layers of widths ``hidden``, each followed by ReLU (and dropout if > 0; ``dropout``
    is a probability in [0, 1)); ``last_activation=False`` leaves the last layer linear.

    With ``copies=G`` the layers are :class:`StackedLinear`: G independent MLPs of this shape
    (experts, towers) that map (G, B, input_dim) to (G, B, hidden[-1]) with one batched matmul
    per layer instead of G.
    """
    hidden = check_widths("hidden", hidden)
    check_sizes(input_dim=input_dim)
    if not 0 <= check_finite_number("dropout", dropout, requirement="a number in [0, 1)") < 1:
        raise ValueError(f"dropout must be a number in [0, 1); got {dropout!r}")
    layers: list[nn.Module] = []
    widths = [input_dim, *hidden]
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(w_in, w_out) if copies is None else StackedLinear(copies, w_in, w_out))
        if last_activation or i < len(hidden) - 1:
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class StackedLinear(nn.Module):
    """``copies`` independent linear layers of one shape, applied with one batched matmul:
    (G, B, in_features) -> (G, B, out_features).

    ``weight[g]`` (in_features, out_features) is the transpose of the g-th layer's
    :class:`torch.nn.Linear` weight (so that the forward and both gradients are plain batched
    matmuls) and ``bias[g, 0]`` its bias, initialised as nn.Linear does. A GPU step runs one
    kernel per layer of all experts (or towers) together instead of one per expert.
    """

    def __init__(self, copies: int, in_features: int, out_features: int) -> None:
        super().__init__()
        check_sizes(copies=copies, in_features=in_features, out_features=out_features)
        self.weight = nn.Parameter(torch.empty(copies, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(copies, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's default init, U(-1/sqrt(in), 1/sqrt(in)) for the weight and the bias. FSDP's
        deferred init (a model made on the meta device, ``to_empty``) calls it to fill the weights,
        which held uninitialised memory without it."""
        bound = self.weight.shape[1] ** -0.5
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return torch.baddbmm(self.bias, x, self.weight)

    def extra_repr(self) -> str:
        copies, in_features, out_features = self.weight.shape
        return f"copies={copies}, in_features={in_features}, out_features={out_features}"


def _task_towers(input_dim: int, num_tasks: int, tower_hidden: Sequence[int], dropout: float) -> nn.Sequential:
    """One MLP per task ending in a single logit, stacked: (T, B, input_dim) -> (T, B, 1)."""
    tower_hidden = check_widths("tower_hidden", tower_hidden, allow_empty=True)
    return mlp(input_dim, [*tower_hidden, 1], dropout, last_activation=False, copies=num_tasks)


def _check_input(x: Tensor, input_dim: int) -> None:
    """A backbone's input is (B, input_dim): the stacked experts would otherwise fail inside a
    batched matmul with shapes of their own, or read a 1-D input as a batch of rows."""
    if x.dim() != 2 or x.shape[1] != input_dim:
        raise ValueError(f"x must have shape (B, {input_dim}) (input_dim={input_dim}); got {tuple(x.shape)}")


def _logits(towers: nn.Sequential, task_inputs: Tensor) -> Tensor:
    """The towers' logits (B, T) from the task inputs (T, B, H)."""
    return towers(task_inputs).squeeze(2).t()


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
        bottom_hidden = check_widths("bottom_hidden", bottom_hidden)
        self.input_dim, self.num_tasks = input_dim, num_tasks
        self.bottom = mlp(input_dim, bottom_hidden, dropout)
        self.towers = _task_towers(bottom_hidden[-1], num_tasks, tower_hidden, dropout)

    def forward(self, x: Tensor) -> Tensor:
        _check_input(x, self.input_dim)
        h = self.bottom(x)
        return _logits(self.towers, h.expand(self.num_tasks, *h.shape))


class ExtractionLevel(ConstantBuffers):
    """One CGC/PLE extraction level (an MMoE when it has no task-specific experts).

    Reads ``num_tasks + 1`` inputs stacked as (T + 1, B, input_dim): one per task, then the
    shared one. Task t's softmax gate, reading input t, mixes task t's experts (which read
    input t) and the shared experts (which read the shared input). With ``shared_gate=True``
    (PLE intermediate levels) a shared gate over all experts, reading the shared input, adds
    the shared output: the level returns (T + 1, B, H) then, (T, B, H) otherwise, H being
    ``expert_hidden[-1]``.

    A gate is softmax(W h + b): a linear layer with a bias, where the papers' softmax(W h) has
    none (the bias lets a gate prefer some experts whatever its input).

    All the level's experts are one stacked MLP and all task gates one stacked linear layer,
    so a level costs a few kernels whatever its number of experts. A task's gate gives weight
    0 to the experts it does not mix.
    """

    gated_experts: Tensor  # a constant buffer (constant_buffers)

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
        check_sizes(num_tasks=num_tasks, num_shared_experts=num_shared_experts)
        expert_hidden = check_widths("expert_hidden", expert_hidden)
        check_int("num_task_experts", num_task_experts, minimum=0)  # 0 in an MMoE
        self.num_tasks, self.num_task_experts, self.num_shared_experts = num_tasks, num_task_experts, num_shared_experts
        self.output_dim = expert_hidden[-1]
        num_experts = num_tasks * num_task_experts + num_shared_experts
        # Experts in the order: task 0's, task 1's, ..., the shared ones.
        self.experts = mlp(input_dim, expert_hidden, dropout, copies=num_experts)
        self.task_gates = StackedLinear(num_tasks, input_dim, num_task_experts + num_shared_experts)
        self.shared_gate = nn.Linear(input_dim, num_experts) if shared_gate else None
        self.register_constant_buffers()  # gated_experts

    def reset_parameters(self) -> None:
        """Nothing of its own to draw: its weights are its children's (StackedLinear, nn.Linear,
        each with its reset_parameters), and ``gated_experts`` is a constant that every move
        (``to_empty``) rebuilds. FSDP's deferred init calls it on each module holding a parameter
        or a buffer, and failed with an AttributeError here."""

    def constant_buffers(self) -> dict[str, Tensor]:
        """``gated_experts`` (T, 1, E_t): the experts task t's gate mixes, its own then the shared."""
        num_experts = self.num_tasks * self.num_task_experts + self.num_shared_experts
        shared = list(range(self.num_tasks * self.num_task_experts, num_experts))
        gated = [[t * self.num_task_experts + i for i in range(self.num_task_experts)] + shared
                 for t in range(self.num_tasks)]
        return {"gated_experts": torch.tensor(gated).unsqueeze(1)}

    def forward(self, inputs: Tensor) -> Tensor:
        tasks = self.num_tasks
        if inputs.dim() != 3 or inputs.shape[0] != tasks + 1:
            raise ValueError(f"inputs must have shape ({tasks + 1}, B, input_dim) (tasks, then shared); "
                             f"got {tuple(inputs.shape)}")
        _, batch, width = inputs.shape
        task_inputs, shared_input = inputs[:tasks], inputs[tasks]
        # Each expert's input, by expand (whose backward is a sum: no scatter, deterministic).
        expert_inputs = shared_input.expand(self.num_shared_experts, batch, width)
        if self.num_task_experts > 0:
            own = task_inputs.unsqueeze(1).expand(tasks, self.num_task_experts, batch, width)
            expert_inputs = torch.cat([own.flatten(0, 1), expert_inputs])
        experts = self.experts(expert_inputs)  # (E, B, H)
        gates = F.softmax(self.task_gates(task_inputs), dim=2)  # (T, B, E_t)
        if self.num_task_experts > 0:  # place them among all experts (the backward is a gather)
            gates = gates.new_zeros(tasks, batch, experts.shape[0]).scatter(
                2, self.gated_experts.expand(tasks, batch, -1), gates)
        if self.shared_gate is not None:
            gates = torch.cat([gates, F.softmax(self.shared_gate(shared_input), dim=1).unsqueeze(0)])
        return torch.einsum("tbe,ebh->tbh", gates, experts)


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
        expert_hidden = check_widths("expert_hidden", expert_hidden)
        self.input_dim, self.num_tasks = input_dim, num_tasks
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
        _check_input(x, self.input_dim)
        hidden = x.expand(self.num_tasks + 1, *x.shape)  # every task and the shared part read x
        for level in self.levels:
            hidden = level(hidden)
        return _logits(self.towers, hidden)


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


class MMoE(PLE):
    """Multi-gate mixture of experts: shared experts, one softmax gate and tower per task,
    y_t = tower_t(sum_e softmax(W_t x + b_t)_e expert_e(x)) (the paper's gates have no bias b_t).
    It is a CGC without task-specific experts."""

    def __init__(
        self,
        input_dim: int,
        num_tasks: int,
        num_experts: int = 4,
        expert_hidden: Sequence[int] = (64, 32),
        tower_hidden: Sequence[int] = (16,),
        dropout: float = 0.0,
    ) -> None:
        check_sizes(num_experts=num_experts)
        super().__init__(input_dim, num_tasks, 1, 0, num_experts, expert_hidden, tower_hidden, dropout)


def esmm_logits(ctr_logit: Tensor, cvr_logit: Tensor) -> Tensor:
    """The logit of pCTCVR = sigmoid(ctr_logit) * sigmoid(cvr_logit), computed in log space:
    log p - log(1 - p), with 1 - p = sigmoid(-a) + sigmoid(a) sigmoid(-b) summed as logarithms, so
    that it stays exact, finite and differentiable for logits of any size (log(1 - p) from p itself
    capped p below 1: every logit past ~16 gave the same 16.1, and almost no gradient)."""
    log_p = F.logsigmoid(ctr_logit) + F.logsigmoid(cvr_logit)
    log_not_p = torch.logaddexp(F.logsigmoid(-ctr_logit), F.logsigmoid(ctr_logit) + F.logsigmoid(-cvr_logit))
    return log_p - log_not_p


def _constants_beside_the_weights(model: MultiTaskModel, incompatible_keys: object) -> None:
    """After ``load_state_dict(sd, assign=True)`` into a model made on the meta device: the constants
    of its parts without tensors of their own (``DotInteraction``'s ``pick``) go where its weights are."""
    device = next((p.device for p in model.parameters() if not p.is_meta), None)
    for part in model.modules():
        if isinstance(part, ConstantBuffers):
            part.rebuild_meta_constants(device)


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
        check_bool("esmm", esmm)  # a truthy string ("no") turned ESMM on
        num_tasks = getattr(backbone, "num_tasks", None)
        if esmm and num_tasks is not None and num_tasks < 2:
            raise ValueError(f"esmm needs a backbone of at least 2 tasks (ctr, cvr); got num_tasks={num_tasks}")
        self.embedding = embedding
        self.interaction = interaction
        self.backbone = backbone
        self.esmm = esmm
        self.register_load_state_dict_post_hook(_constants_beside_the_weights)

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
