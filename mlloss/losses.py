r"""The pairwise ranking losses users put in their models: AUC, LoA, LaA and PDAOM.

Every loss is a ``torch.nn.Module`` called as ``loss(scores, labels, groups=None, mask=None)`` and
returns a scalar; ``mask`` (N,) bool leaves out the items that are False (``ops.dispatch``).
Definitions are those of ``docs/loss-spec.md``; the arithmetic lives in ``mlloss.ops``.
After each call, ``loss.parts`` holds detached facts about the batch (per-label terms, valid-pair
counts) for logging, at no extra cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from . import _validation as check
from ._constants import ConstantBuffers
from .distributed import gather_batch, gather_batch_with_rows, partition, refusing_together, share_failed, sum_shares
from .ops.bce_ranking import bce_plus_pair_loss
from .ops.dispatch import (CLOSED_FORMS, LEVEL_RESOLUTION, PairLossResult, PairStats, pair_loss, resolve_tier,
                           splits_pair_work)
from .parts import LossParts, keep_call_state, pair_parts
from .surrogates import USES_MARGIN

__all__ = ["AUCLoss", "LEVEL_RESOLUTION", "LaALoss", "LoALoss", "PDAOMLoss", "pair_parts"]


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
        validate_args: bool,
        contiguous_groups: bool,
    ) -> None:
        super().__init__()
        self.surrogate = check.check_choice("surrogate", surrogate, check.SURROGATES)
        self.margin = check.check_margin(margin)
        self.pairs = check.check_choice("pairs", pairs, check.PAIR_SETS)
        self.temperature = check.check_temperature(temperature, self.pairs)
        self.reduction = check.check_choice("reduction", reduction, check.REDUCTIONS)
        self.backend = check.check_choice("backend", backend, check.BACKENDS)
        if self.backend == "exact" and self.pairs == "all" and self.surrogate not in CLOSED_FORMS:
            raise ValueError(
                f"backend='exact' needs a surrogate with a closed form ({', '.join(map(repr, CLOSED_FORMS))}); "
                f"the {self.surrogate} all-pairs sum has none: use backend='auto' or 'torch'"
            )
        self.cross_device = check.check_bool("cross_device", cross_device)
        self.validate_args = check.check_bool("validate_args", validate_args)
        self.contiguous_groups = check.check_bool("contiguous_groups", contiguous_groups)
        self.parts = LossParts()  # batch facts of the last call, for logging (mlloss.parts)
        self._counted: int | Tensor = 0  # the last batch's item count, or its (gathered) mask
        self._own_rows: tuple[int, int] | None = None  # this rank's positions in a gathered batch

    def _pair_loss(
        self,
        scores: Tensor,
        labels: Tensor,
        groups: Tensor | None,
        mask: Tensor | None,
        *,
        mixing: Tensor | None = None,
        label_weights: list[float] | None = None,
        cost: str = "uniform",
        real_levels: bool = False,
    ) -> PairLossResult:
        # With cross_device, each rank may compute only its share of the groups' pairs; the shares
        # are then summed (distributed.sum_shares), and a share that raises makes every rank raise.
        shares = partition() if self.cross_device else None
        splits = shares is not None and splits_pair_work(
            resolve_tier(self.backend, self.surrogate, self.pairs, scores.device, scores.shape[0],
                         contiguous_groups=self.contiguous_groups and groups is not None),
            self.pairs, groups, shares[1],
        )
        try:
            result = pair_loss(scores, labels, groups, mask, mixing=mixing, label_weights=label_weights, cost=cost,
                               real_levels=real_levels, partition=shares, **self._pair_options())
        except Exception as error:
            if splits:  # the other ranks wait in sum_shares for this rank's share
                num_problems = 1 if label_weights is not None else labels.shape[1]  # LaA: one; else one per label
                share_failed(error, num_problems, scores.device)
            if isinstance(error, ValueError) and self._own_rows is not None:
                raise self._naming_own_rows(error) from error
            raise
        if not result.partial:
            return result
        # The problems' losses (LoA's parts) are this rank's shares too; the valid pairs and the
        # groups with pairs are counted on the whole gathered batch already.
        loss, problem_losses = sum_shares(result.loss, result.problem_losses)
        stats = torch.cat([problem_losses, result.stats[result.num_problems :]])
        return replace(result, loss=loss, stats=stats, partial=False)

    def _pair_options(self) -> dict:
        """The loss's options as ``ops.dispatch.pair_loss`` takes them."""
        return {"surrogate": self.surrogate, "margin": self.margin, "pairs": self.pairs, "temperature": self.temperature,
                "reduction": self.reduction, "backend": self.backend, "validate": self.validate_args,
                "contiguous_groups": self.contiguous_groups}

    def _naming_own_rows(self, error: ValueError) -> ValueError:
        """The data check's ``error``, which names an entry of the gathered batch, with the positions
        of this rank's items in it."""
        assert self._own_rows is not None  # the caller's condition
        start, end = self._own_rows
        own = f"this rank's items are positions {start} to {end - 1}" if end > start else "this rank has no items"
        return ValueError(
            f"{error} (cross_device=True: positions count in the batch gathered from every rank in rank order; {own})"
        )

    def _checked_batch(
        self, scores: object, labels: object, groups: object, mask: object = None, *, score_columns: bool = False
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """(scores (N,), labels (N, K) in their own dtype, groups (N,) int32 or int64 (``check.group_vector``) or None, mask (N,)
        bool or None), shapes and dtypes checked, gathered across processes when
        ``cross_device=True`` (see ``mlloss.distributed``). The values are checked by the op
        (``validate_args``), which also sets the items outside the mask apart. ``score_columns``:
        scores (N, K) (``AUCLoss.task_columns``)."""
        with refusing_together(self.cross_device, getattr(scores, "device", None)):
            scores = check.score_matrix(scores) if score_columns else check.scores_vector(scores, finite=False)
            labels = check.label_columns(labels, scores.shape[0])
            groups = check.group_vector(groups, scores.shape[0])
            mask = check.mask_vector(mask, scores)
            check.require_scores_device(scores, labels=labels, groups=groups)
        own_rows = None
        if self.cross_device:
            (scores, labels, groups, mask), own_rows = gather_batch_with_rows(scores, labels, groups, mask)
        check.check_loss_items(scores.shape[0])  # before any work on the batch (balanced LoA's label counts)
        keep_call_state(self, _own_rows=own_rows, _counted=scores.shape[0] if mask is None else mask)
        return scores, labels, groups, mask

    @property
    def num_items(self) -> int | Tensor:
        """Items in the last batch, over all ranks with ``cross_device=True``: an int, or with a
        mask the number of its True entries as a 0-dim tensor on its device (no host sync)."""
        return self._counted if isinstance(self._counted, int) else self._counted.sum()

    def extra_repr(self) -> str:
        options = [f"surrogate={self.surrogate!r}", f"pairs={self.pairs!r}", f"reduction={self.reduction!r}"]
        if self.surrogate in USES_MARGIN:
            options.append(f"margin={self.margin}")
        if self.temperature is not None:
            options.append(f"temperature={self.temperature}")
        if self.backend != "auto":
            options.append(f"backend={self.backend!r}")
        if self.cross_device:
            options.append("cross_device=True")
        if not self.validate_args:
            options.append("validate_args=False")
        if self.contiguous_groups:
            options.append("contiguous_groups=True")
        return ", ".join(options)


def _listed(values: Tensor) -> list[float]:
    return [float(value) for value in values.tolist()]


def _unit_weights(num_labels: int) -> Tensor:
    return torch.ones(num_labels, dtype=torch.float64)


class AUCLoss(_PairwiseLoss):
    r"""Bipartite AUC surrogate: :math:`\frac{1}{|P|}\sum_{(i,j)\in P}\phi(s_i - s_j)`,
    P = {(i, j): y_i = 1, y_j = 0} (and g_i = g_j with ``groups``, reduced over groups).

    Args:
        surrogate: ``"logistic"`` (default), ``"hinge"``, ``"squared"`` or ``"exponential"``.
        margin: margin m of the hinge and squared surrogates.
        pairs: ``"all"`` valid pairs (default) or ``"hardest"``: per group the single
            max-violation pair phi(min positive score - max negative score) (DAOM; PDAOM with groups).
        temperature: with ``pairs="hardest"``, replaces min/max by log-mean-exp at this temperature.
            Large temperatures tend to the cell's mean; past about 1e8 the log-mean-exp loses
            precision (relative error about tau x 1e-16, computed in float64 on every path).
        reduction: over groups with a valid pair, ``"mean"`` (default) or ``"sum"``.
        backend: ``"auto"`` (closed form when one exists, else the Triton kernel on CUDA and the
            blocked all-pairs path on the CPU; on CUDA batches of at most 2,048 items, 16,384
            with ``contiguous_groups``, always take the Triton kernels, which never wait for the
            device), ``"exact"`` (the closed forms where they are the cheaper exact path: in
            users of a few items, or with a level per few items, e.g. a real-valued ``LaALoss``
            label, they give way to the blocked sum, as exact and then faster), ``"torch"`` (blocked all-pairs, any device),
            ``"triton"`` (fused kernel; CUDA, or the CPU under ``TRITON_INTERPRET=1``).
        cross_device: take pairs across the processes of a distributed job: the loss (and, after
            DDP's gradient averaging, the parameter gradients) equal the single-process ones on
            the concatenation of the ranks' batches. Every rank must call the loss. An error on
            one rank (its own batch's checks, or its share of the pairs) is raised on every rank.
        validate_args: check the batch's values (finite scores, 0/1 labels) and that the loss
            is finite, raising ``ValueError`` / ``OverflowError`` that name the offending entry.
            On the Triton kernels the check is fused into their launches and read once per call:
            the call's only host synchronisation. ``False`` removes it (e.g. to capture a step in
            a ``torch.cuda.CUDAGraph``). The closed forms (``"exact"``, which ``"auto"`` picks
            for the exponential, squared and hinge surrogates above the sizes ``backend`` names) read sizes on
            the host whatever this says: for a captured step, give a closed-form surrogate
            ``backend="triton"``. Shapes, dtypes and arguments are always checked.
        contiguous_groups: ``True`` when each group's items are consecutive rows of the batch
            (a user-grouped sampler's batches, such as ``mlloss.data.TensorBatches``; a jagged
            batch's sessions): a group is then a *run* of consecutive equal ids, and an id that
            comes back after another id's run starts another group. The Triton kernels' layout
            then keeps the groups where they are instead of sorting the ids (on CUDA a sort is
            about ten launches and their scratch memory a call). Same loss as ``False`` on such
            batches, up to the order of the float sums over the groups. With ``cross_device``
            the runs are those of the gathered batch (the ranks' batches in rank order): give it
            only when no group has rows on two ranks. The runs are read on every row, left out
            by a ``mask`` or not: a left-out row whose id differs from its neighbours' ends a run
            (put filler rows after the real ones, as ``TensorBatches(fixed_size=True)`` does, or
            give them a neighbour's id).

    ``forward(scores, labels, groups=None, mask=None)``: scores (N,) or (N, 1); labels (N,) binary;
    groups (N,) integer ids (e.g. user ids, any order unless ``contiguous_groups``); mask (N,) bool, True for the items that
    count: the others (a fixed-size batch's filler rows) take part in no pair, whatever their
    values, and get a zero gradient. A batch without a valid pair gives exactly 0.

    Task columns (a multi-task model's heads): scores (N, K) and labels (N, K), one binary label
    column per score column, give the sum over the columns of each column's loss on its own
    scores, with the same groups and mask, in one call (the kernels' launches and the host's
    work of one loss, not K): ``loss(logits[:, :2], labels)`` for click and purchase heads.
    ``parts`` then also holds ``label_loss/k``, ``mixing_weight/k`` and ``valid_pairs/k`` per
    column (see ``mlloss.parts``). Not with ``cross_device=True``: call it once per column there.
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
        validate_args: bool = True,
        contiguous_groups: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device, validate_args=validate_args,
            contiguous_groups=contiguous_groups,
        )

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        if check.is_score_matrix(scores) and isinstance(labels, Tensor):
            return self.task_columns(scores, labels, groups, mask).loss
        scores, labels, groups, mask = self._checked_batch(scores, labels, groups, mask)
        check.require_single_column(labels, type(self).__name__)
        result = self._pair_loss(scores, labels, groups, mask)
        keep_call_state(self, parts=pair_parts(result))
        return result.loss

    def task_columns(
        self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None,
        weights: Tensor | None = None,
    ) -> PairLossResult:
        """The loss of each column of ``scores`` (N, K) for the same column of ``labels`` (N, K),
        in one call: ``result.loss`` is their sum (weighted by ``weights``, (K,) float64 on the
        scores' device, if given; what ``forward`` returns for (N, K) scores, and
        ``BCEPlusRanking``'s ``lam``-weighted ranking term), ``result.problem_losses`` each
        column's (unweighted, detached)."""
        # refused together: with cross_device the other ranks are in the gather by then (they raise too)
        with refusing_together(self.cross_device, getattr(scores, "device", None)):
            if isinstance(labels, Tensor) and labels.dim() == 1:  # a transposed score vector, or one label for K columns
                raise ValueError(
                    f"{type(self).__name__} takes scores of shape (N,) or (N, 1), or (N, K) with labels of shape "
                    f"(N, K), one binary label column per score column; got scores of shape "
                    f"{tuple(getattr(scores, 'shape', ()))} and labels of shape {tuple(labels.shape)}"
                )
            if self.cross_device:
                raise ValueError(
                    f"{type(self).__name__}(cross_device=True) takes one score column per call; got scores of shape "
                    f"{tuple(getattr(scores, 'shape', ()))}: call it once per column"
                )
        scores, labels, groups, mask = self._checked_batch(scores, labels, groups, mask, score_columns=True)
        if labels.shape[1] != scores.shape[1]:
            raise ValueError(
                f"{type(self).__name__} with scores of shape (N, K) takes one binary label column per score column; "
                f"got scores of shape {tuple(scores.shape)} and labels of shape {tuple(labels.shape)}"
            )
        if weights is not None:
            check.require_tensor(weights, "weights")
            if tuple(weights.shape) != (scores.shape[1],):
                raise ValueError(f"weights must have one entry per score column, shape ({scores.shape[1]},); "
                                 f"got {tuple(weights.shape)}")
            weights = weights.to(device=scores.device, dtype=torch.float64)  # no op when it is already
        result = self._pair_loss(scores, labels, groups, mask, mixing=weights)
        names = [str(k) for k in range(scores.shape[1])]
        keep_call_state(self, parts=pair_parts(result, label_names=names, mixing=weights))
        return result

    def _plus_cross_entropy(
        self, scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None, *,
        weights: Tensor | None, lam: float, probabilities: bool, sigmoid: bool, summed: bool, validate_bce: bool,
    ) -> tuple[Tensor, PairStats, Tensor]:
        """``BCEPlusRanking``'s objective with this loss as its ranking term, in one op
        (``ops.bce_ranking``; its arguments): (the objective, this loss's statistics, the per-task
        cross-entropies) of (N, K) logits and labels, checked and with the ``parts`` of
        ``task_columns`` (of ``forward`` for K = 1). One process's batch: not ``cross_device``."""
        scores, labels, groups, mask = self._checked_batch(scores, labels, groups, mask, score_columns=True)
        loss, stats, cross_entropies = bce_plus_pair_loss(
            scores, labels, groups, mask, mixing=weights, lam=lam, probabilities=probabilities, sigmoid=sigmoid,
            summed=summed, validate_bce=validate_bce, **self._pair_options())
        facts = PairStats(stats)
        names = [str(k) for k in range(scores.shape[1])] if scores.shape[1] > 1 else None
        keep_call_state(self, parts=pair_parts(facts, label_names=names, mixing=weights))
        return loss, facts, cross_entropies


class PDAOMLoss(AUCLoss):
    r"""Per-user max-violation AUC loss of Sun et al. (PDAOM, Eq. 6):
    :math:`\sum_u \phi(\min_{y=1, g=u} s - \max_{y=0, g=u} s)`.

    Defaults follow the paper: exponential surrogate and a sum over users (``reduction="sum"``).
    Without ``groups`` this is DAOM (Eq. 5). The paper adds it to cross-entropy with weight lambda
    (Eq. 7): ``mlloss.build_loss("bce+pdaom", lam=...)``. With ``temperature`` the min and max
    become log-mean-exp (soft version). The paper feeds probabilities (sigmoid outputs) to it.
    Like ``AUCLoss`` it takes a multi-task model's (N, K) task columns in one call.
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
        validate_args: bool = True,
        contiguous_groups: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs="hardest", temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device, validate_args=validate_args,
            contiguous_groups=contiguous_groups,
        )


class LoALoss(_PairwiseLoss, ConstantBuffers):
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
            one included), kept in the module's state dict (as buffers, which DDP broadcasts
            from rank 0 before each forward: each rank's own counts are lost unless
            ``cross_device``, where every rank counts the gathered batch: see docs/lightning.md).
        priors: label priors pi_k in (0, 1) for ``weights="balanced"``.
        num_labels: K, the number of label columns every batch must have. For
            ``weights="balanced"`` without ``priors`` it sizes the running estimate at
            construction; without it the estimate is sized by the first batch, which makes a
            ``torch.compile``-d step compile once more after that batch (and, compiled, its first
            call must not run under ``torch.inference_mode`` in training mode: the counts it
            sizes would be inference tensors, which the next step cannot update). ``num_labels``,
            ``weights``, ``priors`` and ``label_names`` must agree on K where they say it.
        label_names: names of the K labels in ``parts`` (``label_loss/click``); default their index.
        surrogate, margin, pairs, temperature, reduction, backend, cross_device, validate_args,
            contiguous_groups: as in ``AUCLoss``. With groups, each L_k is reduced over the groups where label k has a valid pair.

    ``forward(scores, labels, groups=None, mask=None)``: labels (N, K) binary; ``mask`` as in
    ``AUCLoss`` (the balanced priors count only the items of the mask). ``parts["label_loss/k"]``
    holds the term L_k (unweighted) of label k (see ``mlloss.parts``).
    """

    constants_keep_dtype = True  # float64 weights and priors (see _apply)
    # Buffers (constant_buffers and the running priors' counts), typed for the readers below.
    weights: Tensor | None
    priors: Tensor | None
    seen_positives: Tensor
    seen_items: Tensor

    def __init__(
        self,
        weights: Sequence[float] | Tensor | str | None = None,
        *,
        priors: Sequence[float] | Tensor | None = None,
        num_labels: int | None = None,
        label_names: Sequence[str] | None = None,
        surrogate: str = "logistic",
        margin: float = 1.0,
        pairs: str = "all",
        temperature: float | None = None,
        reduction: str = "mean",
        backend: str = "auto",
        cross_device: bool = False,
        validate_args: bool = True,
        contiguous_groups: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device, validate_args=validate_args,
            contiguous_groups=contiguous_groups,
        )
        self.balanced = isinstance(weights, str)
        if self.balanced and weights != "balanced":
            raise ValueError(f"weights must be a sequence of numbers, 'balanced' or None; got {weights!r}")
        fixed = None if self.balanced else check.check_weights("weights", weights, strictly_positive=False)
        if fixed is not None and not bool((fixed > 0).any()):
            raise ValueError(f"weights must not all be zero; got {fixed.tolist()}")
        if priors is not None and not self.balanced:
            raise ValueError("priors are only used with weights='balanced'")
        given_priors = check.check_weights("priors", priors, strictly_positive=True)
        if given_priors is not None and bool((given_priors >= 1).any()):
            raise ValueError(f"priors must lie in (0, 1); got {given_priors.tolist()}")
        # Constants as buffers: they follow the module to the device and cost no copy per call, and
        # every move rebuilds them from copies of the values (ConstantBuffers), in float64.
        self._given = {name: None if value is None else value.clone()
                       for name, value in (("weights", fixed), ("priors", given_priors))}
        self.register_constant_buffers()
        if num_labels is not None:
            num_labels = check.check_int("num_labels", num_labels, minimum=1, requirement="a positive int or None")
            for name, given in (("weights", fixed), ("priors", given_priors)):
                if given is not None and given.numel() != num_labels:
                    raise ValueError(f"{name} has {given.numel()} entries but num_labels={num_labels}; got {name}={given.tolist()}")
        self.label_names = check.check_label_names("label_names", label_names)
        # K, where the arguments tell it, must be one number (each batch's labels then have K columns)
        sizes = {name: size for name, size in (
            ("num_labels", num_labels), ("weights", None if fixed is None else fixed.numel()),
            ("priors", None if given_priors is None else given_priors.numel()),
            ("label_names", None if self.label_names is None else len(self.label_names))) if size is not None}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"num_labels, weights, priors and label_names must agree on the number of labels; got {sizes}")
        self.num_labels = num_labels
        # Running prior estimate for weights="balanced": positives per label and items seen.
        self.register_buffer("seen_positives", torch.zeros(num_labels or 0, dtype=torch.float64))
        self.register_buffer("seen_items", torch.zeros((), dtype=torch.float64))

    def extra_repr(self) -> str:
        options = []
        if self.balanced:
            options.append("weights='balanced'")
        elif self.weights is not None:
            options.append(f"weights={_listed(self.weights)}")
        if self.priors is not None:
            options.append(f"priors={_listed(self.priors)}")
        if self.label_names is not None:
            options.append(f"label_names={list(self.label_names)}")
        return ", ".join(options + [super().extra_repr()])

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        scores, labels, groups, mask = self._checked_batch(scores, labels, groups, mask)
        if self.label_names is not None and len(self.label_names) != labels.shape[1]:
            raise ValueError(
                f"label_names has {len(self.label_names)} names but labels have {labels.shape[1]} columns; "
                f"got label_names={self.label_names}"
            )
        # the weights and the running priors check their own lengths (``_mixing``, ``_counts_with``)
        if self.num_labels is not None and self.weights is None and not self.balanced and labels.shape[1] != self.num_labels:
            raise ValueError(f"labels have {labels.shape[1]} columns but num_labels={self.num_labels}; "
                             f"got labels of shape {tuple(labels.shape)}")
        num_items = self.num_items if self.balanced else None  # the balanced priors' denominator
        # labels are data: counted without their autograd history (labels built from tensors that
        # require grad would otherwise chain every step's graph into the running counts)
        counted, counts = labels.detach() if labels.requires_grad else labels, None
        if num_items is not None:
            if mask is not None:  # the priors count the mask's items: the others' labels become 0
                counted = counted.masked_fill(~mask[:, None], 0)
            counts = self._counts_with(counted, num_items)
        mixing = self._mixing(counted, num_items, counts)
        result = self._pair_loss(scores, labels, groups, mask, mixing=mixing)
        if counts is not None:  # stored once the batch is accepted: one the data check refuses is not counted
            self._store_counts(*counts)
        names = self.label_names or tuple(str(k) for k in range(labels.shape[1]))
        keep_call_state(self, parts=pair_parts(result, label_names=names, mixing=mixing))
        return result.loss

    def mixing_weights(self, labels: Tensor) -> Tensor:
        """The a_k ``forward`` would use for a batch of (N, K) labels, float64 on the CPU (no
        state is changed: in training mode, the running priors with this batch added, as
        ``forward`` adds it, then restored). With ``cross_device=True`` the labels are this
        rank's, gathered from every rank as ``forward`` gathers them: a collective, which every
        rank calls, and all get the same a_k."""
        with refusing_together(self.cross_device, getattr(labels, "device", None)):
            labels = check.label_columns(labels, None).detach()
        if self.cross_device:  # the scores are a placeholder: only the labels are read
            _, labels, _, _ = gather_batch(labels.new_zeros(labels.shape[0], dtype=torch.float32), labels, None)
        mixing = self._mixing(labels, None, self._counts_with(labels, labels.shape[0]))
        return _unit_weights(labels.shape[1]) if mixing is None else mixing.cpu()

    def _mixing(
        self, labels: Tensor, num_items: int | Tensor | None = None, counts: tuple[Tensor, Tensor] | None = None
    ) -> Tensor | None:
        """The a_k (K,) float64 on the labels' device for (N, K) labels, of which ``num_items``
        count (default all; masked rows hold zeros); None for all ones. ``counts``: the running
        counts with this batch added (``_counts_with``), in training mode."""
        num_labels = labels.shape[1]
        if not self.balanced:
            if self.weights is None:
                return None
            check.check_weights_length("weights", self.weights, num_labels)
            return self.weights.to(labels.device)  # no copy once the module is on that device
        if self.priors is not None:
            priors = self.priors.to(labels.device)
        # Label means over at least one item: a batch (or a first training batch) whose mask keeps
        # nothing has prior 0, a_k = 0, and no valid pair: the loss is 0, not 0/0 = NaN.
        elif self.training:
            assert counts is not None  # forward and mixing_weights pass them in training mode
            positives, items = counts  # this batch included
            priors = (positives / items.clamp(min=1)).to(labels.device)
        else:  # evaluation: the running means once training has seen a batch, else this batch's
            batch = labels.to(torch.float64).sum(0) / check.at_least_one(labels.shape[0] if num_items is None else num_items)
            if self.seen_positives.numel() == 0:
                priors = batch
            else:
                running = (self.seen_positives / self.seen_items.clamp(min=1)).to(labels.device)
                priors = torch.where(self.seen_items.to(labels.device) > 0, running, batch)
        check.check_weights_length("priors", priors, num_labels)
        return torch.addcmul(priors, priors, priors, value=-1)  # pi (1 - pi)

    def _counts_with(self, labels: Tensor, num_items: int | Tensor) -> tuple[Tensor, Tensor] | None:
        """The running counts of weights='balanced' (positives per label, items) with a training
        batch of ``num_items`` counted items (masked rows hold zeros) added, as new tensors (stored
        by ``_store_counts``); None when there are no running priors to update."""
        if not (self.balanced and self.priors is None and self.training):
            return None
        if not torch.compiler.is_compiling() and torch.is_inference_mode_enabled():  # training mode under inference_mode
            # The new counts would be inference tensors, which no later in-place write may touch
            # (load_state_dict, DDP's buffer broadcast): they are built as normal tensors.
            with torch.inference_mode(False):
                return self._counts_with(labels, num_items)
        positives = labels.sum(0, dtype=torch.float64).to(self.seen_items.device)
        # Two comparisons, not ``seen not in (0, K)``: under torch.compile(dynamic=True) the sizes
        # are symbols, and Dynamo 2.11 took the ``in`` for false with both sizes 2.
        seen = self.seen_positives.numel()
        if seen != 0 and seen != positives.numel():
            raise ValueError(
                f"labels have {positives.numel()} columns but the running priors were estimated "
                f"for {seen} (num_labels, or the first training batch, or a "
                f"loaded state dict); got labels of shape {tuple(labels.shape)}"
            )
        if self.seen_positives.numel():  # else the first batch, which sizes them
            positives = self.seen_positives + positives
        items = self.seen_items + (num_items.to(self.seen_items.device) if isinstance(num_items, Tensor) else num_items)
        return positives, items

    def _store_counts(self, positives: Tensor, items: Tensor) -> None:
        """Keep ``_counts_with``'s counts, in place: a step captured in a CUDA graph (or compiled
        with mode="reduce-overhead") then adds each replay's batch to the buffers the graph reads.
        (Assigned, the graph would go on reading the counts of its capture.) Written by indexing, not
        ``copy_``: torch.compile (2.13, CPU) dropped a ``copy_`` or ``add_`` into the 0-dim float64
        ``seen_items`` (tests/test_compile.py)."""
        if self.seen_positives.numel() == positives.numel():
            self.seen_positives[...] = positives
        else:
            self.seen_positives = positives
        self.seen_items[...] = items

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The running priors have K entries, unknown until the first batch: an unsized module takes
        # the saved size (on this module's device, in float64, whatever the checkpoint's
        # map_location); a sized one (num_labels, or a batch seen) refuses another K as torch does.
        key = prefix + "seen_positives"
        if key in state_dict and self.seen_positives.numel() == 0:
            self.seen_positives = self.seen_items.new_zeros(state_dict[key].shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def constant_buffers(self) -> dict[str, Tensor | None]:
        return self._given

    def _apply(self, fn, recurse=True):
        # Every buffer follows the module to a device but stays float64: .half() or a bf16 precision
        # plugin would round the weights and make the item count inf after 65,504 items (float16),
        # the priors 0 and the loss silently 0. The constants (weights, priors) are rebuilt by
        # ConstantBuffers; the running counts, materialised from the meta device (``to_empty``: FSDP's
        # deferred init, Lightning's empty_init), start at zero as a new module's do instead of
        # holding uninitialised memory (a checkpoint loaded next restores them).
        counts = {"seen_positives": self.seen_positives, "seen_items": self.seen_items}
        super()._apply(fn, recurse)
        for name, original in counts.items():
            moved: Tensor = getattr(self, name)
            if original.is_meta and not moved.is_meta:
                self._buffers[name] = torch.zeros(original.shape, dtype=torch.float64, device=moved.device)
            elif moved.dtype != original.dtype:
                self._buffers[name] = original.to(moved.device)
        return self


class LaALoss(_PairwiseLoss):
    r"""Label aggregation: a multipartite AUC loss on the aggregated label
    :math:`\bar y_i = \sum_k w_k y_{ik}` (Lukasik et al. 2025, Sec. 5.2):
    :math:`\sum_{\bar y_i > \bar y_j} c_{ij}\phi(s_i - s_j) / \sum c_{ij}`.

    With ``cost="linear"`` (default), :math:`c_{ij} = \bar y_i - \bar y_j` and the Bayes-optimal
    scorer is :math:`\sum_k w_k\eta_k(x)` whatever the label priors (Prop. 5.4): no label dictates.
    ``cost="uniform"`` (c = 1) is Prop. 5.3's variant, not Pareto-optimal in general.

    Args:
        weights: label weights w_k > 0 (default all ones). The sums of several columns are
            rounded to ``LEVEL_RESOLUTION`` (2^-40) of their own size (40 significant bits, about
            12 decimal digits), so that sums equal in exact arithmetic (0.1 + 0.2 and 0.3) are one
            level. Levels that agree to that precision may be one level too (1e12 + 1 and
            1e12 + 1.2), and the costs of levels that are kept move by at most 2^-41 of the levels.
        cost: ``"linear"`` or ``"uniform"``.
        real_levels: one label column holds real-valued levels (graded relevance in steps of
            0.5, say). Without it a single column must hold whole numbers (0/1, or ordinal levels
            such as 0..4 ratings): a column of probabilities passed as labels by mistake raises.
        surrogate, margin, pairs, temperature, reduction, backend, cross_device, validate_args,
            contiguous_groups: as in ``AUCLoss``.

    ``forward(scores, labels, groups=None, mask=None)``: labels (N, K) binary, or one ordinal column
    (N,) / (N, 1) such as a 0..4 rating, whose values are the levels (whole numbers unless
    ``real_levels=True``); ``mask`` as in ``AUCLoss``.
    """

    def __init__(
        self,
        weights: Sequence[float] | Tensor | None = None,
        *,
        cost: str = "linear",
        real_levels: bool = False,
        surrogate: str = "logistic",
        margin: float = 1.0,
        pairs: str = "all",
        temperature: float | None = None,
        reduction: str = "mean",
        backend: str = "auto",
        cross_device: bool = False,
        validate_args: bool = True,
        contiguous_groups: bool = False,
    ) -> None:
        super().__init__(
            surrogate=surrogate, margin=margin, pairs=pairs, temperature=temperature,
            reduction=reduction, backend=backend, cross_device=cross_device, validate_args=validate_args,
            contiguous_groups=contiguous_groups,
        )
        # Host constants: the op derives its level tables from them once per device.
        self.weights = check.check_weights("weights", weights, strictly_positive=True)
        self._weight_values = None if self.weights is None else _scaled_to_one(self.weights.tolist())
        self.cost = check.check_choice("cost", cost, check.COSTS)
        self.real_levels = check.check_bool("real_levels", real_levels)

    def extra_repr(self) -> str:
        options = [] if self.weights is None else [f"weights={_listed(self.weights)}"]
        if self.cost != "linear":
            options.append(f"cost={self.cost!r}")
        if self.real_levels:
            options.append("real_levels=True")
        return ", ".join(options + [super().extra_repr()])

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        scores, labels, groups, mask = self._checked_batch(scores, labels, groups, mask)
        num_labels = labels.shape[1]
        if self.weights is not None:
            check.check_weights_length("weights", self.weights, num_labels)
        label_weights = [1.0] * num_labels if self.weights is None else self._weight_values
        result = self._pair_loss(
            scores, labels, groups, mask, label_weights=label_weights, cost=self.cost, real_levels=self.real_levels
        )
        keep_call_state(self, parts=pair_parts(result))
        return result.loss


# LaA weights whose largest lies beyond 2^±WEIGHT_EXPONENT_RANGE are scaled by a power of two.
WEIGHT_EXPONENT_RANGE = 64


def _scaled_to_one(weights: list[float]) -> list[float]:
    """LaA's weights, or, when the largest is far from 1 (beyond 2^±64), the weights times the
    power of two that brings it into [0.5, 1). The loss does not change: its pair costs are
    differences of weighted sums, divided by their group's sum of them (or all 1), and a power of
    two scales them exactly (the exponential closed form's log-costs may round differently in
    the last bit). Weights of 1e-320 or 1e308 (their levels subnormal, their sums infinite) then
    give the loss of weights 1; ordinary weights are passed as they are."""
    exponent = math.frexp(max(weights))[1]
    if abs(exponent) <= WEIGHT_EXPONENT_RANGE:
        return weights
    return [math.ldexp(weight, -exponent) for weight in weights]
