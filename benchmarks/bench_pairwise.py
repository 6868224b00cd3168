"""CPU benchmark of mlloss's exact pairwise losses against LibAUC and naive broadcast baselines.

Sections (``--sections 1,2,3,4``):

1. Logistic bipartite AUC, no groups, label priors 0.5 and 0.1: ``mlloss.AUCLoss("logistic")``
   (blocked all-pairs torch path) vs LibAUC ``PairwiseAUCLoss(surr_loss="logistic", hparam=1.0)``
   vs a naive N x N broadcast. All three compute mean over pos x neg pairs of
   log(1 + exp(-(s_i - s_j))): LibAUC's logistic surrogate is log(1 + exp(-hparam * t)) on the raw
   predictions (no sigmoid, no margin), so hparam=1.0 is the same math; it is evaluated as
   torch.log(1 + torch.exp(.)), which overflows for t < -88 in float32 (not reached here: scores
   are N(0, 1)).
2. Logistic LaA (label aggregation, linear cost), two binary labels with priors 0.5 and 0.1, no
   groups: ``mlloss.LaALoss()`` vs naive broadcast. Acceptance: N = 65,536 under 512 MB extra peak.
3. Closed forms at scale: N = 1,000,000 items in 20,000 user groups (random 40-bit ids):
   exponential / squared / hinge ``AUCLoss`` and ``LaALoss`` (backend "auto" = closed form),
   each cross-checked against mlloss's blocked all-pairs path (backend="torch") on the same
   input, and ``PDAOMLoss()`` against a naive scatter min/max. Acceptance: exponential and
   squared under 2 s.
4. Grouped logistic AUC (users of ~50 items, prior 0.1): mlloss vs naive masked N x N broadcast
   vs LibAUC called once per user in a Python loop (mean over users with both classes, which is
   mlloss's ``reduction="mean"``).

Every (case, N, implementation) runs in a fresh process (see ``_measure`` for the memory method);
time is forward + backward wall time, the min over 3-4 full-size runs after a warm-up on a tiny
input, with ``torch.set_num_threads(2)`` and OMP_WAIT_POLICY=PASSIVE (``--omp-wait-policy``: on a
shared machine the default spinning OpenMP barrier made 2-thread ops up to 6x slower). "peak extra
MB" is the first full-size run's peak RSS above the baseline; "peak all runs MB" the peak over all
the full-size runs (grows when the C allocator keeps freed buffers between steps). Baselines whose
projected peak exceeds ``--mem-limit-gb`` (8) are skipped, and the naive LaA / grouped baselines
stop at N = 8192 to keep the full run near 15 minutes. "pairs/s" is valid pairs (the loss's pair
set, the same numerator for every implementation of a case) per second. "value rel. diff" compares each row with
the case's reference row (mlloss; for section 3 the closed form); the reference row shows, for
N <= 4096, its own difference from a float64 naive evaluation. "grad rel. diff" is
max|g - g_ref| / max|g_ref|.

The workers import mlloss from a copy of ``mlloss/`` taken at start (``--no-snapshot`` to use the
live tree), and the JSON records the git commit, the dirty library files and a hash of the sources.

Usage::

    python benchmarks/bench_pairwise.py                 # full run: ~10 min on 2 idle cores, ~16 busy
    python benchmarks/bench_pairwise.py --quick         # smoke test (~20-30 s): small sizes, one process
    python benchmarks/bench_pairwise.py --sections 1,3 --output benchmarks/results/x.json

``--quick`` runs every case in the driver process (memory numbers approximate: earlier cases'
heap is reused) and writes ``results/cpu-2core-quick.json`` unless ``--output`` is given.

The GPU benchmark, bench_gpu.py, reuses this module's inputs, pair counts, naive losses,
implementation builders (``build_forward``) and cross-checks (``check_against_reference``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _measure  # noqa: E402

SCRIPT = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(SCRIPT))
DEFAULT_OUTPUT = os.path.join(os.path.dirname(SCRIPT), "results", "cpu-2core.json")
LAA_PRIORS = (0.5, 0.1)
THREADS = 2

# Peak bytes per matrix element assumed before any size of an implementation has been measured;
# afterwards the measured peak of the largest size run so far is extrapolated.
PRIOR_BYTES_PER_ELEMENT = {"naive": 24.0, "libauc": 24.0}


# --------------------------------------------------------------------------------------------
# Inputs (identical in the driver and in every worker: seeded by case and N)
# --------------------------------------------------------------------------------------------


def make_inputs(spec: dict[str, Any], n: int | None = None):
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
        user_ids = torch.randint(0, 2**40, (n_groups,), generator=generator)
        groups = user_ids[torch.randint(0, n_groups, (n,), generator=generator)]
    return scores, labels, groups


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
    pairs = float(torch.einsum("ga,ab,gb->", counts, upper, counts))
    return pairs


# --------------------------------------------------------------------------------------------
# Implementations (built inside the worker)
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


def naive_pdaom_loss(scores, labels, groups):
    """sum over users of exp(-(min positive score - max negative score)) by scatter min / max."""
    import torch

    _, inverse = torch.unique(groups, return_inverse=True)
    num_groups = int(inverse.max()) + 1
    pos, neg = labels > 0, labels == 0
    low_pos = torch.full((num_groups,), math.inf, device=scores.device).scatter_reduce(
        0, inverse[pos], scores[pos], "amin"
    )
    high_neg = torch.full((num_groups,), -math.inf, device=scores.device).scatter_reduce(
        0, inverse[neg], scores[neg], "amax"
    )
    valid = torch.isfinite(low_pos) & torch.isfinite(high_neg)
    return torch.exp(-(low_pos[valid] - high_neg[valid])).sum()


def build_forward(spec: dict[str, Any], inputs):
    """A closure computing the loss of ``inputs`` (scores made to require grad) for ``spec["impl"]``.

    ``"mlloss"`` is mlloss with ``backend="auto"``, ``"mlloss-<backend>"`` mlloss with that backend
    (``"mlloss-torch"``, ``"mlloss-triton"``, ``"mlloss-exact"``). The inputs may live on any device.
    """
    import torch

    scores, labels, groups = inputs
    scores.requires_grad_(True)
    impl, kind, surrogate = spec["impl"], spec["kind"], spec["surrogate"]

    if impl == "mlloss" or impl.startswith("mlloss-"):
        import mlloss

        backend = impl.partition("-")[2] or "auto"
        if kind == "pdaom":
            loss_fn = mlloss.PDAOMLoss(backend=backend)
        elif kind == "laa":
            loss_fn = mlloss.LaALoss(surrogate=surrogate, backend=backend)
        else:
            loss_fn = mlloss.AUCLoss(surrogate=surrogate, backend=backend)

        def forward():
            return loss_fn(scores, labels, groups)

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

    elif impl == "naive-scatter":

        def forward():
            return naive_pdaom_loss(scores, labels, groups)

    else:
        raise ValueError(f"unknown implementation {impl!r}")
    return forward


def build_step(spec: dict[str, Any], inputs):
    """A closure running one forward + backward on ``inputs``; returns the loss value."""
    scores = inputs[0]
    forward = build_forward(spec, inputs)

    def step():
        scores.grad = None
        loss = forward()
        loss.backward()
        return float(loss.detach())

    return step


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the inputs, warm up, measure; save value and gradient to ``out_prefix + .grad.pt``."""
    import torch

    torch.set_num_threads(THREADS)
    inputs = make_inputs(spec)
    tiny = make_inputs(spec, n=min(256, spec["n"]))
    step, warm = build_step(spec, inputs), build_step(spec, tiny)
    load_before = os.getloadavg()
    measured = _measure.measure_step(step, warm, repeats=spec["repeats"], long_run_s=spec["long_run_s"])
    value = measured.pop("result")
    torch.save({"value": value, "grad": inputs[0].grad.detach().clone()}, spec["out_prefix"] + ".grad.pt")
    import mlloss

    measured.update(
        value=value,
        mlloss_file=mlloss.__file__,
        loadavg_before=list(load_before),
        loadavg_after=list(os.getloadavg()),
        threads=torch.get_num_threads(),
    )
    return measured


