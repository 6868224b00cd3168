#!/usr/bin/env bash
# The GPU checks a session with a lent GPU should run, one stage per device command (each well
# under the device tool's 10 minutes).
#
#   bash benchmarks/gpu_session.sh tests    # Triton kernels and CUDA metrics against the float64 reference,
#                                           # and fullgraph-compiled steps with every loss on CUDA
#   bash benchmarks/gpu_session.sh bench [OPTION...]  # python benchmarks/bench_gpu.py --quick
#   bash benchmarks/gpu_session.sh recipe [OPTION...]  # recipes/ctr_cvr.py on the GPU with and without a pairwise loss
#   bash benchmarks/gpu_session.sh recipe-compiled [MODE [OPTION...]]  # the same with --compile MODE (bce, bce+pdaom)
#        e.g. recipe-compiled reduce-overhead --fixed-batches: one CUDA graph for every training step
#   bash benchmarks/gpu_session.sh step [OPTION...]  # python benchmarks/bench_recipe.py --device cuda (the step's split)
#        e.g. step --compile reduce-overhead --fixed-batches
#   bash benchmarks/gpu_session.sh profile [OPTION...]  # python benchmarks/profile_call.py (host or kernel bound?)
#   bash benchmarks/gpu_session.sh launch-check  # python benchmarks/check_launcher.py: the direct launches give
#                                                # Triton's results bit for bit (status 3 if not)
#   bash benchmarks/gpu_session.sh kernels   # launch-check, tests, bench, accuracy, profile: issue 10's GPU lines in one device command
#   bash benchmarks/gpu_session.sh training  # step (plain), the step in CUDA graphs at 1,024 and 8,192: issue 12's GPU lines
#
# A lent GPU comes with 15 minutes of device time in all (its start, 1-2 minutes, and each idle wait
# included): kernels and training, run back to back, are sized to fit it together, 400 + 310 s of
# stage limits (see the plans below). Pass the device tool a timeout_s of at most what is left.
# Results go to $OUT (the device tool's output folder; at most 8 files come back) or ./gpu-out.
# The device image has torch, triton and pytorch-lightning but no network: nothing is installed from
# a registry. Wheels in .whl/ (git-ignored, carried with the device tool's `carry: [".whl"]`) are
# unpacked to /tmp/site first: LibAUC for bench_gpu.py's baseline rows, fetched once with
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl libauc==2.0.1
# (the image has its needs: scikit-learn, pandas, scipy, tqdm).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
# Once per command: a composite stage's children inherit the environment set up here.
if [ -z "${GPU_SESSION_READY:-}" ]; then
    python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.cuda.get_device_name(), 'torch', torch.__version__)" | tee -i "$out/device.txt"
    if compgen -G ".whl/*.whl" > /dev/null; then
        python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # mlloss.kernels is the folder kernels/ (pyproject's package-dir); without an install, link it.
    python -c "import mlloss.kernels" 2>/dev/null || ln -sfn ../kernels mlloss/kernels
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GPU_SESSION_READY=1
fi

# The console's tail of a stage's log; it ignores the SIGINT that stops a stage at its time limit, so
# that what the program prints on its way out (pytest's summary) still reaches the log (tee -p) and it.
quiet_tail() { (trap '' INT; exec tail -n "$1"); }

case "${1:?usage: gpu_session.sh tests|bench|profile|recipe|recipe-compiled|step|launch-check|kernels|training}" in
launch-check)
    # Every loss through kernels/_launch.py's direct launches and through Triton's path: equal bits.
    # Its lines go to device.txt (the composite stages fill the 8 files that come back).
    python benchmarks/check_launcher.py 2>&1 | tee -iap "$out/device.txt" | quiet_tail 15
    ;;
tests)
    # The same tests as CI, on CUDA tensors with compiled kernels (TRITON_INTERPRET=0); 8 workers
    # (pytest-xdist is in the image) share the 16 cores' Triton and Inductor compiles and one GPU.
    # The files with the longest tests (Inductor compiles, CUDA graph captures) come first, so that
    # xdist hands them out while the short ones fill the gaps, not last with most workers idle;
    # the 20 slowest are listed (what to move or cut if the stage outgrows its limit).
    MLLOSS_TEST_DEVICE=cuda TRITON_INTERPRET=0 python -m pytest -q -n 8 -p no:cacheprovider --durations=20 \
        tests/test_compile.py tests/test_graph_replay.py tests/test_triton_backend.py tests/test_triton_kernels.py \
        tests/test_dense_kernels.py tests/test_metrics.py tests/test_task_columns.py tests/test_contiguous_groups.py tests/test_group_ids.py \
        tests/test_bad_input.py::test_the_cross_entropy_objectives_name_a_bad_entry_on_every_path \
        tests/test_bad_input.py::test_probabilities_outside_0_1_are_named_before_torch_refuses_them \
        2>&1 | tee -ip "$out/tests.txt" | quiet_tail 5
    ;;
