"""Eager calls replayed from CUDA graphs: a call's host path paid once per signature.

On a GPU, at the batch sizes recommenders train with, an eager loss call is bound by its host:
the library's Python, PyTorch's dispatch of each aten op and the launch of each kernel. On an
H100 an ``AUCLoss`` forward + backward at N = 16,384 took 0.6-1.1 ms eager and 0.09 ms captured
in a CUDA graph; a grouped ``AUCLoss`` at N = 1,048,576 1.1 and 0.44 ms
(``benchmarks/results/nvidia-h100-80gb-hbm3-quick-8ea285f.md``).

With replay on (``mlloss.set_graph_replay(True)``, or ``MLLOSS_GRAPH_REPLAY=1`` in the
environment when mlloss is imported), the Triton tier's work of a call (everything from the
inputs to the loss, its statistics, the gradient and the data-check status) is captured in a
``torch.cuda.CUDAGraph`` at the second call of its *signature*, and every later call of that
signature copies its inputs into the graph's own, replays the graph (one launch) and copies the
outputs out. The first call runs as it is, so a shape seen once is never captured. A signature
is the op, its host options (surrogate, cost, reduction, label weights, ...), each tensor
input's shape, strides and dtype, the device, the current stream, the calling thread and whether
inference mode is on (Lightning validates under it; its tensors cannot be written outside it): every
call of one signature runs the same kernels with the same launch arguments, which is what a
replay repeats. The results are the same bits as without replay (the same kernels on the same
values), and the data check is read after the replay as before.

Not replayed, the call running as it is: on the CPU; while a CUDA graph is being captured on the
current stream (the user's own ``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``:
the call is then part of their graph); under the ``torch.func`` transforms; the PyTorch tier
(``backend="torch"`` or ``"exact"``). A signature whose capture fails warns once and runs as it
is from then on.

Memory: a captured signature keeps its call's working memory (the peak of one call,
``benchmarks/host_path.py --memory``: about 30-40 bytes per item) in its graph's private pool,
besides its inputs' copies. At most ``max_graphs`` signatures keep a graph (default 8): the first
ones to come twice. Later signatures run as they are, with no capture: batches of many sizes
(users kept whole) would otherwise capture a graph and release another at nearly every call;
pad them to one size (``mlloss.data.GroupDataModule(fixed_size=True)``, the recipe's
``--fixed-batches``) to replay them. ``set_graph_replay`` releases every graph.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

__all__ = ["set_graph_replay", "graph_replay_enabled"]

ENVIRONMENT = "MLLOSS_GRAPH_REPLAY"
CAPTURE_AFTER = 2  # a signature's call that captures it; the calls before run as they are
DEFAULT_MAX_GRAPHS = 8
_SEEN_LIMIT = 256  # signatures counted before capture (a bound on the counts' dict, not on graphs)


class _Graph(Protocol):
    def replay(self) -> None: ...


@dataclass
class _Captured:
    """A captured call: its graph, the static inputs it reads and the static outputs it writes."""

    graph: _Graph  # torch.cuda.CUDAGraph, or a ``_StandInGraph`` (tests, benchmarks on the CPU)
    inputs: tuple[Tensor | None, ...]
    outputs: tuple[Tensor | None, ...]

    def replay(self, tensors: tuple[Tensor | None, ...], keep: int) -> tuple[Tensor | None, ...]:
        _copy_into(self.inputs, tensors)
        self.graph.replay()
        kept = tuple(None if output is None else output.clone() for output in self.outputs[:keep])
        return kept + self.outputs[keep:]

    def release(self) -> None:
        """Called when the cache drops this graph (``set_graph_replay``): wait for any replay in
        flight, since what it reads and writes is freed with the last reference (another thread
        may still hold one)."""
        if isinstance(self.graph, torch.cuda.CUDAGraph):
            torch.cuda.synchronize(_device(self.inputs))


@dataclass
class _State:
    enabled: bool = False
    max_graphs: int = DEFAULT_MAX_GRAPHS
    seen: OrderedDict = field(default_factory=OrderedDict)  # signature -> calls so far
    graphs: dict = field(default_factory=dict)  # signature -> _Captured
    failed: set = field(default_factory=set)  # signatures whose capture failed
    stand_in: str | None = None  # "rerun" or "skip": CPU calls replay a ``_StandInGraph``
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            graphs, self.graphs = list(self.graphs.values()), {}
            self.seen.clear()
            self.failed.clear()
        for captured in graphs:
            captured.release()


_STATE = _State()


def set_graph_replay(enabled: bool, *, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
    """Turn the replay of eager Triton-tier calls from CUDA graphs on or off (see the module).
    ``max_graphs``: how many call signatures keep a graph (the first to come twice). Every call
    releases the graphs captured so far."""
    from .._validation import check_bool, check_int

    enabled = check_bool("enabled", enabled)
    max_graphs = check_int("max_graphs", max_graphs, minimum=1)
    _STATE.clear()
    _STATE.enabled, _STATE.max_graphs = enabled, max_graphs


def graph_replay_enabled() -> bool:
    """Whether eager Triton-tier calls are replayed from CUDA graphs (``set_graph_replay``)."""
    return _STATE.enabled


def replaying(scores: Tensor) -> bool:
    """Whether a call on ``scores``' device goes through ``run``."""
    if not _STATE.enabled:
        return False
    if scores.device.type == "cuda":
        return not torch.cuda.is_current_stream_capturing() and not torch._C._are_functorch_transforms_active()
    return _STATE.stand_in is not None and scores.device.type == "cpu"


