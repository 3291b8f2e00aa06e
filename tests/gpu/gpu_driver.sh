#!/usr/bin/env bash
# Starts NP ranks of gpu_job through a file store with MTXCOMM_CUDA_PATH=PATH and small
# scratch/staging buffers (calls run in several chunks). Exit 0 when every rank passes, 77
# (skipped) when the ranks found no CUDA device, 1 otherwise.
# Usage: gpu_driver.sh GPU_JOB NP PATH
set -u
bin=$1 np=$2 path=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((r = 0; r < np; r++)); do
  MTXCOMM_RANK=$r MTXCOMM_SIZE=$np MTXCOMM_STORE="file:$dir/store" MTXCOMM_TIMEOUT=60 \
    MTXCOMM_CUDA_PATH=$path MTXCOMM_CUDA_IPC_BYTES=1M MTXCOMM_CUDA_STAGING_BYTES=256K \
    timeout 150 "$bin" &
  pids+=($!)
done
fail=0 skip=0
for p in "${pids[@]}"; do
  wait "$p"
  rc=$?
  if ((rc == 77)); then skip=1; elif ((rc != 0)); then fail=1; fi
done
if ((fail)); then echo "FAIL: a rank failed"; exit 1; fi
if ((skip)); then echo "SKIPPED: no CUDA device visible"; exit 77; fi
echo "PASS: $np ranks, path $path"
