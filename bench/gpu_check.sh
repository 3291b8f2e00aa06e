#!/usr/bin/env bash
# The device check, on a machine with an NVIDIA GPU and CUDA (no MPI needed): builds the CUDA
# parts (library, GPU tests, mtxcomm_gpu_bench) into build-gpu/, runs the GPU tests, then the
# GPU benchmark: the copy and reduction-kernel baselines and allreduce on device buffers with
# 2 ranks sharing the GPU through CUDA IPC (and through host staging, for comparison), every
# result checked (-c). Time-boxed to GPU_CHECK_SECONDS (default 290); every result (build log
# tail, test results, bench tables, the targets met or not) goes to one file:
# $OUT/gpu_check_results.txt when OUT is set, else build-gpu/gpu_check_results.txt.
# GoogleTest, CLI11 and nlohmann-json come from build-gpu-deps/ when present
# (bench/gpu_check_prepare.sh).
# Extra cmake arguments: GPU_CHECK_CMAKE_ARGS. Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
budget=${GPU_CHECK_SECONDS:-290}
build=build-gpu
mkdir -p "$build"
results=${OUT:+$OUT/gpu_check_results.txt}
results=${results:-$build/gpu_check_results.txt}
: > "$results"
status=0

say() { echo "$*" | tee -a "$results"; }
left() { echo $((budget - ($(date +%s) - start))); }
# step NAME CMD...: runs CMD within the time left, output to the results file (tail on failure).
step() {
  local name=$1
  shift
  local t=$(left)
  if ((t < 5)); then
    say "== $name: NOT RUN (time box of ${budget}s spent)"
    status=1
    return 1
  fi
  say "== $name"
  local log=$build/step_${name// /_}.log
  timeout "$t" "$@" > "$log" 2>&1
  local rc=$?
  if ((rc == 0)); then
    cat "$log" >> "$results"
    say "-- $name: ok ($(($(date +%s) - start))s elapsed)"
  else
    tail -n 60 "$log" >> "$results"
    say "-- $name: FAILED (exit $rc$( ((rc == 124)) && echo ', time box reached'))"
    status=1
  fi
  return $rc
}

say "# mtxcomm gpu_check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>&1 | sed 's/^/# gpu: /' | tee -a "$results"
export PATH=$PATH:/usr/local/cuda/bin

cmake_args=(-DCMAKE_BUILD_TYPE=Release -DMTXCOMM_WITH_MPI=OFF -DMTXCOMM_WITH_CUDA=ON
  -DMTXCOMM_BUILD_TESTS=OFF -DMTXCOMM_BUILD_BENCH=OFF -DMTXCOMM_BUILD_GPU_TESTS=ON
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}")
command -v ninja > /dev/null && cmake_args+=(-G Ninja)
[ -d build-gpu-deps/googletest ] && cmake_args+=(-DMTXCOMM_GTEST_SOURCE_DIR="$root/build-gpu-deps/googletest")
[ -d build-gpu-deps/include/CLI ] && cmake_args+=(-DCLI11_INCLUDE_DIR="$root/build-gpu-deps/include")
[ -d build-gpu-deps/include/nlohmann ] &&
  cmake_args+=(-DNLOHMANN_JSON_INCLUDE_DIR="$root/build-gpu-deps/include")
# shellcheck disable=SC2206
cmake_args+=(${GPU_CHECK_CMAKE_ARGS:-})

step configure cmake -S . -B "$build" "${cmake_args[@]}" || { say "RESULT: FAIL"; exit 1; }
step build cmake --build "$build" -j "$(nproc)" --target test_device_path test_gpu gpu_job \
  mtxcomm_gpu_bench || { say "RESULT: FAIL"; exit 1; }
step tests ctest --test-dir "$build" --output-on-failure -j 1

# bench NP PATH ARGS...: mtxcomm_gpu_bench on NP processes meeting through a file store.
bench=(bash tests/gpu/run_ranks.sh)
gpubench=$build/mtxcomm_gpu_bench
step bench_allreduce_cuda_ipc_np2 "${bench[@]}" 2 cuda_ipc "$gpubench" allreduce -c -m 4K:256M
step bench_allreduce_cuda_ipc_bf16_np2 "${bench[@]}" 2 cuda_ipc "$gpubench" allreduce -T bfloat16 -c \
  -m 4K:64M -i 10
step bench_allreduce_host_staging_np2 "${bench[@]}" 2 host_staging "$gpubench" allreduce -c -m 4K:64M -i 5 \
  --baseline-bytes 64M
for coll in broadcast allgather reduce_scatter; do
  step "bench_${coll}_cuda_ipc_np2" "${bench[@]}" 2 cuda_ipc "$gpubench" "$coll" -c -m 4K:64M -i 10 \
    --baseline-bytes 64M
done

# The same allreduce under the CUDA MPS daemon, where the machine has it: without MPS the two
# processes' contexts take turns on the GPU, and every cross-process event wait of the
# cuda_ipc path (gpu/cuda_ipc.cc, endPhase) waits for such a turn; under MPS both ranks' work
# runs in one shared context. Stopped again afterwards.
if command -v nvidia-cuda-mps-control > /dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=$root/$build/mps-pipe CUDA_MPS_LOG_DIRECTORY=$root/$build/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    step bench_allreduce_cuda_ipc_np2_mps "${bench[@]}" 2 cuda_ipc "$gpubench" allreduce -c \
      -m 4K:256M
    echo quit | nvidia-cuda-mps-control
  else
    say "== MPS: nvidia-cuda-mps-control -d failed; no MPS run"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  say "== MPS: nvidia-cuda-mps-control not found; no MPS run"
fi

# The targets (issue 6): kernel >= 0.80 of peak DRAM bandwidth at 256 MiB; allreduce 256 MiB
# through CUDA IPC on 2 ranks sharing the GPU: busbw >= 0.40 of the copy's; no wrong element.
# With the MPS run, its allreduce is the one held to the target (two processes on one GPU
# without MPS measure the GPU's turns between their contexts more than the path); both are
# printed.
ipc_log=$build/step_bench_allreduce_cuda_ipc_np2.log
mps_log=$build/step_bench_allreduce_cuda_ipc_np2_mps.log
if [ -f "$ipc_log" ]; then
  kernel=$(sed -n 's/.*= \([0-9.]*\) of peak.*/\1/p' "$ipc_log")
  ratio=$(awk '$1 == 268435456 {print $6}' "$ipc_log")
  say "allreduce 256 MiB busbw / copy bandwidth, 2 processes sharing the GPU without MPS: ${ratio:-?}"
  if [ -f "$mps_log" ]; then
    ratio=$(awk '$1 == 268435456 {print $6}' "$mps_log")
    say "allreduce 256 MiB busbw / copy bandwidth, under MPS: ${ratio:-?}"
  fi
  say "target kernel >= 0.80 of peak DRAM bandwidth: ${kernel:-?}"
  bf16_log=$build/step_bench_allreduce_cuda_ipc_bf16_np2.log
  [ -f "$bf16_log" ] && say "target bfloat16 kernel >= 0.80 of peak DRAM bandwidth: $(sed -n 's/.*= \([0-9.]*\) of peak.*/\1/p' "$bf16_log")"
  say "target allreduce 256 MiB busbw >= 0.40 of the copy bandwidth$([ -f "$mps_log" ] && echo ' (MPS)'): ${ratio:-?}"
  awk -v k="${kernel:-0}" -v r="${ratio:-0}" 'BEGIN { exit !(k >= 0.8 && r >= 0.4) }' ||
    { say "targets: NOT MET"; status=1; }
fi
if grep -h -E '^ +[0-9]+ ' "$build"/step_bench_*.log 2> /dev/null | awk '$7 != "0" {bad=1} END {exit !bad}'; then
  say "wrong results: SOME (see the #wrong columns)"
  status=1
fi
say "RESULT: $( ((status == 0)) && echo PASS || echo FAIL) in $(($(date +%s) - start))s; results in $results"
exit $status
