#!/usr/bin/env bash
# Starts NP ranks of a program on this node, meeting through a fresh file store, with
# MTXCOMM_CUDA_PATH=PATH (the rest of the environment is passed on). Exit 0 when every rank
# exits 0, 77 (skipped) when the ranks found no CUDA device, 1 otherwise. Used by the GPU
# tests (tests/gpu/CMakeLists.txt) and bench/gpu_check.sh.
# Usage: run_ranks.sh NP PATH PROGRAM [ARGS...]
set -u
np=$1 path=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((r = 0; r < np; r++)); do
  MTXCOMM_RANK=$r MTXCOMM_SIZE=$np MTXCOMM_STORE="file:$dir/store" \
    MTXCOMM_TIMEOUT=${MTXCOMM_TIMEOUT:-60} MTXCOMM_CUDA_PATH=$path "$@" &
  pids+=($!)
done
fail=0 skip=0
for p in "${pids[@]}"; do
  wait "$p"
  rc=$?
  if ((rc == 77)); then skip=1; elif ((rc != 0)); then fail=1; fi
done
if ((fail)); then echo "FAIL: a rank of $np failed (path $path)"; exit 1; fi
if ((skip)); then echo "SKIPPED: no CUDA device visible"; exit 77; fi
echo "PASS: $np ranks, path $path"