def worker_main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    measured = run_case(spec)
    with open(spec["out_prefix"] + ".result.json", "w") as handle:
        json.dump(measured, handle)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def section_cases(section: int, quick: bool) -> list[dict[str, Any]]:
    """Each case: the loss definition, its sizes and its implementations (reference first)."""
    sizes = [1024, 4096] if quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536]
    if section == 1:
        priors = [0.5] if quick else [0.5, 0.1]
        return [
            dict(section=1, case=f"AUC logistic, prior {p}", kind="auc", prior=p, surrogate="logistic",
                 sizes=sizes, impls=["mlloss", "libauc", "naive"])
            for p in priors
        ]
    if section == 2:
        return [dict(section=2, case=f"LaA logistic, 2 labels (priors {LAA_PRIORS[0]}, {LAA_PRIORS[1]})",
                     kind="laa", priors=list(LAA_PRIORS), surrogate="logistic", sizes=sizes,
                     impls=["mlloss", "naive"], max_n={"naive": 8192})]
    if section == 3:
        n, n_groups = (50_000, 1_000) if quick else (1_000_000, 20_000)
        cases = []
        for surrogate in ("exponential", "squared", "hinge"):
            cases.append(dict(section=3, case=f"AUC {surrogate}, groups, prior 0.1", kind="auc", prior=0.1,
                              surrogate=surrogate, n_groups=n_groups, sizes=[n], impls=["mlloss", "mlloss-torch"]))
            cases.append(dict(section=3, case=f"LaA {surrogate}, groups, 2 labels", kind="laa",
                              priors=list(LAA_PRIORS), surrogate=surrogate, n_groups=n_groups, sizes=[n],
                              impls=["mlloss", "mlloss-torch"]))
        cases.append(dict(section=3, case="PDAOM exponential, groups, prior 0.1", kind="pdaom", prior=0.1,
                          surrogate="exponential", n_groups=n_groups, sizes=[n], impls=["mlloss", "naive-scatter"]))
        return cases
    if section == 4:
        return [dict(section=4, case="grouped AUC logistic, ~50 items/user, prior 0.1", kind="auc", prior=0.1,
                     surrogate="logistic", group_size=50, sizes=sizes, impls=["mlloss", "naive", "libauc-loop"],
                     max_n={"naive": 8192})]
    raise ValueError(f"unknown section {section}")


