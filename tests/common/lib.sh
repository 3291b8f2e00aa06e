# Shell helpers shared by the multi-process test drivers (tests/mp/mp_driver.sh,
# tests/shm/shm_driver.sh). Sourced; defines functions only, until driver_init is called.
#
# Variables the drivers may set: RANK_TRANSPORT (MTXCOMM_TRANSPORT of started ranks; tcp),
# RANK_SHM (when set: their MTXCOMM_SHM, else whatever the driver exported),
# rank_timeout_default (MTXCOMM_TIMEOUT of started ranks when
# RANK_TIMEOUT is unset; 30), wait_quiet=1 (wait_ranks drops the shell's notices about ranks
# that ended on a signal).

# driver_init PREFIX: lets mpirun run as root, clears every MTXCOMM_* variable of the caller's
# environment (nothing from it may steer the bootstrap), exports a fresh MTXCOMM_JOB_SECRET for
# the ranks it starts, makes $workdir (under $TMPDIR, named PREFIX.XXXXXX) and removes it, with
# any started rank, on exit.
driver_init() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for v in $(env | sed -n 's/^\(MTXCOMM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
  MTXCOMM_JOB_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export MTXCOMM_JOB_SECRET
  workdir=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  pids=()
  trap cleanup EXIT
}

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$workdir"
}

die() {
  echo "FAIL: $*"
  exit 1
}

# start_ranks N STORE EXE [ARGS...]: N background processes over the store bootstrap (TCP
# transport), rank r's output in $workdir/out<r>.log.
start_ranks() {
  local n=$1 store=$2
  shift 2
  pids=()
  for ((r = 0; r < n; ++r)); do
    MTXCOMM_TRANSPORT=${RANK_TRANSPORT:-tcp} MTXCOMM_RANK=$r MTXCOMM_SIZE=$n MTXCOMM_STORE=$store \
      MTXCOMM_TIMEOUT=${RANK_TIMEOUT:-${rank_timeout_default:-30}} \
      env ${RANK_SHM:+"MTXCOMM_SHM=$RANK_SHM"} "$@" >"$workdir/out$r.log" 2>&1 &
    pids+=($!)
  done
}

# wait_ranks SECONDS: waits for every started rank; kills them all past the deadline. Sets the
# array codes[] (124 for a rank that had to be killed).
wait_ranks() {
  local deadline=$((SECONDS + $1))
  codes=()
  for i in "${!pids[@]}"; do
    local p=${pids[$i]}
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then
      kill -9 "$p" 2>/dev/null
      wait "$p" 2>/dev/null
      codes[i]=124
    elif [[ ${wait_quiet:-0} == 1 ]]; then
      wait "$p" 2>/dev/null
      codes[i]=$?
    else
      wait "$p"
      codes[i]=$?
    fi
  done
  pids=()
}

# show_ranks N: each rank's exit code and output.
show_ranks() {
  local n=$1
  for ((r = 0; r < n; ++r)); do
    echo "--- rank $r exited with ${codes[$r]:-?}:"
    cat "$workdir/out$r.log"
  done
}

# check_kill_outcome FILE R VICTIM MAX_ELAPSED CODE_RE CODE_TEXT: checks survivor R's outcome
# file (code, elapsed, message lines; see tests/common/kill_outcome.h): the code matches
# CODE_RE (CODE_TEXT says which in the failure), the message names the lost rank VICTIM and the
# error came less than MAX_ELAPSED seconds after the kill. Prints a FAIL line for each miss and
# returns 1 if any.
check_kill_outcome() {
  local f=$1 r=$2 victim=$3 max=$4 code_re=$5 code_text=$6 bad=0
  local code elapsed message
  code=$(sed -n 's/^code //p' "$f")
  elapsed=$(sed -n 's/^elapsed //p' "$f")
  message=$(sed -n 's/^message //p' "$f")
  if ! [[ $code =~ $code_re ]]; then
    echo "FAIL: rank $r: code $code, expected $code_text"
    bad=1
  fi
  if ! grep -Eq "rank $victim([^0-9]|\$)" <<<"$message"; then
    echo "FAIL: rank $r: the message does not name the lost rank $victim"
    bad=1
  fi
  if ! awk -v e="$elapsed" -v m="$max" 'BEGIN { exit !(e >= 0 && e < m) }'; then
    echo "FAIL: rank $r: error $elapsed s after the kill (limit $max s)"
    bad=1
  fi
  return $bad
}
