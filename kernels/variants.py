"""The compiled variants of the kernels, as the offline SASS tool needs them.

``benchmarks/kernel_sass.py`` compiles each variant for Hopper without a GPU and counts the
instructions, special-function ops and shuffles per pair of its loops. The variants are the
CUDA configurations the library launches: float32 scores, the fast special functions, the tile
shape of ``pairwise.TILES["cuda"]`` (with groups ``TILES["cuda groups"]``), every
surrogate, both costs, with and without groups; and the logistic ones again at the tiles of the
issue's instruction budget (``budget_variants``). The
uniform-cost variants are AUC's and LoA's (binary levels), the linear-cost ones LaA's of a few
binary labels (several levels); neither writes shares of Z_u, which only an ordinal column
needs. Then the dense kernel of small binary batches (``dense``), whose tile loop meets every
pair twice (once from each item's row): its per-pair counts add both visits, as the ordinal
kernel's add its two passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton.language as tl

from .._validation import STATUS_BAD_LABEL, STATUS_BAD_SCORE
from ..surrogates import USES_MARGIN
from ._common import SURROGATES, score_scale, value_scale
from . import dense
from .pairwise import TILES, _pair_partials_kernel, factored, register_cap

__all__ = ["SassVariant", "sass_variants"]

_POINTERS = {
    "scores_ptr": "*fp32",
    "values_ptr": "*fp32",
    "order_ptr": "*i32",
    "cell_start_ptr": "*i32",
    "cell_end_ptr": "*i32",
    "group_start_ptr": "*i32",
    "group_end_ptr": "*i32",
    "partials_ptr": "*fp32",
    "shares_ptr": "*fp64",
    "N": "i32",
    "num_chunks": "i32",
}
# In SASS address order: the lower-owning pass (the kernel's else branch) is laid out first,
# and each pass has its unmasked loop before its masked one.
_LOOPS = ("lower full", "lower masked", "upper full", "upper masked")
# The fast logistic's passes have two pairs of loops each: the per-pair terms for row blocks whose
# scores do not fit the factored terms (``kernel_sass`` reports these "(fallback)" loops without
# adding them to the totals), and the factored ones. Triton 3.6 lays these eight loops out in
# another order than 3.9 (and the passes the other way round), so they are labelled by what they
# hold (``_factored_loop_key``), in this order.
_FACTORED_LOOPS = tuple(
    label for side in ("lower", "upper") for label in
    (f"{side} full (fallback)", f"{side} masked (fallback)", f"{side} full", f"{side} masked")
)


def _factored_loop_key(opcodes: dict[str, int], pairs_per_iteration: float) -> tuple[bool, bool, bool]:
    """(upper pass, factored, masked) of a loop of the fast logistic kernel, from its opcodes: the
    upper pass takes a log (``MUFU.LG2``), the per-pair terms an ex2 per pair (the factored ones
    one per column), a masked loop an unsigned compare per pair (the partner-range test)."""
    ex2 = opcodes.get("MUFU.EX2", 0)
    unsigned_compares = sum(n for op, n in opcodes.items() if op.startswith("ISETP") and ".U32" in op)
    return "MUFU.LG2" in opcodes, ex2 < pairs_per_iteration, unsigned_compares >= pairs_per_iteration


@dataclass(frozen=True)
class SassVariant:
    """One specialization of a kernel (the attributes ``kernel_sass.KernelVariant`` reads)."""

    name: str
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int
    pairs_per_iteration: float
    loops: tuple
    #: When set, the loops are labelled in the order of this key of (opcodes, pairs per iteration)
    #: rather than in address order (``kernel_sass.analyse``).
    loop_key: object = None
    maxnreg: int | None = None  # the launch's register cap (pairwise.MAX_REGISTERS)


# The tile shape at which the per-pair instruction budget was stated (../gpu-baseline: the
# ~133 instructions of the first kernel and the ~20 of the reference kernel were counted on 64 x 64
# tiles of 4 warps, 32 pairs a thread): the "budget" variants compile the logistic kernel there, so
# that its loop body is held to the budget whatever tiles the library launches. Smaller launched
# tiles spend a few more instructions a pair on each tile's loads and indices and win on time:
# see pairwise.TILES.
BUDGET_TILES = (64, 64, 4)


def _ordinal_variant(name: str, surrogate: str, cost: str, grouped: bool, tiles: tuple,
                     tile_key: str | None = None) -> SassVariant:
    """The kernel as launched with ``tiles`` (with ``tile_key``, the key of ``pairwise.TILES`` they
    come from: its register cap too)."""
    block_m, block_n, num_warps = tiles
    factor = factored(True, SURROGATES[surrogate])
    constexprs = dict(
        MARGIN=1.0 if surrogate in USES_MARGIN else 0.0, HAS_GROUPS=grouped,
        COST_LINEAR=cost == "linear", SURROGATE=SURROGATES[surrogate], FAST=True, FACTOR=factor,
        SCORE_SCALE=score_scale(surrogate, True), VALUE_SCALE=value_scale(surrogate, True),
        ACC=tl.float32, WRITE_SHARES=False, BLOCK_M=block_m, BLOCK_N=block_n, SCORE_COLUMNS=False,
    )
    return SassVariant(
        name=name, kernel=_pair_partials_kernel, signature=dict(_POINTERS, **{k: "constexpr" for k in constexprs}),
        constexprs=constexprs, num_warps=num_warps, pairs_per_iteration=block_m * block_n / (32 * num_warps),
        loops=_FACTORED_LOOPS if factor else _LOOPS, loop_key=_factored_loop_key if factor else None,
        maxnreg=register_cap(tile_key, factor) if tile_key else None,
    )


def sass_variants() -> list[SassVariant]:
    """Every CUDA variant of the all-pairs kernel as launched (logistic first), the logistic ones
    at the budget's tiles, then the dense kernels."""
    variants = [
        _ordinal_variant(f"ordinal {surrogate} {cost}" + (" groups" if grouped else ""), surrogate, cost, grouped,
                         TILES[key], key)
        for surrogate in SURROGATES for cost in ("uniform", "linear") for grouped in (False, True)
        for key in ["cuda groups" if grouped else "cuda"]
    ]
    return variants + budget_variants() + dense_variants()


