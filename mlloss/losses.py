r"""The pairwise ranking losses users put in their models: AUC, LoA, LaA and PDAOM.

Every loss is a ``torch.nn.Module`` called as ``loss(scores, labels, groups=None)`` and returns a
scalar. Definitions are those of ``docs/loss-spec.md``; the arithmetic lives in ``mlloss.ops``.
After each call, ``loss.parts`` holds detached facts about the batch (per-label terms, valid-pair
counts) for logging, at no extra cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from . import _validation as check
from .distributed import gather_batch, partition, sum_partials
from .ops.ranking import PairTerm, ordinal_ranking_loss, zero_loss

# Aggregated labels are compared after rounding to this relative resolution, so that weighted sums
# of binary labels that are equal in exact arithmetic (0.1 + 0.2 and 0.3) form one level.
LEVEL_RESOLUTION = 2.0**-40


class _PairwiseLoss(nn.Module):
    """Options and checks shared by every pairwise loss."""

    def __init__(
        self,
        *,
        surrogate: str,
        margin: float,
        pairs: str,
        temperature: float | None,
        reduction: str,
        backend: str,
        cross_device: bool,
    ) -> None:
        super().__init__()
        self.surrogate = check.check_choice("surrogate", surrogate, check.SURROGATES)
        self.margin = check.check_margin(margin)
        self.pairs = check.check_choice("pairs", pairs, check.PAIR_SETS)
        self.temperature = check.check_temperature(temperature, self.pairs)
        self.reduction = check.check_choice("reduction", reduction, check.REDUCTIONS)
        self.backend = check.check_choice("backend", backend, check.BACKENDS)
        if self.backend == "exact" and self.pairs == "all" and self.surrogate == "logistic":
            raise ValueError(
                "backend='exact' needs a surrogate with a closed form ('exponential', 'squared', "
                "'hinge'); the logistic all-pairs sum has none: use backend='auto' or 'torch'"
            )
        if not isinstance(cross_device, bool):
            raise TypeError(f"cross_device must be a bool; got {cross_device!r}")
        self.cross_device = cross_device
        self.parts: dict[str, Tensor] = {}
        self.num_items = 0  # items in the last batch, over all ranks with cross_device=True

    def _pair_term(self, scores: Tensor, levels: Tensor, groups: Tensor | None, cost: str) -> PairTerm:
        # With cross_device, each rank computes its share of the groups' pairs and the shares are
        # summed (distributed.sum_partials); O(N) paths compute the whole gathered batch.
        term = ordinal_ranking_loss(
            scores,
            levels,
            groups,
            cost=cost,
            surrogate=self.surrogate,
            margin=self.margin,
            pairs=self.pairs,
            temperature=self.temperature,
            reduction=self.reduction,
            backend=self.backend,
            partition=partition() if self.cross_device else None,
        )
        return replace(term, loss=sum_partials(term.loss), partial=False) if term.partial else term

    def _checked_batch(self, scores: object, labels: object, groups: object) -> tuple[Tensor, Tensor, Tensor | None]:
        """Validated (scores (N,), labels (N, K) float64, groups (N,) or None), gathered across
        processes when ``cross_device=True`` (see ``mlloss.distributed``)."""
        scores = check.scores_vector(scores)
        labels = check.label_matrix(labels, scores.shape[0])
        groups = check.group_vector(groups, scores.shape[0])
        if self.cross_device:
            scores, labels, groups = gather_batch(scores, labels, groups)
        self.num_items = scores.shape[0]
        return scores, labels, groups

    def extra_repr(self) -> str:
        options = [f"surrogate={self.surrogate!r}", f"pairs={self.pairs!r}", f"reduction={self.reduction!r}"]
        if self.surrogate in ("hinge", "squared"):
            options.append(f"margin={self.margin}")
        if self.temperature is not None:
            options.append(f"temperature={self.temperature}")
        if self.backend != "auto":
            options.append(f"backend={self.backend!r}")
        if self.cross_device:
            options.append("cross_device=True")
        return ", ".join(options)


class AUCLoss(_PairwiseLoss):
    r"""Bipartite AUC surrogate: :math:`\frac{1}{|P|}\sum_{(i,j)\in P}\phi(s_i - s_j)`,
    P = {(i, j): y_i = 1, y_j = 0} (and g_i = g_j with ``groups``, reduced over groups).

    Args:
        surrogate: ``"logistic"`` (default), ``"hinge"``, ``"squared"`` or ``"exponential"``.
        margin: margin m of the hinge and squared surrogates.
        pairs: ``"all"`` valid pairs (default) or ``"hardest"``: per group the single
            max-violation pair phi(min positive score - max negative score) (DAOM; PDAOM with groups).
        temperature: with ``pairs="hardest"``, replaces min/max by log-mean-exp at this temperature.
        reduction: over groups with a valid pair, ``"mean"`` (default) or ``"sum"``.
        backend: ``"auto"`` (closed form when one exists, else the Triton kernel on CUDA and the
            blocked all-pairs path on the CPU), ``"exact"`` (closed forms only), ``"torch"``
            (blocked all-pairs, any device), ``"triton"`` (fused kernel; CUDA, or the CPU under
            ``TRITON_INTERPRET=1``).
        cross_device: take pairs across the processes of a distributed job: the loss (and, after
            DDP's gradient averaging, the parameter gradients) equal the single-process ones on
            the concatenation of the ranks' batches. Every rank must call the loss.

    ``forward(scores, labels, groups=None)``: scores (N,) or (N, 1); labels (N,) binary; groups (N,)
    integer ids (e.g. user ids, any order). A batch without a valid pair gives exactly 0.
    """

    def __init__(
        self,
        *,
        surrogate: str = "logistic",
        margin: float = 1.0,
        pairs: str = "all",
        temperature: float | None = None,
        reduction: str = "mean",
        backend: str = "auto",
        cross_device: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device,
        )

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None) -> Tensor:
        scores, labels, groups = self._checked_batch(scores, labels, groups)
        label = check.check_single_column(check.check_binary(labels), type(self).__name__)
        term = self._pair_term(scores, label, groups, "uniform")
        self.parts = {"valid_pairs": term.valid_pairs, "groups_with_pairs": term.groups_with_pairs}
        return term.loss


class PDAOMLoss(AUCLoss):
    r"""Per-user max-violation AUC loss of Sun et al. (PDAOM, Eq. 6):
    :math:`\sum_u \phi(\min_{y=1, g=u} s - \max_{y=0, g=u} s)`.

    Defaults follow the paper: exponential surrogate and a sum over users (``reduction="sum"``).
    Without ``groups`` this is DAOM (Eq. 5). The paper adds it to cross-entropy with weight lambda
    (Eq. 7): ``mlloss.build_loss("bce+pdaom", lam=...)``. With ``temperature`` the min and max
    become log-mean-exp (soft version). The paper feeds probabilities (sigmoid outputs) to it.
    """

    def __init__(
        self,
        *,
        surrogate: str = "exponential",
        margin: float = 1.0,
        temperature: float | None = None,
        reduction: str = "sum",
        backend: str = "auto",
        cross_device: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs="hardest", temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device,
        )


class LoALoss(_PairwiseLoss):
    r"""Loss aggregation: :math:`\sum_k a_k L_k`, L_k the AUC loss of label k alone
    (Lukasik et al. 2025, Sec. 5.1).

    Its Bayes-optimal scorer ranks by :math:`\sum_k \frac{a_k}{\pi_k(1-\pi_k)}\eta_k(x)`
    (Prop. 5.2), where :math:`\pi_k` is the prior of label k and :math:`\eta_k(x) = P(y_k=1|x)`:
    the most skewed label gets the largest effective weight and, with deterministic labels,
    dictates the ranking (Prop. 6.1). ``mlloss.label_dictatorship`` reports these weights.

    Args:
        weights: mixing weights a_k >= 0 (default all ones), or ``"balanced"``:
            a_k = pi_k (1 - pi_k), which makes every effective weight 1, so that the Bayes-optimal
            scorer is :math:`\sum_k \eta_k` like LaA's. The priors are ``priors`` if given, else a
            running estimate: the label means over every batch seen in training mode (the current
            one included), kept in the module's state dict.
        priors: label priors pi_k in (0, 1) for ``weights="balanced"``.
        surrogate, margin, pairs, temperature, reduction, backend, cross_device: as in ``AUCLoss``.
            With groups, each L_k is reduced over the groups where label k has a valid pair.

    ``forward(scores, labels, groups=None)``: labels (N, K) binary. ``parts["label_losses"]``
    holds the K terms L_k (unweighted).
    """

    def __init__(
        self,
        weights: Sequence[float] | Tensor | str | None = None,
        *,
        priors: Sequence[float] | Tensor | None = None,
        surrogate: str = "logistic",
        margin: float = 1.0,
        pairs: str = "all",
        temperature: float | None = None,
        reduction: str = "mean",
        backend: str = "auto",
        cross_device: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device,
        )
        self.balanced = isinstance(weights, str)
        if self.balanced and weights != "balanced":
            raise ValueError(f"weights must be a sequence of numbers, 'balanced' or None; got {weights!r}")
        self.weights = None if self.balanced else check.check_weights("weights", weights, strictly_positive=False)
        if self.weights is not None and not bool((self.weights > 0).any()):
            raise ValueError(f"weights must not all be zero; got {self.weights.tolist()}")
        if priors is not None and not self.balanced:
            raise ValueError("priors are only used with weights='balanced'")
        self.priors = check.check_weights("priors", priors, strictly_positive=True)
        if self.priors is not None and bool((self.priors >= 1).any()):
            raise ValueError(f"priors must lie in (0, 1); got {self.priors.tolist()}")
        # Running prior estimate for weights="balanced": positives per label and items seen.
        self.register_buffer("seen_positives", torch.zeros(0, dtype=torch.float64))
        self.register_buffer("seen_items", torch.zeros((), dtype=torch.float64))

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None) -> Tensor:
        scores, labels, groups = self._checked_batch(scores, labels, groups)
        check.check_binary(labels)
        self._update_running_priors(labels)
        mixing = self.mixing_weights(labels)
        terms = [
            self._pair_term(scores, labels[:, k], groups, "uniform") if mixing[k] > 0 else None
            for k in range(labels.shape[1])
        ]
        zero = zero_loss(scores)
        label_losses = [zero if term is None else term.loss for term in terms]
        loss = sum((float(a) * term for a, term in zip(mixing, label_losses)), zero)
        self.parts = {
            "label_losses": torch.stack(label_losses).detach(),
            "mixing_weights": mixing.to(torch.float32),
            "valid_pairs": torch.stack(
                [torch.zeros((), dtype=torch.float64) if t is None else t.valid_pairs.cpu() for t in terms]
            ),
        }
        return loss

    def mixing_weights(self, labels: Tensor) -> Tensor:
        """The a_k for a batch of (N, K) labels, float64 on the CPU (no state is changed)."""
        num_labels = labels.shape[1]
        if not self.balanced:
            weights = torch.ones(num_labels, dtype=torch.float64) if self.weights is None else self.weights
            check.check_weights_length("weights", weights, num_labels)
            return weights
        if self.priors is not None:
            priors = self.priors
        elif self.seen_items > 0:
            priors = (self.seen_positives / self.seen_items).cpu()
        else:  # nothing seen yet (evaluation before training): the batch's own label means
            priors = labels.detach().to(torch.float64).mean(0).cpu()
        check.check_weights_length("priors", priors, num_labels)
        return priors * (1 - priors)

    def _update_running_priors(self, labels: Tensor) -> None:
        """Add a training batch to the running label means of weights='balanced'."""
        if not (self.balanced and self.priors is None and self.training):
            return
        positives = labels.detach().to(torch.float64).sum(0).to(self.seen_items.device)
        if self.seen_positives.numel() == 0:
            self.seen_positives = torch.zeros_like(positives)
        elif self.seen_positives.numel() != positives.numel():
            raise ValueError(
                f"labels have {positives.numel()} columns but the running priors were estimated "
                f"for {self.seen_positives.numel()}"
            )
        self.seen_positives += positives
        self.seen_items += labels.shape[0]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The running priors have K entries, unknown until the first batch: take the saved size.
        key = prefix + "seen_positives"
        if key in state_dict:
            self.seen_positives = torch.zeros_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class LaALoss(_PairwiseLoss):
    r"""Label aggregation: a multipartite AUC loss on the aggregated label
    :math:`\bar y_i = \sum_k w_k y_{ik}` (Lukasik et al. 2025, Sec. 5.2):
    :math:`\sum_{\bar y_i > \bar y_j} c_{ij}\phi(s_i - s_j) / \sum c_{ij}`.

    With ``cost="linear"`` (default), :math:`c_{ij} = \bar y_i - \bar y_j` and the Bayes-optimal
    scorer is :math:`\sum_k w_k\eta_k(x)` whatever the label priors (Prop. 5.4): no label dictates.
    ``cost="uniform"`` (c = 1) is Prop. 5.3's variant, not Pareto-optimal in general.

    Args:
        weights: label weights w_k > 0 (default all ones).
        cost: ``"linear"`` or ``"uniform"``.
        surrogate, margin, pairs, temperature, reduction, backend, cross_device: as in ``AUCLoss``.

    ``forward(scores, labels, groups=None)``: labels (N, K) binary, or one ordinal column (N,) /
    (N, 1) such as a 0..4 rating, whose values are the levels.
    """

    def __init__(
        self,
        weights: Sequence[float] | Tensor | None = None,
        *,
        cost: str = "linear",
        surrogate: str = "logistic",
        margin: float = 1.0,
        pairs: str = "all",
        temperature: float | None = None,
        reduction: str = "mean",
        backend: str = "auto",
        cross_device: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device,
        )
        self.weights = check.check_weights("weights", weights, strictly_positive=True)
        self.cost = check.check_choice("cost", cost, check.COSTS)

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None) -> Tensor:
        scores, labels, groups = self._checked_batch(scores, labels, groups)
        term = self._pair_term(scores, self.aggregate(labels), groups, self.cost)
        self.parts = {"valid_pairs": term.valid_pairs, "groups_with_pairs": term.groups_with_pairs}
        return term.loss

    def aggregate(self, labels: Tensor) -> Tensor:
        """The aggregated label ybar (N,) float64 from (N, K) float64 labels."""
        num_labels = labels.shape[1]
        weights = torch.ones(num_labels, dtype=torch.float64) if self.weights is None else self.weights
        check.check_weights_length("weights", weights, num_labels)
        if num_labels == 1:
            return labels[:, 0] * float(weights[0])  # binary or already ordinal
        check.check_binary(labels, "labels with several columns")
        aggregated = labels @ weights.to(labels.device)
        resolution = float(weights.sum()) * LEVEL_RESOLUTION
        return torch.round(aggregated / resolution) * resolution
