#!/usr/bin/env bash
# Multi-process test driver, run by ctest (see tests/mp/CMakeLists.txt).
#
#   mp_driver.sh mpi-kill MPIEXEC MP_KILL NP     rank NP-1 dies under mpirun
#   mp_driver.sh tcp-subset MP_TCP_SUBSET file|tcp N
#                                                N processes over the MTXCOMM_STORE bootstrap
#   mp_driver.sh tcp-kill MP_KILL MP_TCP_SUBSET N
#                                                rank N-1 dies, TCP transport
#
# The kill tests assert on the survivors' outcome files (see mp_kill.cc): both present, code
# MTXCOMM_REMOTE_ERROR (4) or MTXCOMM_TIMEOUT (5), the lost rank named, the error less than
# MAX_ELAPSED seconds after the kill, the poisoned communicator answering MTXCOMM_INVALID_USAGE
# (2), and mtxcomm_comm_abort returning.
set -u

MAX_ELAPSED=8
# shellcheck source=../common/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/lib.sh"
rank_timeout_default=30
driver_init mtxcomm_mp

# check_survivors DIR NP: ranks 0..NP-2 survived, rank NP-1 was killed.
check_survivors() {
  local dir=$1 np=$2 victim=$(($2 - 1)) bad=0
  [[ -f $dir/kill_time ]] || die "rank $victim never reached its kill (no $dir/kill_time)"
  for ((r = 0; r < victim; ++r)); do
    local f=$dir/rank$r.txt
    if [[ ! -f $f ]]; then
      echo "FAIL: rank $r wrote no outcome file"
      bad=1
      continue
    fi
    echo "--- rank $r:"
    cat "$f"
    check_kill_outcome "$f" "$r" "$victim" "$MAX_ELAPSED" '^(4|5)$' \
      '4 (MTXCOMM_REMOTE_ERROR) or 5 (MTXCOMM_TIMEOUT)' || bad=1
    local after
    after=$(sed -n 's/^after //p' "$f")
    if [[ $after != 2 ]]; then
      echo "FAIL: rank $r: the next call on the poisoned communicator returned '$after', expected 2"
      bad=1
    fi
    if ! grep -q '^abort_ok$' "$f"; then
      echo "FAIL: rank $r: mtxcomm_comm_abort did not return"
      bad=1
    fi
  done
  ((bad == 0)) || exit 1
  echo "PASS: $((np - 1)) survivors failed fast and named rank $victim"
}

free_port() {
  "$1" --free-port || die "no free port"
}

mode=${1:-}
case $mode in
  mpi-kill)
    mpiexec=$2 exe=$3 np=$4
    mkdir -p "$workdir/out"
    # Open MPI 4.1 kills the whole job when a rank dies unless told not to.
    MTXCOMM_TIMEOUT=10 timeout 90 "$mpiexec" --mca orte_abort_on_non_zero_status 0 \
      -np "$np" --oversubscribe "$exe" "$workdir/out"
    rc=$?
    echo "mpirun exited with $rc (ignored unless 124: a hang)"
    ((rc != 124)) || die "mpirun did not finish within 90 s"
    check_survivors "$workdir/out" "$np"
    ;;
  tcp-subset)
    exe=$2 kind=$3 n=$4
    case $kind in
      file) store=file:$workdir/store ;;
      tcp) store=tcp:127.0.0.1:$(free_port "$exe") ;;
      *) die "unknown store kind $kind" ;;
    esac
    echo "store $store, $n processes"
    start_ranks "$n" "$store" "$exe"
    wait_ranks 120
    show_ranks "$n"
    for c in "${codes[@]}"; do ((c == 0)) || die "a rank failed"; done
    echo "PASS"
    ;;
  tcp-kill)
    exe=$2 portexe=$3 n=$4
    mkdir -p "$workdir/out"
    store=tcp:127.0.0.1:$(free_port "$portexe")
    echo "store $store, $n processes, rank $((n - 1)) is killed"
    RANK_TIMEOUT=10 start_ranks "$n" "$store" "$exe" "$workdir/out"
    wait_ranks 60
    show_ranks "$n"
    check_survivors "$workdir/out" "$n"
    ;;
  *)
    die "usage: $0 mpi-kill|tcp-subset|tcp-kill ..."
    ;;
esac