bench)
    python benchmarks/bench_gpu.py --quick --output "$out" "${@:2}" 2>&1 | tee -iap "$out/bench.log" | quiet_tail 30
    ;;
profile)
    # AUC and LaA calls at N = 16,384, grouped AUC at 2^20 and 16,384, PDAOM at 2^20: wall time per call, the profiler's tables.
    python benchmarks/profile_call.py --output "$out/profile.txt" "${@:2}" 2>&1 | quiet_tail 12
    ;;
recipe|recipe-compiled)
    # Training throughput (impressions/s) and test AUC/GAUC with and without the pairwise term, at
    # batches of 1,024 and 8,192; DDP on one GPU uses NCCL. recipe-compiled [MODE]: the same with
    # --compile MODE (default: default; reduce-overhead: CUDA graphs), bce and bce+pdaom. One JSON comes back.
    mkdir -p runs
    if [ "$1" = recipe ]; then tag=gpu; extra=("${@:2}"); losses="bce bce+pdaom bce+auc laa"
    else mode=${2:-default}; tag=gpu-compiled-$mode; extra=(--compile "$mode" "${@:3}"); losses="bce bce+pdaom"
        if [ $# -gt 2 ]; then tag=$tag$(printf '%s' "${@:3}" | tr -c 'a-z0-9' '-'); fi; fi
    summary="$out/$tag-recipe-throughput.json"
    # Stopped by a composite stage's time limit (SIGINT), the run in flight exits (Lightning turns the
    # interrupt into exit 1) and the loop would go on with the next run: stop after the summary instead.
    stopped=
    trap 'stopped=1' INT
    for batch in 1024 8192; do
        for loss in $losses; do
            [ -z "$stopped" ] || break 2
            run="runs/$tag-$loss-$batch"
            started=$(date +%s.%N)
            python recipes/ctr_cvr.py --accelerator gpu --devices 1 --strategy ddp --loss "$loss" --batch-size "$batch" \
                --no-progress-bar --no-checkpoint "${extra[@]}" --output-dir "$run" > "$run.log" 2>&1 \
                || echo "$run failed (status $?); the end of its log goes to $summary"
            echo "$started $(date +%s.%N)" > "$run.wall"  # the process's wall time: imports, set-up, data, compiles
            # Rewritten after every run, so that a stage stopped by its time limit keeps what it measured.
            CURRENT="$loss batch $batch" python - "$summary" "$tag" $losses <<'EOF'
import json, os, statistics, sys
output, tag, losses = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for batch in (1024, 8192):
    for loss in losses:
        run = f"runs/{tag}-{loss}-{batch}"
        if os.path.exists(f"{run}/results.json"):
            report = json.load(open(f"{run}/results.json"))
            speeds = [row["train_samples_per_s"] for row in report["history"][1:]]  # epoch 1 warms up (and compiles)
            test = report["results"]["test"]
            rows[f"{loss} batch {batch}"] = {
                "impressions_per_s_median": statistics.median(speeds) if speeds else None,
                **{k: test[f"model/{k}"] for k in ("auc/click", "gauc/click", "auc/purchase", "gauc/purchase")},
                # where a run's time goes: the process, main() (data, fit, test, report), each epoch
                "runtime_s": report["runtime_s"],
                "epoch_s": [[row["train_seconds"], row["seconds"]] for row in report["history"]]}
        elif os.path.exists(f"{run}.log"):  # failed
            rows[f"{loss} batch {batch}"] = {"log_tail": open(f"{run}.log").read()[-2000:]}
        if f"{loss} batch {batch}" in rows and os.path.exists(f"{run}.wall"):
            start, end = map(float, open(f"{run}.wall").read().split())
            rows[f"{loss} batch {batch}"]["process_wall_s"] = end - start
with open(output + ".partial", "w") as handle:  # replaced whole: a stop while writing keeps the last version
    json.dump(rows, handle, indent=2)
os.replace(output + ".partial", output)
print(os.environ["CURRENT"], str(rows.get(os.environ["CURRENT"]))[:300])
EOF
        done
    done
    ;;
step)
    # The options name the output: recipe-cuda.json, recipe-cuda-compile-reduce-overhead-fixed-batches.json.
    suffix=$(printf '%s ' "${@:2}" | tr -cs 'a-z0-9' '-' | sed 's/^-*//; s/-*$//')
    # Compiled: why Inductor skipped or split a graph's CUDA graphs goes to the log (the JSON counts them).
    case " ${*:2} " in *" --compile"*) export TORCH_LOGS=${TORCH_LOGS:-cudagraphs} ;; esac
    python benchmarks/bench_recipe.py --device cuda "${@:2}" --output "$out/recipe-cuda${suffix:+-$suffix}.json" 2>&1 \
        | tee -iap "$out/recipe-step.log" | quiet_tail 40
    ;;
