#!/usr/bin/env bash
# Creates the Python virtual environment .venv (idempotent) with TensorFlow (the CPU wheel),
# scikit-learn, pytest and matplotlib from PyPI, and PyTorch (for the array API's torch tests), then
# installs this repository's Python package into it (`pip install --no-build-isolation .`:
# scikit-build-core builds libmtxcomm, the array API's module, the TensorFlow binding and the C++
# torch.distributed backend with CMake, incrementally in build-python/). PYTHON selects the
# interpreter (default: python3, >= 3.9).
# Usage: scripts/setup_python.sh [--no-torch]   (--no-torch: no PyTorch; its tests then skip)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
with_torch=1
for arg in "$@"; do
  case "$arg" in
    --no-torch) with_torch=0 ;;
    *) echo "setup_python: unknown argument '$arg' (usage: $0 [--no-torch])" >&2; exit 2 ;;
  esac
done
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import tensorflow, sklearn, pytest, matplotlib" >/dev/null 2>&1; then
  # TensorFlow first: the binding is compiled against the TensorFlow in this environment.
  # matplotlib: mtxcomm_bench report's plots (python -m mtxcomm.bench_report).
  .venv/bin/python -m pip install -q "tensorflow-cpu>=2.16" scikit-learn pytest matplotlib
fi
if [ "$with_torch" = 1 ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  # The CPU wheel from PyTorch's own index (about 200 MB); where that index cannot be reached,
  # PyPI's wheel, which is built with CUDA (several GB with its CUDA libraries) and runs on the
  # CPU as well.
  if ! .venv/bin/python -m pip install -q --retries 0 --timeout 30 torch \
      --index-url https://download.pytorch.org/whl/cpu >/dev/null 2>&1; then
    echo "setup_python: PyTorch's CPU index is not reachable; installing torch from PyPI" >&2
    .venv/bin/python -m pip install -q torch
  fi
fi
# ccache, where installed: CMake reads the launcher from the environment.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
fi
# The build requirements (pyproject.toml's [build-system]) go into .venv itself, and the package
# is built without pip's build isolation: an isolated build would not see the torch installed
# here, which the C++ torch.distributed backend (mtxcomm.torch._c10d, bindings/torch) is compiled
# against. Without torch (--no-torch), or a torch without its headers, that module is skipped
# and the Python backend serves. After upgrading torch, rerun this script (or
# `pip install --no-build-isolation --force-reinstall .`) to rebuild it.
.venv/bin/python -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12"
.venv/bin/python -m pip install -q --no-build-isolation .
echo "setup_python: $(.venv/bin/python -c 'import tensorflow as tf, keras, mtxcomm.tensorflow; print("TensorFlow", tf.__version__, "Keras", keras.__version__, "mtxcomm.tensorflow OK")' 2>/dev/null | tail -1)"
echo "setup_python: $(.venv/bin/python -c 'import mtxcomm; mtxcomm.allreduce; print("mtxcomm array API OK")' 2>/dev/null | tail -1)$(.venv/bin/python -c 'import torch; print(", torch", torch.__version__)' 2>/dev/null | tail -1)"
