"""The benchmark cases and baselines that the CPU runner (bench_pairwise.py) and the GPU runner
(bench_gpu.py) share: one definition of each, imported by both (neither runner imports the other).

- Cases: the loss definitions (``auc_logistic``, ``laa_logistic``, ``closed_forms``, ``pdaom``,
  ``grouped_auc_logistic``, ``grouped_laa_logistic``: kind, label prior(s), surrogate, grouping)
  and each runner's plan of sections, sizes and implementations (``cpu_cases`` and
  ``CPU_SECTION_TITLES``, ``gpu_cases`` and ``GPU_SECTION_TITLES``). A spec is a case's dict with
  ``n``, ``seed`` and ``impl`` added.
- Inputs: ``make_inputs`` (seeded by the spec's seed and N, so the CPU and GPU runs of a case see
  the same scores, labels and user ids; built on the CPU; ``on_device`` copies them) and the pair counts: ``count_pairs``
  (valid pairs, the pairs/s numerator) and ``group_pair_elements`` (sum of squared group sizes).
- Implementations (``build_forward``, ``build_step``): mlloss with each backend, and the baselines:
  a naive N x N broadcast with autograd, eager (``"naive"``) or under ``torch.compile``
  (``"naive-compile"``), a naive scatter min / max for PDAOM (``"naive-scatter"``), and LibAUC's
  ``PairwiseAUCLoss`` on the whole batch (``"libauc"``) or once per user (``"libauc-loop"``).
- The peak memory projected for the quadratic baselines before they run (``quadratic_elements``,
  ``projected_peak_mb``).
- Accuracy: a float64 naive evaluation for N <= 4096 (``float64_reference``), the comparison of
  every row with its case's reference row (``check_against_reference``) and the table cells that
  show it (``cross_check_cells``); the GPU runner's section 6 (``accuracy_cases``) compares the
  float32 Triton path with the same loss of float64 scores at any N.

The runners keep their own argument parsing, timing, memory measurement, skips and output files.
torch, mlloss and LibAUC are imported inside the functions: bench_gpu.py sets TRITON_INTERPRET
before torch is imported.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import _measure

LAA_PRIORS = (0.5, 0.1)
GROUP_SIZE = 50  # items per user in the GPU runner's grouped cases and closed forms, and CPU section 4
CLOSED_FORM_SURROGATES = ("exponential", "squared", "hinge")
LAA_CASE = f"LaA logistic, 2 labels (priors {LAA_PRIORS[0]}, {LAA_PRIORS[1]})"
PDAOM_CASE = "PDAOM exponential, groups, prior 0.1"
# The soft max-violation pairs (log-mean-exp extremes, three sums per cell scanned: kernels/scan.py)
# at a temperature of about the scores' spread within a user: no target, timed beside the hard ones.
PDAOM_SOFT_TEMPERATURE = 0.5

# Peak bytes per matrix element assumed before any size of an implementation has been measured;
# afterwards the measured peak of the largest size run so far is extrapolated.
PRIOR_BYTES_PER_ELEMENT = {"naive": 24.0, "libauc": 24.0}


# --------------------------------------------------------------------------------------------
# Cases: the loss definitions, then each runner's plan
# --------------------------------------------------------------------------------------------


def auc_logistic(prior: float) -> dict[str, Any]:
    return dict(case=f"AUC logistic, prior {prior}", kind="auc", prior=prior, surrogate="logistic")


AUC_CASE = auc_logistic(0.1)["case"]  # the bipartite partner of the grouped AUC case


def laa_logistic() -> dict[str, Any]:
    return dict(case=LAA_CASE, kind="laa", priors=list(LAA_PRIORS), surrogate="logistic")


def closed_forms(**grouping: int) -> list[dict[str, Any]]:
    """AUC (prior 0.1) and LaA (two labels) with each closed-form surrogate; ``grouping`` is
    ``n_groups=`` (a fixed number of users) or ``group_size=`` (items per user)."""
    cases = []
    for surrogate in CLOSED_FORM_SURROGATES:
        cases.append(dict(case=f"AUC {surrogate}, groups, prior 0.1", kind="auc", prior=0.1,
                          surrogate=surrogate, **grouping))
        cases.append(dict(case=f"LaA {surrogate}, groups, 2 labels", kind="laa", priors=list(LAA_PRIORS),
                          surrogate=surrogate, **grouping))
    return cases


def pdaom(temperature: float | None = None, **grouping: int) -> dict[str, Any]:
    """PDAOM's max-violation pairs; with ``temperature`` its soft ones (``PDAOMLoss(temperature=)``)."""
    if temperature is None:
        return dict(case=PDAOM_CASE, kind="pdaom", prior=0.1, surrogate="exponential", **grouping)
    return dict(case=f"PDAOM exponential, soft (temperature {temperature:g}), groups, prior 0.1", kind="pdaom", prior=0.1,
                surrogate="exponential", temperature=temperature, **grouping)


def grouped_auc_logistic(contiguous: bool = False, id_dtype: str = "int64") -> dict[str, Any]:
    """``contiguous``: each user's items consecutive, the loss told so (``contiguous_groups=True``);
    ``id_dtype``: the user ids' dtype (int32 ids: the layout's sort of them takes half the passes)."""
    return dict(case=f"grouped AUC logistic, ~{GROUP_SIZE} items/user" + (" in runs" if contiguous else "")
                + (f", {id_dtype} ids" if id_dtype != "int64" else "") + ", prior 0.1", kind="auc", prior=0.1,
                surrogate="logistic", group_size=GROUP_SIZE, contiguous=contiguous, id_dtype=id_dtype)


