"""The arithmetic of every loss, behind one custom op per loss kind, in two tiers.

* ``dispatch``: the entry point, ``pair_loss`` and the op ``mlloss::pair_loss``: data checks,
  the problems' levels, and the switch of tier (``resolve_tier``: the user's ``backend``,
  ``"auto"``, ``"torch"``, ``"exact"`` or ``"triton"``).
* ``layout``: the sync-free pair layout both tiers read (items sorted by group and level), and
  the PyTorch tier's sorted cells and tables; the metrics sort with it too.
* The PyTorch tier (the reference tier and the CPU path): ``torch_tier`` (its entry), with
  ``allpairs`` (blocked exact all-pairs sums), ``closed_form`` (O(N log N) closed forms) and
  ``hardest`` (max-violation pairs).
* The Triton tier: the top-level folder ``kernels/``, installed as ``mlloss.kernels``
  (``kernels.pairwise``, ``kernels.dense``, ``kernels.hardest``); imported only when a call runs on it.
* ``fused``: the dtype rule, the registration and the autograd formula every op shares (the
  gradient is computed in the forward pass); ``pointwise``: the binary cross-entropy op;
  ``bce_ranking``: the cross-entropy plus a pairwise term (``bce+auc``, ``bce+pdaom``) as one op.
* ``replay``: opt-in replay of eager Triton-tier calls from CUDA graphs
  (``mlloss.set_graph_replay``), the host path paid once per shape.

The surrogates' formulas and the one table of their names are ``mlloss.surrogates``; the checks
are ``mlloss._validation``. docs/architecture.md draws the layers and the path of one call.
"""
