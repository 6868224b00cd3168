"""The GPU benchmark's CPU smoke mode end to end: rows, cross-checks, acceptance lines, JSON and .md.

``benchmarks/bench_gpu.py --device cpu`` runs the Triton rows on Triton's interpreter, so this
exercises every path of the benchmark except the CUDA events and memory statistics. Tiny N and
the cheap implementations only (the Triton interpreter and torch.compile are slow on the CPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest

pytest.importorskip("triton")

import mlloss  # noqa: E402,F401 -- the installed package, not the benchmark's temporary snapshot

pytestmark = pytest.mark.triton
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark_script(stem: str, name: str):
    """benchmarks/<stem>.py loaded as a fresh module called ``name`` (a test's own copy: its
    monkeypatches reach no other test's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_gpu():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 before triton is imported")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_gpu

        yield bench_gpu
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def cases(bench_gpu):
    """benchmarks/cases.py: the cases, inputs, baselines and cross-checks of both runners."""
    import cases

    return cases


def test_both_runners_plan_the_same_loss_for_a_case_name_and_count_its_pairs(cases):
    """A case name means one loss in bench_pairwise.py's and bench_gpu.py's plans, and count_pairs
    is the brute-force count of same-group pairs with a higher level first."""
    import torch

    loss_keys = ("kind", "prior", "priors", "surrogate", "temperature")
    planned = {}
    for plan in [cases.cpu_cases(s, quick) for s in cases.CPU_SECTION_TITLES for quick in (False, True)] + [
        cases.gpu_cases(s, mode) for s in cases.GPU_SECTION_TITLES for mode in cases.GPU_SIZES
    ]:
        for case in plan:
            definition = {k: case.get(k) for k in loss_keys}
            assert planned.setdefault(case["case"], definition) == definition, case["case"]
    assert {cases.AUC_CASE, cases.LAA_CASE, cases.PDAOM_CASE} <= set(planned)
    for case in (cases.laa_logistic(), cases.grouped_auc_logistic(), cases.pdaom(n_groups=7)):
        spec = dict(case, n=300, seed=1)
        _, labels, groups = cases.make_inputs(spec)
        level = cases.levels_of(spec, labels)
        same = torch.ones(300, 300, dtype=torch.bool) if groups is None else groups[:, None] == groups[None, :]
        assert cases.count_pairs(spec, labels, groups) == float(((level[:, None] > level[None, :]) & same).sum())


def test_cpu_smoke_run_writes_cross_checked_rows_and_acceptance(bench_gpu, tmp_path):
    output = tmp_path / "smoke.json"
    bench_gpu.main(["--device", "cpu", "--sections", "2,5", "--sizes", "96", "--min-repeats", "1",
                    "--max-repeats", "1", "--impls", "mlloss-triton,mlloss-graph,mlloss-unchecked,mlloss-replay,mlloss-torch,naive",
                    "--output", str(output)])
    report = json.loads(output.read_text())
    rows = report["results"]
    impls = ("mlloss-triton", "mlloss-graph", "mlloss-unchecked", "mlloss-replay", "mlloss-torch", "naive")
    assert {(r["section"], r["impl"]) for r in rows} == {(section, impl) for section in (2, 5) for impl in impls}
    graphed = [row for row in rows if row["impl"] in ("mlloss-graph", "mlloss-replay")]  # captured on CUDA only
    assert graphed and all(row["skipped"] == "a CUDA graph needs a CUDA device" for row in graphed)
    # without the data check: the same bits as the checked call (section 2 runs it at 1,024 and 16,384 only)
    unchecked = {row["section"]: row for row in rows if row["impl"] == "mlloss-unchecked"}
    assert unchecked[2]["skipped"].startswith("run time: this mode runs mlloss-unchecked here only at")
    assert unchecked[5]["value_rel_diff"] == 0 and unchecked[5]["grad_rel_diff"] == 0
    for row in rows:
        if row in graphed or row is unchecked[2]:
            continue
        assert "error" not in row and "skipped" not in row, row
        assert row["time_s"] > 0 and row["pairs_per_s"] > 0
        # steps under 5 ms are also timed back to back (a training loop's view of a host-bound call)
        assert (row["back_to_back_s"] is not None) == (row["time_s"] < bench_gpu.BACK_TO_BACK_BELOW_S), row
        assert row["back_to_back_s"] is None or row["back_to_back_s"] > 0
        if row["impl"] == "mlloss-triton":
            assert row["reference"] and row["f64_rel_diff"] < 1e-5
        else:
            assert row["value_rel_diff"] < 1e-5 and row["grad_rel_diff"] < 1e-5
    acceptance = "\n".join(report["acceptance"])
    assert "valid pairs/s" in acceptance and "~50 items/user" in acceptance
    assert "no verdict: not on a GPU" in acceptance and "PASS" not in acceptance and "FAIL" not in acceptance
    assert "## Acceptance" in output.with_suffix(".md").read_text()
    # the host's speed at a Python call and an eager op, in the JSON and the report's head
    speed = report["device"]["host_speed"]
    assert set(speed) == {"python_call_us", "cpu_op_us"} and all(value > 0 for value in speed.values())
    assert "\nhost: a Python call " in output.with_suffix(".md").read_text()


@pytest.mark.parametrize("options,named", [
    (["--max-repeats", "-1"], "--max-repeats must be >= 1; got -1"),
    (["--min-repeats", "3", "--max-repeats", "1"], "--min-repeats must not exceed --max-repeats; got 3 and 1"),
    (["--min-repeats", "4"], "got 4 and 3 (the smoke run's defaults: 2 and 3)"),
    (["--impls", "mlloss-torch,mlloss-trition"], "--impls mlloss-trition: no section runs it"),
    (["--impls", "libauc"], "--impls libauc: none in sections 2, which run mlloss-compile, "),
    (["--sizes", "96,0"], "--sizes must be >= 1 (each value); got 96,0"),
    (["--sizes", "96;128"], "--sizes takes comma-separated integers; got '96;128'"),
    (["--sections", "2,11"], "--sections 2,11: unknown section 11"),
])
def test_gpu_benchmark_refuses_repeats_sizes_and_implementations_that_time_nothing(bench_gpu, options, named, capsys):
    """--max-repeats -1 timed no step and every row ended in a TypeError; --min-repeats above the
    maximum went unheeded; an --impls name no section runs (a typo), or only other sections' names,
    ran less or nothing, silently;
    --sizes 0 failed in the first row's inputs (max() of an empty tensor); a non-integer or an
    unknown section raised a bare ValueError. Now parse_args refuses them, naming the option."""
    with pytest.raises(SystemExit):
        bench_gpu.parse_args(["--device", "cpu", "--sections", "2", "--sizes", "96", *options])
    assert named in capsys.readouterr().err


def test_gpu_benchmark_skips_a_size_without_pairs(bench_gpu, tmp_path):
    """At N = 1 a case has no pair: the loss is 0 and the cross-checks divided by it (a
    ZeroDivisionError after the first row ended the run); now each of its rows is skipped, saying so."""
    output = tmp_path / "tiny.json"
    bench_gpu.main(["--device", "cpu", "--sections", "2", "--sizes", "1,64", "--impls", "mlloss-torch,naive",
                    "--min-repeats", "1", "--max-repeats", "1", "--output", str(output)])
    rows = {(r["impl"], r["n"]): r for r in json.loads(output.read_text())["results"]}
    assert all(rows[impl, 1]["skipped"] == "no pairs at N=1 (seed 0): nothing to time or cross-check"
               for impl in ("mlloss-torch", "naive"))
    assert "skipped" not in rows["naive", 64] and rows["naive", 64]["value_rel_diff"] < 1e-6


def test_the_loss_compiled_as_a_users_step_compiles_it_has_its_own_row(bench_gpu, tmp_path):
    """``mlloss-compile``: the Triton tier's loss under torch.compile (aot_eager on the CPU), one
    graph without breaks, the eager call's bits; its compile counters in the row."""
    output = tmp_path / "compiled.json"
    bench_gpu.main(["--device", "cpu", "--sections", "2", "--sizes", "64", "--min-repeats", "1", "--max-repeats", "1",
                    "--impls", "mlloss-triton,mlloss-compile", "--output", str(output)])
    row, = (r for r in json.loads(output.read_text())["results"] if r["impl"] == "mlloss-compile")
    assert "error" not in row and "skipped" not in row, row
    assert row["value_rel_diff"] == 0 and row["grad_rel_diff"] == 0
    assert row["graph_breaks"] == 0 and row["compiled_graphs"] >= 1


def test_accuracy_section_compares_the_float32_path_with_float64_scores(bench_gpu, cases, tmp_path):
    """Section 6: each case's reference row is the loss of float64 scores (the float64 brute force
    agrees with it), the float32 row is compared with it, and the acceptance line reports it without
    a verdict off the GPU. The well-ordered case's scores are the plain case's plus 4 per level."""
    import torch

    output = tmp_path / "accuracy.json"
    bench_gpu.main(["--device", "cpu", "--sections", "6", "--sizes", "96", "--min-repeats", "2",
                    "--max-repeats", "2", "--output", str(output)])
    report = json.loads(output.read_text())
    rows = {(r["case"], r["impl"]): r for r in report["results"]}
    names = [case["case"] for case in cases.accuracy_cases()]
    assert set(rows) == {(name, impl) for name in names for impl in ("mlloss-triton-f64", "mlloss-triton")}
    for name in names:
        reference, row = rows[name, "mlloss-triton-f64"], rows[name, "mlloss-triton"]
        assert reference["reference"] and reference["f64_rel_diff"] < 1e-12  # float64 sums: not float32's
        assert 0 < row["value_rel_diff"] < 1e-6 and row["grad_rel_diff"] < 1e-6
        # the float64 reference is one step, without a warm-up (at N = 1,048,576 on a GPU its steps take seconds)
        assert len(reference["times_s"]) == 1 and reference["warmup_steps"] == 0
        assert len(row["times_s"]) == 2 and row["warmup_steps"] >= 1
    lines = [line for line in report["acceptance"] if "float32 Triton loss vs float64" in line]
    assert len(lines) == 3 and all("no verdict: not on a GPU" in line for line in lines)

    plain, ordered = cases.accuracy_cases()[0], cases.accuracy_cases()[2]
    scores, labels, _ = cases.make_inputs(dict(plain, n=200, seed=3))
    shifted, same_labels, _ = cases.make_inputs(dict(ordered, n=200, seed=3))
    assert torch.equal(labels, same_labels)
    assert torch.equal(shifted, scores + cases.WELL_ORDERED_SEPARATION * labels)


def test_tile_section_runs_the_layout_kernel_with_each_candidate_and_restores_the_library_tiles(
    bench_gpu, cases, tmp_path
):
    """Section 7: one row per candidate tile shape besides the library's; the shapes take effect
    (a BLOCK_N other than the interpreter's 128 sums in another order, so the gradient's bits
    differ from the reference's; the float32 loss may round to the same value), the values agree within float32 summation error, the library's
    tiles are restored afterwards (also after an error), and the report names the fastest."""
    import torch

    from mlloss.kernels import dense, pairwise

    before = dict(pairwise.TILES), dense.MAX_ITEMS
    output = tmp_path / "tiles.json"
    bench_gpu.main(["--device", "cpu", "--sections", "7", "--sizes", "200", "--min-repeats", "1",
                    "--max-repeats", "1", "--impls",
                    "mlloss-layout,mlloss-layout@64x64x8,mlloss-layout@32x128x4",
                    "--output", str(output)])
    assert (dict(pairwise.TILES), dense.MAX_ITEMS) == before
    report = json.loads(output.read_text())
    rows = {(r["case"], r["impl"]): r for r in report["results"]}
    for case in (cases.TILES_PREFIX + cases.AUC_CASE, cases.TILES_PREFIX + cases.LAA_CASE):
        assert rows[case, "mlloss-layout"]["reference"]
        other_order = rows[case, "mlloss-layout@64x64x8"]
        assert other_order["value_rel_diff"] < 1e-6 and 0 < other_order["grad_rel_diff"] < 1e-6
        assert rows[case, "mlloss-layout@32x128x4"]["value_rel_diff"] < 1e-6
    assert sum("(no target): fastest" in line for line in report["acceptance"]) == 2

    with pytest.raises(RuntimeError), cases.kernel_settings(torch.device("cpu"), layout_only=True, tiles="16x16x1"):
        assert pairwise.TILES["interpreter"] == (16, 16, 1) and dense.MAX_ITEMS == 0
        raise RuntimeError
    assert (dict(pairwise.TILES), dense.MAX_ITEMS) == before
    caps = dict(pairwise.MAX_REGISTERS)
    with pytest.raises(RuntimeError), cases.kernel_settings(torch.device("cpu"), tiles=cases.PER_PAIR):
        assert pairwise.FACTOR_LOGISTIC is False and dict(pairwise.TILES) == before[0]
        raise RuntimeError
    with pytest.raises(RuntimeError), cases.kernel_settings(torch.device("cpu"), tiles="16x16x1"):
        pairwise.MAX_REGISTERS["interpreter"] = 64  # as a tile candidate's row might leave it
        raise RuntimeError
    assert pairwise.FACTOR_LOGISTIC is True and dict(pairwise.MAX_REGISTERS) == caps


def test_dense_or_layout_section_times_both_kernels_and_restores_the_threshold(bench_gpu, cases, tmp_path):
    """Section 10: the grouped AUC and LaA on the layout kernels and on the dense ones (the CUDA
    graph rows are skipped on the CPU): the two agree within float32 summation error, the dense
    kernels' threshold is what the word asks inside and the library's after (also after an error),
    and the report puts the two side by side."""
    import torch

    from mlloss.kernels import dense

    before = dense.MAX_ITEMS
    output = tmp_path / "dense.json"
    bench_gpu.main(["--device", "cpu", "--sections", "10", "--sizes", "200", "--min-repeats", "1",
                    "--max-repeats", "1", "--output", str(output)])
    assert dense.MAX_ITEMS == before
    report = json.loads(output.read_text())
    rows = {(r["case"], r["impl"]): r for r in report["results"]}
    for case in (cases.DENSE_PREFIX + spec["case"] for spec in (cases.grouped_auc_logistic(), cases.grouped_laa_logistic())):
        assert rows[case, "mlloss-layout"]["reference"]
        assert rows[case, f"mlloss-triton@{cases.DENSE}"]["value_rel_diff"] < 1e-6
        assert rows[case, f"mlloss-triton@{cases.DENSE}"]["grad_rel_diff"] < 1e-5
        assert "CUDA graph" in rows[case, f"mlloss-graph@{cases.DENSE}"]["skipped"]
    lines = [line for line in report["acceptance"] if line.startswith("- " + cases.DENSE_PREFIX)]
    assert len(lines) == 2 and all("eager layout" in line and "/ dense" in line for line in lines), lines

    for word, inside in ((cases.DENSE, cases.DENSE_LIMIT), (cases.LAYOUT, 0)):
        with pytest.raises(RuntimeError), cases.kernel_settings(torch.device("cpu"), tiles=word):
            assert dense.MAX_ITEMS == inside
            raise RuntimeError
        assert dense.MAX_ITEMS == before


def test_a_tile_variant_is_projected_from_the_reference_at_the_same_size(bench_gpu):
    """A tile variant's step at N = 2^20 is the reference's there times their ratio at 16,384: a
    host-bound 16,384 row scaled by the ratio of pairs would project seconds and skip it."""
    projector = bench_gpu.Projector(mem_limit_gb=80.0, max_step_s=2.0)
    small, large = 16_384, 1 << 20
    pairs_small, pairs_large = 0.09 * small * small, 0.09 * large * large
    for impl, time_s in (("mlloss-layout", 1.0e-3), ("mlloss-layout@64x32x4", 0.7e-3)):
        projector.record(dict(impl=impl, n=small, pairs=pairs_small, time_s=time_s, peak_extra_mb=1.0))
    naive_projection = 0.7e-3 * pairs_large / pairs_small
    assert naive_projection > 2.0
    projector.record(dict(impl="mlloss-layout", n=large, pairs=pairs_large, time_s=0.155, peak_extra_mb=28.0))
    row = dict(impl="mlloss-layout@64x32x4", n=large, pairs=pairs_large)
    assert projector.skip_reason(row) is None
    assert row["projected_time_s"] == pytest.approx(0.155 * 0.7)
    other = dict(impl="mlloss-torch", n=large, pairs=pairs_large)  # no variant: the work ratio
    projector.record(dict(impl="mlloss-torch", n=small, pairs=pairs_small, time_s=7e-3, peak_extra_mb=33.0))
    assert projector.skip_reason(other).startswith("projected step")


def test_a_host_bound_step_is_projected_from_its_kernels_time(bench_gpu):
    """With its kernels' time at the last size, a row's projection scales those by the work and the
    rest of the step by N: LibAUC's 18 ms at 1,024 (its Python sum over the mask) is no 4.7 s step
    at 16,384, as the work ratio alone projected (eb07a70); a step that is all kernels is still
    projected by the work."""
    projector = bench_gpu.Projector(mem_limit_gb=80.0, max_step_s=2.0)
    small, large = 1024, 16_384
    pairs_small, pairs_large = 0.09 * small * small, 0.09 * large * large
    projector.record(dict(impl="libauc", n=small, pairs=pairs_small, time_s=18e-3, peak_extra_mb=1.0))
    row = dict(impl="libauc", n=large, pairs=pairs_large)
    assert projector.skip_reason(row).startswith("projected step 4.61 s")
    assert projector.refinable("libauc")
    projector.record_kernel_time("libauc", 2e-3)
    assert not projector.refinable("libauc")
    assert projector.skip_reason(row) is None
    assert row["projected_time_s"] == pytest.approx(2e-3 * 256 + 16e-3 * 16)
    assert row["projected_from_kernel_s"] == 2e-3
    projector.record(dict(impl="mlloss-torch", n=small, pairs=pairs_small, time_s=10e-3, peak_extra_mb=1.0))
    projector.record_kernel_time("mlloss-torch", 12e-3)  # the profiled step ran longer: all kernels
    reason = projector.skip_reason(dict(impl="mlloss-torch", n=large, pairs=pairs_large))
    assert reason.startswith("projected step 2.56 s > 2 s (its kernels' 10 ms of the 10 ms step at N=1,024")
    # compiled rows and tile variants are not rebuilt to profile them
    projector.record(dict(impl="naive-compile", n=small, pairs=pairs_small, time_s=1e-3, peak_extra_mb=1.0))
    assert not projector.refinable("naive-compile") and not projector.refinable("naive")


def test_a_row_projected_past_the_limit_is_profiled_at_the_last_size_first(bench_gpu, tmp_path, monkeypatch):
    """The runner rebuilds the step of the last size (its seeded inputs) and profiles its kernels
    before it skips a row on its projection; the skip says what it projected from."""
    profiled = []

    def kernel_seconds(clock, step):
        profiled.append(step)
        return 0.0  # all host path: the projection scales the step by N alone

    monkeypatch.setattr(bench_gpu.DeviceClock, "times_kernels", property(lambda clock: True))
    monkeypatch.setattr(bench_gpu.DeviceClock, "kernel_seconds", kernel_seconds)
    built = []
    build_step = bench_gpu.cases.build_step
    monkeypatch.setattr(bench_gpu.cases, "build_step",
                        lambda spec, inputs, backend: built.append((spec["impl"], spec["n"])) or build_step(spec, inputs, backend))
    output = tmp_path / "projected.json"
    bench_gpu.main(["--device", "cpu", "--sections", "2", "--sizes", "64,128", "--impls", "mlloss-torch,naive",
                    "--min-repeats", "1", "--max-repeats", "1", "--max-step-s", "1e-9", "--output", str(output)])
    rows = {(r["impl"], r["n"]): r for r in json.loads(output.read_text())["results"]}
    assert "skipped" not in rows["mlloss-torch", 128]  # the reference row always runs
    skipped = rows["naive", 128]
    assert skipped["skipped"].startswith("projected step") and "the rest by N)" in skipped["skipped"]
    assert skipped["projected_time_s"] == pytest.approx(rows["naive", 64]["time_s"] * 2)
    assert len(profiled) == 1 and built.count(("naive", 64)) == 2  # measured, then rebuilt to profile


def test_tile_candidates_are_the_shapes_that_compile_without_spills(cases):
    """Section 7 times only shapes whose sm_90 compile keeps every accumulator in registers:
    ``tile_sass_variants`` builds each candidate (and the spilling shapes) from the library's
    variants, and the committed results/kernel-sass-tiles.json (kernel_sass.py on those) shows no
    spill for a candidate and a spill for each shape left out."""
    variants = cases.tile_sass_variants()
    shapes = cases.TILE_CANDIDATES + cases.SPILLING_TILES
    assert len(variants) == 2 * len(shapes)
    for variant in variants:
        shape = variant.name.rsplit(" ", 1)[1]
        block_m, block_n, num_warps = cases.parse_tiles(shape)
        assert (variant.constexprs["BLOCK_M"], variant.constexprs["BLOCK_N"], variant.num_warps) == (
            block_m, block_n, num_warps)
        assert variant.pairs_per_iteration == block_m * block_n / (32 * num_warps)
    measured = json.loads((BENCHMARKS / "results" / "kernel-sass-tiles.json").read_text())["variants"]
    spills = {v["name"]: v["spills"]["store_bytes"] for v in measured}
    assert set(spills) == {v.name for v in variants}
    for name, spilled in spills.items():
        assert (spilled > 0) == (name.rsplit(" ", 1)[1] in cases.SPILLING_TILES), name


def test_merge_recomputes_acceptance_from_both_files(bench_gpu, cases, tmp_path):
    row = dict(section=2, case=cases.LAA_CASE, n=16384, impl="mlloss-triton", pairs=1e8,
               pair_elements=16384.0**2, time_s=1e-3, time_min_s=1e-3, peak_extra_mb=1.0,
               pairs_per_s=1e11, value=0.7, first_call_s=0.1, reference=True)
    naive = dict(row, impl="naive", time_s=3e-2, reference=None, value_rel_diff=0.0, grad_rel_diff=0.0)
    base = {"device": {"device": "cuda", "gpu_name": "NVIDIA H100", "torch": "2.11", "date_utc": "today",
                       "cpu_model": "x"}, "command": "c"}
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(dict(base, results=[row])))
    second.write_text(json.dumps(dict(base, results=[naive])))
    bench_gpu.main(["--merge", str(first), str(second), "--output", str(tmp_path / "m.json")])
    merged = json.loads((tmp_path / "m.json").read_text())
    assert len(merged["results"]) == 2
    assert any("naive eager / Triton at N=16,384: 30.0x" in line and "PASS" in line for line in merged["acceptance"])


