"""benchmarks/cuda_specializations.py: the CUDA launches recorded under the interpreter are the
ones a GPU would compile, the recording leaves the call's results unchanged, and one recorded
specialization of each shape of work (a data check, a dense kernel with a mask) compiles for sm_90.
About 35 s on 2 cores."""

from __future__ import annotations

import contextlib
import importlib
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

# The tool and its neighbours (kernel_sass, host_path) import one another by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.fixture(scope="module")
def tool():
    """benchmarks/cuda_specializations.py; recording needs the interpreter."""
    from mlloss.kernels import _common

    if not _common.INTERPRET:
        pytest.skip("recording needs TRITON_INTERPRET=1 (the suite's CPU setting)")
    return importlib.import_module("cuda_specializations")


def _case(tool, name):
    return next(case for case in tool.cases() if case.name == name)


@pytest.fixture(scope="module")
def masked_dense(tool) -> list[dict]:
    """The launches of a grouped, masked AUC call on the dense kernels."""
    return tool.record([_case(tool, "AUC logistic dense groups mask")])["AUC logistic dense groups mask"]


def test_recorded_launches_carry_the_cuda_choices(tool, masked_dense):
    from mlloss.kernels import _common, dense

    # the data check is the rows kernel's (CHECK): no launch of its own
    assert [launch["kernel"] for launch in masked_dense] == ["_dense_rows_kernel", "_combine_kernel"]
    dense_launch = masked_dense[0]
    constexprs = dense_launch["constexprs"]
    assert constexprs["CHECK"] is True
    assert (constexprs["BLOCK_M"], constexprs["BLOCK_N"], dense_launch["num_warps"]) == dense.TILES["cuda"]
    assert constexprs["FAST"] is True and constexprs["MASKED"] is True and constexprs["ACC"] == {"tl": "float32"}
    assert dense_launch["signature"]["keep_ptr"] == "*u1" and dense_launch["signature"]["scores_ptr"] == "*fp32"
    assert dense_launch["signature"]["N"] == "i32"
    # Nothing stays patched.
    assert dense.launch_target(torch.device("cpu")) == "interpreter" == _common.launch_target(torch.device("cpu"))


@pytest.mark.parametrize("name", ["LaA linear dense groups mask", "LaA linear layout groups",
                                  "AUC exponential dense groups", "AUC exponential layout groups",
                                  "AUC logistic layout groups float64", "LoA balanced layout groups mask",
                                  "AUC logistic dense groups mask"])
def test_recording_leaves_the_results_unchanged(tool, name):
    """A recorded call runs the CUDA launches: the fast branch (base-2 scores, the special-function
    ops computed exactly by the interpreter), the CUDA tiles and chunks (at N = 300 the layout
    kernel's 32 chunks of 5 partner tiles are mostly empty). It computes what the interpreter's own
    launches (exact branch, big tiles) compute, up to float32 rounding. The layout kernel takes the
    CUDA tiles of its accumulation dtype and grouping (float64: the smaller ones that do not spill)."""
    from host_path import dense_kernels_off

    from mlloss.kernels import pairwise

    case = _case(tool, name)
    scores, labels, groups, mask = tool._inputs(case)
    options = {"mask": mask} if mask is not None else {}
    runs = []
    for recording in (False, True):
        x = scores.clone().requires_grad_(True)
        with tool.recording_cuda_launches() if recording else contextlib.nullcontext() as launches, \
                dense_kernels_off() if case.layout else contextlib.nullcontext():
            loss = case.make()(x, labels, groups, **options)
            loss.backward()
        runs.append((loss.detach(), x.grad))
    (loss, grad), (again, recorded_grad) = runs
    tolerance = 1e-12 if case.dtype == "float64" else 1e-6
    torch.testing.assert_close(again, loss, rtol=tolerance, atol=0)
    torch.testing.assert_close(recorded_grad, grad, rtol=10 * tolerance, atol=tolerance * 1e-3)

    kernels = [launch["kernel"] for launch in launches]
    assert ("_pair_partials_kernel" in kernels) == case.layout and ("_dense_rows_kernel" in kernels) != case.layout
    if case.layout:
        launch = next(x for x in launches if x["kernel"] == "_pair_partials_kernel")
        constexprs = launch["constexprs"]
        accumulation = torch.float64 if case.dtype == "float64" else torch.float32
        tiles = pairwise.TILES[pairwise.tile_key("cuda", accumulation, grouped="groups" in name)]
        assert (constexprs["BLOCK_M"], constexprs["BLOCK_N"], launch["num_warps"]) == tiles
        assert constexprs["FAST"] is (case.dtype == "float32")