def budget_variants() -> list[SassVariant]:
    """The logistic all-pairs kernel (both costs, with and without groups) at ``BUDGET_TILES``."""
    shape = "x".join(map(str, BUDGET_TILES))
    return [_ordinal_variant(f"budget {shape}: logistic {cost}" + (" groups" if grouped else "") + " (ordinal kernel)",
                             "logistic", cost, grouped, BUDGET_TILES)
            for cost in ("uniform", "linear") for grouped in (False, True)]


def dense_variants() -> list[SassVariant]:
    """The CUDA variants of ``dense._dense_rows_kernel``: every surrogate's all-pairs loop, with
    and without groups, the logistic one with groups and a mask (a fixed-size batch) and LaA's
    three levels with linear costs, then the hardest pairs' two scans (comparisons only), the
    logistic with contiguous groups (its pair loop over the tiles of the rows' runs only, whose
    bounds two loops over the positions before and after the rows find), and the logistic with
    groups, without and with a mask, on int32 ids (``check.group_vector`` keeps 32-bit ids so)."""
    block_m, block_n, num_warps = dense.TILES["cuda"]
    # Binary labels as the caller passes them: one float32 column (an item stride of 1, which
    # Triton specializes as a constant); LaA's ranks are int32, also of item stride 1.
    signature = {"scores_ptr": "*fp32", "labels_ptr": "*fp32", "label_stride_problem": "i32",
                 "groups_ptr": "*i64", "keep_ptr": "*i8", "values_ptr": "*fp64", "grad_ptr": "*fp32",
                 "block_sums_ptr": "*fp64", "status_ptr": "*i32", "N": "i32", "num_blocks": "i32"}
    pairs_per_iteration = block_m * block_n / (32 * num_warps) / 2  # every pair is visited from both rows
    # (surrogate, groups, mask, levels, hardest, contiguous groups), on int64 ids
    cases = [(surrogate, grouped, False, 2, False, False) for surrogate in SURROGATES for grouped in (False, True)]
    cases += [("logistic", True, True, 2, False, False), ("logistic", True, False, 3, False, False),
              ("exponential", True, False, 2, True, False), ("logistic", True, False, 2, False, True)]
    cases = [(*case, "*i64") for case in cases]
    cases += [("logistic", True, masked, 2, False, False, "*i32") for masked in (False, True)]  # int32 ids
    variants = []
    for surrogate, grouped, masked, levels, hardest, runs, ids in cases:
        constexprs = dict(
            label_stride=1, GROUPED=grouped, RUNS=runs, MASKED=masked, HARDEST=hardest, LEVELS=levels, LINEAR=levels > 2,
            SURROGATE=SURROGATES[surrogate], MARGIN=1.0 if surrogate in USES_MARGIN else 0.0, FAST=not hardest,
            SCORE_SCALE=score_scale(surrogate, not hardest), VALUE_SCALE=value_scale(surrogate, not hardest),
            ACC=tl.float32, BLOCK_M=block_m, BLOCK_N=block_n, CHECK=False, BAD_SCORE=STATUS_BAD_SCORE, BAD_LABEL=STATUS_BAD_LABEL,
            SCORE_COLUMNS=False,
        )
        variants.append(SassVariant(
            name=f"dense {'hardest' if hardest else 'all-pairs'} {surrogate}"
            + (" contiguous groups" if runs else " groups" if grouped else "")
            + (" mask" if masked else "") + (f" {levels} levels linear" if levels > 2 else "")
            + (" int32 ids" if ids == "*i32" else ""),
            kernel=dense._dense_rows_kernel,
            signature=dict(signature, labels_ptr="*i32" if levels > 2 else "*fp32", groups_ptr=ids,
                           **{name: "constexpr" for name in constexprs}),
            constexprs=constexprs, num_warps=num_warps, pairs_per_iteration=pairs_per_iteration,
            loops=("scan", "ties") if hardest else ("runs before (per program)", "runs after (per program)", "both sides") if runs else ("both sides",),
        ))
    return variants