def test_recipe_benchmark_splits_each_step_and_times_the_data_path(tmp_path):
    """benchmarks/bench_recipe.py on a tiny log: every loss row has a throughput and a split whose
    parts add up to the step time (other = the rest, so never more than the step), the framework
    overhead compares the recipe's module with a plain loop on both clocks, and the data-path rows
    compare TensorBatches with a per-row DataLoader; JSON and .md written, dated, with the version."""
    bench = benchmark_script("bench_recipe", "bench_recipe")
    out = tmp_path / "recipe.json"
    result = bench.main(["--device", "cpu", "--losses", "bce", "laa", "--batch-sizes", "256", "--steps", "8",
                         "--warmup", "2", "--num-users", "300", "--rounds", "1", "--steps-per-call", "2",
                         "--output", str(out)])
    assert [row["loss"] for row in result["training"]] == ["bce", "laa"]
    for row in result["training"]:
        assert row["steps"] == 8 and row["impressions_per_s"] > 0
        assert set(row["split_ms"]) == set(bench.PARTS)
        assert all(row["split_ms"][part] > 0 for part in ("data", "forward", "loss", "backward", "optimizer"))
        assert row["kernel_ops"] > 20 and row["syncing_ops"] >= 0  # one step's launches, counted
    (framework,) = result["framework"]
    for clock in ("cpu", "wall"):
        row = framework[clock]
        assert row["lightning_step_ms"] > 0 and row["plain_step_ms"] > 0
        assert row["smallest_ms"] <= row["framework_ms"] <= row["largest_ms"]
    (data,) = result["data_path"]
    assert data["tensor_batches_impressions_per_s"] > 0 and data["per_row_dataloader_impressions_per_s"] > 0
    assert json.loads(out.read_text())["training"][0]["loss"] == "bce"
    markdown = out.with_suffix(".md").read_text()
    assert "| laa | 256 |" in markdown
    # the run says when and what it measured: its date and the library's version
    assert f"{result['date']}, mlloss {(result['mlloss_commit'] or 'unknown')[:7]}" in markdown
    # and the host's speed, which a host-bound step's time follows
    assert result["host_speed"]["cpu_op_us"] > 0 and "\nHost: a Python call " in markdown


