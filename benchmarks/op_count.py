"""Counting the aten ops a piece of PyTorch code dispatches, and which of them would make the host
wait for a GPU or run a kernel on one: ``with OpCounter() as counter: ...``.

Shared by ``host_path.py`` (one loss call) and ``bench_recipe.py`` (one training step); importing
it changes nothing (``host_path.py`` sets ``TRITON_INTERPRET``, this module does not).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mlloss.ops.fused import IMPLEMENTATIONS

# Ops that make the host wait for the device whatever their arguments.
SYNCING_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "argwhere",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "masked_select",
    "bincount",
    "equal",
    "is_nonzero",
    "allclose",
}


def is_syncing(func, args, kwargs) -> bool:
    """Whether the aten op ``func`` called with ``args`` waits for the device on CUDA."""
    name = func.overloadpacket.__name__
    if name in SYNCING_OPS:
        return True
    if name == "repeat_interleave":
        return kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None)
    if name == "segment_reduce":
        return not kwargs.get("unsafe", False)
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
    if name in ("_to_copy", "copy_"):
        source = args[1] if name == "copy_" else args[0]
        target_device = args[0].device if name == "copy_" else kwargs.get("device", source.device)
        return source.device.type != "cpu" and torch.device(target_device).type == "cpu"
    return False


# Tensors made from Python data (``torch.tensor``, ``torch.as_tensor`` of a list or number): on a
# CUDA device each is a copy from pageable host memory, which a CUDA graph capture rejects.
HOST_DATA_OPS = {"lift_fresh", "lift_fresh_copy"}

# Ops that allocate or mark the profiler and run no kernel (views are told apart by their schema).
NO_KERNEL_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                 "_record_function_enter_new", "_record_function_exit",
                 "_unsafe_view"}  # a view by what it does, though its schema has no alias annotation


class OpCounter(TorchDispatchMode):
    """Records every aten op dispatched inside the ``with`` block; ``kernels`` are those that
    run a kernel on CUDA (not views or bare allocations; a sort can run several)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []
        self.kernels: list[str] = []
        self._depth = 0  # the mode re-enters itself (below); tolist is wrapped once
        self._tolist = torch.Tensor.tolist  # what was there on entry, put back on exit

    def __enter__(self):
        if self._depth == 0:
            self._tolist = torch.Tensor.tolist  # (another counter's, when counters nest)
            # ``Tensor.tolist`` of a CUDA tensor dispatches a copy to the host (``_to_copy``: a
            # kernel and a sync); of a CPU tensor it reads the memory and dispatches nothing. The
            # CPU tensors of a run on this machine stand for CUDA ones: their tolist counts the same.
            tolist = self._tolist

            def counted_tolist(tensor: torch.Tensor):
                if tensor.device.type == "cpu":
                    self._record("_to_copy", kernel=True, syncing=True)
                return tolist(tensor)

            torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign]
        self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0:
            torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]
        return super().__exit__(*exc)

    def _record(self, name: str, *, kernel: bool, syncing: bool) -> None:
        self.ops.append(name)
        if kernel:
            self.kernels.append(name)
        if syncing:
            self.syncs.append(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "mlloss":
            # A library op: count what its Python implementation issues, not the op itself.
            with self:
                return IMPLEMENTATIONS[func.overloadpacket.__name__](*args, **kwargs)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # Inside a library op, composite ops reach the mode undecomposed (autograd is below):
            # decompose them as the dispatcher does elsewhere (a no-op .to() issues nothing).
            with self:
                return func.decompose(*args, **kwargs)
        name = str(func.overloadpacket.__name__)
        self._record(name, kernel=not func.is_view and name not in NO_KERNEL_OPS, syncing=is_syncing(func, args, kwargs))
        return func(*args, **kwargs)