def grouped_laa_logistic() -> dict[str, Any]:
    return dict(case=f"grouped LaA logistic, ~{GROUP_SIZE} items/user, 2 labels", kind="laa",
                priors=list(LAA_PRIORS), surrogate="logistic", group_size=GROUP_SIZE)


ACCURACY_PREFIX = "float32 accuracy: "
# Scores + this much per level: a well-trained model (bipartite AUC ~0.998), whose loss is a sum of
# small terms log(1 + e^x), x ~ N(-4, sd 1.4): the stress test of the fast branch's log and its sums.
WELL_ORDERED_SEPARATION = 4.0


def accuracy_cases() -> list[dict[str, Any]]:
    """The float32 Triton path against the same loss on float64 scores (the kernels' exact branch
    with float64 sums): the headline AUC and LaA on standard normal scores, and AUC on well-ordered
    scores."""
    return [
        dict(auc_logistic(0.1), case=ACCURACY_PREFIX + AUC_CASE),
        dict(laa_logistic(), case=ACCURACY_PREFIX + LAA_CASE),
        dict(auc_logistic(0.1), case=f"{ACCURACY_PREFIX}{AUC_CASE}, well-ordered scores "
             f"(+{WELL_ORDERED_SEPARATION:g} per level)", separation=WELL_ORDERED_SEPARATION),
    ]


TILES_PREFIX = "tiles: "
# Section 7's (BLOCK_M x BLOCK_N x warps) of the layout kernel, timed against the library's choice
# (pairwise.TILES["cuda"], 64x64x8 since d3d908a's run, listed too: the two rows' gap is the run's
# noise). All compile
# for sm_90 without spills in the logistic uniform and linear grouped variants; 128x128x8 spills
# 104 B (uniform) to 1.5 KB (linear, groups) per thread and is left out (tile_sass_variants,
# results/kernel-sass-tiles.json).
TILE_CANDIDATES = ("64x64x4", "64x64x8", "32x128x4", "128x32x4", "64x128x8", "128x64x8", "32x64x4", "64x32x4")
SPILLING_TILES = ("128x128x8",)
# Section 8: the same kernel's tiles in CUDA graphs (``mlloss-graph@64x32x4``: the call captured with
# those tiles, its replay timed; the kernels' time without the host path), for the calls whose
# eager time is host-bound: the grouped AUC and LaA (users of ~50 items) at 2^20 and 16,384 with
# GROUPED_TILE_CANDIDATES, and AUC and LaA at N = 16,384 with TILE_CANDIDATES. A grouped row block scans
# the partner positions of the groups its rows fall in, about BLOCK_M + 50 positions rounded up to
# BLOCK_N tiles, where ~50 hold valid pairs: smaller tiles waste less (pairwise.TILES["cuda groups"]).
GRAPH_TILES_PREFIX = "graph tiles: "
# Section 9: the layout kernel's calls in CUDA graphs with the library's settings, with the fast
# logistic's per-pair terms everywhere (``@per-pair``: the kernel before its factored terms, 5
# special-function ops a pair instead of 3) and without the register cap (``@uncapped``); AUC and
# LaA with and without users of ~50 items, at 16,384 and 1,048,576.
FACTORED_PREFIX = "factored: "
# Section 10: the dense kernels' threshold (kernels/dense.py MAX_ITEMS, 2,048 items): the grouped AUC
# and LaA (users of ~50 items, the recipe's batches) on the dense kernels (``@dense``: every N up to
# DENSE_LIMIT) and on the layout kernels (``mlloss-layout``, ``@layout``), eager and in CUDA graphs,
# at 2,048 to 16,384 items. The dense kernels visit all N^2 pairs (38-52 instructions a pair) but
# need 2 launches and 9-19 aten ops, the layout kernels a group's pairs only after 5 launches and
# 14-30 ops: the eager calls are bound by the host, the graphs by the device.
DENSE_PREFIX = "dense or layout: "
GROUPED_TILE_CANDIDATES = ("64x64x4", "64x32x4", "32x64x4", "32x32x4", "32x32x2", "16x64x4", "16x32x2", "64x16x2",
                           "32x16x2")


def tile_sass_variants() -> list[Any]:
    """The ordinal logistic kernel (uniform cost; linear cost with groups) with each tile shape of
    section 7 and the spilling ones, for ``python benchmarks/kernel_sass.py --variants-from
    cases:tile_sass_variants --output benchmarks/results/kernel-sass-tiles.json``."""
    import dataclasses

    from mlloss.kernels.variants import sass_variants

    wanted = [v for v in sass_variants() if v.name in ("ordinal logistic uniform", "ordinal logistic linear groups")]
    shaped = []
    for shape in TILE_CANDIDATES + SPILLING_TILES:
        block_m, block_n, num_warps = parse_tiles(shape)
        shaped += [dataclasses.replace(
            v, name=f"{v.name} {shape}", num_warps=num_warps, pairs_per_iteration=block_m * block_n / (32 * num_warps),
            constexprs=dict(v.constexprs, BLOCK_M=block_m, BLOCK_N=block_n)) for v in wanted]
    return shaped