def test_level_tiles_benchmark_forces_each_path_and_restores_the_library_choice():
    """benchmarks/bench_level_tiles.py: both forced paths give the same loss on one group, and the
    library's RECTANGLE_PAIRS is back afterwards."""
    from mlloss.ops import allpairs

    bench = benchmark_script("bench_level_tiles", "bench_level_tiles")
    chosen = allpairs.RECTANGLE_PAIRS
    (_, rectangles), (_, tiles) = (bench.time_call(300, 6, path) for path in bench.PATHS)
    assert allpairs.RECTANGLE_PAIRS == chosen
    assert rectangles == pytest.approx(tiles, rel=1e-6) and rectangles > 0


def test_recipe_losses_benchmark_reads_the_recipes_runs(tmp_path, monkeypatch):
    """benchmarks/recipe_losses.py on a tiny log, two runs of one loss: a throughput from the epochs
    after the first, the test metrics of results.json, the runs identical to the bit (the recipe is
    deterministic on the CPU); JSON and .md written. Its command lines run the recipe's main in this
    process (a subprocess spends ~8 s importing Lightning)."""
    import subprocess
    from types import SimpleNamespace

    from recipe_util import RECIPES, load_recipe

    bench = benchmark_script("recipe_losses", "recipe_losses")
    recipe = load_recipe("ctr_cvr")

    def run_in_this_process(command, check, cwd, stdout):
        assert command[:2] == [sys.executable, str(RECIPES / "ctr_cvr.py")] and check, command
        recipe.main(command[2:])

    monkeypatch.setattr(bench, "subprocess", SimpleNamespace(run=run_in_this_process, DEVNULL=subprocess.DEVNULL))
    out = tmp_path / "losses.json"
    result = bench.main(["--losses", "bce", "--runs", "2", "--epochs", "2", "--output", str(out),
                         "--recipe-args", "--num-users", "150", "--num-items", "100", "--mean-impressions", "20"])
    (row,) = result["rows"]
    assert row["loss"] == "bce" and len(row["epoch_throughputs"]) == 2 and row["impressions_per_s"] > 0
    assert row["runs_identical"] and set(row["test"]) == set(bench.METRICS)
    assert all(0 <= value <= 1 for value in row["test"].values())
    assert json.loads(out.read_text())["rows"][0]["loss"] == "bce"
    assert "| `bce` |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("options,named", [
    (["--losses", "bce", "lambdarank"], "recipes/ctr_cvr.py refuses --losses lambdarank: argument --loss: invalid choice"),
    (["--losses", "laa", "bce", "--recipe-args", "--lambda", "2"],
     "refuses --losses bce with --recipe-args --lambda 2: --lambda weighs a ranking term"),
])
def test_recipe_losses_benchmark_refuses_a_run_the_recipe_would_refuse(options, named, capsys, monkeypatch):
    """--losses bce lambdarank ran bce's runs in full and then ended in a CalledProcessError (the
    recipe's --loss choices), writing nothing; so did an option only some losses take. Now every
    loss's command line is checked by the recipe's own parser before the first run."""
    from types import SimpleNamespace

    bench = benchmark_script("recipe_losses", "recipe_losses_refusing")
    monkeypatch.setattr(bench, "subprocess", SimpleNamespace(run=lambda *a, **k: pytest.fail("ran the recipe")))
    with pytest.raises(SystemExit):
        bench.main(["--runs", "1", "--epochs", "2", *options])
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("options,named", [(["--steps", "4"], "--steps must be at least --steps-per-call (8)"),
                                           (["--steps-per-call", "0"], "--steps-per-call must be >= 1"),
                                           (["--warmup", "-1"], "--warmup >= 0")])
def test_recipe_benchmark_refuses_a_window_with_nothing_to_time(options, named, capsys):
    """--steps below --steps-per-call timed no call at all: a ZeroDivisionError after a whole training
    run (--steps 4 --warmup 2, a call of 8 steps)."""
    bench = benchmark_script("bench_recipe", "bench_recipe_refusing")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--steps-per-call", "8", *options])
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("options,named", [(["--steps", "0"], "--steps must be >= 1; got 0"),
                                           (["--world", "0"], "--world must be >= 1; got 0"),
                                           (["--group-size", "0"], "--group-size must be >= 1; got 0"),
                                           (["--per-rank", "0"], "--per-rank must be >= 1; got 0"),
                                           (["--per-rank", "256", "--group-size", "1000"],
                                            "--group-size must be at most twice --per-rank (256)")])
