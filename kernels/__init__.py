"""Triton kernels for mlloss, installed as ``mlloss.kernels``: the Triton tier of ``mlloss.ops``.

``mlloss.ops.dispatch`` sends a call here for ``backend="triton"`` (and ``"auto"`` on CUDA); the
PyTorch tier (``mlloss.ops.torch_tier``) computes the same results and is the reference these
kernels are tested against (``tests/test_tiers.py``).

* ``pairwise``: the all-pairs losses: kernel 1 (the pair partials) and the host entry;
* ``reduce``: their finalize and combine steps (``combine`` also reduces ``hardest``'s sums);
* ``dense``: binary labels (and LaA's aggregated levels of at most 4 values) of up to ``dense.MAX_ITEMS``
  items, every pair compared in registers without the sorted layout;
* ``hardest``: the max-violation pairs, hard or soft, of binary labels and of LaA's levels;
* ``check``: the fused data check;
* ``levels``: LaA's label patterns of several binary columns ranked in one launch, and the
  layout of a few levels by a counting sort inside each group;
* ``_common``: the surrogate terms (``reverse_margin_terms``, one branch per row of
  ``mlloss.surrogates.TABLE``) and launch plumbing;
* ``variants``: the compiled variants, for ``benchmarks/kernel_sass.py``.
"""


def sass_variants():
    """The kernels' CUDA variants for the offline SASS tool (imports triton)."""
    from .variants import sass_variants as variants

    return variants()