def test_the_fast_logistic_launches_its_factored_terms_with_the_register_cap(tool, monkeypatch):
    """The layout kernel of a CUDA float32 logistic call takes the factored terms (FACTOR) and,
    with the 64 x 64 x 8 tiles, ``MAX_REGISTERS``' cap; ``FACTOR_LOGISTIC = False`` (bench_gpu.py's
    ``@per-pair`` rows) launches the per-pair kernel without the cap, and both compute the same
    loss and gradient (float32 rounding apart)."""
    from host_path import dense_kernels_off

    from mlloss.kernels import pairwise

    case = _case(tool, "AUC logistic layout")
    scores, labels, groups, _ = tool._inputs(case)
    runs = []
    for factor in (True, False):
        monkeypatch.setattr(pairwise, "FACTOR_LOGISTIC", factor)
        x = scores.clone().requires_grad_(True)
        with tool.recording_cuda_launches() as launches, dense_kernels_off():
            case.make()(x, labels, groups).backward()
        (launch,) = [x for x in launches if x["kernel"] == "_pair_partials_kernel"]
        assert launch["constexprs"]["FACTOR"] is factor
        assert launch.get("maxnreg") == (pairwise.MAX_REGISTERS["cuda"] if factor else None)
        runs.append(x.grad)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("name", ["PDAOM soft layout groups", "LaA soft hardest layout", "AUC hinge dense groups"])
def test_no_float_argument_reaches_a_cuda_kernel_as_float32(tool, name):
    """Triton's launcher types a plain Python float as fp32 on CUDA, so a float64 loss with
    tau = 0.3 or margin = 0.3 would lose ~1e-8 relative there (the interpreter keeps the Python
    float, so no CPU value shows it). Every float reaches a kernel as a constexpr (the margin) or
    through a parameter annotated ``tl.float64`` (the temperature)."""
    launches = tool.record([_case(tool, name)])[name]
    float32_scalars = [(x["kernel"], p) for x in launches for p, kind in x["signature"].items() if kind == "fp32"]
    assert not float32_scalars
    temperatures = {kind for x in launches for p, kind in x["signature"].items() if "temperature" in p}
    assert temperatures == (set() if "soft" not in name else {"fp64"})
    margins = [x["constexprs"]["MARGIN"] for x in launches if "MARGIN" in x["constexprs"]]
    assert margins and set(margins) == {1.0}  # the losses' default margin, compiled in


def test_distinct_merges_equal_launches_and_keeps_their_cases(tool):
    launch = {"module": "m", "kernel": "k", "signature": {"x": "*fp32"}, "constexprs": {}, "num_warps": 4}
    other = dict(launch, num_warps=8)
    specs = tool.distinct({"a": [launch, launch], "b": [launch, other]})
    assert [(s["num_warps"], s["cases"]) for s in specs] == [(4, ["a", "b"]), (8, ["b"])]


def test_two_recorded_specializations_compile_for_sm90(tool, masked_dense):
    check, dense_launch = masked_dense[:2]
    results = tool.compile_all([check, dense_launch], jobs=2)
    for result in results:
        assert result["ok"], result.get("error")
        assert 0 < result["registers"] <= 255
    assert results[1]["spill_store_bytes"] == 0  # the dense kernel's CUDA tiles fit in registers


