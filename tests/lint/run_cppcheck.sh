#!/usr/bin/env bash
# cppcheck over the library, the engine, the tools and the benchmarks (warnings, portability,
# performance); fails on any finding. A false positive is suppressed inline, on the line before,
# with `// cppcheck-suppress ID` and a reason. Usage: run_cppcheck.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 build=$2
command -v cppcheck >/dev/null || { echo "run_cppcheck: cppcheck is not installed (scripts/install_deps.sh installs it)"; exit 1; }
cd "$src" || exit 2
cppcheck --std=c++17 -I . -I include -I "$build/generated" \
  --enable=warning,portability,performance --inline-suppr \
  --suppress=missingIncludeSystem --suppress=missingInclude \
  -DMTXCOMM_HAVE_MPI=1 -DMTXCOMM_HAVE_UCX=1 -DMTXCOMM_HAVE_HWLOC=1 \
  --template='{file}:{line}: {severity}: {message} [{id}]' --error-exitcode=1 -q \
  lib algos transports gpu bindings/common tools bench
rc=$?
[ "$rc" -eq 0 ] && echo "run_cppcheck: no findings"
exit "$rc"
