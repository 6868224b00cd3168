"""Recommender models in plain PyTorch, built from small modules that read like the papers' figures.

* ``embeddings.py``: the sparse id fields' embeddings (:class:`FieldEmbedding`) and the pairwise
  dot-product interaction (:class:`DotInteraction`);
* ``towers.py``: the multi-task backbones (:class:`SharedBottom`, :class:`MMoE`, :class:`CGC`,
  :class:`PLE`), ESMM's :func:`esmm_logits`, and :class:`MultiTaskModel`, which joins an embedding,
  an optional interaction and a backbone; same-shaped experts and towers run stacked
  (:class:`StackedLinear`), one batched matmul per layer.

Nothing here needs an extra. TorchRec tables that can be sharded (``TorchRecEmbedding``) are in
:mod:`mlloss.integrations.torchrec`; the losses the models are trained with are in :mod:`mlloss`.
"""

from .embeddings import DotInteraction, FieldEmbedding
from .towers import CGC, MMoE, PLE, ExtractionLevel, MultiTaskModel, SharedBottom, StackedLinear, esmm_logits, mlp

__all__ = [
    "CGC",
    "DotInteraction",
    "ExtractionLevel",
    "FieldEmbedding",
    "MMoE",
    "MultiTaskModel",
    "PLE",
    "SharedBottom",
    "StackedLinear",
    "esmm_logits",
    "mlp",
]