@pytest.mark.parametrize("loss_name", ["AUCLoss", "LaALoss", "PDAOMLoss"])
@pytest.mark.parametrize("layout", [False, True])
def test_batches_of_other_sizes_and_offsets_reuse_each_kernels_compiled_specialization(tool, loss_name, layout):
    """Triton compiles a kernel again for each new pattern of its int arguments (1, a multiple of 16,
    other) and pointer alignments. The sizes of a batch (N, and the counts that follow it) and the
    caller's tensors that the kernels read as they are (slices of a data set's columns) are not
    specialized on: batches of other sizes at odd offsets launch one specialization of each
    kernel. (With them specialized, these batches launched two or three of most kernels.)
    Small batches here: one, two and three blocks of rows."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.interpreter import InterpretedFunction

    import mlloss
    from host_path import dense_kernels_off

    specializations: dict[str, set] = {}
    gen = torch.Generator().manual_seed(0)
    data_labels = torch.randint(0, 2, (200, 2), generator=gen).float()
    data_groups = torch.randint(0, 8, (200,), generator=gen)
    loss = {"AUCLoss": mlloss.AUCLoss, "LaALoss": mlloss.LaALoss, "PDAOMLoss": mlloss.PDAOMLoss}[loss_name](backend="triton")
    with tool.recording_cuda_launches(), dense_kernels_off() if layout else contextlib.nullcontext():
        recorded_run = InterpretedFunction.run

        def keyed_run(self, *args, grid, warmup, **kwargs):
            bound = dict(zip(self.arg_names, args)) | {k: v for k, v in kwargs.items() if k in self.arg_names}
            sizes = self.kwargs.get("do_not_specialize") or ()
            alignments = self.kwargs.get("do_not_specialize_on_alignment") or ()
            key = tuple(
                repr(bound[name]) if kind == "constexpr"
                else native_specialize_impl(BaseBackend, bound[name], False, name not in sizes, name not in alignments)
                for name, kind in tool.launcher_signature(self.fn, bound).items())
            specializations.setdefault(self.fn.__name__, set()).add((key, kwargs.get("num_warps", 4)))
            return recorded_run(self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = keyed_run  # restored by the recording's exit
        for start, n in [(0, 64), (1, 50), (7, 81), (2, 160)]:
            labels = data_labels[start:start + n] if loss_name == "LaALoss" else data_labels[start:start + n, 0]
            scores = torch.randn(n, generator=gen, requires_grad=True)
            mask = torch.ones(200, dtype=torch.bool)[start:start + n]
            loss(scores, labels, data_groups[start:start + n], mask=mask).backward()
    assert specializations, "no kernel launched"
    assert {name: len(keys) for name, keys in specializations.items()} == dict.fromkeys(specializations, 1)


def test_the_report_counts_compiled_and_failed_specializations(tool, monkeypatch, tmp_path):
    # made-up recordings (three launches of two specializations in two cases) and compile results
    # (one fails): the JSON's counts and the exit status follow from them
    import json

    launch = {"module": "m", "kernel": "k", "signature": {"x": "*fp32"}, "constexprs": {}, "num_warps": 4}
    recorded = {"a": [launch, launch], "b": [dict(launch, num_warps=8)]}
    monkeypatch.setattr(tool, "_record_in_child", lambda match: recorded)

    def compile_all(specs, jobs):
        return [dict(spec, ok=True, registers=40, spill_store_bytes=0, spill_load_bytes=0) if spec["num_warps"] == 4
                else dict(spec, ok=False, error="made up") for spec in specs]

    monkeypatch.setattr(tool, "compile_all", compile_all)
    assert tool.main(["--output", str(tmp_path / "s.json")]) == 1
    report = json.loads((tmp_path / "s.json").read_text())
    assert report["cases"] == {"a": 2, "b": 1}
    assert (report["compiled"], report["failed"], len(report["specializations"])) == (1, 1, 2)
