#!/usr/bin/env bash
# Shared-memory test driver, run by ctest (see tests/shm/CMakeLists.txt). JOB is shm_job.
#
#   shm_driver.sh leak-normal JOB NP [MPIEXEC]   collectives, normal exit (mpirun if given)
#   shm_driver.sh leak-abort JOB NP              the last rank aborts its communicator mid-job
#   shm_driver.sh leak-killall JOB NP            every rank is SIGKILLed inside collectives
#   shm_driver.sh leak-setup JOB NP PRELOAD      rank 1 is SIGKILLed while attaching the
#                                                segment (before rank 0 unlinks it)
#   shm_driver.sh perm JOB NP                    mode 0600, unguessable name, unlinked while live
#   shm_driver.sh tiny JOB                       /dev/shm of 64 KiB: init fails cleanly;
#                                                MTXCOMM_SHM=off works there
#   shm_driver.sh small JOB                      /dev/shm of 12 MiB: the auto slot shrinks to fit
#                                                the world and two splits (each its own segment)
#   shm_driver.sh kill JOB NP MPIEXEC            a rank SIGKILLs itself in a 4 MiB shm allreduce
#   shm_driver.sh idle-kill JOB NP               a rank SIGKILLs itself while the others sleep
#                                                in mtxcomm_comm_wait_notify (an idle engine)
#   shm_driver.sh perf JOB MPIEXEC               8 ranks x 200 checked 1 MiB allreduces < 60 s
#
# Leak checks: each rank reports the segment it maps (from /proc/self/maps); after the job
# none of those names may exist in /dev/shm, nor any mtxcomm-* name that was not there before.
# The leak and tiny tests run in a private mount namespace with their own tmpfs on /dev/shm
# (`unshare -m`), so jobs running concurrently on the machine cannot disturb them; where that is
# not permitted the leak tests fall back to the host's /dev/shm and the tiny test is skipped
# (exit 77).
set -u

# shellcheck source=../common/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common/lib.sh"
rank_timeout_default=20
wait_quiet=1
driver_init mtxcomm_shm

# isolate SIZE ARGS...: re-executes this script with ARGS inside a private mount namespace
# whose /dev/shm is a fresh tmpfs of SIZE. Returns (without re-executing) if that is not
# permitted, with the reason in $isolate_error.
isolate() {
  local size=$1
  shift
  [[ ${SHM_TEST_ISOLATED:-} == 1 ]] && return 0
  if ! isolate_error=$(unshare -m sh -c "mount -t tmpfs -o size=$size tmpfs /dev/shm" 2>&1); then
    isolate_error=${isolate_error:-unshare -m / mount failed}
    return 1
  fi
  rm -rf "$workdir"
  trap - EXIT
  exec unshare -m bash -c \
    'mount -t tmpfs -o size="$0" tmpfs /dev/shm && SHM_TEST_ISOLATED=1 exec bash "$@"' \
    "$size" "${BASH_SOURCE[0]}" "$@"
}

# isolate_or_skip SIZE WHAT ARGS...: isolate, or exit 77 (ctest's skip) saying why, WHAT naming
# the size; in the namespace, shows the new /dev/shm.
isolate_or_skip() {
  local size=$1 what=$2
  shift 2
  if ! isolate "$size" "$@"; then
    echo "SKIP: cannot give the job a private $what /dev/shm: $isolate_error"
    exit 77
  fi
  df -k /dev/shm | tail -1
}

shm_names() {
  local f
  for f in /dev/shm/mtxcomm-*; do [[ -e $f ]] && echo "${f#/dev/shm/}"; done | sort
}

# start_file_ranks N EXE [ARGS...]: N background processes over a fresh file store (TCP
# transport).
start_file_ranks() {
  local n=$1
  shift
  start_ranks "$n" "file:$workdir/store.$RANDOM" "$@"
}

# await_ready NP WHAT: waits (up to 60 s) until NP ranks have written $workdir/ready*; otherwise
# shows the ranks and fails ("WHAT only K of NP ranks reached their loop").
await_ready() {
  local np=$1 what=$2 ready=0
  for ((t = 0; t < 600; ++t)); do
    ready=$(ls "$workdir"/ready* 2>/dev/null | wc -l)
    ((ready == np)) && break
    sleep 0.1
  done
  ((ready == np)) || {
    wait_ranks 1
    show_ranks "$np"
    die "${what}only $ready of $np ranks reached their loop"
  }
}

