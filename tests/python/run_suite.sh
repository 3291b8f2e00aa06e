#!/usr/bin/env bash
# Runs the Python tests of the TensorFlow binding (tests/python/README.md):
#   1. test_ops*.py + test_horovod_api.py + test_keras*.py under mpirun at np=1 and np=2,
#      test_ops*.py + test_horovod_api.py at np=3
#      (one pytest session per rank count: importing TensorFlow takes seconds per process);
#   2. test_transparent*.py and test_engine_jobs.py, each in one plain process (they launch
#      their own mtxrun jobs);
#   3. test_arrays*.py (the array API: NumPy, PyTorch and JAX arrays when importable) under
#      mpirun at np=1, 2 and 3, one short session each;
#   4. test_torch.py, test_torch_hvd.py, test_torch_process_sets.py, test_torch_groups.py,
#      test_torch_p2p.py, test_torch_c10d.py, test_torch_c10d_group.py (the "mtxcomm"
#      torch.distributed backend, C++ and its Python fallback, and mtxcomm.torch) under mtxrun
#      (which sets torch's env:// variables) at np=1, 2 and 3, test_torch_groups.py and
#      test_torch_c10d_group.py at np=4, and test_torch_jobs.py (DDP, torchrun, killed ranks,
#      a 2-D DeviceMesh at np=4) in one plain process; skipped, saying so, without PyTorch;
#   5. test_bench_report.py: mtxcomm_bench report on a tiny sweep, its page in headless
#      Chromium.
# Every session runs under `timeout`, so a hang fails the suite. Exit status: 0 when every
# session passed. Usage: tests/python/run_suite.sh [PYTHON]   (default: .venv/bin/python)
# Environment: MTXCOMM_PYTEST_ARGS adds pytest arguments (e.g. "-x" or "-k allreduce").
set -u
cd "$(dirname "$0")/../.."
PY=${1:-${PYTHON:-.venv/bin/python}}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export TF_CPP_MIN_LOG_LEVEL=2
# A collective waiting for a peer that never comes fails after this many seconds.
export MTXCOMM_TIMEOUT=${MTXCOMM_TIMEOUT:-120}
PYTEST=(-m pytest -q -p no:cacheprovider --color=no -rfEs --durations=5 ${MTXCOMM_PYTEST_ARGS:-})

if ! "$PY" -c "import mtxcomm.tensorflow" >/dev/null 2>&1; then
  echo "run_suite: '$PY -c \"import mtxcomm.tensorflow\"' fails; the tests will report it" >&2
fi

failed=()
run() {  # run NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc$([ "$rc" -eq 124 ] && echo ', timed out'))")
}

# Each subject's files, in one session and in this order.
OPS=(tests/python/test_ops.py tests/python/test_ops_collectives.py
  tests/python/test_ops_gradients.py
  tests/python/test_horovod_api.py)
KERAS=(tests/python/test_keras.py tests/python/test_keras_callbacks.py)
ARRAYS=(tests/python/test_arrays.py tests/python/test_arrays_errors.py
  tests/python/test_arrays_frameworks.py)
MPIRUN=(mpirun)
run "np=1 ops+keras" 300 "${MPIRUN[@]}" -np 1 "$PY" "${PYTEST[@]}" "${OPS[@]}" "${KERAS[@]}"
run "np=2 ops+keras" 480 "${MPIRUN[@]}" -np 2 "$PY" "${PYTEST[@]}" "${OPS[@]}" "${KERAS[@]}"
run "np=3 ops" 480 "${MPIRUN[@]}" -np 3 --oversubscribe "$PY" "${PYTEST[@]}" "${OPS[@]}"
run "transparent" 900 "$PY" "${PYTEST[@]}" tests/python/test_transparent.py \
  tests/python/test_transparent_forms.py
run "engine jobs" 900 "$PY" "${PYTEST[@]}" tests/python/test_engine_jobs.py
run "np=1 arrays" 300 "${MPIRUN[@]}" -np 1 "$PY" "${PYTEST[@]}" "${ARRAYS[@]}"
run "np=2 arrays" 300 "${MPIRUN[@]}" -np 2 "$PY" "${PYTEST[@]}" "${ARRAYS[@]}"
run "np=3 arrays" 300 "${MPIRUN[@]}" -np 3 --oversubscribe "$PY" "${PYTEST[@]}" "${ARRAYS[@]}"
run "bench report" 600 "$PY" "${PYTEST[@]}" tests/python/test_bench_report.py

if "$PY" -c "import torch" >/dev/null 2>&1; then
  MTXRUN=("$(dirname "$PY")/mtxrun")
  run "np=1 torch" 300 "${MTXRUN[@]}" -np 1 "$PY" "${PYTEST[@]}" \
    tests/python/test_torch.py tests/python/test_torch_hvd.py tests/python/test_torch_process_sets.py \
    tests/python/test_torch_groups.py tests/python/test_torch_p2p.py tests/python/test_torch_c10d.py \
    tests/python/test_torch_c10d_group.py
  run "np=2 torch" 300 "${MTXRUN[@]}" -np 2 "$PY" "${PYTEST[@]}" \
    tests/python/test_torch.py tests/python/test_torch_hvd.py tests/python/test_torch_process_sets.py \
    tests/python/test_torch_groups.py tests/python/test_torch_p2p.py tests/python/test_torch_c10d.py \
    tests/python/test_torch_c10d_group.py
  run "np=3 torch" 300 "${MTXRUN[@]}" -np 3 "$PY" "${PYTEST[@]}" \
    tests/python/test_torch.py tests/python/test_torch_hvd.py tests/python/test_torch_process_sets.py \
    tests/python/test_torch_groups.py tests/python/test_torch_p2p.py tests/python/test_torch_c10d.py \
    tests/python/test_torch_c10d_group.py
  run "np=4 torch groups" 300 "${MTXRUN[@]}" -np 4 "$PY" "${PYTEST[@]}" tests/python/test_torch_groups.py \
    tests/python/test_torch_c10d_group.py
  run "torch jobs" 600 "$PY" "${PYTEST[@]}" tests/python/test_torch_jobs.py
else
  echo "=== torch sessions SKIPPED: '$PY -c \"import torch\"' fails (scripts/setup_python.sh" \
       "--no-torch leaves PyTorch out)"
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'run_suite: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "run_suite: all sessions passed"
