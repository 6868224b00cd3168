"""mlloss: exact, memory-safe pairwise ranking losses for recommender models.

Losses (``torch.nn.Module``, ``loss(scores, labels, groups=None) -> scalar``):
``AUCLoss``, ``LoALoss`` (loss aggregation), ``LaALoss`` (label aggregation), ``PDAOMLoss``
(per-user max-violation). ``build_loss(name, ...)`` builds any of them, or ``"bce+pdaom"`` and
friends, by name. ``label_dictatorship(labels, weights)`` reports which label a loss-aggregated
ranking obeys. Definitions: ``docs/loss-spec.md``.

Beside the losses: ``mlloss.metrics`` (exact AUC, GAUC, multipartite AUC), ``mlloss.models``
(embeddings and multi-task towers), ``mlloss.data`` (impression logs, group-keeping batches),
``mlloss.checkpointing`` (crash-safe checkpoints) and, imported only when asked for,
``mlloss.integrations`` (Lightning and TorchRec, one module each). ``import mlloss`` imports no
framework; docs/architecture.md draws the layers.
"""

from . import _extras
from .diagnostics import DictatorshipReport, label_dictatorship
from .bce import BCELoss, BCEPlusRanking
from .losses import AUCLoss, LaALoss, LoALoss, PDAOMLoss
from .ops.replay import graph_replay_enabled, set_graph_replay
from .registry import build_loss, register_loss

# A source checkout keeps the kernels in the top-level kernels/ folder: import it as mlloss.kernels.
_extras.link_source_tree_kernels(__name__, __file__)

__version__ = "0.1.0"

__all__ = [
    "AUCLoss",
    "BCELoss",
    "BCEPlusRanking",
    "DictatorshipReport",
    "LaALoss",
    "LoALoss",
    "PDAOMLoss",
    "build_loss",
    "graph_replay_enabled",
    "label_dictatorship",
    "register_loss",
    "set_graph_replay",
]