SECTION_TITLES = {
    1: "Section 1: logistic bipartite AUC, no groups",
    2: "Section 2: logistic LaA, two labels, no groups",
    3: "Section 3: closed forms at scale (groups)",
    4: "Section 4: grouped logistic AUC (users of ~50 items)",
}


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


def run_section(section: int, args, tmpdir: str, env_extra: dict[str, str]) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    for case in section_cases(section, args.quick):
        measured_per_element: dict[str, tuple[float, float]] = {}  # impl -> (elements, MB)
        for n in case["sizes"]:
            spec_base = {k: v for k, v in case.items() if k not in ("sizes", "impls", "max_n")}
            spec_base.update(n=n, seed=args.seed, repeats=args.repeats, long_run_s=args.long_run_s)
            inputs = make_inputs(spec_base)
            pairs = count_pairs(spec_base, inputs[1], inputs[2])
            f64 = float64_reference(spec_base, inputs)
            reference: dict[str, Any] | None = None
            for impl in case["impls"]:
                spec = dict(spec_base, impl=impl)
                row = dict(section=section, case=case["case"], n=n, impl=impl, pairs=pairs)
                elements = None
                if impl == "naive":
                    elements = float(n) * n
                elif impl == "libauc":
                    elements = pairs
                if elements is not None:
                    if impl in measured_per_element:
                        seen_elements, seen_mb = measured_per_element[impl]
                        projected_mb = seen_mb / seen_elements * elements
                    else:
                        projected_mb = PRIOR_BYTES_PER_ELEMENT[impl] * elements / _measure.MB
                    row["projected_peak_mb"] = projected_mb
                    cap = case.get("max_n", {}).get(impl)
                    if projected_mb > args.mem_limit_gb * 1024:
                        row["skipped"] = f"projected {projected_mb / 1024:.1f} GB > {args.mem_limit_gb:g} GB"
                    elif cap is not None and n > cap:
                        row["skipped"] = f"time budget: run up to N={cap} here (projected {projected_mb / 1024:.1f} GB)"
                    if "skipped" in row:
                        rows.append(row)
                        print(f"  skip {case['case']} N={n} {impl}: {row['skipped']}", flush=True)
                        continue
                if args.snapshot is None:  # measuring the live working tree: flag edits mid-run
                    row["library_sha256"] = _measure.library_hash(REPO_ROOT)
                    if row["library_sha256"] != args.library_sha256:
                        print(f"  WARNING: the mlloss sources changed during the run "
                              f"({args.library_sha256} -> {row['library_sha256']})", flush=True)
                spec["out_prefix"] = os.path.join(tmpdir, f"s{section}-{len(rows)}-{impl}-{n}")
                if args.in_process:
                    result = run_case(spec)
                    result["memory_isolation"] = "in-process (approximate: earlier cases' heap is reused)"
                else:
                    result = _measure.run_worker(SCRIPT, spec, timeout_s=args.timeout, env_extra=env_extra)
                    result["memory_isolation"] = "fresh process"
                row.update(result)
                if "error" not in result:
                    if elements is not None and result["peak_extra_mb"] > 0:
                        measured_per_element[impl] = (elements, result["peak_extra_mb"])
                    row["pairs_per_s"] = pairs / result["time_s"] if case["kind"] != "pdaom" else None
                    saved = torch.load(spec["out_prefix"] + ".grad.pt")
                    reference = check_against_reference(row, saved["value"], saved["grad"], reference, f64)
                    os.remove(spec["out_prefix"] + ".grad.pt")
                rows.append(row)
                print(f"  {case['case']} N={n} {impl}: " + (
                    result["error"] if "error" in result else
                    f"{result['time_s'] * 1e3:.1f} ms, peak extra {result['peak_extra_mb']:.0f} MB, "
                    f"load {result['loadavg_before'][0]:.2f}"), flush=True)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    headers = ["case", "N", "implementation", "time ms", "peak extra MB", "peak all runs MB", "pairs/s",
               "value rel. diff", "grad rel. diff"]
    table = []
    for row in rows:
        if "skipped" in row:
            table.append([row["case"], row["n"], row["impl"], f"skipped: {row['skipped']}", "-", "-", "-", "-", "-"])
            continue
        if "error" in row:
            table.append([row["case"], row["n"], row["impl"], f"error: {row['error'][:80]}", "-", "-", "-", "-", "-"])
            continue
        if row.get("reference"):
            diff = "ref" + (f" (vs f64: {row['f64_rel_diff']:.1e})" if "f64_rel_diff" in row else "")
            grad = "ref"
        else:
            diff = f"{row['value_rel_diff']:.1e}"
            grad = f"{row['grad_rel_diff']:.1e}"
        pairs_per_s = "-" if row.get("pairs_per_s") is None else f"{row['pairs_per_s']:.3g}"
        table.append([
            row["case"], row["n"], row["impl"], f"{row['time_s'] * 1e3:.1f}",
            f"{row['peak_extra_mb']:.0f}", f"{row['peak_extra_all_runs_mb']:.0f}", pairs_per_s, diff, grad,
        ])
    return _measure.markdown_table(headers, table)


