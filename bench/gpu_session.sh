#!/usr/bin/env bash
# The GPU evidence of the open issues, as named steps, for short sessions on a 2-GPU machine.
#
#   bench/gpu_session.sh STEP[:SECONDS] ...      (SECONDS: that step's time limit, default 300)
#   EMULATE=W bench/gpu_session.sh STEP ...      (one GPU: the multi-rank tests in an emulated
#                                                  world of W ranks under one MPS daemon)
#   CLOCKS=1 bench/gpu_session.sh STEP ...       (the SM clock, power and temperature sampled
#                                                  beside each step, in its log's _clocks.csv)
#
# Each step writes its log to $OUT/logs/<step>.log (headed by the commit in $CUCO_REV and the
# exact command) and its result files to $OUT/results/; copy what matters into bench/logs and
# bench/results. A step that fails or runs out of time does not stop the next one. Give a
# pipeline step more than its CASE_TIMEOUT (+ 30 s): a case that hangs then reports the workers'
# stacks before the step is cut. trace_<workload> runs bench/pipeline_trace.py. Steps share
# one kernel cache ($CUCO_CACHE_DIR), so a later step reuses what an earlier one built.
#
# The GPU image lacks some of cuco's dependencies (pydantic, SQLAlchemy, nvidia-cutlass, optuna,
# ...): where a .whl folder was carried (see ../shared/DEVICE.md and bench/device_wheels.txt),
# they are installed from it into /tmp/site first, and src/ goes on the path.
set -u
# the commit the result files name (results.write refuses a file without one; the device's copy
# of the tree may have no .git, so pass CUCO_REV=<commit> there)
export CUCO_REV=${CUCO_REV:-$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)}
OUT=${OUT:-/tmp/cuco_out}
if [ ! -d .whl ] && [ ! -d /tmp/site ]; then
  echo "no .whl folder here: download bench/device_wheels.txt into .whl (../shared/DEVICE.md) and carry it" >&2
