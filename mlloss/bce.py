"""Binary cross-entropy losses, beside the pairwise ones of ``losses``: ``BCELoss`` and
``BCEPlusRanking`` (cross-entropy plus a weighted pairwise term, per task; Sun et al. Eq. 7 with
PDAOM). The arithmetic is the fused op ``mlloss::binary_cross_entropy`` (``ops.pointwise``), and
for ``bce+auc`` and ``bce+pdaom`` ``mlloss::bce_plus_pair_loss`` (``ops.bce_ranking``); the
registry that builds them by name is ``registry``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from . import _validation as check
from .distributed import refusing_together
from .losses import AUCLoss
from .ops.dispatch import PairStats, cached_on_device
from .ops.pointwise import binary_cross_entropy
from .parts import LossParts, keep_call_state, made

__all__ = ["BCELoss", "BCEPlusRanking", "INPUTS"]


class BCELoss(nn.Module):
    """Binary cross-entropy, the mean over items of each task, summed over tasks; ``groups`` is
    checked as the ranking losses check it (integer ids, one per item), then ignored. An empty
    batch gives 0.

    Args:
        inputs: ``"logits"`` (default) or ``"probabilities"`` for models whose heads end in a
            sigmoid (torch-rechub's towers): the cross-entropy of a probability is not that of a
            logit, so say which the model gives. With the data check on, probabilities outside
            [0, 1] raise, and logits that all lie in [0, 1] in 8 batches in a row (they look like
            probabilities) warn.
        validate_args: check for non-finite scores and labels other than 0/1 (one host read per
            call), as the pairwise losses do.

    ``forward(scores, labels, groups=None, mask=None)``: scores and labels (N,) for one task, or
    (N, K) with one column per task; ``mask`` (N,) bool, True for the items that count: the means
    are over those, and the other items (a fixed-size batch's filler rows) are not read and get a
    zero gradient. ``parts`` (``mlloss.parts``): ``bce``, and ``bce/k`` per task.
    """

    def __init__(self, *, inputs: str = "logits", validate_args: bool = True) -> None:
        super().__init__()
        self.inputs = check.check_choice("inputs", inputs, INPUTS)
        self.validate_args = check.check_bool("validate_args", validate_args)
        self.parts = LossParts()

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        scores, labels = _task_columns(scores, labels)
        # the groups count for nothing here, but are checked as the ranking losses check them: a
        # mask passed in their place (positionally) would otherwise be dropped without a word
        check.require_scores_device(scores, groups=check.group_ids(groups, scores.shape[0]))
        loss, task_losses = binary_cross_entropy(
            scores, labels, check.mask_vector(mask, scores),
            probabilities=self.inputs == "probabilities", validate=self.validate_args,
        )
        # The entries close over the op's statistics, never over the differentiable loss: kept until
        # the next call, it would hold the step's autograd graph (and, in a step captured in a CUDA
        # graph, nodes of an eager call outside it, which broke the capture).
        keep_call_state(self, parts=_bce_parts(task_losses))
        return loss

    def extra_repr(self) -> str:
        options = [f"inputs={self.inputs!r}"] if self.inputs != "logits" else []
        return ", ".join(options + ([] if self.validate_args else ["validate_args=False"]))


class BCEPlusRanking(nn.Module):
    r"""Cross-entropy plus ``lam`` times a pairwise term, per task.

    With a ranking loss of ``reduction="mean"`` (``"bce+auc"``) this is
    ``mean_i CE_i + lam * ranking``. With ``reduction="sum"`` (PDAOM, ``"bce+pdaom"``) it is Sun et
    al. Eq. 7, ``sum_i CE_i + lam * sum_u phi_u``, divided by the number of items N so that the
    cross-entropy keeps its usual mean scale: ``mean_i CE_i + lam * sum_u phi_u / N``. ``lam`` is
    then the paper's lambda and does not have to change with the batch size (the paper's best was
    10 on its data; on ours ``docs/results.md`` finds 1 neutral and 10 harmful). N counts the
    items over all ranks when the ranking loss has ``cross_device=True``, and only the items of
    ``mask`` when one is given.

    Multi-task models: scores and labels (N, K), one column per task (click, purchase): the
    objective is the sum over tasks of ``mean_i CE_ik + lam_k * ranking_k``, the ranking loss
    applied to each task's column (with the same groups); ``lam`` is one number or one per task.
    With an ``AUCLoss`` or ``PDAOMLoss`` ranking (not ``cross_device``) the cross-entropy and the K
    ranking terms are one op (``ops.bce_ranking``: the ranking on the task columns, one set of
    kernel launches and one autograd node, not K calls and a node per term); any other ranking
    module is called once per task.

    Args:
        ranking: the pairwise loss (one binary label column at a time).
        lam: the weight of the ranking term, >= 0, or a sequence of K of them.
        ranking_input: what the pairwise term sees: ``"probability"`` (default; f = sigmoid(logit),
            as in Eq. 7, where PDAOM's surrogate acts on predicted probabilities) or ``"logit"``.
        inputs: what the model gives: ``"logits"`` (default) or ``"probabilities"`` (heads that end
            in a sigmoid, torch-rechub's): see ``BCELoss``.

    ``parts`` (``mlloss.parts``): ``bce``, ``ranking`` (the term before ``lam``, already divided
    by N for ``reduction="sum"``), ``valid_pairs`` and ``groups_with_pairs`` (when the ranking loss
    reports them, as every mlloss loss does); with K tasks also ``bce/k``, ``ranking/k`` and
    ``valid_pairs/k``.
    """

    def __init__(
        self,
        ranking: nn.Module,
        lam: float | Sequence[float] = 1.0,
        ranking_input: str = "probability",
        inputs: str = "logits",
    ) -> None:
        super().__init__()
        if not isinstance(ranking, nn.Module):
            raise TypeError(
                f"ranking must be a pairwise loss module (mlloss.PDAOMLoss(), mlloss.AUCLoss(), or your own nn.Module); "
                f"got {ranking!r}" + (f"; for a loss by name use mlloss.build_loss('bce+{ranking}')" if isinstance(ranking, str) else "")
            )
        self.ranking = ranking
        self.lam = check.check_lam(lam)
        self.ranking_input = check.check_choice("ranking_input", ranking_input, ("probability", "logit"))
        self.bce = BCELoss(inputs=inputs, validate_args=getattr(ranking, "validate_args", True))
        self.parts = LossParts()

    @property
    def inputs(self) -> str:
        return self.bce.inputs

    @property
    def num_items(self) -> int | Tensor:
        """Items in the last batch (over all ranks with a ``cross_device`` ranking loss): an int,
        or with a mask the number of its True entries as a 0-dim tensor (no host sync)."""
        return getattr(self.ranking, "num_items", 0)

    def forward(self, scores: Tensor, labels: Tensor, groups: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """``mask`` (N,) bool: True for the items that count, as in ``BCELoss`` and the ranking losses."""
        # The cross-entropy checks this rank's batch alone: a rank it refuses tells the others, who
        # are in the ranking loss's gather by then (``mlloss.distributed.refusing_together``).
        with refusing_together(getattr(self.ranking, "cross_device", False) is True, getattr(scores, "device", None)):
            scores, labels = _task_columns(scores, labels)
            num_tasks = scores.shape[1]
            weights = self.lam if isinstance(self.lam, tuple) else (self.lam,) * num_tasks
            if len(weights) != num_tasks:
                raise ValueError(f"lam has {len(weights)} entries but scores have {num_tasks} task columns; got lam={self.lam}")
            one_op = self._in_one_op()
            if not one_op:
                bce = self.bce(scores, labels, mask=mask)
        if one_op:
            return self._in_one_op_call(scores, labels, groups, mask, weights)
        if num_tasks > 1 and self._takes_task_columns():
            term, weight = self._ranking_in_one_call(scores, labels, groups, mask, weights)
            return torch.add(bce, term, alpha=weight)
        terms, task_parts, items = [], [], None
        for task in range(num_tasks):
            ranking_args = {} if mask is None else {"mask": mask}  # ranking losses of other libraries take none
            term = self.ranking(self._ranking_scores(scores[:, task], mask), labels[:, task], groups, **ranking_args)
            if self._summed():  # Eq. 7 over N: see the class docstring
                items = self._items(scores, mask) if items is None else items  # the same for every task
                term = term / items
            terms.append(term)
            task_parts.append(getattr(self.ranking, "parts", {}))
        self._keep_parts([term.detach() for term in terms], task_parts)
        # lam as add's alpha, not ``lam * term``: under torch.compile(dynamic=True) Dynamo passes a
        # float attribute as a float64 CPU tensor, which a product keeps in the graph (on CUDA that
        # skips or splits its CUDA graphs), where alpha takes it as a constant.
        total = bce
        for weight, term in zip(weights, terms):
            if weight != 0:  # a task of lam 0 adds nothing, also when its term overflows (0 * inf = NaN)
                total = torch.add(total, term, alpha=weight)
        return total

    def _summed(self) -> bool:
        """Whether the ranking term is a sum over groups (PDAOM's Eq. 6), divided by the items."""
        return getattr(self.ranking, "reduction", "mean") == "sum"

    def _items(self, scores: Tensor, mask: Tensor | None) -> int | Tensor:
        """N of Eq. 7 after a ranking call: the items it counted (over all ranks with
        ``cross_device``), or those of the mask for a loss that does not count them; at least 1."""
        counted = scores.shape[0] if mask is None else mask.sum()
        return check.at_least_one(getattr(self.ranking, "num_items", counted))

    def _keep_parts(self, terms: Sequence[Tensor] | Tensor | Callable[[], Tensor],
                    task_parts: Sequence[Mapping[str, Tensor]] | Callable[[], Sequence[Mapping[str, Tensor]]]) -> None:
        """``parts`` from the detached per-task ranking ``terms`` (scalars, or a (K,) tensor) and each
        task's ranking parts (its ``valid_pairs`` and ``groups_with_pairs``, if it counts them), or
        functions making them, read only when an entry is."""
        # parts close over detached terms only (see BCELoss.forward), and are built when first read
        bce_parts = self.bce.parts

        def makers() -> dict:
            made_terms, parts = made(terms), made(task_parts)
            totals: dict[str, Callable[[], Tensor]] = {"bce": lambda: bce_parts["bce"],
                                                       "ranking": lambda: _total(made_terms)}
            per_task: dict[str, object] = {"bce": bce_parts, "ranking": made_terms}
            if all("valid_pairs" in p and "groups_with_pairs" in p for p in parts):  # a user's loss may count none
                totals["valid_pairs"] = lambda: _total([p["valid_pairs"] for p in parts])
                totals["groups_with_pairs"] = lambda: _total([p["groups_with_pairs"] for p in parts])
                per_task["valid_pairs"] = [_maker(p, "valid_pairs") for p in parts]
            return _task_entries(totals, per_task if len(parts) > 1 else {})

        keep_call_state(self, parts=LossParts(makers))

    def _takes_task_columns(self) -> bool:
        """Whether the ranking loss computes every task's term in one call (``AUCLoss.task_columns``,
        ``PDAOMLoss``'s too): the kernels' launches and host work of one call instead of K. Not
        across processes (``cross_device``), nor for a subclass of ``AUCLoss`` whose own
        ``forward`` would change what a call per task computes."""
        ranking = self.ranking
        if getattr(ranking, "cross_device", False) or not callable(getattr(ranking, "task_columns", None)):
            return False
        return not isinstance(ranking, AUCLoss) or type(ranking).forward is AUCLoss.forward

    def _in_one_op(self) -> bool:
        """Whether the cross-entropy and the ranking term are computed as one op
        (``ops.bce_ranking``: one autograd node and one pass through the host path, not four): an
        ``AUCLoss`` or ``PDAOMLoss`` ranking that takes task columns (``_takes_task_columns``,
        its ``task_columns`` its own), seeing the model's scores as they are or the sigmoid of
        its logits (not the logit of its probabilities)."""
        ranking = self.ranking
        return (isinstance(ranking, AUCLoss) and self._takes_task_columns()
                and type(ranking).task_columns is AUCLoss.task_columns
                and not (self.inputs == "probabilities" and self.ranking_input == "logit"))

    def _in_one_op_call(self, scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None,
                        weights: tuple[float, ...]) -> Tensor:
        """The objective in one op (``_in_one_op``), with the ``parts`` of the calls it stands for."""
        equal, summed = _one_lam(weights), self._summed()
        ranking: AUCLoss = self.ranking  # type: ignore[assignment]  # see _in_one_op
        loss, facts, cross_entropies = ranking._plus_cross_entropy(
            scores, labels, groups, mask, weights=None if equal else _lam_on(weights, scores.device),
            lam=weights[0] if equal else 1.0, probabilities=self.inputs == "probabilities",
            sigmoid=self.inputs == "logits" and self.ranking_input == "probability", summed=summed,
            validate_bce=self.bce.validate_args,
        )
        keep_call_state(self.bce, parts=_bce_parts(cross_entropies))
        num_items = scores.shape[0]

        def per_task() -> Tensor:  # in the per-task calls' dtype
            terms = facts.problem_losses.to(loss.dtype)
            # Eq. 7 over N (see the class docstring): the items the op divided by
            return terms / check.at_least_one(num_items if mask is None else mask.sum()) if summed else terms

        self._keep_parts(per_task, lambda: _column_parts(facts, len(weights)))
        return loss

    def _ranking_in_one_call(self, scores: Tensor, labels: Tensor, groups: Tensor | None, mask: Tensor | None,
                             weights: tuple[float, ...]) -> tuple[Tensor, float]:
        """``sum_k lam_k * ranking_k`` of the K task columns in one ranking call, with the same
        ``parts`` as the call per task, as a term and the weight to add it with (the lam they
        share; 1 when the call weighted them)."""
        equal = _one_lam(weights)
        task_columns = getattr(self.ranking, "task_columns")  # see _takes_task_columns
        result = task_columns(self._ranking_scores(scores, mask), labels, groups, mask,
                              weights=None if equal else _lam_on(weights, scores.device))
        term, per_task = result.loss, result.problem_losses
        if self._summed():  # Eq. 7 over N: see the class docstring
            items = self._items(scores, mask)
            term, per_task = term / items, per_task / items
        facts = PairStats(result.stats)  # the parts keep no autograd graph
        self._keep_parts(per_task.detach().to(term.dtype), _column_parts(facts, len(weights)))  # the per-task calls' dtype
        return term, weights[0] if equal else 1.0

    def _ranking_scores(self, column: Tensor, mask: Tensor | None) -> Tensor:
        """What the ranking loss sees of a score column, or of (N, K) task columns."""
        if mask is not None and (self.inputs == "logits") == (self.ranking_input == "probability"):
            # The rows left out take part in no pair whatever they hold, but sigmoid / logit of a
            # NaN filler would make their zero gradient NaN (0 * NaN): they enter as a neutral value.
            column = column.masked_fill(~(mask[:, None] if column.dim() == 2 else mask), 0.0 if self.inputs == "logits" else 0.5)
        if (self.inputs == "logits") == (self.ranking_input == "logit"):
            return column
        # In float32 at least: half-precision probabilities tie (bfloat16 keeps 8 bits) and clamp
        # 1 - 1e-7 to 1, whose logit is inf.
        column = column.to(torch.promote_types(column.dtype, torch.float32))
        return torch.sigmoid(column) if self.inputs == "logits" else torch.logit(column, eps=1e-7)

    def extra_repr(self) -> str:
        options = f"lam={self.lam}, ranking_input={self.ranking_input!r}"
        return options + (f", inputs={self.inputs!r}" if self.inputs != "logits" else "")


INPUTS = ("logits", "probabilities")


def _one_lam(weights: tuple[float, ...]) -> bool:
    """Whether every task's ranking term takes the same non-zero lam, which then scales their sum
    (one multiplier); else the lams go in as per-task weights, where a task of lam 0 adds nothing
    even when its own term overflows (a scale of 0 would make the sum 0 * inf = NaN)."""
    return weights[0] != 0 and all(w == weights[0] for w in weights)


def _lam_on(weights: tuple[float, ...], device: torch.device) -> Tensor:
    """``lam`` as a (K,) float64 tensor on ``device``: a constant of the graph under
    ``torch.compile``, else made once per weights and device (``ops.dispatch.cached_on_device``)."""
    if torch.compiler.is_compiling():
        return torch.tensor(weights, dtype=torch.float64, device=device)
    return _lam_cached(weights, device)


@functools.lru_cache(maxsize=64)
def _lam_cached(weights: tuple[float, ...], device: torch.device) -> Tensor:
    (on_device,) = cached_on_device((torch.tensor(weights, dtype=torch.float64),), device,
                                    built_by="bce+<ranking> with one lam per task builds its weights on its first "
                                             "call for each lam and device")
    return on_device


def _task_columns(scores: object, labels: object) -> tuple[Tensor, Tensor]:
    """Scores and labels as (N, K) task columns; (N,) is one task."""
    scores = check.floating_scores(scores)
    if scores.dim() == 1:
        scores = scores[:, None]
    if scores.dim() != 2:
        raise ValueError(f"scores must have shape (N,) or (N, K); got {tuple(scores.shape)}")
    labels = check.label_columns(labels, scores.shape[0])
    check.require_scores_device(scores, labels=labels)
    if labels.shape[1] != scores.shape[1]:
        raise ValueError(
            f"scores have {scores.shape[1]} task columns but labels have {labels.shape[1]}; "
            f"got scores of shape {tuple(scores.shape)} and labels of shape {tuple(labels.shape)}"
        )
    return scores, labels


def _bce_parts(task_losses: Tensor) -> LossParts:
    """``BCELoss``'s ``parts`` from its per-task cross-entropies (K,), detached."""
    return LossParts(lambda: _task_entries({"bce": lambda: task_losses.sum()}, {"bce": task_losses}))


def _column_parts(facts: PairStats, num_columns: int) -> list[LossParts]:
    """The ranking parts of each of the task columns a ranking loss's ``facts`` count."""

    def column_parts(k: int) -> LossParts:
        return LossParts({"valid_pairs": lambda: facts.valid_pairs[k], "groups_with_pairs": lambda: facts.groups_with_pairs[k]})

    return [column_parts(k) for k in range(num_columns)]


def _task_entries(totals: dict, per_task: dict) -> dict:
    """``parts`` makers: the totals, then ``name/k`` for each task of each per-task entry (a
    (K,) tensor, a sequence of scalars or another loss's parts)."""
    makers = {name: _maker(value) for name, value in totals.items()}
    for name, values in per_task.items():
        if isinstance(values, LossParts):  # the BCE's own per-task entries
            makers.update({key: _maker(values, key) for key in values if key.startswith(f"{name}/")})
            continue
        count = values.shape[0] if isinstance(values, Tensor) else len(values)
        if count > 1:
            makers.update({f"{name}/{k}": _maker(values, k) for k in range(count)})
    return makers


def _total(values: Sequence[Tensor] | Tensor) -> Tensor:
    """The sum of K > 0 scalars (a (K,) tensor, or a sequence of 0-dim tensors) in their order."""
    return sum(values[1:], values[0])


def _maker(value, key=None):
    """A function making a parts entry from a tensor or a function making one (or item ``key``
    of a sequence of either, or of a tensor)."""
    if key is not None:
        return lambda: made(value[key])
    return lambda: made(value)