def run(function: Callable, tensors: tuple[Tensor | None, ...], host: tuple, *, keep: int) -> tuple[Tensor | None, ...]:
    """``function(*tensors, *host)``, which returns a tuple of tensors (or None) and computes on the
    device only (no host read, no data-dependent shape), from its signature's graph once that is
    captured. The first ``keep`` outputs are the caller's; the others are the graph's own, valid
    until the next call on this thread and stream (read them at once)."""
    key = _signature(function, tensors, host)
    state = _STATE
    with state.lock:
        captured = state.graphs.get(key)
        capture = False
        if captured is None and key not in state.failed and len(state.graphs) < state.max_graphs:
            calls = state.seen.pop(key, 0) + 1
            capture = calls >= CAPTURE_AFTER
            if not capture:
                state.seen[key] = calls
                if len(state.seen) > _SEEN_LIMIT:
                    state.seen.popitem(last=False)
    if captured is not None:
        return captured.replay(tensors, keep)
    if not capture:
        return function(*tensors, *host)
    try:
        captured = _capture(function, tensors, host)
    except Exception as error:  # noqa: BLE001 - any failure: this signature runs as it is
        with state.lock:
            state.failed.add(key)
        warnings.warn(
            f"mlloss could not capture a loss call in a CUDA graph ({type(error).__name__}: {error}); "
            "calls of this shape and these options run without graph replay",
            RuntimeWarning,
            stacklevel=2,
        )
        return function(*tensors, *host)
    with state.lock:
        state.graphs[key] = captured
    return captured.replay(tensors, keep)


def _device(tensors: tuple[Tensor | None, ...]) -> torch.device:
    """The device of a call: its first tensor's (the scores, never None)."""
    first = tensors[0]
    assert first is not None
    return first.device


def _signature(function: Callable, tensors: tuple[Tensor | None, ...], host: tuple) -> tuple:
    device = _device(tensors)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    # inference mode: the tensors a capture makes in it (the static inputs) cannot be written outside it
    return (function, host, device, stream, threading.get_ident(), torch.is_inference_mode_enabled(),
            *[None if t is None else (t.shape, t.stride(), t.dtype) for t in tensors])


def _capture(function: Callable, tensors: tuple[Tensor | None, ...], host: tuple) -> _Captured:
    # Static inputs of the same shapes and strides (dense tensors keep theirs), allocated on the
    # caller's stream, where every replay copies into them.
    static = tuple(None if t is None else torch.empty_like(t) for t in tensors)
    device = _device(tensors)
    if device.type != "cuda":
        return _StandInGraph.capture(function, static, tensors, host, rerun=_STATE.stand_in == "rerun")
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        _copy_into(static, tensors)
        function(*static, *host)  # warm-up: compiles the kernels and fills host-side caches
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            outputs = function(*static, *host)
        finally:
            graph.capture_end()
    current.wait_stream(side)
    return _Captured(graph, static, tuple(outputs))


def _copy_into(static: tuple[Tensor | None, ...], tensors: tuple[Tensor | None, ...]) -> None:
    for target, tensor in zip(static, tensors):
        if target is not None and tensor is not None:  # None in the same places: the signature says
            target.copy_(tensor)


class _StandInGraph:
    """What stands for a CUDA graph on the CPU, where there is none: for the tests of this module's
    bookkeeping (``rerun``: a replay runs the function again on the static inputs and writes its
    results into the static outputs, as a graph's kernels would) and for ``benchmarks/host_time.py``
    (a replay does nothing: the host path of a replayed call alone)."""

    def __init__(self, replay: Callable[[], None]) -> None:
        self.replay = replay

    @classmethod
    def capture(cls, function, static, tensors, host, *, rerun: bool) -> _Captured:
        _copy_into(static, tensors)
        outputs = tuple(function(*static, *host))

        def replay() -> None:
            for output, fresh in zip(outputs, function(*static, *host)):
                if output is not None:
                    output.copy_(fresh)

        return _Captured(cls(replay if rerun else lambda: None), static, outputs)


@contextlib.contextmanager
def stand_in_on_cpu(rerun: bool = True) -> Iterator[None]:
    """Inside: replay on (if it was not), with CPU calls captured in ``_StandInGraph``s."""
    enabled, max_graphs, stand_in = _STATE.enabled, _STATE.max_graphs, _STATE.stand_in
    _STATE.clear()
    _STATE.enabled, _STATE.stand_in = True, "rerun" if rerun else "skip"
    try:
        yield
    finally:
        _STATE.clear()
        _STATE.enabled, _STATE.max_graphs, _STATE.stand_in = enabled, max_graphs, stand_in


def captured_signatures() -> int:
    """How many call signatures hold a graph now."""
    return len(_STATE.graphs)


if os.environ.get(ENVIRONMENT, "0") not in ("", "0"):
    _STATE.enabled = True