fi
if [ -d .whl ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
# src/ always goes on the path (the device's copy is not installed); the wheels' folder before it
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site:$PYTHONPATH"
mkdir -p "$OUT/logs" "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
R="--out-dir $OUT/results"
# pytest's own limit per test (fixtures included): a test that hangs fails with its stack and
# the step goes on to the next test, instead of the whole step being cut with no summary
PT="python3 -m pytest -v -p no:xdist --tb=short --timeout ${TEST_TIMEOUT:-240}"
if [ -n "${EMULATE:-}" ]; then
  # one MPS daemon for every step: each worker group finds it running and uses it
  export CUCO_EMULATE=$EMULATE CUDA_MPS_PIPE_DIRECTORY=/tmp/cuco-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/cuco-mps/log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
fi
# a fresh MPS daemon per step: a step cut at its limit may leave a client's kernel spinning
mps_fresh() {
  [ -z "${EMULATE:-}" ] && return 0
  [ -e $CUDA_MPS_PIPE_DIRECTORY/control ] && { echo quit | nvidia-cuda-mps-control; sleep 2; }
  nvidia-cuda-mps-control -d || { echo "MPS would not start"; exit 1; }
}
# resumable benches go on from the committed file of a run that was cut short
for f in tp_shapes gemm_mainloop gemm_tile_k; do
  [ -f "bench/results/$f.json" ] && grep -q '"partial": true' "bench/results/$f.json" && cp "bench/results/$f.json" "$OUT/results/"
done

step_command() {
  case "$1" in
    tests_pipelines) echo "python3 -m pytest -v -n 4 tests/test_moe_gpu.py tests/test_kv_gpu.py tests/test_cp_attention_gpu.py tests/test_cp_library_gpu.py tests/test_pipelines_gpu.py" ;;
    tests_tp)        echo "python3 -m pytest -v -n 4 tests/test_tp_in_kernel_gpu.py tests/test_torch_ops_gpu.py tests/test_host_baseline_gpu.py" ;;
    tests_evaluator) echo "python3 -m pytest -v -n 4 tests/test_evaluator_in_kernel_gpu.py tests/test_evaluator_gpu.py" ;;
    tests_torch_ops) echo "$PT tests/test_torch_ops_gpu.py" ;;
    tests_graph)     echo "$PT -k 'replays or refused' tests/test_torch_ops_gpu.py" ;;
    tests_moe)       echo "$PT tests/test_moe_gpu.py" ;;
    tests_kv)        echo "$PT tests/test_kv_gpu.py" ;;
    tests_cp)        echo "$PT tests/test_cp_attention_gpu.py" ;;
    # CP attention's library cores (core=flash / cudnn) in the evaluator's job (2 GPUs or EMULATE=W)
    tests_cp_library) echo "$PT tests/test_cp_library_gpu.py" ;;
    # their one-call variant (peer_calls=all_keys, non-causal) alone: run at EMULATE=2 and EMULATE=4
    tests_cp_all_keys) echo "$PT -k all_keys tests/test_cp_library_gpu.py" ;;
    # their compute against torch's attention on one GPU (issue #37); _quick: two rows, no file
    cp_attention_kernel)       echo "python3 bench/cp_attention_kernel.py $R" ;;
    cp_attention_kernel_quick) echo "python3 bench/cp_attention_kernel.py --quick" ;;
    # the non-causal cases next to the bar, every variant, into a file of their own: every
    # W = 2 one, W = 4 at 8k tokens
    cp_attention_kernel_full) echo "python3 bench/cp_attention_kernel.py --only full/W2 --only T8192H32D64full/W4 --only T8192H32D128full/W4 --only T8192H64D64full/W4 --only T8192H64D128full/W4 --name cp_attention_kernel_full $R" ;;
    tests_emulated)  echo "$PT tests/test_emulated_world_gpu.py" ;;
    tests_runtime)   echo "$PT tests/test_runtime_gpu.py" ;;
    tests_emulated_spin) echo "$PT -k spin tests/test_emulated_world_gpu.py" ;;
    tests_integrity) echo "$PT tests/test_evaluator_gpu.py tests/test_evaluator_in_kernel_gpu.py" ;;
    tests_ev_side)   echo "$PT tests/test_evaluator_gpu.py" ;;
    # the side-stream plants alone, each cut by pytest at 120 s (so one that hangs still
    # reports, and the next one runs)
    tests_ev_plants) echo "python3 -m pytest -v -rA -p no:xdist --tb=short --timeout 120 -k 'unedited or planted' tests/test_evaluator_gpu.py" ;;
    tests_tp_side)   echo "$PT tests/test_tp_gpu.py" ;;
    tests_in_kernel) echo "$PT tests/test_tp_in_kernel_gpu.py" ;;
    # the same file in three parts, each inside one step's limit at 4 emulated ranks
    tests_in_kernel_grid)     echo "$PT -k 'grid or one_build or skips' tests/test_tp_in_kernel_gpu.py" ;;
    tests_in_kernel_tools)    echo "$PT -k 'split_k_and_64_row or wave_tiles' tests/test_tp_in_kernel_gpu.py" ;;
    tests_in_kernel_clusters) echo "$PT -k clusters tests/test_tp_in_kernel_gpu.py" ;;
    tests_in_kernel_clusters_ag) echo "$PT -k 'clusters and allgather_gemm' tests/test_tp_in_kernel_gpu.py" ;;
    # what tests_in_kernel_grid left at 4 emulated ranks on 1 x H200 (b2d37ec): its last six
    tests_in_kernel_rest)     echo "$PT -k 'allgather_gemm and one_build or skips' tests/test_tp_in_kernel_gpu.py" ;;
    # the two ping-pong plants tests_in_kernel_rest did not reach in 160 s at 4 emulated ranks (bf67bbb)
    tests_skips_pingpong)     echo "$PT -k 'skips and pingpong' tests/test_tp_in_kernel_gpu.py" ;;
    # split-K over a grid: whole waves unsplit, the short last wave's tiles cut (tail shape)
    tests_split_tail)         echo "$PT -k 'split_k_and_64 and 1280x' tests/test_tp_in_kernel_gpu.py" ;;
    gemm_split_tail) echo "python3 bench/gemm_mainloop.py --shape 1536x1536x1536 --shape 2176x2048x8192 --shape 1000x5120x5120 --shape 512x4096x8192 --dtype bf16 --name gemm_mainloop_split_tail $R" ;;
    tests_cp_racy)            echo "$PT -k skips tests/test_cp_library_gpu.py tests/test_cp_grouped_gpu.py" ;;
    tests_host_baseline)      echo "$PT tests/test_host_baseline_gpu.py" ;;
    too_wide)        echo "$PT -k too_wide tests/test_tp_gpu.py" ;;
    tests_pipes)     echo "$PT tests/test_pipelines_gpu.py" ;;
    emulated_world)  echo "python3 bench/emulated_world.py $R" ;;
    # issue #35's last part: every workload, placement and backend at 8 ranks on one GPU
    mps_clients_probe) echo "python3 bench/mps_clients_probe.py --clients 16 --connections 8 --clients 16 --connections 4 --clients 16 --connections 1 --clients 32 --connections 1" ;;
    mps_barrier_probe) echo "python3 bench/mps_barrier_probe.py --world 2 --world 4 --world 8" ;;
    emulated_world_w8_ag) echo "python3 bench/emulated_world.py --worlds 8 --only allgather_gemm --name emulated_world_w8_allgather $R" ;;
    emulated_world_w8) echo "python3 bench/emulated_world.py --worlds 8 --name emulated_world_w8 $R" ;;
    tests_sealed)    echo "$PT tests/test_sealed_reference_gpu.py tests/test_jobs_gpu.py" ;;
    tests_adversary) echo "$PT tests/test_adversary_gpu.py" ;;
    # the planted lossy all-reduces alone (gpu_checks.lost_bits: two bits at W = 8)
    tests_precision_plants) echo "$PT -k 'one_bit_less or drops_precision' tests/test_adversary_gpu.py tests/test_evaluator_gpu.py" ;;
    # the shared-job plants and the sync regions' own tests (a region per variant; writes into
    # another's caught): the route each took is printed (-rA)
    tests_shared_plants) echo "python3 -m pytest -v -rA -p no:xdist --tb=short --timeout ${TEST_TIMEOUT:-240} -k 'forger or every_shared_job or forged_flags or tamper or pair' tests/test_adversary_gpu.py" ;;
    # the verifier in its own process (issue #36); verifier_smoke first: it prints each stage
    tests_verifier)  echo "$PT tests/test_verifier_process_gpu.py" ;;
    # the address-space scan alone, its control (a plain launch parameter) printed (-rP)
    tests_verifier_scan) echo "$PT -rP -k holds_no_reference tests/test_verifier_process_gpu.py" ;;
    # the MoE file's parts, each inside one step's limit at 8 emulated ranks
    tests_moe_routing) echo "$PT -k 'routing_tables and empty_experts' tests/test_moe_gpu.py" ;;
    tests_moe_programs) echo "$PT -k every_moe_program tests/test_moe_gpu.py" ;;
    verifier_smoke)  echo "python3 bench/verifier_smoke.py" ;;
    tests_w1_tp)     echo "python3 -m pytest -v -n 4 tests/test_tp_in_kernel_gpu.py tests/test_torch_ops_gpu.py" ;;
    # resumable: a call cut short leaves its finished cases in the file, partial; bring that file
    # back into bench/results (same commit) and the next call goes on from it
    gemm_mainloop)   echo "python3 bench/gemm_mainloop.py --resume $R" ;;
    # the file of record's best point per case beside its twin in 32-deep k-tiles (twice the
    # stages in the same shared memory), bf16; resumable like gemm_mainloop
    gemm_tile_k)     echo "python3 bench/gemm_mainloop.py --best-of bench/results/gemm_mainloop.json --top 1 --tile-k 32 --dtype bf16 --name gemm_tile_k --resume $R" ;;
    # the GEMM bench with GEMM_ARGS (e.g. --shape 200x4096x4096 --mainloop cooperative:208x128:sk4:ab --name X)
    gemm_args)       echo "python3 bench/gemm_mainloop.py ${GEMM_ARGS:-} $R" ;;
    # thread-block clusters of 2 and 4 the GPU runs at once, by shared memory (the cluster grids' size)
    cluster_capacity) echo "python3 bench/cluster_capacity_probe.py" ;;
    # the mainloop alone (no stores) with the tile staged over its own buffers, at its stages and one more:
    # what the shared memory of a smaller staging would buy
    gemm_stage_probe) echo "python3 bench/gemm_overhead_probe.py --part no_store --part aliased_no_store --part deeper_no_store --shape 1536x1536x1536 --shape 2048x4096x2048 --shape 3000x4096x4096 --shape 1000x5120x5120 --shape 2048x2048x4096" ;;
    # programmatic dependent launch: each call's CTAs launched over the tail of the call before
    gemm_pdl_probe)  echo "python3 bench/gemm_overhead_probe.py --part as_is --part pdl" ;;
    gemm_quick)      echo "python3 bench/gemm_mainloop.py --quick --name gemm_mainloop_quick $R" ;;
    gemm_overhead_probe) echo "python3 bench/gemm_overhead_probe.py" ;;
    # the probe with PROBE_ARGS (e.g. --part as_is --part swz_tma_store --shape 1536x1536x1536)
    gemm_probe_args) echo "python3 bench/gemm_overhead_probe.py ${PROBE_ARGS:-}" ;;
    # CUTLASS's own GEMM (bench/stock: built here first, carried) beside cuco's and the libraries
    stock_probe)     echo "python3 bench/cutlass_stock_probe.py ${STOCK_ARGS:-}" ;;
    # the epilogue's store paths alone (as built, none, unpadded staging, one TMA tensor store)
    gemm_store_probe) echo "python3 bench/gemm_overhead_probe.py --part as_is --part no_store --part unpadded --part tma_store" ;;
    # Nsight Compute's sections for the default point and the library at three GEMMs (ncu's
    # path: PATH, else the image's install), their table last; NCU_ARGS: the probe's arguments (--shape MxNxK, --part X)
    # the decode-like rows furthest behind (#37): where the time of the few-tile points goes (L2,
    # SM and memory throughput beside the library's kernel), the split-K points whose slices are
    # cut finer included; then the same summary table as gemm_ncu
    gemm_ncu_decode) NCU_LOG=gemm_ncu_decode NCU_ARGS="--shape 256x1536x8192 --shape 200x4096x4096 --mainloop pingpong:64x128:sk2 --mainloop pingpong:64x192:sk4 --mainloop pingpong:128x128:sk4 --mainloop cooperative:256x128:sk8:ab" step_command gemm_ncu ;;
    gemm_ncu)        echo "\$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -1) --profile-from-start off --clock-control none --cache-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats --metrics ${NCU_METRICS:-sm__ops_path_tensor_src_bf16_dst_fp32.sum} python3 bench/gemm_ncu_probe.py ${NCU_ARGS:-} && python3 bench/gemm_ncu_probe.py --summarize $OUT/logs/${NCU_LOG:-gemm_ncu}.log" ;;
    tests_gemm_tools) echo "$PT -k 'split_k_and_64_row or wave_tiles or clusters' tests/test_tp_in_kernel_gpu.py" ;;
    tests_gemm_swapped) echo "$PT -k 'swapped' tests/test_tp_in_kernel_gpu.py" ;;
    # the in-kernel TP tests that TEST_K selects (pytest -k)
    tests_tp_k)      echo "$PT -k \"${TEST_K:-}\" tests/test_tp_in_kernel_gpu.py" ;;
    # the GEMM-alone bench's library twins, built, checked and timed at one shape
    tests_gemm_alone) echo "$PT tests/test_gemm_alone_gpu.py" ;;
    tests_swapped_clusters) echo "$PT -k 'swapped_clusters' tests/test_tp_in_kernel_gpu.py" ;;
    # what b157e15's session (the epoch taken after the CTA barrier) did not reach at 2 emulated
    # ranks: the grid's planted skips and the all-gather family's swapped clusters
    tests_epoch_rest) echo "$PT -k 'skips or (swapped_clusters and allgather_gemm)' tests/test_tp_in_kernel_gpu.py" ;;
    tests_buffers)   echo "$PT tests/test_buffer_lifetime_gpu.py" ;;
    tests_scrub)     echo "$PT tests/test_scrub_gpu.py" ;;
    tests_side_rest) echo "$PT -k 'M3001N1544-fp16 or too_wide' tests/test_tp_gpu.py" ;;
    # the too_wide test's honest point (comm_ctas 32 of a rank's 33 SMs at W = 4) hung at
    # 1be8aa5 with every check in the verifier process: the same with the checks inline
    too_wide_inline) echo "CUCO_VERIFIER=inline $PT -k too_wide tests/test_tp_gpu.py" ;;
    # CP's grouped peer calls (peer_calls=grouped, 3+ ranks: EMULATE=4)
    tests_cp_grouped) echo "$PT tests/test_cp_grouped_gpu.py" ;;
    tests_gin)       echo "$PT tests/test_gin_emulated_gpu.py" ;;
    gin_probe)       echo "python3 bench/gin_probe.py --world ${EMULATE:-2}" ;;
    gin_correctness) echo "python3 bench/gin_correctness.py $R" ;;
    kv_interference) echo "python3 bench/kv_compute_interference.py $R" ;;
    moe_compute)     echo "python3 bench/moe_compute.py $R" ;;
    tests_isolation) echo "python3 -m pytest -v -rA -p no:xdist --tb=short -k isolation tests/test_adversary_gpu.py" ;;
    tests_dispatch)  echo "$PT tests/test_dispatch_gpu.py" ;;
    tests_custom_op) echo "$PT tests/test_custom_op_gpu.py" ;;
    tests_jobs)      echo "$PT tests/test_jobs_gpu.py tests/test_sealed_reference_gpu.py tests/test_host_baseline_gpu.py" ;;
    tests_ev_kernel) echo "$PT tests/test_evaluator_in_kernel_gpu.py" ;;
    # the same file in two halves (each CUTLASS candidate is a build of its own: the whole
    # file needs more than 340 s on one H100, emulated or not)
    tests_ev_kernel_planted) echo "$PT -k 'planted or unedited' tests/test_evaluator_in_kernel_gpu.py" ;;
    tests_ev_kernel_tells)   echo "$PT -k 'behaves_differently or staged_flag' tests/test_evaluator_in_kernel_gpu.py" ;;
    hang_in_kernel)  # the in-kernel planted hang, with the GPU's clients and the workers sampled
                     # every 15 s, the stacks at pytest's timeout and the MPS logs after
                     echo "( while sleep 15; do date +%T; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; ps -eo pid,etime,args | grep -E 'worker_entry|mps' | grep -v grep; done ) & python3 -m pytest -v -s -p no:xdist --timeout ${HANG_TIMEOUT:-240} -k 'rejected and hang' tests/test_evaluator_in_kernel_gpu.py; kill \$!; tail -n 30 \${CUDA_MPS_LOG_DIRECTORY:-/dev/null}/control.log \${CUDA_MPS_LOG_DIRECTORY:-/dev/null}/server.log" ;;
    tests_block)     echo "python3 -m pytest -v tests/test_tp_block_gpu.py" ;;
    pipelines)       echo "python3 bench/pipelines.py $R" ;;
    pipelines_moe|pipelines_kv_transfer|pipelines_cp_attention)
                     echo "python3 bench/pipelines.py --only ${1#pipelines_} --case-timeout ${CASE_TIMEOUT:-240} $R" ;;
    trace_moe|trace_kv_transfer|trace_cp_attention)
                     echo "python3 bench/pipeline_trace.py --only ${1#trace_} --variants ${TRACE_VARIANTS:-0} --limit 20" ;;
    evaluator)       echo "python3 bench/evaluator.py --candidates 24 $R" ;;
    # issue #39's file: one GPU, the side-stream batch and the evolved in-kernel batch at steady
    # state (its configurations built first, as a running search has them)
    evaluator_w1)    echo "python3 bench/evaluator.py --world-size 1 --name evaluator_w1 --candidates 40 --kinds side_stream,in_kernel_evolved --warm-configs $R" ;;
    # issue #39's batches one at a time (side-stream alone; the evolved in-kernel steady state)
    evaluator_w1_side)    echo "python3 bench/evaluator.py --world-size 1 --name evaluator_w1_side --candidates 40 --kinds side_stream $R" ;;
    evaluator_w1_evolved) echo "python3 bench/evaluator.py --world-size 1 --name evaluator_w1_evolved --candidates 40 --kinds in_kernel_evolved --warm-configs $R" ;;
    poison)          echo "python3 bench/poison.py $R" ;;
    # issue #43's dispatch (2 GPUs): a table tuned on this machine for the three patterns at
    # Llama-3-70B's layer sizes at TP=2 (gate/up AllGather+GEMM, down GEMM+ReduceScatter, the
    # attention output GEMM+AllReduce), then the dispatched ops against torch's fused op and
    # the host program at 24 Ms (tp_dispatch.json). On 2 x H200 at 8f4b630 a layer took about
    # 130 s (give tune_70b 450 s); the table is written after each bucket, so a step cut short
    # goes on where it stopped when its table is carried back in (TUNE_TABLE=path)
    tune_70b)        T=${TUNE_TABLE:-$OUT/results/tp_table_70b.json}
                     echo "python3 -m cuco.cli tune allgather_gemm --n 28672 --k 8192 --table $T && python3 -m cuco.cli tune gemm_reducescatter --n 8192 --k 28672 --table $T && python3 -m cuco.cli tune gemm_allreduce --n 8192 --k 8192 --table $T" ;;
    tp_dispatch)     echo "python3 bench/tp_dispatch.py --table ${TUNE_TABLE:-$OUT/results/tp_table_70b.json} $R" ;;
    tp_workloads)    echo "python3 bench/tp_workloads.py --quick $R" ;;
    tp_shapes)       echo "python3 bench/tp_shapes.py --resume $R" ;;
    tp_block)        echo "python3 bench/tp_block.py --budget 4 $R" ;;
    search_moe|search_kv_transfer|search_cp_attention)
                     echo "python3 bench/search.py --family ${1#search_} --budget 24 --no-grid $R" ;;
    *) return 1 ;;
  esac
}

