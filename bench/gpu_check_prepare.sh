#!/usr/bin/env bash
# Run on a machine with the Debian packages (this repository's CI machine) before carrying the
# working tree to a GPU machine that has CUDA, cmake and ninja but no internet and no
# GoogleTest, CLI11 or nlohmann-json: copies GoogleTest's sources and the CLI11 and nlohmann-json
# headers, as Debian installs them, into build-gpu-deps/ (git-ignored, a few MiB), where
# bench/gpu_check.sh finds them.
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
du -sh "$deps"
echo "gpu_check_prepare: carry $deps/ with the working tree, then run bench/gpu_check.sh there"