#: ``kernel_settings``' words besides tile shapes: "@per-pair" rows time the fast logistic's
#: per-pair terms (the kernel before its factored terms), "@uncapped" the library's tiles without
#: their register cap, each beside the library's own row.
PER_PAIR, UNCAPPED = "per-pair", "uncapped"
#: ``kernel_settings``' words for section 10: "@dense" rows take the dense kernels up to DENSE_LIMIT
#: items (their packed counts need fewer than 2^15), "@layout" rows the layout kernels at every N.
DENSE, LAYOUT = "dense", "layout"
DENSE_LIMIT = 2**15 - 1


def parse_tiles(shape: str) -> tuple[int, int, int]:
    """``"64x32x4"`` -> (64, 32, 4): BLOCK_M x BLOCK_N x warps, as ``pairwise.TILES`` holds them."""
    block_m, block_n, num_warps = (int(part) for part in shape.split("x"))
    return block_m, block_n, num_warps


CPU_SECTION_TITLES = {
    1: "Section 1: logistic bipartite AUC, no groups",
    2: "Section 2: logistic LaA, two labels, no groups",
    3: "Section 3: closed forms at scale (groups)",
    4: "Section 4: grouped logistic AUC (users of ~50 items)",
}


def cpu_cases(section: int, quick: bool) -> list[dict[str, Any]]:
    """bench_pairwise.py's cases of ``section``: each with its sizes and implementations (reference
    first), ``max_n`` capping a baseline's N to keep the run's time."""
    sizes = [1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    if section == 1:
        priors = [0.5] if quick else [0.5, 0.1]
        return [dict(auc_logistic(p), section=1, sizes=sizes, impls=["mlloss", "libauc", "naive"]) for p in priors]
    if section == 2:
        return [dict(laa_logistic(), section=2, sizes=sizes, impls=["mlloss", "naive"], max_n={"naive": 8192})]
    if section == 3:
        n, n_groups = (50_000, 1_000) if quick else (1_000_000, 20_000)
        return [dict(case, section=3, sizes=[n], impls=["mlloss", "mlloss-torch"])
                for case in closed_forms(n_groups=n_groups)] + [
            dict(pdaom(n_groups=n_groups), section=3, sizes=[n], impls=["mlloss", "naive-scatter"])]
    if section == 4:
        return [dict(grouped_auc_logistic(), section=4, sizes=sizes, impls=["mlloss", "naive", "libauc-loop"],
                     max_n={"naive": 8192})]
    raise ValueError(f"unknown section {section}")


GPU_SECTION_TITLES = {
    1: "Section 1: logistic bipartite AUC, no groups",
    2: "Section 2: logistic LaA, two labels, no groups (headline)",
    3: "Section 3: closed forms at scale (users of ~50 items)",
    4: "Section 4: grouped logistic AUC (users of ~50 items)",
    5: "Section 5: grouped logistic LaA (users of ~50 items)",
    6: "Section 6: float32 accuracy of the Triton path against float64",
    7: "Section 7: the layout kernel's tiles (BLOCK_M x BLOCK_N x warps)",
    8: "Section 8: the layout kernel's tiles in CUDA graphs (the kernels' time, no host path)",
    9: "Section 9: the fast logistic's factored terms against its per-pair terms (CUDA graphs)",
    10: "Section 10: the dense kernels against the layout kernels, 2,048 to 16,384 items (eager and CUDA graphs)",
}
# bench_gpu.py's sizes per mode: the mlloss sweep, the grouped sweep, and the one size of section 3.
GPU_SIZES = {
    "full": ([1024, 4096, 16384, 65536, 262144, 1048576], [1024, 4096, 16384, 65536, 262144, 1048576], 1048576),
    "quick": ([1024, 16384, 1048576], [16384, 1048576], 1048576),
    "smoke": ([256], [256], 256),
}
HEADLINE_SPEEDUP_N = 16384  # the GPU runner's naive / Triton ratios and small-call targets
# The recipe's batch, as many recommenders train: the GPU runner's calls beside their naive peers
# there too (no target; LaA's naive torch.compile row runs there in --quick as well).
RECIPE_BATCH_N = 1024
HEADLINE_MEMORY_N = 1048576  # its pairs/s, memory, large-call and accuracy targets


def gpu_cases(section: int, mode: str, sizes_override: list[int] | None = None) -> list[dict[str, Any]]:
    """bench_gpu.py's cases of ``section`` in ``mode`` (full, quick, smoke): each with its sizes and
    implementations (reference first), ``only_at`` limiting an implementation to some N, and for the
    grouped cases the ``dense_case`` they pair with."""
    sweep, grouped_sweep, big = GPU_SIZES[mode]
    if sizes_override:
        sweep = grouped_sweep = sizes_override
    quick = mode == "quick"

    def at(impl: str, *sizes: int) -> dict[str, list[int]]:
        """``impl`` run only at ``sizes`` (a smoke run, or --sizes, runs it at every size)."""
        return {} if mode == "smoke" or sizes_override else {impl: list(sizes)}

    # torch.compile costs ~5-30 s per (case, N): compiled rows at every size only where they feed the
    # headline (LaA, grouped LaA) in the full run, at the acceptance N otherwise; LaA's in --quick
    # at the recipe's batch too (what compiling the obvious code gives a user there), and the
    # Triton tier's loss compiled as a user's step compiles it at both.
    compile_at_speedup_n = at("naive-compile", HEADLINE_SPEEDUP_N)
    both = (RECIPE_BATCH_N, HEADLINE_SPEEDUP_N)
    # The dense kernels' threshold (kernels/dense.py MAX_ITEMS) is measured against the layout
    # kernels at the recipe's batch size.
    layout_at = {"mlloss-layout": [RECIPE_BATCH_N]}
    # The host-bound calls (the small-call targets) again in a CUDA graph: their kernels' own time.
    # and eager without the data check (validate_args=False: no host sync, the host path and the
    # kernels overlap), as a training step that has checked its data elsewhere runs it.
    graph_at = {impl: list(both) for impl in ("mlloss-graph", "mlloss-unchecked", "mlloss-replay")}
    if section == 1:
        # quick keeps prior 0.1: the dense partner of the grouped AUC case in the acceptance ratio
        priors = [0.1] if quick else [0.5, 0.1]
        impls = ["mlloss-triton", "mlloss-graph", "mlloss-unchecked", "mlloss-replay", "mlloss-layout", "mlloss-torch",
                 "naive", "libauc"]
        if not quick:
            impls.insert(6, "naive-compile")
        return [dict(auc_logistic(p), section=1, sizes=sweep, impls=impls,
                     only_at=compile_at_speedup_n | layout_at | graph_at) for p in priors]
    if section == 2:
        return [dict(laa_logistic(), section=2, sizes=sweep,
                     impls=["mlloss-triton", "mlloss-graph", "mlloss-unchecked", "mlloss-replay", "mlloss-compile",
                            "mlloss-torch", "naive", "naive-compile"],
                     only_at=(at("naive-compile", *both) if quick else {}) | at("mlloss-compile", *both) | graph_at)]
    if section == 3:
        if sizes_override:
            big = max(sizes_override)
        return [dict(case, section=3, sizes=[big], impls=["mlloss-exact", "mlloss-triton", "mlloss-torch"])
                for case in closed_forms(group_size=GROUP_SIZE)] + [
            dict(pdaom(group_size=GROUP_SIZE), section=3, sizes=[big], impls=["mlloss", "mlloss-graph", "mlloss-unchecked", "mlloss-replay",
                                                                   "naive-scatter"]),
            dict(pdaom(PDAOM_SOFT_TEMPERATURE, group_size=GROUP_SIZE), section=3, sizes=[big],
                 impls=["mlloss", "mlloss-graph", "naive-scatter"])]
    if section == 4:
        impls = ["mlloss-triton", "mlloss-graph", "mlloss-unchecked", "mlloss-replay", "mlloss-layout", "mlloss-torch",
                 "naive", "libauc-loop"]
        if not quick:
            impls.insert(6, "naive-compile")
        # and the same users in runs, told so (contiguous_groups=True: no sort of the ids; the dense
        # kernels visit each user's tiles only)
        runs_impls = ["mlloss-triton", "mlloss-graph", "mlloss-unchecked"]
        return [dict(grouped_auc_logistic(), section=4, sizes=grouped_sweep, impls=impls,
                     only_at=compile_at_speedup_n | layout_at, dense_case=AUC_CASE),
                dict(grouped_auc_logistic(contiguous=True), section=4, sizes=grouped_sweep, impls=runs_impls),
                # users of the same sizes with int32 ids (no runs): the sort of the ids in 4 radix passes, not 8
                dict(grouped_auc_logistic(id_dtype="int32"), section=4, sizes=grouped_sweep, impls=runs_impls)]
    if section == 5:
        return [dict(grouped_laa_logistic(), section=5, sizes=grouped_sweep,
                     impls=["mlloss-triton", "mlloss-graph", "mlloss-unchecked", "mlloss-replay", "mlloss-torch", "naive",
                            "naive-compile"],
                     only_at=compile_at_speedup_n if quick else {}, dense_case=LAA_CASE)]
    if section == 6:
        sizes = [big] if mode != "full" or sizes_override else [HEADLINE_SPEEDUP_N, big]
        return [dict(case, section=6, sizes=sizes, impls=["mlloss-triton-f64", "mlloss-triton"])
                for case in accuracy_cases()]
    if section == 7:
        sizes = sizes_override or ([big] if mode == "smoke" else [HEADLINE_SPEEDUP_N, big])
        return [dict(case, case=TILES_PREFIX + case["case"], section=7, sizes=sizes,
                     impls=["mlloss-layout"] + [f"mlloss-layout@{choice}" for choice in TILE_CANDIDATES])
                for case in (auc_logistic(0.1), laa_logistic())]
    if section == 8:
        def graphs(candidates):
            return ["mlloss-graph"] + [f"mlloss-graph@{choice}" for choice in candidates]

        # The grouped cases first, at 2^20 first: the data a budget-limited run must not miss.
        small = sizes_override or ([big] if mode == "smoke" else [HEADLINE_SPEEDUP_N])
        grouped = sizes_override or ([big] if mode == "smoke" else [big, HEADLINE_SPEEDUP_N])
        return [dict(case, case=GRAPH_TILES_PREFIX + case["case"], section=8, sizes=grouped,
                     impls=graphs(GROUPED_TILE_CANDIDATES))
                for case in (grouped_auc_logistic(), grouped_laa_logistic())] + [
            dict(case, case=GRAPH_TILES_PREFIX + case["case"], section=8, sizes=small, impls=graphs(TILE_CANDIDATES))
            for case in (auc_logistic(0.1), laa_logistic())]
    if section == 9:
        sizes = sizes_override or ([big] if mode == "smoke" else [HEADLINE_SPEEDUP_N, big])
        impls = ["mlloss-graph", f"mlloss-graph@{PER_PAIR}", f"mlloss-graph@{UNCAPPED}"]
        return [dict(case, case=FACTORED_PREFIX + case["case"], section=9, sizes=sizes, impls=impls)
                for case in (auc_logistic(0.1), laa_logistic(), grouped_auc_logistic(), grouped_laa_logistic())]
    if section == 10:
        sizes = sizes_override or ([256] if mode == "smoke" else [2048, 4096, 8192, 16384])
        impls = ["mlloss-layout", f"mlloss-triton@{DENSE}", f"mlloss-graph@{LAYOUT}", f"mlloss-graph@{DENSE}"]
        return [dict(case, case=DENSE_PREFIX + case["case"], section=10, sizes=sizes, impls=impls)
                for case in (grouped_auc_logistic(), grouped_laa_logistic())]
    raise ValueError(f"unknown section {section}; expected one of {sorted(GPU_SECTION_TITLES)}")


# --------------------------------------------------------------------------------------------
# Inputs and pair counts (seeded by the case and N: the same in every process and runner)
# --------------------------------------------------------------------------------------------


def make_inputs(spec: dict[str, Any], n: int | None = None):
    """(scores, labels, groups or None) on the CPU for ``spec`` at N = ``n`` (default ``spec["n"]``)."""
    import torch

    n = spec["n"] if n is None else n
    generator = torch.Generator().manual_seed(spec["seed"] * 1_000_003 + n)
    scores = torch.randn(n, generator=generator)
    if spec["kind"] == "laa":
        labels = (torch.rand(n, len(spec["priors"]), generator=generator) < torch.tensor(spec["priors"])).float()
    else:
        labels = (torch.rand(n, generator=generator) < spec["prior"]).float()
    groups = None
    if spec.get("n_groups") or spec.get("group_size"):
        if spec.get("n_groups"):  # a fixed number of groups; scaled down for the tiny warm-up input
            n_groups = max(1, round(spec["n_groups"] * n / spec["n"]))
        else:
            n_groups = max(1, n // spec["group_size"])
        id_dtype = getattr(torch, spec.get("id_dtype", "int64"))
        user_ids = torch.randint(0, min(2**40, torch.iinfo(id_dtype).max + 1), (n_groups,), generator=generator)
        groups = user_ids[torch.randint(0, n_groups, (n,), generator=generator)].to(id_dtype)
        if spec.get("contiguous"):  # each user's items in one run (the users' random ids ascending)
            groups = torch.sort(groups, stable=True).values
    if spec.get("separation"):
        scores = scores + spec["separation"] * levels_of(spec, labels)
    return scores, labels, groups


def on_device(inputs, device):
    """``inputs`` (``make_inputs``' tuple) copied to ``device``; None stays None."""
    return tuple(None if t is None else t.to(device) for t in inputs)


def levels_of(spec: dict[str, Any], labels):
    return labels.sum(1) if spec["kind"] == "laa" else labels


def count_pairs(spec: dict[str, Any], labels, groups) -> float:
    """Valid pairs: level_i > level_j in the same group (for LibAUC also its pos x neg elements)."""
    import torch

    level = levels_of(spec, labels).to(torch.int64)
    num_levels = int(level.max()) + 1
    inverse = torch.zeros_like(level) if groups is None else torch.unique(groups, return_inverse=True)[1]
    num_groups = int(inverse.max()) + 1
    counts = torch.bincount(inverse * num_levels + level, minlength=num_groups * num_levels)
    counts = counts.reshape(num_groups, num_levels).to(torch.float64)
    upper = torch.tril(torch.ones(num_levels, num_levels, dtype=torch.float64), -1)  # a > b
    return float(torch.einsum("ga,ab,gb->", counts, upper, counts))


def group_pair_elements(groups, n: int) -> float:
    """sum_u n_u^2 (N^2 without groups): the dense-equivalent size of the pair space."""
    import torch

    if groups is None:
        return float(n) * n
    counts = torch.unique(groups, return_counts=True)[1].to(torch.float64)
    return float((counts * counts).sum())


# --------------------------------------------------------------------------------------------
# Implementations: mlloss and the baselines
# --------------------------------------------------------------------------------------------


def naive_broadcast_loss(spec, scores, labels, groups):
    """The spec's loss from full N x N matrices and autograd: the obvious way to write it."""
    import torch
    import torch.nn.functional as F

    level = levels_of(spec, labels)
    cost = (level[:, None] - level[None, :]).clamp(min=0)  # linear cost; 0/1 for binary labels
    if groups is None:
        weight = cost / cost.sum()
    else:
        cost = cost * (groups[:, None] == groups[None, :])
        _, inverse = torch.unique(groups, return_inverse=True)
        group_cost = torch.zeros(int(inverse.max()) + 1, dtype=cost.dtype, device=cost.device).index_add_(
            0, inverse, cost.sum(1)
        )
        groups_with_pairs = (group_cost > 0).sum()
        weight = cost / (group_cost[inverse].clamp(min=1e-30)[:, None] * groups_with_pairs)
    t = scores[:, None] - scores[None, :]
    return (F.softplus(-t) * weight).sum()


def naive_pdaom_loss(scores, labels, groups, temperature: float | None = None):
    """sum over users of exp(-(min positive score - max negative score)) by scatter min / max;
    with ``temperature`` tau the soft extremes, -tau log mean exp(-s / tau) of the positives and
    tau log mean exp(s / tau) of the negatives, each shifted by its hard extreme (scatter min / max,
    then sums of exp by index_add)."""
    import torch

    _, inverse = torch.unique(groups, return_inverse=True)
    num_groups = int(inverse.max()) + 1

    def extreme(members, sign):  # sign -1: each user's (soft) min of its members, +1: max
        at, values = inverse[members], scores[members]
        hard = torch.full((num_groups,), -sign * math.inf, dtype=scores.dtype, device=scores.device).scatter_reduce(
            0, at, values, "amax" if sign > 0 else "amin")
        if temperature is None:
            return hard
        shift = torch.where(torch.isfinite(hard), hard, 0)
        sums = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add(
            0, at, torch.exp(sign * (values - shift[at]) / temperature))
        counts = torch.bincount(at, minlength=num_groups).clamp(min=1)
        return hard + sign * temperature * torch.log(sums / counts)

    low_pos, high_neg = extreme(labels > 0, -1), extreme(labels == 0, 1)
    valid = torch.isfinite(low_pos) & torch.isfinite(high_neg)
    return torch.exp(-(low_pos[valid] - high_neg[valid])).sum()


def libauc_missing(planned: list[dict[str, Any]]) -> str | None:
    """Why the LibAUC rows of the ``planned`` cases cannot run (``libauc.losses`` not importable),
    or None (none planned, or importable): both runners record it as the rows' skip reason (the
    peer is optional)."""
    if not any(impl.startswith("libauc") for case in planned for impl in case["impls"]):
        return None
    try:
        import libauc.losses  # noqa: F401
    except Exception as exc:  # noqa: BLE001 -- e.g. its scikit-learn / pandas needs missing too
        return f"libauc not importable ({type(exc).__name__}: {exc})"
    return None


def build_forward(spec: dict[str, Any], inputs, compile_backend: str = "inductor"):
    """A closure computing the loss of ``inputs`` (scores made to require grad) for ``spec["impl"]``.

    ``"mlloss"`` is mlloss with ``backend="auto"``, ``"mlloss-<backend>"`` mlloss with that backend
    (``"mlloss-torch"``, ``"mlloss-triton"``, ``"mlloss-exact"``), and with ``-f64`` appended the same
    loss of float64 copies of the scores (section 6's reference); ``"mlloss-layout"`` is the Triton
    tier with its dense small-batch kernels off (``kernels/dense.py``), the layout kernels at every N,
    ``"mlloss-unchecked"`` the Triton tier with ``validate_args=False`` (no data check, no host sync),
    ``"mlloss-replay"`` the Triton tier with graph replay on (``mlloss.set_graph_replay``: the call
    replayed from its CUDA graph after its second run; the rows' warm-up calls capture it; every
    other mlloss row turns replay off),
    and ``"mlloss-layout@64x64x8"`` the same with those tiles (section 7; ``kernel_settings``).
    ``"naive-compile"`` is
    ``naive_broadcast_loss`` under ``torch.compile(backend=compile_backend, dynamic=False)``,
    compiled afresh (``torch._dynamo.reset()``: no recompile limit, no reuse across rows; its
    counters are cleared for ``compile_counters``), and ``"mlloss-compile"`` the Triton tier's loss
    (its defaults: the data check on) compiled the same way, as a user's compiled step calls it
    (the loss an opaque operator that runs its Python at every call). The LibAUC rows use
    ``PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)``: log(1 + exp(-hparam * t)) on the raw
    predictions (no sigmoid, no margin), the same mean over positive x negative pairs as the
    logistic AUC cases. The inputs may live on any device.
    """
    import torch

    scores, labels, groups = inputs
    scores.requires_grad_(True)
    impl = spec["impl"]

    if impl == "mlloss" or impl.startswith("mlloss-"):
        backend = impl.partition("-")[2] or "auto"
        backend, _, tiles = backend.partition("@")  # "@64x64x8": the layout kernel's tiles (section 7)
        # "-f64": the loss of float64 copies of the scores (its gradient flows back to them).
        float64 = backend.endswith("-f64")
        backend = backend.removesuffix("-f64")
        layout_only = backend == "layout"  # the Triton tier without its dense small-batch kernels
        unchecked = backend == "unchecked"  # the Triton tier with validate_args=False
        replayed = backend == "replay"  # the Triton tier replayed from CUDA graphs
        compiled = backend == "compile"  # the Triton tier inside torch.compile
        backend = "triton" if layout_only or unchecked or replayed or compiled else backend
        loss_fn = mlloss_loss(spec, backend=backend, validate_args=not unchecked)
        import mlloss

        mlloss.set_graph_replay(replayed)  # (off: also releases the graphs of an earlier row)
        if compiled:
            loss_fn = fresh_compile(loss_fn, compile_backend)

        def forward():
            s = scores.double() if float64 else scores
            with kernel_settings(s.device, layout_only=layout_only, tiles=tiles):
                return loss_fn(s, labels, groups)

    elif impl == "libauc":
        from libauc.losses import PairwiseAUCLoss

        loss_fn = PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)

        def forward():
            return loss_fn(scores.view(-1, 1), labels.view(-1, 1))

    elif impl == "libauc-loop":
        from libauc.losses import PairwiseAUCLoss

        loss_fn = PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)

        def forward():
            order = torch.argsort(groups, stable=True)
            _, sizes = torch.unique_consecutive(groups[order], return_counts=True)
            sizes = sizes.tolist()
            terms = []
            for s_u, y_u in zip(torch.split(scores[order], sizes), torch.split(labels[order], sizes)):
                positives = int(y_u.sum())
                if 0 < positives < y_u.numel():  # LibAUC asserts a positive; skip one-class users
                    terms.append(loss_fn(s_u.view(-1, 1), y_u.view(-1, 1)))
            return torch.stack(terms).mean() if terms else scores.sum() * 0

    elif impl == "naive":

        def forward():
            return naive_broadcast_loss(spec, scores, labels, groups)

    elif impl == "naive-compile":

        def naive(s, y, g):
            return naive_broadcast_loss(spec, s, y, g)

        compiled = fresh_compile(naive, compile_backend)

        def forward():
            return compiled(scores, labels, groups)

    elif impl == "naive-scatter":

        def forward():
            return naive_pdaom_loss(scores, labels, groups, spec.get("temperature"))

    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return forward