# kill_ranks: SIGKILLs every started rank and reaps it (codes[] as wait_ranks sets it).
kill_ranks() {
  {
    kill -9 "${pids[@]}"
    wait_ranks 10
  } 2>/dev/null # no "Killed" notices from bash
}

# leak_begin ARGS...: a leak test's start: isolates /dev/shm (512 MiB; see isolate), says where
# it runs and records the mtxcomm-* names present now in $before.
leak_begin() {
  isolate 512m "$@"
  where
  before=$(shm_names)
}

# recorded_names DIR: the segment names the ranks reported (one per line, unique).
recorded_names() {
  cat "$1"/seg*.txt 2>/dev/null | sed -n 's|^segment /dev/shm/\(mtxcomm-[0-9a-f]*\).*|\1|p' |
    sort -u
}

# check_no_leak BEFORE DIR MIN: fails if a name the job reported, or (in an isolated /dev/shm)
# any mtxcomm-* name absent from BEFORE, is in /dev/shm now; and if fewer than MIN names were
# reported.
check_no_leak() {
  local before=$1 dir=$2 min=$3 bad=0
  local names
  names=$(recorded_names "$dir")
  local count
  count=$(grep -c . <<<"$names")
  echo "segments the job reported: ${names:-none}"
  ((count >= min)) || die "expected at least $min segment name(s) reported, got $count"
  for nm in $names; do
    if [[ -e /dev/shm/$nm ]]; then
      echo "FAIL: /dev/shm/$nm is left behind"
      bad=1
    fi
  done
  local new=""
  # Any other new name counts only in our own tmpfs: on the host's /dev/shm, other jobs (ctest
  # runs tests in parallel) may be between creating and unlinking their segments right now.
  if [[ ${SHM_TEST_ISOLATED:-} == 1 ]]; then
    new=$(comm -13 <(echo "$before") <(shm_names))
  fi
  if [[ -n $new ]]; then
    echo "FAIL: new mtxcomm-* names left in /dev/shm: $new"
    ls -l /dev/shm/mtxcomm-* 2>/dev/null
    bad=1
  fi
  if ((bad != 0)); then
    # Tidy up after the library (matters only where /dev/shm is the host's).
    for nm in $names $new; do rm -f "/dev/shm/$nm"; done
    exit 1
  fi
  echo "PASS: nothing left in /dev/shm"
}

where() {
  if [[ ${SHM_TEST_ISOLATED:-} == 1 ]]; then
    echo "running in a private mount namespace with its own /dev/shm"
  else
    echo "note: no private /dev/shm ($isolate_error); using the host's, counting only names new" \
      "since the start"
  fi
}

