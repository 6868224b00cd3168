"""Triton kernels for mlloss, installed as ``mlloss.kernels`` (the Triton tier of ``mlloss.ops``).

``pairwise``: the all-pairs losses (pair partials, finalize, combine) and the data check;
``hardest``: the max-violation pairs of binary problems; ``_common``: the surrogate terms;
``variants``: the compiled variants, for ``benchmarks/kernel_sass.py``.
"""


def sass_variants():
    """The kernels' CUDA variants for the offline SASS tool (imports triton)."""
    from .variants import sass_variants as variants

    return variants()