def test_cross_device_benchmark_refuses_values_that_failed_in_its_ranks(options, named, capsys, monkeypatch):
    """--steps 0 (an empty median), --group-size 0 (ZeroDivisionError), --per-rank 0 or a --group-size
    above twice it (no user id to draw) failed inside the spawned ranks, --world 0 in an IndexError
    reading no rank's file; now refused before any process is spawned."""
    bench = benchmark_script("bench_cross_device", "bench_cross_device_refusing")
    monkeypatch.setattr(bench.mp, "spawn", lambda *a, **k: pytest.fail("spawned ranks"))
    with pytest.raises(SystemExit):
        bench.main(options)
    assert named in capsys.readouterr().err


def test_recipe_benchmark_keeps_its_rows_when_stopped_and_runs_without_bce(tmp_path, monkeypatch):
    """bench_recipe.py rewrites its JSON and .md after every row, so that gpu_session.sh's stage
    stopped at its time limit (SIGINT: KeyboardInterrupt) keeps the rows measured; ``--rounds 0``
    leaves out the framework overhead (the compiled stage's), and a run without bce writes "-" for
    "vs bce" (it raised StopIteration)."""
    bench = benchmark_script("bench_recipe", "bench_recipe_stopped")
    real_train, calls = bench.train, []

    def train(*args, **kwargs):  # the second loss's first run is where the time limit falls
        calls.append(args[1])
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    monkeypatch.setattr(bench, "train", train)
    out = tmp_path / "recipe.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--device", "cpu", "--losses", "laa", "bce+auc", "--batch-sizes", "256", "--steps", "4",
                    "--warmup", "2", "--num-users", "300", "--rounds", "0", "--steps-per-call", "2",
                    "--output", str(out)])
    saved = json.loads(out.read_text())
    assert [row["loss"] for row in saved["training"]] == ["laa"] and saved["framework"] == []
    assert "| laa | 256 |" in out.with_suffix(".md").read_text()
    assert not list(tmp_path.glob("*.partial"))


# --------------------------------------------------------------------------------------------
# benchmarks/gpu_session.sh, with a stand-in `python` (no GPU): what each stage runs, what it
# leaves in $OUT, and how a stage stopped at its time limit ends.
# --------------------------------------------------------------------------------------------

FAKE_PYTHON = r'''#!{python}
"""gpu_session.sh's `python` in the tests: records each call, writes what the real program would."""
import json, os, signal, sys, time

argv = sys.argv[1:]
launch = os.environ.get("MLLOSS_TRITON_LAUNCH")
with open(os.environ["FAKE_CALLS"], "a") as log:  # a launch setting in the environment: one more word
    log.write(json.dumps(argv + ([f"MLLOSS_TRITON_LAUNCH={{launch}}"] if launch else [])) + "\n")
behaviour = os.environ.get("FAKE_BEHAVIOUR", "")
if argv[:1] == ["-"] or (argv[:1] == ["-c"] and "cuda" not in argv[1] and "mlloss" not in argv[1]):
    os.execv({python!r}, [{python!r}, *argv])  # the stage's own inline scripts
if argv[:1] == ["-c"] or argv[:2] == ["-m", "pip"]:
    print("FAKE GPU")
    sys.exit(0)


def value(flag, default=None):  # the last occurrence wins, as with argparse
    found = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]
    return found[-1] if found else default


def stop_on_interrupt(seconds, exit_status):  # a program that ends gracefully on SIGINT
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        print("summary printed after the interrupt", flush=True)
        sys.exit(exit_status)


if argv[:2] == ["-m", "pytest"]:
    print("tests started", flush=True)
    if behaviour == "slow":
        stop_on_interrupt(30, 2)
    print("606 passed")
elif argv[0].endswith("bench_gpu.py"):
    output = value("--output")
    path = os.path.join(output, "nvidia-h100-80gb-hbm3-quick.json") if os.path.isdir(output) else output
    for suffix in (".json", ".md"):
        open(os.path.splitext(path)[0] + suffix, "w").write("{{}}")
elif argv[0].endswith("bench_recipe.py"):
    output = value("--output")
    for suffix in (".json", ".md"):
        open(os.path.splitext(output)[0] + suffix, "w").write("{{}}")
elif argv[0].endswith("check_launcher.py"):
    if behaviour == "launch-crashes":
        sys.exit("Traceback (most recent call last): ... (made up)")  # status 1, as a Python error
    differs = behaviour == "launch-differs"
    print("direct launches: " + ("differ from" if differs else "bit-identical to") + " Triton's path")
    sys.exit(3 if differs else 0)  # check_launcher.DIFFER_STATUS
elif argv[0].endswith("profile_call.py"):
    open(value("--output"), "w").write("profile")
elif argv[0].endswith("ctr_cvr.py"):
    if behaviour == "slow":
        stop_on_interrupt(3, 1)  # Lightning ends fit on an interrupt with exit(1)
    run = value("--output-dir")
    os.makedirs(run, exist_ok=True)
    epochs = int(value("--epochs", "5"))
    history = [dict(train_samples_per_s=1000.0 * (epoch + 1), train_seconds=1.0, seconds=1.5) for epoch in range(epochs)]
    test = {{f"model/{{k}}": 0.75 for k in ("auc/click", "gauc/click", "auc/purchase", "gauc/purchase")}}
    json.dump(dict(history=history, results=dict(test=test), runtime_s=4.5), open(os.path.join(run, "results.json"), "w"))
else:
    sys.exit(f"fake python: unexpected call {{argv}}")
'''


@pytest.fixture()
def gpu_session(tmp_path):
    """Run benchmarks/gpu_session.sh from a copy of the checkout's layout with the stand-in python;
    returns a function(stage args, behaviour, limit) -> (calls, $OUT, seconds, completed process)."""
    import shutil
    import subprocess
    import time

    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    shutil.copy(BENCHMARKS / "gpu_session.sh", repo / "benchmarks")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE_PYTHON.format(python=sys.executable))
    (bin_dir / "python").chmod(0o755)

    def run(*stage: str, behaviour: str = "", limit: float | None = None, ready: bool = False):
        out = tmp_path / f"out-{stage[0]}-{behaviour or 'plain'}"
        out.mkdir()
        calls = tmp_path / f"calls-{stage[0]}-{behaviour or 'plain'}.jsonl"
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out),
                   FAKE_CALLS=str(calls), FAKE_BEHAVIOUR=behaviour)
        env.pop("GPU_SESSION_READY", None)
        if ready:  # a stage called by a composite one: the set-up is done
            env["GPU_SESSION_READY"] = "1"
        command = ["bash", str(repo / "benchmarks" / "gpu_session.sh"), *stage]
        if limit is not None:  # as the composite stages call a stage
            command = ["timeout", "--signal=INT", str(limit), *command]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        lines = calls.read_text().splitlines() if calls.exists() else []
        return [json.loads(line) for line in lines], out, time.perf_counter() - started, done

    return run


def test_gpu_session_composite_stages_run_every_stage_and_leave_at_most_eight_files(gpu_session):
    """kernels and training: every stage runs (each under its limit, summed within the 15 minutes of a
    loan), and $OUT holds at most the 8 files the device tool returns, with names it accepts."""
    import re

    runs = {}
    for composite in ("kernels", "training"):
        calls, out, _, done = gpu_session(composite)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "stopped with status" not in done.stdout, done.stdout
        files = {path.name for path in out.iterdir()}
        assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files), files
        assert not any(name.endswith(".partial") for name in files)
        limits = [int(limit) for limit in re.findall(r"\(limit (\d+) s\)", done.stdout)]
        assert sum(limits) <= 400, limits
        runs[composite] = [call for call in calls if call[0].endswith(".py")], files, out
    kernels_calls, kernels_files, _ = runs["kernels"]
    assert [call[0] for call in kernels_calls] == (
        ["benchmarks/check_launcher.py"] + ["benchmarks/bench_gpu.py"] * 2 + ["benchmarks/profile_call.py"])
    assert set(kernels_calls[1][kernels_calls[1].index("--sections") + 1].split(",")) == {"1", "2", "3", "4", "5", "10"}
    profiled = kernels_calls[3]
    assert profiled[profiled.index("--impls") + 1:profiled.index("--impls") + 3] == ["mlloss-triton", "mlloss-replay"]
    assert {"tests.txt", "bench.log", "accuracy.json", "profile.txt"} <= kernels_files
    assert not any(word.startswith("MLLOSS_TRITON_LAUNCH") for call in kernels_calls for word in call)
    assert "bit-identical to Triton's path" in (runs["kernels"][2] / "device.txt").read_text()
    training_calls, _, _ = runs["training"]
    # the step plain, then in CUDA graphs (issue 12's throughput lines) at both batch sizes; the
    # recipe's runs (their figures on record) in a command of their own
    assert [call[0] for call in training_calls] == ["benchmarks/bench_recipe.py"] * 2
    plain, compiled = training_calls
    assert "--compile" not in plain and compiled[compiled.index("--compile") + 1] == "reduce-overhead"
    assert "--fixed-batches" in compiled and "--rounds" in compiled
    sizes = compiled[compiled.index("--batch-sizes") + 1:]
    assert sizes[:2] == ["1024", "8192"], compiled


def test_gpu_session_times_through_tritons_path_when_the_direct_launches_differ(gpu_session):
    """kernels: when check_launcher.py finds the direct launches differ from Triton's path (status 3),
    the later stages run with MLLOSS_TRITON_LAUNCH=triton (their figures then stand) and the log says so."""
    calls, _, _, done = gpu_session("kernels", behaviour="launch-differs")
    later = [call for call in calls if call[0].endswith(".py") and call[0] != "benchmarks/check_launcher.py"]
    later += [call for call in calls if call[:2] == ["-m", "pytest"]]
    assert len(later) == 4 and all(call[-1] == "MLLOSS_TRITON_LAUNCH=triton" for call in later), later  # bench x2, profile, tests
    assert "launch-check stopped with status 3" in done.stdout
    assert "the later stages launch through Triton's" in done.stdout


