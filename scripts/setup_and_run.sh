#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: installs the Debian packages, builds mtxcomm, sets
# up the Python environment (.venv: TensorFlow CPU, Keras 3, the mtxcomm package with mtxrun),
# and runs the main job: an unmodified Keras script trained data-parallel on 2 ranks,
#   mtxrun -np 2 --transparent python examples/keras_digits.py
# (scikit-learn's handwritten digits; prints the test accuracy and the time per epoch).
# Extra arguments go to the script (e.g. --epochs 10).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/build.sh
scripts/setup_python.sh
.venv/bin/mtxrun -np 2 --transparent .venv/bin/python examples/keras_digits.py "$@"
