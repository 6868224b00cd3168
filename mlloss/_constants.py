"""Constants that a module derives from its construction arguments, kept as buffers: the models'
index tables, the mixing weights and priors of ``LoALoss``."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn


class ConstantBuffers(nn.Module):
    """Base of a module whose buffers are functions of its construction arguments, not state
    (field offsets, index maps): :meth:`constant_buffers` computes them, they stay out of the
    ``state_dict`` (``persistent=False``), and every move (``to``, ``cuda``, ``to_empty``)
    rebuilds them on the buffer's new device and dtype. A model made on the meta device and
    materialised with ``to_empty()`` (FSDP's deferred init) then holds their values, which
    ``load_state_dict`` would not restore, instead of uninitialised memory.

    The buffers take the dtype of the move (``.double()`` of a model casts its float tables),
    unless ``constants_keep_dtype``: then each keeps the dtype :meth:`constant_buffers` gives it."""

    constants_keep_dtype: bool = False

    def constant_buffers(self) -> dict[str, Tensor]:
        """The buffers' values (on the CPU), from the module's construction arguments."""
        raise NotImplementedError

    def register_constant_buffers(self) -> None:
        """Register :meth:`constant_buffers`; call at the end of ``__init__``."""
        for name, value in self.constant_buffers().items():
            self.register_buffer(name, value, persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ConstantBuffers:
        super()._apply(fn, recurse)
        for name, value in self.constant_buffers().items():
            moved = self._buffers[name]
            if moved is not None:
                dtype = value.dtype if self.constants_keep_dtype else moved.dtype
                self._buffers[name] = value.to(device=moved.device, dtype=dtype)
        return self