def test_gpu_session_says_so_when_the_launch_check_itself_fails(gpu_session):
    """kernels: a crash of check_launcher.py (status 1) was reported as launches that differ; the
    later stages still launch through Triton's path (the bench results record it)."""
    calls, _, _, done = gpu_session("kernels", behaviour="launch-crashes")
    later = [call for call in calls if call[0].endswith(".py") and call[0] != "benchmarks/check_launcher.py"]
    assert later and all(call[-1] == "MLLOSS_TRITON_LAUNCH=triton" for call in later), later
    assert "launch-check stopped with status 1" in done.stdout
    assert "the launch check failed: the later stages launch through Triton's path" in done.stdout
    assert "differ from Triton's path" not in done.stdout


def test_gpu_session_recipe_stage_summarises_every_run(gpu_session):
    """recipe: the 4 losses at 1,024 and 8,192, one JSON with each run's median impressions/s over
    epochs 2-3 and where its time went (the process: imports, set-up; main(); each epoch)."""
    calls, out, _, done = gpu_session("recipe", "--epochs", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([call for call in calls if call[0] == "recipes/ctr_cvr.py"]) == 8
    summary = json.loads((out / "gpu-recipe-throughput.json").read_text())
    assert len(summary) == 8
    assert summary["bce batch 1024"]["impressions_per_s_median"] == 2500.0  # epochs 2-3: the first warms up
    assert summary["bce batch 1024"]["runtime_s"] == 4.5 and summary["bce batch 1024"]["epoch_s"] == [[1.0, 1.5]] * 3
    assert 0 < summary["bce batch 1024"]["process_wall_s"] < 60


def test_gpu_session_recipe_stage_stops_at_its_time_limit(gpu_session):
    """A recipe run interrupted by the stage's limit exits 1 (as Lightning does): the stage writes the
    summary, with that run's log, and stops; it went on with the next run, past its limit."""
    calls, out, seconds, _ = gpu_session("recipe", behaviour="slow", limit=1.5, ready=True)
    assert [c[0] for c in calls if c[0].endswith(".py")] == ["recipes/ctr_cvr.py"]
    summary = json.loads((out / "gpu-recipe-throughput.json").read_text())
    assert list(summary) == ["bce batch 1024"] and "log_tail" in summary["bce batch 1024"]
    assert seconds < 10


def test_gpu_session_keeps_what_a_stopped_stage_prints_on_its_way_out(gpu_session):
    """pytest stopped at the stage's limit prints its summary after the interrupt: it reaches
    tests.txt (the console tail used to die with the interrupt, and tee with it)."""
    _, out, _, done = gpu_session("tests", behaviour="slow", limit=1.5, ready=True)
    assert "summary printed after the interrupt" in (out / "tests.txt").read_text()
    assert "summary printed after the interrupt" in done.stdout


@pytest.mark.parametrize("sections,named", [("2,9", "--sections must name sections of [1, 2, 3, 4]; got '2,9'"),
                                            (",", "--sections must name sections of [1, 2, 3, 4]; got ','"),
                                            ("2,x", "--sections takes comma-separated integers; got '2,x'")])
def test_cpu_runner_refuses_sections_it_does_not_have(sections, named, tmp_path):
    """--sections 2,9 ran section 2 and then died in a KeyError (nothing written); 2,x raised a bare
    ValueError and ',' ran nothing; now refused before anything runs, naming the sections it has."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_pairwise.py"), "--quick", "--no-snapshot",
                           "--sections", sections, "--output", str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and named in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]


def test_cpu_runner_skips_libauc_rows_when_libauc_is_not_importable(tmp_path):
    """bench_pairwise.py --quick without LibAUC (an optional peer): its rows say why they were
    skipped and the run goes on (the in-process quick run stopped with ModuleNotFoundError)."""
    import subprocess

    hidden = tmp_path / "hidden"
    (hidden / "libauc").mkdir(parents=True)
    (hidden / "libauc" / "__init__.py").write_text('raise ImportError("libauc hidden by the test")\n')
    out = tmp_path / "cpu.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_pairwise.py"), "--quick", "--sections", "1",
                           "--output", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["results"]
    libauc_rows = [row for row in rows if row["impl"] == "libauc"]
    assert libauc_rows and all("libauc not importable" in row["skipped"] for row in libauc_rows)
    assert all("time_s" in row for row in rows if row["impl"] == "mlloss")


def test_closed_form_choice_times_both_exact_paths_and_records_the_librarys_choice(tmp_path):
    """benchmarks/closed_form_choice.py at a tiny N: a row per (users, labels, surrogate) with both
    paths' times, their losses equal, the choice of the library's cost model, and the .md beside."""
    import subprocess

    out = tmp_path / "choice.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "closed_form_choice.py"), "--sizes", "64", "--group-sizes", "0",
                           "5", "--labels", "auc p0.1", "levels", "--repeats", "1", "--threads", "1", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 2 * 3
    for row in rows:
        assert row["closed_form_ms"] > 0 and row["blocked_sum_ms"] > 0 and row["value_rel_diff"] < 1e-5, row  # float32 scores
        assert isinstance(row["auto_picks_closed_form"], bool) and row["faster"] in ("closed", "blocked")
    # a level per few items: the hinge form's per-level work makes the blocked sum the choice
    assert not any(r["auto_picks_closed_form"] for r in rows if r["labels"] == "levels" and r["surrogate"] == "hinge")
    assert "auto picks the slower path in" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("options,named", [(["--repeats", "0"], "--repeats must be >= 1; got 0"),
                                           (["--group-sizes", "0", "-5"], "--group-sizes must be >= 0 (each value; 0: no groups); got [0, -5]"),
                                           (["--levels", "1"], "--levels must be >= 2 (one level has no pair); got 1")])
def test_closed_form_choice_refuses_values_that_time_nothing(options, named, capsys):
    """--repeats 0 wrote both paths at inf ms and the time lost as nan; a negative --group-sizes put every
    item in one user; --levels 0 ended in a RuntimeError after the other label kinds' cases, and 1
    timed a loss without pairs. Now refused before anything runs."""
    choice = benchmark_script("closed_form_choice", "closed_form_choice_refusing")
    with pytest.raises(SystemExit):
        choice.main(["--sizes", "64", "--threads", "1", *options])
    assert named in capsys.readouterr().err


def test_metrics_benchmark_times_each_metric_and_reports_its_value(tmp_path):
    """benchmarks/bench_metrics.py at a tiny N: a row per metric and size, its time, and the
    metric's value, which is the brute-force AUC over every (positive, negative) pair."""
    import subprocess

    import torch

    out = tmp_path / "metrics.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_metrics.py"), "--sizes", "256", "--repeats", "1",
                           "--threads", "1", "--output", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {row["metric"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"binary_auc", "group_auc"} and all(row["ms"] > 0 and row["n"] == 256 for row in rows.values())
    generator = torch.Generator().manual_seed(0)  # the benchmark's inputs
    scores = torch.randn(256, generator=generator)
    labels = torch.rand(256, generator=generator) < 0.1
    wins = (scores[labels][:, None] > scores[~labels][None, :]).double().mean()
    assert rows["binary_auc"]["value"] == pytest.approx(float(wins), abs=1e-12)


@pytest.mark.parametrize("options,named", [(["--repeats", "0"], "--repeats must be >= 1; got 0"),
                                           (["--group-size", "0"], "--group-size must be >= 1; got 0"),
                                           (["--group-size", "-3"], "--group-size must be >= 1; got -3")])
def test_metrics_benchmark_refuses_no_repeats_and_groups_below_one_item(options, named, capsys, tmp_path):
    """--repeats 0 reported every metric at inf ms, --group-size 0 ended in a ZeroDivisionError and a
    negative one put every item in one user, silently; now refused before anything runs."""
    bench = benchmark_script("bench_metrics", "bench_metrics_refusing")
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "64", "--threads", "1", "--output", str(tmp_path / "m.json"), *options])
    assert named in capsys.readouterr().err and not (tmp_path / "m.json").exists()


def test_cpu_path_benchmark_times_and_counts_each_case_and_the_naive_broadcast(tmp_path):
    """bench_cpu_path.py at a tiny N: a row per (case, N, groups) with its times and op counts
    (two task columns among them), and the naive broadcast's rows, eager and compiled."""
    import subprocess

    out = tmp_path / "cpu-path.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cpu_path.py"), "--sizes", "64", "--repeats", "1",
                           "--threads", "1", "--cases", "AUCLoss/torch", "PDAOM", "auc[2 tasks]", "--naive", "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["records"]
    cases = {(row["case"], row["grouped"]) for row in rows}
    assert {("AUCLoss/torch", False), ("AUCLoss/torch", True), ("naive-broadcast-fixed/compiled", True)} <= cases
    assert any(case.startswith("PDAOM") for case, _ in cases) and ("bce+auc[2 tasks]/torch", True) in cases
    for row in rows:
        assert row["n"] == 64 and row["wall_s"] > 0 and row["cpu_s"] >= 0
        if not row["case"].startswith("naive"):
            assert row["ops"] > 0, row


@pytest.mark.parametrize("options,named", [(["--repeats", "0"], "--repeats must be >= 1; got 0"),
                                           (["--group-size", "0"], "--group-size must be >= 1; got 0"),
                                           (["--group-size", "-5"], "--group-size must be >= 1; got -5"),
                                           (["--cases", "AUCLoss/torch", "AUCLos/torch"], "contains --cases 'AUCLos/torch'")])