def fresh_compile(function, compile_backend: str):
    """``torch.compile(function)`` with static shapes, compiled afresh: Dynamo's caches and counters
    reset (no recompile limit or reuse across rows; ``compile_counters`` counts this build's)."""
    import torch
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    return torch.compile(function, backend=compile_backend, dynamic=False)


#: The rows that run under torch.compile (``fresh_compile``).
COMPILED_IMPLS = ("naive-compile", "mlloss-compile")


@contextlib.contextmanager
def kernel_settings(device, *, layout_only: bool = False, tiles: str = ""):
    """The Triton tier's launch settings changed for one call: its dense small-batch kernels off
    (``layout_only``: the layout kernels at every N), and the layout kernel's ``tiles`` setting on
    ``device``'s target, with and without groups: (BLOCK_M, BLOCK_N, warps) such as ``"64x64x8"``
    (see ``parse_tiles``; launched without ``pairwise.MAX_REGISTERS``' cap), ``"uncapped"`` (the
    library's tiles without that cap), ``"per-pair"`` (the fast logistic's per-pair terms
    everywhere: ``pairwise.FACTOR_LOGISTIC`` off), ``"dense"`` (the dense kernels up to
    ``DENSE_LIMIT`` items) or ``"layout"`` (the layout kernels at every N, as ``layout_only``)."""
    if not (layout_only or tiles):
        yield
        return
    from mlloss.kernels import dense, pairwise
    from mlloss.kernels._common import launch_target

    max_items, saved_tiles = (dense.MAX_ITEMS, dense.MAX_RUN_ITEMS), dict(pairwise.TILES)
    saved_caps = dict(pairwise.MAX_REGISTERS)
    factor = pairwise.FACTOR_LOGISTIC
    try:
        if layout_only:
            dense.MAX_ITEMS = dense.MAX_RUN_ITEMS = 0
        if tiles in (DENSE, LAYOUT):
            dense.MAX_ITEMS = DENSE_LIMIT if tiles == DENSE else 0
        elif tiles == PER_PAIR:
            pairwise.FACTOR_LOGISTIC = False
        elif tiles:  # with and without groups
            target = launch_target(device)
            for key in {pairwise.tile_key(target), pairwise.tile_key(target, grouped=True)}:
                pairwise.MAX_REGISTERS.pop(key, None)
                if tiles != UNCAPPED:
                    pairwise.TILES[key] = parse_tiles(tiles)
        yield
    finally:
        dense.MAX_ITEMS, dense.MAX_RUN_ITEMS = max_items
        pairwise.FACTOR_LOGISTIC = factor
        pairwise.TILES.clear()
        pairwise.TILES.update(saved_tiles)
        pairwise.MAX_REGISTERS.clear()
        pairwise.MAX_REGISTERS.update(saved_caps)


