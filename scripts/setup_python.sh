#!/usr/bin/env bash
# Creates the Python virtual environment .venv (idempotent) with TensorFlow (the CPU wheel),
# scikit-learn and pytest from PyPI, then installs this repository's Python package into it
# (`pip install .`: scikit-build-core builds libmtxcomm and the TensorFlow binding with CMake,
# incrementally in build-python/). PYTHON selects the interpreter (default: python3, >= 3.9).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import tensorflow, sklearn, pytest" >/dev/null 2>&1; then
  # TensorFlow first: the binding is compiled against the TensorFlow in this environment.
  .venv/bin/python -m pip install -q "tensorflow-cpu>=2.16" scikit-learn pytest
fi
.venv/bin/python -m pip install -q .
echo "setup_python: $(.venv/bin/python -c 'import tensorflow as tf, keras, mtxcomm.tensorflow; print("TensorFlow", tf.__version__, "Keras", keras.__version__, "mtxcomm.tensorflow OK")' 2>/dev/null | tail -1)"