def test_cpu_path_benchmark_refuses_counts_below_one_and_cases_that_select_nothing(options, named):
    """--repeats 0 ended in statistics.median([]) after the first case's warm-up, --group-size 0 in a
    ZeroDivisionError (a negative one put every item in one group), and a --cases name in no case
    ran nothing (or less) silently; now the arguments are refused before anything is imported."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cpu_path.py"), "--sizes", "64", *options],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and named in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("options,named", [(["--steps", "0"], "--steps must be >= 1; got 0"),
                                           (["--steps", "-1"], "--steps must be >= 1; got -1"),
                                           (["--profiled", "0"], "--profiled must be >= 1; got 0"),
                                           (["--num-items", "0"], "--num-items must be >= 1; got 0")])
def test_profile_call_refuses_no_timed_or_profiled_calls_and_no_items(options, named, capsys, monkeypatch):
    """--steps 0 and --profiled 0 ended in a ZeroDivisionError after the case's warm-up (--steps -1
    printed a negative time per call); --num-items 0 silently took each case's target size."""
    profile_call = benchmark_script("profile_call", "profile_call_refusing")
    monkeypatch.setattr(profile_call, "profile_case", lambda *a, **k: pytest.fail("profiled a case"))
    with pytest.raises(SystemExit):
        profile_call.main(["--device", "cpu", "--num-items", "64", "--steps", "2", "--profiled", "1", "--cases", "AUC", *options])
    assert named in capsys.readouterr().err


def test_profile_call_reports_each_loss_per_call(tmp_path):
    """benchmarks/profile_call.py on the CPU (interpreted kernels): a timed line, a host-time table
    and a Python profile per case."""
    import re

    import torch

    profile_call = benchmark_script("profile_call", "profile_call")
    report = profile_call.main(["--device", "cpu", "--num-items", "64", "--steps", "2", "--profiled", "1",
                                "--output", str(tmp_path / "profile.txt")])
    assert (tmp_path / "profile.txt").read_text() == report
    for name in ("AUC logistic, prior 0.1", "LaA logistic, 2 labels (priors 0.5, 0.1)",
                 "grouped AUC logistic, ~50 items/user, prior 0.1", "PDAOM exponential, groups, prior 0.1"):
        assert f"## {name}, N = 64, cpu:" in report
    assert report.count("## grouped AUC logistic, ~50 items/user, prior 0.1, N = 64, cpu:") == 2  # at both sizes
    assert report.count("Self CPU time total") == 5
    # and by Python function: the library's share of the host's time, named
    assert report.count("Python profile (cProfile, 1 calls):") == 5
    assert report.splitlines()[1].startswith("host: a Python call ")
    assert re.search(r"mlloss Python \d+%, torch Python \d+%, triton Python \d+%, C calls \d+%", report)
    owner = profile_call._owner
    assert owner(str(BENCHMARKS.parent / "mlloss" / "ops" / "dispatch.py")) == "mlloss Python"
    assert owner(str(BENCHMARKS.parent / "kernels" / "dense.py")) == "mlloss Python"
    assert owner(torch.__file__) == "torch Python" and owner("~") == "C calls"
    report = profile_call.main(["--device", "cpu", "--num-items", "64", "--steps", "2", "--profiled", "1",
                                "--impls", "mlloss-replay", "--cases", "AUC"])  # on a GPU: the replayed call
    assert report.count("## AUC logistic, prior 0.1, N = 64, cpu with graph replay on:") == 1
    assert report.count("Self CPU time total") == 1
    # Stopped in its second case (the GPU stage's time limit): the file keeps the first (it was
    # written only at the end).
    profile_case = profile_call.profile_case

    def stopped_in_the_second(name, *args):
        if name != "AUC":
            raise KeyboardInterrupt
        return profile_case(name, *args)

    profile_call.profile_case = stopped_in_the_second
    with pytest.raises(KeyboardInterrupt):
        profile_call.main(["--device", "cpu", "--num-items", "64", "--steps", "2", "--profiled", "1",
                           "--cases", "AUC", "LaA", "--output", str(tmp_path / "stopped.txt")])
    assert (tmp_path / "stopped.txt").read_text().count("Self CPU time total") == 1


def test_host_time_compiles_the_kernels_and_times_each_call_with_and_without_triton_launches(tmp_path):
    """benchmarks/host_time.py (interpreter off: the kernels compiled for sm_90 on their first
    launch, launched through Triton's JIT path to a stand-in driver) for PDAOM: a row per groups
    and kernels setting, with its launches per call and both times, and each replayed from a
    stand-in graph (``--replay``: no launch); under TRITON_INTERPRET=1 the tool refuses to run."""
    import subprocess

    out = tmp_path / "host-time.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "host_time.py"), "--match", "PDAOM", "--calls", "12", "--rounds", "2",
                           "--replay", "--output", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    for loss in ("PDAOMLoss", "PDAOMLoss(2 task columns)"):  # two task columns: one call's launches
        assert sorted((row["grouped"], row["layout"], row["replay"]) for row in rows if row["loss"] == loss) == sorted(
            (grouped, layout, replay) for grouped in (False, True) for layout in (False, True) for replay in (False, True))
    for row in rows:
        assert row["loss"] in ("PDAOMLoss", "PDAOMLoss(2 task columns)") and row["num_items"] == 1024
        # the dense kernel and the combine step; the counting layout's two launches, the cells'
        # scan and its carries, the max-violation kernel and the combine step; a replay: none
        assert row["launches"] == (0 if row["replay"] else 6 if row["layout"] else 2), row
        assert row["host_us"] > 0 and row["without_launches_us"] > 0
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "host_time.py")], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert refused.returncode != 0 and "without TRITON_INTERPRET=1" in refused.stderr


def test_check_launcher_runs_every_loss_and_finds_equal_bits_under_the_interpreter():
    """benchmarks/check_launcher.py (gpu_session.sh's first kernels stage) on the CPU: it runs every
    case and exits 0 (under the interpreter both launch paths are Triton's; the comparison of the
    direct launches with Triton's own is tests/test_launch.py's, and CUDA's in a GPU session)."""
    import subprocess

    done = subprocess.run([sys.executable, str(BENCHMARKS / "check_launcher.py"), "--device", "cpu", "--num-items", "64"],
                          env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count(": loss ") == 9 and "bit-identical to Triton's path" in done.stdout


@pytest.mark.parametrize("num_items", ["0", "1", "-3"])
def test_check_launcher_refuses_batches_without_a_pair(num_items, capsys):
    """--num-items 0 or 1 launched no kernel at all and printed "direct launches: bit-identical to
    Triton's path" (exit 0) having compared nothing; -3 failed in torch.randn. Now refused."""
    check = benchmark_script("check_launcher", "check_launcher_refusing")
    with pytest.raises(SystemExit) as stopped:
        check.main(["--device", "cpu", "--num-items", num_items])
    assert stopped.value.code == 2 and "--num-items must be >= 2" in capsys.readouterr().err


def test_gpu_report_judges_the_replayed_calls_beside_the_eager_ones(bench_gpu, cases):
    """The acceptance lines of a GPU run with ``mlloss-replay`` rows: each eager target also for the
    replayed call, and the naive baselines over it (rows made up here, not measured)."""
    import gpu_report

    def row(case, impl, n, ms):
        return {"section": 2, "case": case, "impl": impl, "n": n, "time_s": ms / 1e3, "pairs_per_s": 1.0,
                "peak_extra_mb": 1.0}

    laa, n = cases.LAA_CASE, cases.HEADLINE_SPEEDUP_N
    rows = [row(laa, "mlloss-triton", n, 0.8), row(laa, "mlloss-replay", n, 0.25), row(laa, "naive-compile", n, 1.6),
            row(laa, "naive", n, 10.0)]
    lines = "\n".join(gpu_report.acceptance_lines(rows, gpu=True))
    assert f"{laa}, mlloss-triton forward + backward at N=16,384: 0.8 ms; target <= 0.3 ms: FAIL" in lines
    assert f"{laa}, mlloss-replay forward + backward at N=16,384: 0.25 ms; target <= 0.3 ms: PASS" in lines
    assert "naive torch.compile / Triton at N=16,384: 2.0x (1.6 ms vs 0.8 ms); target >= 5x: FAIL" in lines
    assert "naive torch.compile / Triton with graph replay at N=16,384: 6.4x (1.6 ms vs 0.25 ms); target >= 5x: PASS" in lines
    # a run without replayed rows says nothing of them
    assert "graph replay" not in "\n".join(gpu_report.acceptance_lines(rows[:1] + rows[2:], gpu=True))


def test_gpu_report_sets_the_recipe_batch_calls_beside_compiled_naive_code(bench_gpu, cases):
    """At the recipe's batch (no target), each way the library ran LaA beside the naive rows, with
    the compiled naive code's time over each; nothing without a library row (rows made up here)."""
    import gpu_report

    def row(impl, ms, n=cases.RECIPE_BATCH_N):
        return {"section": 2, "case": cases.LAA_CASE, "impl": impl, "n": n, "time_s": ms / 1e3, "pairs_per_s": 1.0,
                "peak_extra_mb": 1.0}

    rows = [row("mlloss-triton", 0.9), row("mlloss-graph", 0.03), row("naive", 0.8), row("naive-compile", 0.45),
            row("mlloss-triton", 0.1, n=16384)]
    line, = (line for line in gpu_report.acceptance_lines(rows, gpu=True) if "recipe's batch" in line)
    assert line == (f"- {cases.LAA_CASE} at the recipe's batch, N=1,024 (no target): naive eager 0.8 ms, naive "
                    "torch.compile 0.45 ms; mlloss eager 0.9 ms (0.5x), in a CUDA graph 0.03 ms (15x) "
                    "(x: naive torch.compile's time over the row's)")
    assert not any("recipe's batch" in line for line in gpu_report.acceptance_lines(rows[2:], gpu=True))
    # the LaA case of --quick runs naive torch.compile there
    laa, = (case for case in cases.gpu_cases(2, "quick") if case["case"] == cases.LAA_CASE)
    assert laa["only_at"]["naive-compile"] == [cases.RECIPE_BATCH_N, cases.HEADLINE_SPEEDUP_N]


def test_gpu_report_puts_the_back_to_back_calls_beside_the_graph(bench_gpu, cases):
    """The graph line of a case and N lists each row's time per call back to back where measured
    (rows made up here, not measured)."""
    import gpu_report

    def row(impl, ms, back_to_back_ms):
        return {"section": 2, "case": cases.LAA_CASE, "impl": impl, "n": 1024, "time_s": ms / 1e3, "pairs_per_s": 1.0,
                "peak_extra_mb": 1.0, "back_to_back_s": None if back_to_back_ms is None else back_to_back_ms / 1e3}

    rows = [row("mlloss-triton", 0.9, 0.4), row("mlloss-graph", 0.03, 0.02), row("mlloss-unchecked", 0.7, 0.1),
            row("mlloss-replay", 0.6, None)]
    line, = (line for line in gpu_report.acceptance_lines(rows, gpu=True) if "in a CUDA graph (no target" in line)
    assert line.endswith("; per call back to back: graph 0.02 ms, eager 0.4 ms, validate_args=False 0.1 ms")


def test_gpu_report_survives_a_failed_float64_reference_row(bench_gpu, cases):
    """Section 6 with its float64 row failed (out of memory, say): the float32 row became the
    case's reference, without a ``value_rel_diff``, and the report raised a KeyError after every
    row, which stopped the run (rows made up here, not measured)."""
    import gpu_report

    case, n = cases.accuracy_cases()[0]["case"], gpu_report.HEADLINE_MEMORY_N
    rows = [{"section": 6, "case": case, "n": n, "impl": "mlloss-triton-f64", "error": "OutOfMemoryError: (made up)"},
            {"section": 6, "case": case, "n": n, "impl": "mlloss-triton", "time_s": 0.1, "pairs_per_s": 1e12,
             "peak_extra_mb": 28.0, "reference": True}]
    lines = "\n".join(gpu_report.acceptance_lines(rows, gpu=True))
    assert f"{case}: not measured (the float64 reference row failed: OutOfMemoryError: (made up))" in lines


# --------------------------------------------------------------------------- #
# Tests from a mutation audit of the measurement tools: made-up rows, runs    #
# and clocks whose answers are known by construction                          #
# --------------------------------------------------------------------------- #
def _gpu_row(case, impl, n, ms, section=2, **extra):
    return {"section": section, "case": case, "impl": impl, "n": n, "time_s": ms / 1e3, "time_min_s": ms / 2e3,
            "pairs_per_s": 1e12, "peak_extra_mb": 10.0, "first_call_s": 0.5, "reference": True, **extra}


def test_gpu_report_table_cells_are_the_rows_median_and_minimum_in_ms(bench_gpu):
    import gpu_report

    row = _gpu_row("c", "mlloss-triton", 1024, 0.8, time_min_s=0.6e-3, back_to_back_s=0.25e-3, peak_extra_mb=12.34,
                   pairs_per_s=2.5e9)
    header, _, cells = gpu_report.format_rows([row]).splitlines()
    columns = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in cells.strip("|").split("|")]))
    assert columns["N"] == "1,024"
    assert (columns["median ms"], columns["min ms"], columns["back-to-back ms"]) == ("0.8", "0.6", "0.25")
    assert (columns["peak extra MB"], columns["pairs/s"], columns["first call s"]) == ("12.3", "2.5e+09", "0.50")


