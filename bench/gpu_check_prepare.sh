#!/usr/bin/env bash
# Run on a machine with the Debian packages (this repository's CI machine) before carrying the
# working tree to a GPU machine that has CUDA, cmake and ninja but no internet and no
# GoogleTest, CLI11, nlohmann-json or pybind11: copies GoogleTest's sources and the CLI11 and
# nlohmann-json headers, as Debian installs them, and .venv's pybind11 package into
# build-gpu-deps/ (git-ignored, a few MiB), where bench/gpu_check.sh finds them.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=build-gpu-deps
rm -rf "$deps"
mkdir -p "$deps/include"
if [ ! -d /usr/src/googletest ] || [ ! -f /usr/include/CLI/CLI.hpp ] ||
  [ ! -f /usr/include/nlohmann/json.hpp ]; then
  echo "gpu_check_prepare: needs libgtest-dev, libcli11-dev and nlohmann-json3-dev" \
    "(scripts/install_deps.sh)" >&2
  exit 1
fi
cp -r /usr/src/googletest "$deps/googletest"
cp -r /usr/include/CLI "$deps/include/CLI"
cp -r /usr/include/nlohmann "$deps/include/nlohmann"
# pybind11's Python package (headers and CMake files) for the module _core, from .venv.
py=.venv/bin/python
if [ -x "$py" ] && pb=$("$py" -c 'import os, pybind11; print(os.path.dirname(pybind11.__file__))'); then
  mkdir -p "$deps/python" && cp -r "$pb" "$deps/python/pybind11"
else
  echo "gpu_check_prepare: no pybind11 in .venv (scripts/setup_python.sh): the torch steps will not run" >&2
fi
du -sh "$deps"
echo "gpu_check_prepare: carry $deps/ with the working tree, then run bench/gpu_check.sh there"
