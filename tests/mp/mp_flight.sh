#!/usr/bin/env bash
# The flight recorder at np=3 under mpirun (tests/mp/mp_flight.c): a rank that stops before a
# call, and ranks that disagree on a count. Each job must write every rank's record to
# MTXCOMM_FLIGHT_RECORDER_DIR (the stopped rank's on the SIGUSR1 a failing peer sends it), and
# `mtxcomm_info --why-stuck` must name the rank the others wait for, the last call every rank
# completed, and the call where the counts differ. Prints FAIL on a mismatch.
# usage: mp_flight.sh MPIEXEC MP_FLIGHT MTXCOMM_INFO
set -u
mpiexec=$1 prog=$2 info=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
expect() {  # expect FILE TEXT
  if grep -qF -- "$2" "$1"; then echo "ok: $2"; else echo "FAIL: no '$2' in $1"; fail=1; fi
}
for mode in stop count; do
  dir=$work/$mode
  echo "=== $mode"
  start=$SECONDS
  timeout 120 "$mpiexec" -np 3 --oversubscribe -x MTXCOMM_FLIGHT_RECORDER_DIR="$dir" \
    -x MTXCOMM_TIMEOUT=3 "$prog" "$mode" "$dir" >"$work/$mode.out" 2>&1
  echo "job: exit $? after $((SECONDS - start)) s"
  cat "$work/$mode.out"
  ls -l "$dir" || true
  for r in 0 1 2; do
    [[ -f $dir/world.rank$r.json ]] || { echo "FAIL: no record of rank $r"; fail=1; }
  done
  if [[ -n $(find "$dir" -name '*.json' -perm /077 2>/dev/null) ]]; then
    echo "FAIL: a record others can read"
    fail=1
  fi
  "$info" --why-stuck "$dir" >"$work/$mode.why" 2>&1
  echo "--- mtxcomm_info --why-stuck $dir:"
  cat "$work/$mode.why"
  expect "$work/$mode.why" "Communicator world (3 ranks): records from ranks 0-2."
  if [[ $mode == stop ]]; then
    expect "$work/$mode.out" "rank 2: record written"
    # The first of ranks 0,1 to time out (5) aborts; the other may hear that first (4).
    if grep -qE "rank 0: sixth call (4|5)" "$work/$mode.out"; then
      echo "ok: rank 0: sixth call 4 or 5"
    else
      echo "FAIL: rank 0's sixth call did not end with 4 or 5"
      fail=1
    fi
    expect "$work/$mode.why" "The last call every rank completed is allreduce(count 256, float32, sum) as call #"
    expect "$work/$mode.why" "'step 5'"
    expect "$work/$mode.why" "Rank 2 is behind"
    expect "$work/$mode.why" "which ranks 0,1 entered"
    expect "$work/$mode.why" "Ranks 0,1 waited on rank 2 in call #"
    expect "$work/$mode.why" "and rank 2 is in no call (its newest is #"
  else
    expect "$work/$mode.out" "rank 2: sixth call 2"
    expect "$work/$mode.why" "The first call where the ranks differ is #"
    expect "$work/$mode.why" "allreduce(count 255, float32, sum) 'step 6' on rank 2"
    expect "$work/$mode.why" "allreduce(count 256, float32, sum) 'step 6' on ranks 0,1"
  fi
done
[[ $fail == 0 ]] && echo "mp_flight: all checks passed"
exit $fail