def test_gpu_report_judges_the_target_n_and_otherwise_the_largest_n_below_without_a_verdict(bench_gpu, cases):
    import gpu_report

    auc, big, small = cases.AUC_CASE, gpu_report.HEADLINE_MEMORY_N, cases.HEADLINE_SPEEDUP_N
    below = [_gpu_row(auc, "mlloss-triton", n, 1.0, pairs_per_s=1e12, peak_extra_mb=60.0) for n in (small, big // 4, big // 2)]
    lines = "\n".join(gpu_report.acceptance_lines(below, gpu=True))
    # the largest N measured, flagged: no verdict
    assert f"{auc}, Triton throughput at N={big // 2:,}: 1e+12 valid pairs/s; target >= 6e+11: no verdict: target N not measured" in lines
    at_target = below + [_gpu_row(auc, "mlloss-triton", big, 1.0, pairs_per_s=1e12, peak_extra_mb=60.0)]
    lines = "\n".join(gpu_report.acceptance_lines(at_target, gpu=True))
    assert f"{auc}, Triton throughput at N={big:,}: 1e+12 valid pairs/s; target >= 6e+11: PASS" in lines
    assert f"{auc}, Triton peak extra memory at N={big:,}: 60.0 MB; target <= 48 MB: FAIL" in lines
    small_memory = [dict(row, peak_extra_mb=20.0) for row in at_target]
    assert f"{auc}, Triton peak extra memory at N={big:,}: 20.0 MB; target <= 48 MB: PASS" in "\n".join(
        gpu_report.acceptance_lines(small_memory, gpu=True))


def test_gpu_report_times_the_grouped_cases_at_the_large_n(bench_gpu, cases):
    import gpu_report

    grouped = next(case for case in cases.gpu_cases(4, "quick") if case.get("dense_case"))
    big, small = gpu_report.HEADLINE_MEMORY_N, cases.HEADLINE_SPEEDUP_N
    rows = [_gpu_row(grouped["case"], "mlloss-triton", small, 0.1, dense_case=True),
            _gpu_row(grouped["case"], "mlloss-triton", big, 2.0, dense_case=True)]
    lines = "\n".join(gpu_report.acceptance_lines(rows, gpu=True))
    assert f"{grouped['case']}, mlloss-triton forward + backward at N={big:,}: 2 ms; target <= 1 ms: FAIL" in lines


def test_gpu_report_accuracy_verdict_is_the_values_difference(bench_gpu, cases):
    import gpu_report

    case, n = cases.accuracy_cases()[0]["case"], gpu_report.HEADLINE_MEMORY_N
    rows = [_gpu_row(case, "mlloss-triton-f64", n, 10.0, section=6),
            _gpu_row(case, "mlloss-triton", n, 1.0, section=6, reference=None, value_rel_diff=2e-6, grad_rel_diff=3e-4)]
    lines = "\n".join(gpu_report.acceptance_lines(rows, gpu=True))
    assert (f"{case}, float32 Triton loss vs float64 at N={n:,}: 2e-06 relative (gradient max 0.0003); "
            "target <= 1e-05: PASS") in lines


def test_gpu_report_sets_pdaoms_graph_beside_its_eager_call(bench_gpu, cases):
    import gpu_report

    pdaom, n = cases.PDAOM_CASE, 16384
    rows = [_gpu_row(pdaom, "mlloss", n, 0.7), _gpu_row(pdaom, "mlloss-graph", n, 0.05)]
    (line,) = [line for line in gpu_report.acceptance_lines(rows, gpu=True) if "in a CUDA graph" in line]
    assert line == f"- {pdaom} at N={n:,} in a CUDA graph (no target, no host path): 0.05 ms, eager 0.7 ms"


@pytest.mark.parametrize("temperature", [None, 0.05, 0.5, 5.0])
def test_naive_scatter_is_pdaoms_loss_hard_and_soft(cases, temperature):
    """The PDAOM rows' peer (scatter min / max, and log-mean-exp sums for the soft case that section 3
    times beside the hard one) computes the loss PDAOMLoss computes, on float64 inputs of the case."""
    spec = dict(cases.pdaom(temperature, group_size=cases.GROUP_SIZE), n=2000, seed=1)
    scores, labels, groups = cases.make_inputs(spec)
    scores = scores.double()
    expected = mlloss.PDAOMLoss(temperature=temperature, backend="torch")(scores, labels, groups)
    got = cases.naive_pdaom_loss(scores, labels, groups, spec.get("temperature"))
    assert got.item() == pytest.approx(expected.item(), rel=1e-13)
    planned = [case for case in cases.gpu_cases(3, "quick") if case["kind"] == "pdaom"]
    assert {case.get("temperature") for case in planned} == {None, cases.PDAOM_SOFT_TEMPERATURE}


def test_gpu_report_sets_the_soft_pdaoms_graph_beside_its_eager_call(bench_gpu, cases):
    import gpu_report

    soft, n = cases.pdaom(cases.PDAOM_SOFT_TEMPERATURE)["case"], 1048576
    rows = [_gpu_row(soft, "mlloss", n, 2.0), _gpu_row(soft, "mlloss-graph", n, 0.5)]
    (line,) = [line for line in gpu_report.acceptance_lines(rows, gpu=True) if "in a CUDA graph" in line]
    assert line == f"- {soft} at N={n:,} in a CUDA graph (no target, no host path): 0.5 ms, eager 2 ms"


def test_gpu_report_names_the_fastest_tiles(bench_gpu, cases):
    import gpu_report

    case = cases.TILES_PREFIX + " made up"
    rows = [_gpu_row(case, "mlloss-layout", 4096, 1.0), _gpu_row(case, "mlloss-triton@64x32x4", 4096, 0.5),
            _gpu_row(case, "mlloss-triton@128x64x8", 4096, 2.0)]
    (line,) = gpu_report._tile_lines(rows)
    assert line == f"- {case} at N=4,096 (no target): fastest 64x32x4 0.5 ms; library's 1 ms (3 rows)"


def test_merge_keeps_the_later_files_row(bench_gpu, cases, tmp_path):
    row = _gpu_row(cases.LAA_CASE, "mlloss-triton", 1024, 1.0)
    base = {"device": {"device": "cuda", "gpu_name": "NVIDIA H100", "torch": "2.11", "date_utc": "today",
                       "cpu_model": "x"}, "command": "c"}
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(dict(base, results=[row])))
    second.write_text(json.dumps(dict(base, results=[dict(row, time_s=0.5e-3)])))
    bench_gpu.main(["--merge", str(first), str(second), "--output", str(tmp_path / "m.json")])
    (merged,) = json.loads((tmp_path / "m.json").read_text())["results"]
    assert merged["time_s"] == 0.5e-3


def test_gpu_report_records_the_threads_torch_ran_with(bench_gpu, monkeypatch):
    import gpu_report
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    assert gpu_report.describe_device("cpu")["torch_threads"] == 7


def test_host_speed_is_the_fastest_rounds_microseconds_per_operation(bench_gpu, monkeypatch):
    # a clock that says each round of python calls (100,000) took 0.3, 0.2, 0.4, 0.25, 0.5 s, and each
    # of eager ops (2,000) 8, 6, 9, 7, 6.5 ms: 2 us a call and 3 us an op, the fastest rounds'
    import _measure

    ticks = iter(sum(([0.0, s] for s in (0.3, 0.2, 0.4, 0.25, 0.5, 8e-3, 6e-3, 9e-3, 7e-3, 6.5e-3)), []))
    monkeypatch.setattr(_measure.time, "perf_counter", lambda: next(ticks))
    assert _measure.host_speed("cpu") == {"python_call_us": 2.0, "cpu_op_us": 3.0}


def test_measure_step_times_the_fastest_run_and_runs_the_repeats_after_the_first(bench_gpu, monkeypatch):
    import _measure

    durations = iter([3.0, 1.0, 2.0, 5.0])  # the first (memory) run, then 3 repeats
    clock = [0.0]
    monkeypatch.setattr(_measure.time, "perf_counter", lambda: clock[0])

    def step():
        clock[0] += next(durations)
        return "result"

    measured = _measure.measure_step(step, lambda: None, repeats=3, long_run_s=100.0)
    assert measured["times_s"] == [3.0, 1.0, 2.0, 5.0] and measured["time_s"] == 1.0
    assert measured["result"] == "result"


def test_source_provenance_names_the_commit_the_dirty_files_and_hashes_both_source_folders(bench_gpu, tmp_path):
    import subprocess

    import _measure

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True).stdout.strip()

    for folder in ("mlloss", "kernels"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "two")
    head = git("rev-parse", "HEAD")
    clean = _measure.source_provenance(str(tmp_path))
    assert clean["git_commit"] == head and clean["library_dirty_files"] == []
    (tmp_path / "kernels" / "a.py").write_text("x = 2\n")
    edited = _measure.source_provenance(str(tmp_path))
    assert edited["git_commit"] == head
    # porcelain's two status columns kept: " M" unstaged (a strip of the whole output made the first
    # line read "M ", staged), "M " staged
    assert edited["library_dirty_files"] == [" M kernels/a.py"]
    git("add", "kernels/a.py")
    (tmp_path / "mlloss" / "a.py").write_text("x = 3\n")
    assert _measure.source_provenance(str(tmp_path))["library_dirty_files"] == ["M  kernels/a.py", " M mlloss/a.py"]
    assert edited["library_sha256"] != clean["library_sha256"]


