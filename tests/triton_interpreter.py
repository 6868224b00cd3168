"""The test suite's two changes to Triton's interpreter: a launch patches the language once, and
integer arithmetic skips the overflow bounds that nothing reads without Triton's debug mode
(``skip_the_unchecked_overflow_arithmetic``).

Under ``TRITON_INTERPRET=1`` a kernel launch (``GridExecutor.__call__``) patches
``triton.language`` to the interpreter's semantics for the whole launch, and then every call of
a ``@triton.jit`` device function inside it (``InterpretedFunction.__call__``: the kernels'
helpers, ``tl.sum`` and ``tl.max``, a scan's combine function once per lane) patches it again:
``_patch_lang``, ``inspect.getmembers`` over the language modules, about 1.7 ms a call. That was
a third of the kernel tests' time (149 of 455 s of ``tests/test_triton_kernels.py``, 86,000
calls). Patching twice sets the same attributes to equivalent functions, so here a device
function's call skips it when the language modules it sees are patched already by the running
launch (or by an earlier call in it); anything else patches as Triton does. Nothing the kernels
compute changes; the suite's brute-force references check that.

If Triton's interpreter no longer has these internals, ``patch_the_language_once_per_launch``
changes nothing and says so."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings


def patch_the_language_once_per_launch() -> bool:
    """Wraps ``triton.runtime.interpreter._patch_lang`` (called by both the launch and the device
    function calls, by name); True if it did."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    launch = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    if original is None or scope_type is None or launch is None or "patch_scope.restore()" not in inspect.getsource(launch):
        warnings.warn("Triton's interpreter changed: the test suite runs without its launch-once patching (slower)",
                      stacklevel=2)
        return False
    if hasattr(original, "original"):
        return True
    languages = (tl, tl.core)
    patched: list[set[int]] = []  # the language modules patched in the running launch
    sees: dict[object, set[int]] = {}  # the language modules a function's globals name

    def patch_lang(fn):
        seen = sees.get(fn)
        if seen is None:
            seen = sees[fn] = {id(value) for value in fn.__globals__.values()
                               if inspect.ismodule(value) and value in languages}
        if patched and seen <= patched[-1]:
            return scope_type()  # a device function's call inside the launch: nothing to restore
        scope = patch_lang.original(fn)
        if patched:  # a device function that sees another module: patched as Triton does (never restored)
            patched[-1] |= seen
            return scope
        patched.append(seen)  # a launch: GridExecutor restores its scope when the launch ends
        restore = scope.restore

        def restore_and_end_launch():
            try:
                restore()
            finally:
                patched.pop()

        scope.restore = restore_and_end_launch
        return scope

    patch_lang.original = original  # Triton's (a test counts its calls)
    interpreter._patch_lang = patch_lang
    return True


def skip_the_unchecked_overflow_arithmetic() -> bool:
    """Stop the interpreter computing overflow checks that it then drops.

    Triton's interpreter builder has ``sanitize_overflow=True`` and ``debug=False``: every add,
    subtract and multiply of int32 or narrower values is recomputed in int64 and compared with the
    type's bounds, and the ``device_assert`` that would read the comparison returns at once
    without debug (``semantic.device_assert``). Nothing is checked, and that arithmetic took a
    quarter of the kernel tests' time (tests/test_triton_kernels.py's tier and max-violation
    comparisons: 39.6-42.7 -> 30.0-30.6 s). Where the builder's options have ``debug`` on (Triton
    leaves it off for the interpreter; a test turns it on) the checks are real and left alone.
    True if the interpreter computes no unchecked bounds."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not {"debug", "sanitize_overflow"} <= set(options.__dataclass_fields__):
        warnings.warn("Triton's interpreter changed: the test suite runs with its overflow arithmetic (slower)",
                      stacklevel=2)
        return False
    if options.debug:
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


@contextlib.contextmanager
def warnings_as_errors():
    """Inside: every warning is an error (the tests that assert the library warns nothing), but
    NumPy's DeprecationWarning that older Triton interpreters (3.6, with NumPy 1.25 or newer) raise
    inside a kernel, which is Triton's and not the library's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "Conversion of an array with ndim > 0 to a scalar", DeprecationWarning)
        yield
