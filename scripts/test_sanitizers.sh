#!/usr/bin/env bash
# The sanitizer and fuzzing habits (run by scripts/test.sh, hence by CI):
#   build-asan  clang, AddressSanitizer + UndefinedBehaviorSanitizer (no recovery) and the
#               libFuzzer targets of tests/fuzz: runs the fast unit tests, the trust cases and
#               every fuzz target for MTXCOMM_FUZZ_SECONDS (default 60) from its checked-in
#               corpus, two at a time.
#   build-tsan  clang, ThreadSanitizer: the threaded programs (the engine, the trust cases:
#               abort and destroy from another thread, the stores' server threads, the C API).
# Without MPI, UCX, CUDA or TensorFlow (the sanitizers see mtxcomm's own code). Arguments: none.
# MTXCOMM_SANITIZERS=skip skips it all (says so).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${MTXCOMM_SANITIZERS:-}" = "skip" ]; then
  echo "test_sanitizers.sh: skipped (MTXCOMM_SANITIZERS=skip)"
  exit 0
fi
jobs="$(nproc)"
seconds="${MTXCOMM_FUZZ_SECONDS:-60}"
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # Paths under the checkout are hashed relative to it (any clone's directory hits the cache).
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
common=("${launcher[@]}" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  -DMTXCOMM_WITH_MPI=OFF -DMTXCOMM_WITH_UCX=OFF -DMTXCOMM_WITH_CUDA=OFF -DMTXCOMM_WITH_NCCL=OFF
  -DMTXCOMM_WITH_TENSORFLOW=OFF -DMTXCOMM_BUILD_BENCH=OFF -DMTXCOMM_BUILD_TOOLS=OFF)
threaded=(test_engine test_engine_alone test_engine_pair test_notify test_trust test_store test_api_comm test_p2p
          test_flight_recorder)

# -fno-sanitize=enum: the C API's enums are C enums; a caller may pass any int (the tests do),
# which the argument checks reject by range before use.
asan="-O1 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-sanitize=enum"
cmake -S . -B build-asan "${common[@]}" -DMTXCOMM_FUZZ=ON -DMTXCOMM_FUZZ_SECONDS="$seconds" \
  -DCMAKE_C_FLAGS="$asan -fsanitize=fuzzer-no-link" -DCMAKE_CXX_FLAGS="$asan -fsanitize=fuzzer-no-link" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined -fsanitize-link-c++-runtime -lstdc++" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
# Only what runs here: the programs of the fast tests (a new FAST program in tests/CMakeLists.txt
# belongs in this list), the trust cases and the fuzz targets.
fast=(test_adasum test_config test_engine test_engine_alone test_notify test_patterns test_reduce test_schedule
  test_selection test_signals test_store test_topology test_transport_contract test_p2p)
fuzz=(fuzz_store_request fuzz_auth_handshake fuzz_engine_request fuzz_tuning_json fuzz_config_env
  fuzz_tcp_frames)
cmake --build build-asan -j "$jobs" --target "${fast[@]}" test_trust "${fuzz[@]}"
# The error signals stay at their defaults (tests/test_signals.cc checks that mtxcomm leaves
# them alone). fast_unwind_on_malloc=0: full stacks for LeakSanitizer, through hwloc's plugins
# (the suppression names libhwloc, which a fast unwind does not reach).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
(cd build-asan && ctest --output-on-failure -j "$jobs" --timeout 900 -L fast -LE lint \
  --no-tests=error)
build-asan/tests/test_trust --gtest_brief=1
# All targets at once (each runs its full time; they share the cores). The parsers touch no
# hwloc: fast stacks, more executions.
(cd build-asan && ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=1" \
  ctest --output-on-failure -j 6 -L fuzz)
awk '/ Test: fuzz_/ {t = $NF} /stat::number_of_executed_units/ {e = $NF}
     /stat::new_units_added/ {printf "  %-22s %10d executions, %5d new inputs\n", t, e, $NF}' \
  build-asan/Testing/Temporary/LastTest.log

tsan="-O1 -g1 -fno-omit-frame-pointer -fsanitize=thread"
cmake -S . -B build-tsan "${common[@]}" -DCMAKE_C_FLAGS="$tsan" -DCMAKE_CXX_FLAGS="$tsan" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  >/dev/null
cmake --build build-tsan -j "$jobs" --target "${threaded[@]}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
for t in "${threaded[@]}"; do
  echo "== ThreadSanitizer: $t"
  "build-tsan/tests/$t" --gtest_brief=1
done
echo "test_sanitizers.sh: ASan+UBSan (fast tests, trust cases, fuzz targets) and TSan (${threaded[*]}) clean"
