"""``loss.parts``: the batch facts of a loss's last call, for logging.

Every loss exposes the same kinds of entries, each a detached scalar tensor, so that one
``self.log_dict(loss.parts)`` line works whichever loss a config picks:

| loss | entries |
| --- | --- |
| ``AUCLoss``, ``PDAOMLoss``, ``LaALoss`` | ``valid_pairs``, ``groups_with_pairs``; ``AUCLoss`` and ``PDAOMLoss`` on (N, K) task columns also ``label_loss/k``, ``mixing_weight/k``, ``valid_pairs/k`` per column |
| ``LoALoss`` | ``valid_pairs``, ``groups_with_pairs`` (over its labels), and per label k: ``label_loss/k``, ``mixing_weight/k``, ``valid_pairs/k`` (k the label's index, or its name from ``label_names``) |
| ``BCELoss`` | ``bce`` |
| ``bce+<name>`` | ``bce``, ``ranking``, ``valid_pairs``, ``groups_with_pairs``; with K tasks also ``bce/k``, ``ranking/k``, ``valid_pairs/k`` |

``valid_pairs`` counts the item pairs the loss averaged over (level pairs for the max-violation
losses): a grouped loss that sees few of them per batch, fewer than about one per item, is
starved of pairs, usually because the batches split users (``mlloss.data.GroupBatchSampler``
keeps them together). ``groups_with_pairs`` counts the groups with at least one valid pair.

The entries are computed when read, not during the call: a training step that does not log
them pays nothing for them (no kernel launch, no host synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
import torch
from torch import Tensor

from .ops.dispatch import PairStats


Makers = Mapping[str, Callable[[], Tensor]]


def made(value):
    """``value``, or what it makes if it is a function: a tensor, a sequence, a mapping or None is
    kept as it is. (Not ``callable(value)``: torch.compile cannot trace ``callable`` of a dict or a
    list, and parts are read inside compiled steps.)"""
    if value is None or isinstance(value, (Tensor, Sequence, Mapping)):
        return value
    return value()


class LossParts(Mapping[str, Tensor]):
    """A read-only mapping name -> detached scalar tensor, each made on first access.

    ``makers``: name -> a function making the entry; or a function returning that mapping, called
    when the parts are first looked at (a loss call that nobody logs does not even build it: a
    loss's parts are a dozen closures, tens of microseconds of host time a call)."""

    def __init__(self, makers: Makers | Callable[[], Makers] | None = None) -> None:
        self._source = makers
        self._table: dict[str, Callable[[], Tensor]] | None = None
        self._made: dict[str, Tensor] = {}

    @property
    def _makers(self) -> dict[str, Callable[[], Tensor]]:
        if self._table is None:
            self._table, self._source = dict(made(self._source) or {}), None
        return self._table

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._made:
            self._made[name] = self._makers[name]().detach()
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __contains__(self, name: object) -> bool:
        # Mapping's own would make the entry (it tries ``self[name]``): a membership test reads nothing
        return name in self._makers

    def __len__(self) -> int:
        return len(self._makers)

    def __repr__(self) -> str:
        return f"LossParts({dict(self.items())!r})"

    def __reduce__(self):
        # Pickled (torch.save of a model holding the loss, a spawned DDP worker) with every entry
        # made: the makers close over the call's results, which do not pickle.
        return (_made_parts, (dict(self.items()),))


def keep_call_state(module: torch.nn.Module, **state: object) -> None:
    """Set a loss module's per-call attributes (its ``parts``, the last batch's counts): written
    into the instance's dict, without ``nn.Module.__setattr__``'s lookups of parameters, buffers
    and submodules (about 3 us an attribute on this repository's CPU, on every call). The names
    must be none of these. Under ``torch.compile`` they go through ``setattr``: Dynamo before
    torch 2.13 cannot trace ``__dict__.update`` (a graph break, which ``fullgraph=True`` refuses)."""
    if torch.compiler.is_compiling():
        for name, value in state.items():
            setattr(module, name, value)
    else:
        module.__dict__.update(state)


def _made_parts(values: dict[str, Tensor]) -> LossParts:
    return LossParts({name: value.detach for name, value in values.items()})


def pair_parts(
    result: PairStats, *, label_names: Sequence[str] | None = None, mixing: Tensor | None = None
) -> LossParts:
    """``parts`` of a pairwise loss (see ``mlloss.parts``): totals over its problems, and with
    ``label_names`` (LoA) one entry per label of its term, mixing weight and valid pairs."""
    facts = PairStats(result.stats)  # the makers read the statistics: no autograd graph kept alive

    def makers() -> dict[str, Callable[[], Tensor]]:
        entries: dict[str, Callable[[], Tensor]] = {
            "valid_pairs": lambda: facts.valid_pairs.sum(),
            "groups_with_pairs": lambda: facts.groups_with_pairs.sum(),
        }
        for k, name in enumerate(label_names or ()):
            entries.update(_label_makers(facts, name, k, mixing))
        return entries

    return LossParts(makers)


def _label_makers(facts: PairStats, name: str, k: int, mixing: Tensor | None) -> dict[str, Callable[[], Tensor]]:
    """The entries of label (or column) ``k``, named ``name``."""

    def mixing_weight() -> Tensor:  # on the device of the other entries
        return torch.ones((), dtype=torch.float64, device=facts.stats.device) if mixing is None else mixing[k]

    return {
        f"label_loss/{name}": lambda: facts.problem_losses[k],
        f"mixing_weight/{name}": mixing_weight,
        f"valid_pairs/{name}": lambda: facts.valid_pairs[k],
    }