def mlloss_loss(spec: dict[str, Any], **options):
    """The mlloss loss of ``spec``'s kind and surrogate (PDAOM keeps its own), made with ``options``."""
    import mlloss

    if spec.get("contiguous"):
        options = dict(options, contiguous_groups=True)
    if spec["kind"] == "pdaom":
        return mlloss.PDAOMLoss(temperature=spec.get("temperature"), **options)
    if spec["kind"] == "laa":
        return mlloss.LaALoss(surrogate=spec["surrogate"], **options)
    return mlloss.AUCLoss(surrogate=spec["surrogate"], **options)


def graphed_step(spec: dict[str, Any], inputs, tiles: str = ""):
    """``"mlloss-graph"``: the Triton tier's forward + backward (``validate_args=False``: no host
    sync) captured once in a CUDA graph after three warm-up calls on a side stream (PyTorch's
    recipe for whole-step capture); each step replays it. The loss and the scores' gradient are
    the graph's static outputs, rewritten by every replay (each step sets ``.grad`` to the latter). What a step costs without the host
    path: the GPU time of the kernels and copies, as a user gets it with ``torch.cuda.graphs``
    or ``torch.compile(mode="reduce-overhead")``. ``tiles``: the layout kernel's tiles while the
    call is warmed up and captured (``"mlloss-graph@64x32x4"``, section 8; ``kernel_settings``)."""
    import torch

    scores, labels, groups = inputs
    if scores.device.type != "cuda":
        raise RuntimeError("mlloss-graph captures a CUDA graph: it needs a CUDA device")
    loss_fn = mlloss_loss(spec, backend="triton", validate_args=False)
    scores.requires_grad_(True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with kernel_settings(scores.device, tiles=tiles):  # the replays launch what the capture launched
        with torch.cuda.stream(side):
            for _ in range(3):
                scores.grad = None
                loss_fn(scores, labels, groups).backward()
        torch.cuda.current_stream().wait_stream(side)
        scores.grad = None  # allocated by the capture, in the graph's pool
        with torch.cuda.graph(graph):
            loss = loss_fn(scores, labels, groups)
            loss.backward()
    static_grad = scores.grad

    def step():
        graph.replay()
        scores.grad = static_grad  # the runner clears .grad before timing; the replays write here
        return loss.detach()

    return step


def build_step(spec: dict[str, Any], inputs, compile_backend: str = "inductor"):
    """One forward + backward on ``inputs``; returns the detached loss (no host sync of its own)."""
    base, _, tiles = spec["impl"].partition("@")
    if base == "mlloss-graph":
        return graphed_step(spec, inputs, tiles)
    scores = inputs[0]
    forward = build_forward(spec, inputs, compile_backend)

    def step():
        scores.grad = None
        loss = forward()
        loss.backward()
        return loss.detach()

    return step


def compile_counters() -> dict[str, int]:
    """Graph breaks and compiled graphs of the last compiled row's build (``fresh_compile``: counters since its reset)."""
    from torch._dynamo.utils import counters

    return {"graph_breaks": sum(counters["graph_break"].values()),
            "compiled_graphs": int(counters["stats"]["unique_graphs"])}


def quadratic_elements(impl: str, n: int, pairs: float) -> float | None:
    """Elements of the quadratic temporaries, for the implementations that build them: N x N for
    the naive broadcasts, the pos x neg matrix for LibAUC on the whole batch; None for the others."""
    if impl.startswith("naive") and impl != "naive-scatter":
        return float(n) * n
    if impl == "libauc":
        return pairs
    return None


def projected_peak_mb(impl: str, elements: float, measured: tuple[float, float] | None) -> float:
    """Peak extra MB of ``impl`` at ``elements`` quadratic elements: ``measured`` (elements, MB) of
    an earlier size extrapolated, or ``PRIOR_BYTES_PER_ELEMENT`` before any measurement."""
    if measured is not None:
        seen_elements, seen_mb = measured
        return seen_mb / seen_elements * elements
    return PRIOR_BYTES_PER_ELEMENT["libauc" if impl == "libauc" else "naive"] * elements / _measure.MB


# --------------------------------------------------------------------------------------------
# Accuracy: float64 reference and cross-checks against the reference row
# --------------------------------------------------------------------------------------------


def float64_reference(spec, inputs) -> float | None:
    """Float64 naive value for small N (independent check of the reference row)."""
    import torch

    if spec["kind"] == "pdaom" or spec["surrogate"] != "logistic" or spec["n"] > 4096:
        return None
    scores, labels, groups = inputs
    with torch.no_grad():
        # The naive builder works in the dtype of its inputs.
        value = naive_broadcast_loss(spec, scores.double(), labels.double(), groups)
    return float(value)


def check_against_reference(
    row: dict[str, Any], value: float, grad, reference: dict[str, Any] | None, f64: float | None
) -> dict[str, Any]:
    """Fill ``row``'s cross-check fields; return the case's reference (value, gradient, implementation).

    The first measured implementation of a (case, N) is the reference: it is compared with the
    float64 naive value when there is one; every later row with the reference's value and
    gradient (relative to the largest reference gradient entry).
    """
    if reference is None:
        row["reference"] = True
        if f64 is not None:
            row["f64_rel_diff"] = abs(value - f64) / abs(f64)
        return {"value": value, "grad": grad, "impl": row["impl"]}
    row["value_rel_diff"] = abs(value - reference["value"]) / abs(reference["value"])
    scale = float(reference["grad"].abs().max())
    row["grad_rel_diff"] = float((grad - reference["grad"]).abs().max()) / scale
    row["reference_impl"] = reference["impl"]
    return reference


def cross_check_cells(row: dict[str, Any]) -> tuple[str, str]:
    """The "value rel. diff" and "grad rel. diff" cells of a measured row."""
    if row.get("reference"):
        return "ref" + (f" (vs f64: {row['f64_rel_diff']:.1e})" if "f64_rel_diff" in row else ""), "ref"
    return f"{row['value_rel_diff']:.1e}", f"{row['grad_rel_diff']:.1e}"
