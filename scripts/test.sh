#!/usr/bin/env bash
# Runs every test: builds (if needed) and runs ctest — unit tests, the threaded correctness
# matrix, the mpirun multi-process suite, killed-rank tests and the install/consumer test —,
# the trust and shm suites again under each forced shm chunking (tests/run_chunkings.sh), the
# sanitizer and fuzzing builds (scripts/test_sanitizers.sh: ASan+UBSan, TSan, libFuzzer), then
# sets up the Python environment (if needed) and runs the Python suites under mtxrun/mpirun
# (tests/python/run_suite.sh: TensorFlow, Keras, the array API, PyTorch). The lint tests need
# ruff (scripts/install_deps.sh puts it in .venv-lint). Arguments go to ctest.
set -euo pipefail
case "${1:-}" in
  -h | --help)
    cat <<'USAGE'
usage: scripts/test.sh [CTEST_ARGS...]
Builds mtxcomm into build/, runs ctest (with CTEST_ARGS, e.g. -R Trust), the trust and shm
suites under each shm chunking (tests/run_chunkings.sh), then the sanitizer
and fuzzing builds (scripts/test_sanitizers.sh), then sets up .venv and runs the Python suite
(tests/python/run_suite.sh). About 25-30 minutes on 2 cores. To run one part only:
  (cd build && ctest -R NAME)     scripts/test_sanitizers.sh     tests/python/run_suite.sh
USAGE
    exit 0
    ;;
esac
cd "$(dirname "$0")/.."
phase() {  # phase NAME COMMAND...: runs it, then says how long it took (a failure ends the run)
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "=== test.sh: $name took $((SECONDS - start)) s"
}
phase build scripts/build.sh
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
phase ctest bash -c 'cd build && exec ctest --output-on-failure -j 2 --timeout 900 "$@"' ctest "$@"
# The trust and shm suites once more under each shm chunking a CPU model can pick (its L2).
phase chunkings tests/run_chunkings.sh
phase sanitizers scripts/test_sanitizers.sh
phase setup_python scripts/setup_python.sh
phase python_suite tests/python/run_suite.sh
