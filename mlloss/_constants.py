"""Constants that a module derives from its construction arguments, kept as buffers: the models'
index tables, the mixing weights and priors of ``LoALoss``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn


class ConstantBuffers(nn.Module):
    """Base of a module whose buffers are functions of its construction arguments, not state
    (field offsets, index maps): :meth:`constant_buffers` computes them, they stay out of the
    ``state_dict`` (``persistent=False``), and every move (``to``, ``cuda``, ``to_empty``)
    rebuilds them on the buffer's new device and dtype. A model made on the meta device and
    materialised with ``to_empty()`` (FSDP's deferred init) then holds their values, which
    ``load_state_dict`` would not restore, instead of uninitialised memory; one made there and
    loaded with ``load_state_dict(sd, assign=True)`` gets them beside the loaded tensors.

    The buffers take the dtype of the move (``.double()`` of a model casts its float tables),
    unless ``constants_keep_dtype``: then each keeps the dtype :meth:`constant_buffers` gives it."""

    constants_keep_dtype: bool = False

    def constant_buffers(self) -> Mapping[str, Tensor | None]:
        """The buffers' values (on the CPU), from the module's construction arguments (None: a
        buffer registered as None)."""
        raise NotImplementedError

    def register_constant_buffers(self) -> None:
        """Register :meth:`constant_buffers`; call at the end of ``__init__``."""
        for name, value in self.constant_buffers().items():
            self.register_buffer(name, value, persistent=False)
        self.register_load_state_dict_post_hook(_rebuild_after_load)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> ConstantBuffers:
        super()._apply(fn, recurse)
        self._rebuild_constants(lambda moved: moved.device)
        return self

    def rebuild_meta_constants(self, device: torch.device | None = None) -> None:
        """Rebuild the constant buffers left on the meta device on ``device`` (default: that of the
        module's first tensor off the meta device; none there, nothing changes). ``load_state_dict(sd,
        assign=True)`` into a module made on the meta device (loading without a copy) takes the loaded
        tensors, which hold no constants: a hook after every load calls this; a parent holding a
        module without tensors of its own (``DotInteraction``) calls it with its own device."""
        if device is None:
            device = next((t.device for t in [*self.parameters(), *self.buffers()] if not t.is_meta), None)
        if device is not None:
            self._rebuild_constants(lambda current: device if current.is_meta else None)

    def _rebuild_constants(self, device: Callable[[Tensor], torch.device | None]) -> None:
        """Each constant buffer recomputed on ``device(buffer)`` (left as it is where that is None)."""
        for name, value in self.constant_buffers().items():
            current = self._buffers[name]
            if current is None or value is None:
                continue
            target = device(current)
            if target is not None:
                dtype = value.dtype if self.constants_keep_dtype else current.dtype
                self._buffers[name] = value.to(device=target, dtype=dtype)


def _rebuild_after_load(module: ConstantBuffers, incompatible_keys: Any) -> None:
    module.rebuild_meta_constants()