kernels|training)
    # Several stages in one device command (a cold start costs a minute or two of the session's 15),
    # each under its own time limit so that one that hangs leaves the others their time; at most 8
    # files. Limits (H100, 16 cores): kernels 40 + 115 + 160 + 40 + 45 = 400 s, training 90 + 220 = 310 s,
    # so that both commands, the machine's start and its idle wait fit 15 minutes. A stage that reaches
    # its limit gets SIGINT (its files are rewritten as it goes), then SIGKILL 15 s later.
    if [ "$1" = kernels ]; then
        # the launch check, then tests (69 s on an H100 before the launch check compiled part of their
        # kernels, 84-87 s with the suite of 2026-11-26, before tests/test_task_columns.py's 55 tests
        # and their 10 new specializations, tests/test_contiguous_groups.py's 49 and their 8, and
        # tests/test_group_ids.py's 74 with the int32-id specializations: the 130 s may cut the last few),
        # then bench_gpu.py --quick (issue 10): sections 1-5,
        # then 6 (accuracy) in a file of their own, so that a slow float64 reference cannot take
        # the timing sections' time (section 7, the tiles, ran at a20b70f and before: `bench
        # --sections 7` in a command of its own), then the profile of the host-bound calls, eager and
        # replayed (35 s on 2026-11-27). A budget leaves its limit room for the start (imports,
        # ~10 s) and the row in flight. (Sections 1-5 took 74 s on 2026-11-26, before their
        # mlloss-graph, mlloss-unchecked and mlloss-replay rows: about 30 rows of 1-2 s more.)
        # Section 9 (the fast logistic's factored terms against its per-pair terms and without the
        # register cap) answered its question at eb07a70 (both stay) and left the plan: `bench
        # --sections 9` reruns it after a kernel change. Section 10 (the dense kernels against the
        # layout kernels at 2,048-16,384 items, 32 rows) comes last in the bench stage: the budget
        # cuts it first. (Section 2's compiled rows at N = 1,024 and the mlloss-compile rows, added
        # after the last GPU run, cost it about 15-20 s of compiles; so do section 3's soft PDAOM rows,
        # added after it too: 2 timed rows at 2^20 and the soft scan kernels' compiles.)
        # The launch check comes first: if the direct launches differ from Triton's path (status 3),
        # or the check itself fails (another status), the later stages launch through Triton's path
        # (MLLOSS_TRITON_LAUNCH=triton, which the bench results record), so that their figures
        # stand, and the tests show the failure.
        plan=("40 launch-check" "130 tests" "150 bench --budget-s 130 --sections 2,5,3,1,4,10" \
              "40 bench --budget-s 25 --sections 6 --output $out/accuracy.json" \
              "40 profile --impls mlloss-triton mlloss-replay --cases AUC LaA grouped-AUC")
    else
        # bench_recipe.py's step split (issue 12), plain (3 framework-overhead rounds, so that its 16
        # training rows fit: eb07a70 bce 1.36M impressions/s at 8,192, 182k at 1,024); then the step
        # under torch.compile's CUDA graphs (fixed batches: one shape a batch size; its framework
        # overhead left out: the plain run has it), the configuration of issue 12's throughput lines,
        # at the launch-bound batch of 1,024 (a20b70f: bce 545k, the pairwise losses 0.80-0.98 of it,
        # before the fixes of stop 65: its cudagraph counters and Inductor's cudagraph log say what
        # was captured), then at 8,192 (bce >= 2M: never measured compiled; eager, the step is the
        # host's, 5.2-5.8 ms at both sizes). Each (loss, batch) compiles afresh, about 20-25 s (the compiled
        # step did 3-4 losses at 1,024 in about 100 s): the limit may cut 8,192's last loss. The plain
        # recipe runs (recipe: Lightning end to end, NCCL; 35 s a run, 3 in 110 s on 2026-11-27; their
        # figures stand from da5adbf, a20b70f and eb07a70), the step with the losses' calls replayed
        # from CUDA graphs (step --graph-replay --fixed-batches --rounds 0 --batch-sizes 1024: measured
        # at eb07a70) and recipe-compiled run in commands of their own.
        plan=("90 step --rounds 3" "220 step --compile reduce-overhead --fixed-batches --rounds 0 --batch-sizes 1024 8192")
    fi
    for entry in "${plan[@]}"; do
        read -r limit stage <<< "$entry"
        echo "== $stage (limit ${limit} s)"
        status=0
        # shellcheck disable=SC2086 -- the stage's words are its arguments
        timeout --signal=INT --kill-after=15 "$limit" bash "$0" $stage || status=$?
        if [ "$status" != 0 ]; then
            echo "== $stage stopped with status $status"
            if [ "$stage" = launch-check ]; then
                export MLLOSS_TRITON_LAUNCH=triton
                if [ "$status" = 3 ]; then
                    echo "== the direct launches differ from Triton's path: the later stages launch through Triton's"
                else
                    echo "== the launch check failed: the later stages launch through Triton's path"
                fi
            fi
        fi
    done
    rm -f "$out"/*.partial  # a file being replaced when its stage was killed
    ;;
*)
    echo "unknown stage $1: tests, bench, profile, recipe, recipe-compiled, step, launch-check, kernels or training" >&2
    exit 2
    ;;
esac