mode=${1:-}
case $mode in
  leak-normal)
    exe=$2 np=$3 mpiexec=${4:-}
    leak_begin "$@"
    if [[ -n $mpiexec ]]; then
      echo "mpirun -np $np: collectives, normal exit"
      timeout 120 "$mpiexec" -np "$np" --oversubscribe "$exe" collectives "$workdir" 5 2>&1
      rc=$?
      ((rc == 0)) || die "mpirun exited with $rc"
    else
      echo "$np processes over the store: collectives, normal exit"
      start_file_ranks "$np" "$exe" collectives "$workdir" 5
      wait_ranks 120
      show_ranks "$np"
      for c in "${codes[@]}"; do ((c == 0)) || die "a rank failed"; done
    fi
    check_no_leak "$before" "$workdir" 1
    ;;
  leak-abort)
    exe=$2 np=$3
    leak_begin "$@"
    echo "$np processes over the store: rank $((np - 1)) aborts its communicator mid-job"
    start_file_ranks "$np" "$exe" abort "$workdir"
    wait_ranks 90
    show_ranks "$np"
    for ((r = 0; r < np; ++r)); do
      ((codes[r] == 0)) || die "rank $r exited with ${codes[$r]}"
    done
    for ((r = 0; r < np - 1; ++r)); do
      code=$(sed -n 's/^code //p' "$workdir/rank$r.txt" 2>/dev/null)
      [[ $code == 4 ]] || die "rank $r: code '$code', expected 4 (MTXCOMM_REMOTE_ERROR)"
    done
    check_no_leak "$before" "$workdir" 1
    ;;
  leak-killall)
    exe=$2 np=$3
    leak_begin "$@"
    echo "$np processes over the store in allreduce loops; all SIGKILLed at once"
    start_file_ranks "$np" "$exe" loop "$workdir"
    await_ready "$np" ""
    sleep 0.5
    kill_ranks
    show_ranks "$np"
    for ((r = 0; r < np; ++r)); do
      ((codes[r] == 137)) || die "rank $r exited with ${codes[$r]}, expected 137 (SIGKILL)"
    done
    check_no_leak "$before" "$workdir" 1
    ;;
  leak-setup)
    exe=$2 np=$3 preload=$4
    leak_begin "$@"
    echo "$np processes over the store; rank 1 is SIGKILLed as it attaches the segment"
    store=$workdir/store
    pids=()
    for ((r = 0; r < np; ++r)); do
      die_flag=0
      ((r == 1)) && die_flag=1
      SHM_TEST_DIE_ON_ATTACH=$die_flag LD_PRELOAD=$preload MTXCOMM_TRANSPORT=tcp \
        MTXCOMM_RANK=$r MTXCOMM_SIZE=$np MTXCOMM_STORE=file:$store MTXCOMM_TIMEOUT=5 \
        "$exe" init "$workdir" >"$workdir/out$r.log" 2>&1 &
      pids+=($!)
    done
    wait_ranks 60
    show_ranks "$np"
    ((codes[1] == 137)) || die "rank 1 exited with ${codes[1]}, expected 137 (the hook's SIGKILL)"
    for ((r = 0; r < np; ++r)); do
      ((r == 1)) && continue
      ((codes[r] != 124)) || die "rank $r hung"
      grep -q "init code [45] " "$workdir/out$r.log" ||
        die "rank $r: init did not fail with MTXCOMM_REMOTE_ERROR or MTXCOMM_TIMEOUT"
    done
    check_no_leak "$before" "$workdir" 0
    ;;
  perm)
    exe=$2 np=$3
    # A rank maps more than one segment (the collectives' and the point-to-point rings'), in an
    # address order that may differ between processes: every mapping is checked, each job's
    # ranks must map the same set of names, and no name may serve two jobs.
    all_names=()
    for job in 1 2 3; do
      rm -f "$workdir"/ready* "$workdir"/seg*
      start_file_ranks "$np" "$exe" loop "$workdir"
      await_ready "$np" "job $job: "
      job_set=""
      for ((r = 0; r < np; ++r)); do
        p=${pids[$r]}
        lines=$(grep '/dev/shm/mtxcomm-' "/proc/$p/maps") ||
          die "job $job rank $r (pid $p): no /dev/shm/mtxcomm-* mapping in /proc/$p/maps"
        self=$(cat "$workdir/seg$r.txt")
        names=()
        while read -r line; do
          range=${line%% *}
          path=$(sed 's|.* \(/dev/shm/mtxcomm-[^ ]*\).*|\1|' <<<"$line")
          mode=$(stat -L -c %a "/proc/$p/map_files/$range" 2>&1) ||
            die "stat -L /proc/$p/map_files/$range: $mode"
          echo "job $job rank $r: /proc/$p/maps: $path, mode $mode"
          [[ $path =~ ^/dev/shm/mtxcomm-[0-9a-f]{32}$ ]] ||
            die "name $path does not match ^/dev/shm/mtxcomm-[0-9a-f]{32}\$ (128 random bits)"
          [[ $mode == 600 ]] || die "segment $path has mode $mode, expected 600"
          [[ ! -e $path ]] || die "$path still exists in /dev/shm once every rank has mapped it"
          names+=("$path")
        done <<<"$lines"
        set_r=$(printf '%s\n' "${names[@]}" | sort -u | tr '\n' ' ')
        echo "job $job rank $r: the rank reports: $self"
        [[ $self =~ ^segment\ (/dev/shm/mtxcomm-[0-9a-f]{32})\ mode\ 0600$ ]] ||
          die "rank $r reports '$self', expected 'segment /dev/shm/mtxcomm-... mode 0600'"
        [[ " $set_r" == *" ${BASH_REMATCH[1]} "* ]] ||
          die "rank $r reports ${BASH_REMATCH[1]}, which is not among its mappings: $set_r"
        [[ -z $job_set || $set_r == "$job_set" ]] ||
          die "job $job: rank $r maps $set_r, rank 0 maps $job_set"
        job_set=$set_r
      done
      for path in $job_set; do all_names+=("$path"); done
      kill_ranks
    done
    total=${#all_names[@]}
    distinct=$(printf '%s\n' "${all_names[@]}" | sort -u | wc -l)
    ((distinct == total)) || die "3 jobs used $distinct distinct segment names for $total, expected none shared"
    echo "PASS: mode 0600, 128-bit random names, the same per job and distinct across jobs, unlinked while live"
    ;;
  tiny)
    exe=$2
    isolate_or_skip 64k "64 KiB" "$@"
    echo "--- 2 ranks, default MTXCOMM_SHM=auto: init must fail on both"
    start_file_ranks 2 "$exe" init "$workdir"
    wait_ranks 60
    show_ranks 2
    for r in 0 1; do
      ((codes[r] != 124)) || die "rank $r hung"
      ((codes[r] == 0)) || die "rank $r exited with ${codes[$r]} (135 = SIGBUS)"
      line=$(grep "init code" "$workdir/out$r.log") || die "rank $r: init did not fail"
      [[ $line == *"init code 3 "* ]] || die "rank $r: expected MTXCOMM_SYSTEM_ERROR (3): $line"
      [[ $line == *"/dev/shm"* ]] || die "rank $r: the message does not name /dev/shm"
      grep -Eq 'needs [0-9]+ bytes|of [0-9]+ bytes' <<<"$line" ||
        die "rank $r: the message does not name the bytes needed"
    done
    rm -f "$workdir"/init* "$workdir"/seg*
    echo "--- 2 ranks, MTXCOMM_SHM=off: must work"
    MTXCOMM_SHM=off start_file_ranks 2 "$exe" collectives "$workdir" 3
    wait_ranks 60
    show_ranks 2
    for r in 0 1; do
      ((codes[r] == 0)) || die "rank $r exited with ${codes[$r]}"
      grep -q "init code" "$workdir/out$r.log" && die "rank $r: init failed with MTXCOMM_SHM=off"
      grep -q "segment none" "$workdir/out$r.log" || die "rank $r maps a segment despite off"
    done
    echo "PASS: a too-small /dev/shm fails init cleanly on every rank; MTXCOMM_SHM=off works"
    ;;
  small)
    exe=$2
    isolate_or_skip 12m "12 MiB" "$@"
    echo "--- 2 ranks, MTXCOMM_SHM_SLOT_BYTES auto: the world and 2 splits, each a segment"
    MTXCOMM_LOG_LEVEL=INFO start_file_ranks 2 "$exe" splits "$workdir" 2
    wait_ranks 60
    show_ranks 2
    for r in 0 1; do
      ((codes[r] != 124)) || die "rank $r hung"
      ((codes[r] == 0)) || die "rank $r exited with ${codes[$r]}"
      grep -q "init code" "$workdir/out$r.log" && die "rank $r: init failed"
      grep -q "splits ok" "$workdir/out$r.log" || die "rank $r: the splits did not all run"
      segs=$(grep -c "shared-memory segment of" "$workdir/out$r.log")
      ((segs == 3)) || die "rank $r: $segs segments logged, expected 3 (world and 2 splits)"
    done
    echo "PASS: on a 12 MiB /dev/shm the auto slot fits the world's segment and two splits'"
    ;;
  kill)
    exe=$2 np=$3 mpiexec=$4
    max_elapsed=3
    victim=$((np - 1))
    before=$(shm_names)
    echo "mpirun -np $np: 4 MiB float32 allreduces over shm; rank $victim SIGKILLs itself"
    MTXCOMM_TIMEOUT=30 MTXCOMM_LOG_LEVEL=DEBUG timeout 90 "$mpiexec" \
      --mca orte_abort_on_non_zero_status 0 -np "$np" --oversubscribe \
      "$exe" kill "$workdir" 4 >"$workdir/job.log" 2>&1
    rc=$?
    grep -v '^\[mtxcomm.*DEBUG' "$workdir/job.log"
    echo "mpirun exited with $rc (ignored unless 124: a hang)"
    ((rc != 124)) || die "mpirun did not finish within 90 s"
    grep -m1 "allreduce 1048576 x 4 B on $np ranks" "$workdir/job.log"
    grep -Eq "allreduce 1048576 x 4 B on $np ranks[^:]*: shm " "$workdir/job.log" ||
      die "the allreduces did not use the shm algorithm (MTXCOMM_LOG_LEVEL=DEBUG)"
    [[ -f $workdir/kill_time ]] || die "rank $victim never reached its kill"
    bad=0
    for ((r = 0; r < victim; ++r)); do
      f=$workdir/rank$r.txt
      [[ -f $f ]] || {
        echo "FAIL: rank $r wrote no outcome"
        bad=1
        continue
      }
      check_kill_outcome "$f" "$r" "$victim" "$max_elapsed" '^4$' '4 (MTXCOMM_REMOTE_ERROR)' ||
        bad=1
    done
    ((bad == 0)) || exit 1
    check_no_leak "$before" "$workdir" 1
    echo "PASS: $victim survivors got MTXCOMM_REMOTE_ERROR naming rank $victim within" \
      "$max_elapsed s"
    ;;
  idle-kill)
    exe=$2 np=$3
    victim=$((np - 1))
    echo "$np processes over the store; rank $victim SIGKILLs itself while the others are idle"
    # The store's processes are this shell's children, reaped only by wait_ranks: the victim is
    # a zombie while the survivors look, as under a launcher that reaps late.
    start_file_ranks "$np" "$exe" idle-kill "$workdir"
    wait_ranks 90
    show_ranks "$np"
    bad=0
    for ((r = 0; r < victim; ++r)); do
      f=$workdir/rank$r.txt
      [[ -f $f ]] || die "rank $r wrote no outcome"
      check_kill_outcome "$f" "$r" "$victim" 5 '^4$' '4 (MTXCOMM_REMOTE_ERROR)' || bad=1
      next=$(sed -n 's/^next //p' "$f")
      if ! [[ $next =~ ^4\ .*rank\ $victim([^0-9]|$) ]]; then
        echo "FAIL: rank $r: the allreduce after the idle wait gave '$next'," \
          "expected code 4 naming rank $victim"
        bad=1
      fi
    done
    ((bad == 0)) || exit 1
    echo "PASS: $victim idle survivors got MTXCOMM_REMOTE_ERROR naming rank $victim within 5 s"
    ;;
  perf)
    exe=$2 mpiexec=$3
    bound=60
    for np in 2 8; do
      echo "--- mpirun -np $np: 200 checked allreduces of 1 MiB"
      rm -f "$workdir"/seg*
      start=$SECONDS
      MTXCOMM_LOG_LEVEL=DEBUG timeout $((bound + 30)) "$mpiexec" -np "$np" --oversubscribe \
        "$exe" perf "$workdir" 200 262144 >"$workdir/job.log" 2>&1
      rc=$?
      took=$((SECONDS - start))
      grep -v '^\[mtxcomm.*DEBUG' "$workdir/job.log"
      echo "np $np: mpirun exited with $rc after ${took} s (bound $bound s for np 8)"
      ((rc == 0)) || die "np $np: mpirun exited with $rc"
      nshm=$(grep -Ec "allreduce 262144 x 4 B on $np ranks[^:]*: shm " "$workdir/job.log")
      ((nshm == 201 * np)) || die "np $np: $nshm of $((201 * np)) allreduces used shm"
      if ((np == 8 && took > bound)); then
        die "8 ranks took $took s for 200 allreduces of 1 MiB (bound $bound s)"
      fi
    done
    echo "PASS"
    ;;
  *)
    die "usage: $0 leak-normal|leak-abort|leak-killall|leak-setup|perm|tiny|kill|idle-kill|perf ..."
    ;;
esac