def test_device_description_records_the_threads_torch_runs_with():
    """It recorded 2 whatever torch ran with (bench_cross_device's ranks ran 1 thread each)."""
    import torch

    import _measure

    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert _measure.device_description()["torch_threads"] == n
    finally:
        torch.set_num_threads(threads)


def test_group_pair_elements_is_the_brute_force_count_of_same_group_pairs(cases):
    import torch

    groups = torch.tensor([5, 5, 9, 5, 2, 9, 7])
    assert cases.group_pair_elements(groups, 7) == float((groups[:, None] == groups[None, :]).sum())
    assert cases.group_pair_elements(None, 7) == 49.0


def _host_time_module(monkeypatch):
    """benchmarks/host_time.py in this process (it refuses TRITON_INTERPRET=1 at import, and sets 0)."""
    import importlib.util

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("host_time_under_test", BENCHMARKS / "host_time.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # (its dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def test_host_time_blocks_give_the_smallest_block_median_of_each_kind(monkeypatch):
    import contextlib

    host_time = _host_time_module(monkeypatch)
    removed = [False]

    @contextlib.contextmanager
    def launches_removed():
        removed[0] = True
        yield
        removed[0] = False

    # each block of 3 calls takes 1, 9, 5 ticks (median 5) + the block's index; without launches
    # half as long: the smallest block medians are 5 us and 2.5 us; the min of a block is 1 or 0.5
    clock, calls = [0.0], [0]

    def call():
        block, within = divmod(calls[0], 3)
        calls[0] += 1
        ticks = (1, 9, 5)[within] + block // 2
        clock[0] += 1e-6 * (ticks / 2 if removed[0] else ticks)

    monkeypatch.setattr(host_time, "launches_removed", launches_removed)
    monkeypatch.setattr(host_time.time, "thread_time", lambda: clock[0])
    with_launches, without = host_time._alternating_us(call, calls=12, blocks=4)
    assert with_launches == pytest.approx(5.0) and without == pytest.approx(2.5)


def test_host_time_compare_divides_the_later_fastest_by_the_earlier_fastest(monkeypatch, tmp_path):
    host_time = _host_time_module(monkeypatch)

    def run(path, commit, *times):
        rows = [{"loss": "AUCLoss", "grouped": False, "layout": False, "num_items": 1024, "replay": False,
                 "launches": 2, "host_us": t, "without_launches_us": t / 2} for t in times]
        path.write_text(json.dumps({"git_commit": commit, "mlloss_root": "/x", "library_dirty_files": [], "rows": rows}))
        return str(path)

    before = [run(tmp_path / "b1.json", "a" * 40, 300.0, 200.0), run(tmp_path / "b2.json", "a" * 40, 250.0)]
    after = [run(tmp_path / "a1.json", "b" * 40, 120.0), run(tmp_path / "a2.json", "b" * 40, 100.0, 180.0)]
    host_time.compare(before, after, str(tmp_path / "ab.json"))
    result = json.loads((tmp_path / "ab.json").read_text())
    (row,) = result["rows"]
    assert (row["before_us"], row["after_us"]) == (200.0, 100.0)
    assert "after / before 0.50-0.50" in result["summary"] and "aaaaaaaaaa (before)" in result["summary"]
    assert "| AUCLoss | False | dense | 2 | 200 | 100 | 0.50 |" in (tmp_path / "ab.md").read_text()


def test_host_time_keeps_each_rows_fastest_round(monkeypatch, tmp_path):
    host_time = _host_time_module(monkeypatch)
    rounds = iter([300.0, 100.0, 200.0])

    def made_up(name, *, grouped, layout, calls, replay=False):
        return host_time.HostTime(name, grouped, layout, 1024, replay, 2, next(rounds), 50.0)

    monkeypatch.setattr(host_time, "host_time", made_up)
    monkeypatch.setattr(host_time, "cases", lambda match, replay=False: [("AUCLoss", False, False, False)])
    monkeypatch.setattr(host_time.torch, "set_num_threads", lambda n: None)
    host_time.main(["--rounds", "3", "--output", str(tmp_path / "t.json")])
    (row,) = json.loads((tmp_path / "t.json").read_text())["rows"]
    assert row["host_us"] == 100.0


def test_host_time_refuses_no_rounds_a_match_of_no_loss_and_runs_without_a_row_in_common(monkeypatch, tmp_path, capsys):
    """--rounds 0 and a --match in no loss name timed nothing and wrote a JSON of no rows over
    --output; --compare of runs with no row in common ended in min() of an empty list. Now each
    says what was given."""
    host_time = _host_time_module(monkeypatch)
    monkeypatch.setattr(host_time, "host_time", lambda *a, **k: pytest.fail("timed a row"))
    monkeypatch.setattr(host_time.torch, "set_num_threads", lambda n: None)
    output = tmp_path / "t.json"
    with pytest.raises(SystemExit):
        host_time.main(["--rounds", "0", "--output", str(output)])
    assert "--rounds must be >= 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--match 'PDOAM': no loss name contains it; the losses: AUCLoss, "):
        host_time.main(["--match", "PDOAM", "--output", str(output)])
    assert not output.exists()

    def run(path, loss):
        row = {"loss": loss, "grouped": False, "layout": False, "num_items": 1024, "replay": False, "launches": 2,
               "host_us": 100.0, "without_launches_us": 50.0}
        path.write_text(json.dumps({"git_commit": "a" * 40, "mlloss_root": "/x", "library_dirty_files": [], "rows": [row]}))
        return str(path)

    with pytest.raises(SystemExit, match="--compare and --to share no row .*: 1 rows before, 1 after"):
        host_time.compare([run(tmp_path / "b.json", "AUCLoss")], [run(tmp_path / "a.json", "LaALoss")], str(output))


def test_recipe_benchmark_split_adds_up_to_the_step_and_impressions_per_s_to_the_window():
    """One profiled run: its parts (other: the rest) add up to its step time, and impressions per
    second are the window's impressions over its steps' time (step_ms * steps)."""
    import argparse

    bench = benchmark_script("bench_recipe", "bench_recipe")
    import ctr_cvr

    data, _ = ctr_cvr.load_data(ctr_cvr.parse_args(["--num-users", "300"]))
    args = argparse.Namespace(device="cpu", compile=None, steps_per_call=2, warmup=2, steps=6, fixed_batches=False)
    row = bench.train(args, "bce", 256, data, profile=True)
    assert row["steps"] == 6 and 0 < row["impressions"] <= 6 * 256 * 2
    assert sum(row["split_ms"].values()) == pytest.approx(row["step_ms"], rel=1e-9)
    assert row["impressions_per_s"] == pytest.approx(row["impressions"] / (row["step_ms"] * row["steps"] / 1e3), rel=1e-9)


def test_recipe_step_ops_count_kernels_not_views():
    """step_ops' kernel ops: the same step with views added runs the same kernels."""
    import torch

    bench = benchmark_script("bench_recipe", "bench_recipe")

    class Step(torch.nn.Module):
        def __init__(self, views: bool):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))
            self.views = views
            self.register_buffer("train_loss_sum", torch.zeros(()))

        def batch_loss(self, batch):
            w = self.w.view(2, 2).view(-1).unsqueeze(0).squeeze(0) if self.views else self.w
            return (w * batch).sum()

    counts = []
    for views in (False, True):
        module = Step(views)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        counts.append(bench.step_ops(module, optimizer, torch.arange(4.0)))
    assert counts[0] == counts[1] and counts[0]["kernel_ops"] > 0 and counts[0]["syncing_ops"] == 0
