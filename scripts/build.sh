#!/usr/bin/env bash
# Configures and builds mtxcomm into ./build (Release, Ninja). Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache, where installed (scripts/install_deps.sh): a rebuild of unchanged sources, in a fresh
# clone too, is a cache hit.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  # Paths under the checkout are hashed relative to it (any clone's directory hits the cache).
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build build -j "$(nproc)"