def acceptance_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if "error" in row or "skipped" in row or row["impl"] != "mlloss":
            continue
        if row["section"] == 2 and row["n"] == 65536:
            ok = row["peak_extra_mb"] < 512
            lines.append(f"- LaALoss(surrogate='logistic'), N=65,536, 2 labels: peak extra "
                         f"{row['peak_extra_mb']:.0f} MB (< 512 MB: {'PASS' if ok else 'FAIL'}); "
                         f"RSS still held after the step {row['rss_after_mb']:.0f} MB; "
                         f"time {row['time_s']:.2f} s")
        if row["section"] == 3 and row["n"] >= 1_000_000 and any(
            s in row["case"] for s in ("exponential", "squared")
        ) and not row["case"].startswith("PDAOM"):
            ok = row["time_s"] < 2.0
            lines.append(f"- {row['case']}, N={row['n']:,}: {row['time_s']:.2f} s "
                         f"(< 2 s: {'PASS' if ok else 'FAIL'})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    parser.add_argument("--sections", default="1,2,3,4", help="comma-separated sections to run")
    parser.add_argument("--output", default=None, help=f"JSON path (default {DEFAULT_OUTPUT})")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed full-size runs after the memory run (default 3, quick 1)")
    parser.add_argument("--long-run-s", type=float, default=5.0,
                        help="one repeat fewer when the first full-size run exceeds this many seconds")
    parser.add_argument("--mem-limit-gb", type=float, default=8.0,
                        help="skip baseline cases whose projected peak exceeds this")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-case worker timeout, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in-process", action="store_true",
                        help="run every case in this process (no fresh process per case; memory numbers "
                             "approximate); implied by --quick unless --fresh-process is given")
    parser.add_argument("--fresh-process", action="store_true", help="with --quick, still isolate cases")
    parser.add_argument("--omp-wait-policy", default="PASSIVE",
                        help="OMP_WAIT_POLICY for the measured processes (default PASSIVE; 'unset' leaves "
                             "it unset). With other processes on the cores, the default spinning OpenMP "
                             "barrier makes every 2-thread op wait for a descheduled thread")
    parser.add_argument("--no-snapshot", action="store_true",
                        help="import mlloss from the working tree in every worker instead of from a copy "
                             "taken at start (the copy keeps one version if the tree is edited mid-run)")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=None,
                        help="set MALLOC_MMAP_THRESHOLD_ (bytes) in the workers (pins glibc's mmap threshold)")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.quick and not args.fresh_process:
        args.in_process = True
    output = args.output or (DEFAULT_OUTPUT if not args.quick else
                             os.path.join(os.path.dirname(DEFAULT_OUTPUT), "cpu-2core-quick.json"))
    sections = [int(s) for s in args.sections.split(",") if s.strip()]
    snapshot = None
    if not args.no_snapshot:
        snapshot = os.environ.get("MLLOSS_BENCH_SNAPSHOT") or _measure.snapshot_library(
            REPO_ROOT, tempfile.mkdtemp(prefix="mlloss-bench-src-"))
    env_extra = {"OMP_NUM_THREADS": str(THREADS)}
    if snapshot:
        env_extra["MLLOSS_BENCH_SNAPSHOT"] = snapshot
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != snapshot]
        env_extra["PYTHONPATH"] = os.pathsep.join([snapshot, *inherited])
    if args.omp_wait_policy.lower() != "unset":
        env_extra["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if args.malloc_mmap_threshold is not None:
        env_extra["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    if args.in_process and any(os.environ.get(k) != v for k, v in env_extra.items()):
        # OpenMP and glibc read these at start-up: re-execute this driver with them set.
        os.environ.update(env_extra)
        os.execv(sys.executable, [sys.executable, *sys.argv])
    if snapshot and snapshot not in sys.path:
        sys.path.insert(0, snapshot)

    import torch

    torch.set_num_threads(THREADS)
    device = _measure.device_description()
    provenance = _measure.source_provenance(REPO_ROOT)
    provenance["measured"] = "snapshot of the working tree taken at start" if snapshot else "working tree"
    args.library_sha256 = provenance["library_sha256"]
    args.snapshot = snapshot
    device["torch_threads"] = THREADS
    started = time.perf_counter()
    print(f"device: {device['cpu_model']}, {device['logical_cpus']} logical CPUs, torch {device['torch']}, "
          f"load average {tuple(round(x, 2) for x in device['loadavg_start'])}", flush=True)
    print(f"mlloss at {provenance['git_commit']}, dirty library files: {provenance['library_dirty_files']}, "
          f"sources sha256 {provenance['library_sha256']}", flush=True)
    all_rows: list[dict[str, Any]] = []
    markdown = []
    with tempfile.TemporaryDirectory(prefix="mlloss-bench-") as tmpdir:
        for section in sections:
            load_start = os.getloadavg()
            print(f"\nrunning {SECTION_TITLES[section]} ...", flush=True)
            rows = run_section(section, args, tmpdir, env_extra)
            load_end = os.getloadavg()
            table = format_rows(rows)
            block = (f"\n## {SECTION_TITLES[section]}\n\nload average (1, 5, 15 min) at start "
                     f"{tuple(round(x, 2) for x in load_start)}, at end {tuple(round(x, 2) for x in load_end)}"
                     f"\n\n{table}\n")
            print(block, flush=True)
            markdown.append(block)
            all_rows.extend(rows)
    accept = acceptance_lines(all_rows)
    if accept:
        block = "\n## Acceptance\n\n" + "\n".join(accept) + "\n"
        print(block)
        markdown.append(block)
    device["loadavg_end"] = list(os.getloadavg())
    try:
        import libauc

        device["libauc"] = libauc.__version__
    except Exception:  # noqa: BLE001
        device["libauc"] = None
    import mlloss

    device["mlloss"] = mlloss.__version__
    report = {
        "device": device,
        "provenance": dict(provenance, working_tree_sha256_end=_measure.library_hash(REPO_ROOT)),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "settings": {
            "quick": args.quick, "sections": sections, "repeats": args.repeats,
            "long_run_s": args.long_run_s, "mem_limit_gb": args.mem_limit_gb, "seed": args.seed,
            "threads": THREADS, "malloc_mmap_threshold": args.malloc_mmap_threshold,
            "omp_wait_policy": args.omp_wait_policy, "in_process": args.in_process,
            "worker_env": env_extra,
            "memory_method": _measure.__doc__.split("\n\n")[1].replace("\n", " "),
            "time_method": "forward+backward wall time, min over the full-size runs (the memory run "
                           "included) after a warm-up on a 256-item input",
        },
        "total_wall_s": time.perf_counter() - started,
        "results": all_rows,
        "acceptance": accept,
    }
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as handle:
        json.dump(report, handle, indent=1)
    with open(os.path.splitext(output)[0] + ".md", "w") as handle:
        handle.write(f"# mlloss pairwise benchmark\n\ndevice: {device['cpu_model']}, {device['logical_cpus']} "
                     f"logical CPUs, torch {device['torch']}, {device['date_utc']}\n\ncommand: "
                     f"`{report['command']}`\n" + "".join(markdown))
    if snapshot:
        import shutil

        shutil.rmtree(snapshot, ignore_errors=True)
    print(f"\nwrote {output} ({report['total_wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