summary=()
for spec in "$@"; do
  name=${spec%%:*}; limit=300
  [[ "$spec" == *:* ]] && limit=${spec##*:}
  cmd=$(step_command "$name") || { echo "unknown step $name"; summary+=("$name unknown"); continue; }
  log="$OUT/logs/$name${EMULATE:+_emulated_w$EMULATE}.log"
  { echo "# commit ${CUCO_REV:-unknown}; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)${EMULATE:+; emulated world of $EMULATE ranks on one GPU (CUCO_EMULATE=$EMULATE)}"
    echo "# $cmd   (limit ${limit}s)"; } > "$log"
  mps_fresh
  # CLOCKS=1: the GPU's SM clock, power and temperature sampled every 250 ms beside the step
  # (what a long call leaves behind for the next one shows there), in <log>_clocks.csv
  clocks=""
  if [ -n "${CLOCKS:-}" ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 \
      > "${log%.log}_clocks.csv" 2>&1 &
    clocks=$!
  fi
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c "$cmd" >> "$log" 2>&1
  rc=$?
  [ -n "$clocks" ] && kill "$clocks" 2>/dev/null
  dt=$(( $(date +%s) - t0 ))
  echo "# exit $rc after ${dt}s" >> "$log"
  summary+=("$(printf '%-22s rc=%-4s %4ss  %s' "$name" "$rc" "$dt" "$(grep -E 'passed|failed|error' "$log" | tail -1 | cut -c1-90)")")
done
printf '%s\n' "${summary[@]}"
[ -n "${EMULATE:-}" ] && { echo quit | nvidia-cuda-mps-control; } 2>/dev/null || true
