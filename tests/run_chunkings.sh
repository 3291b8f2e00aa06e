#!/usr/bin/env bash
# Runs the trust and shared-memory suites once more under each shm chunking a machine can pick
# from its L2 (lib/comm/config.h; tests/harness.h, shmChunkings): 256 KiB slots, 512 KiB slots,
# 1 MiB slots in whole chunks, and 1 MiB slots whose reductions go in 512 KiB chunks, forced
# through MTXCOMM_SHM_SLOT_BYTES and MTXCOMM_SHM_CHUNK_BYTES (the threaded tests take them where
# a test leaves the chunking to the machine; the mpirun ones read them at init). So a test
# written on one CPU model runs the other models' paths too. Run by scripts/test.sh after ctest;
# arguments go to ctest. Needs build/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/../build"
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
suites='^(Trust\.|ShmGroupContract\.|Sizes/CollectiveMatrix\.Shm|shm_)'
for mode in 256K:256K 512K:512K 1M:1M 1M:512K; do
  slot=${mode%%:*} chunk=${mode##*:}
  echo "=== chunking: MTXCOMM_SHM_SLOT_BYTES=$slot MTXCOMM_SHM_CHUNK_BYTES=$chunk"
  MTXCOMM_SHM_SLOT_BYTES=$slot MTXCOMM_SHM_CHUNK_BYTES=$chunk \
    ctest --output-on-failure -j 2 --timeout 300 -R "$suites" "$@"
done
