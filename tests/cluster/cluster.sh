#!/usr/bin/env bash
# An emulated multi-node cluster on one machine, for the cross-node paths (run by ctest, see
# tests/cluster/CMakeLists.txt; needs root, iproute2's `ip` and `tc`, util-linux's `unshare`).
#
#   cluster.sh correctness BUILD_DIR   mp_tcp_subset (the multi-process correctness checker of
#                                      tests/mp) on 2 nodes x 2 ranks, then on 3 + 1
#   cluster.sh fault BUILD_DIR         a node's link goes down in the middle of allreduces: every
#                                      rank must fail with MTXCOMM_TIMEOUT or MTXCOMM_REMOTE_ERROR
#                                      naming a rank on the other node, within the timeout
#   cluster.sh bench BUILD_DIR LAYOUT -- BENCH_ARGS...
#                                      mtxcomm_bench under mpirun across the nodes (LAYOUT:
#                                      ranks per node, e.g. "2 2"); prints its output.
#                                      CLUSTER_BENCH_ENV="MTXCOMM_X=v ..." sets variables for the
#                                      ranks (every other MTXCOMM_* variable is cleared)
#
# Each node is a network namespace with its own host name (a UTS namespace per process: the
# library tells nodes apart by host name and namespace, as it would on real machines; nothing in
# the library knows it is being tested). The nodes hang off a bridge in the root namespace
# through veth pairs; each node's uplink (the egress of its veth) is shaped with a token bucket
# (tc tbf) to CLUSTER_RATE (default 250mbit), CLUSTER_BURST (default 128kb): on a 2-core VM that
# rate is below what loopback TCP between namespaces reaches (several GB/s), so the link, not
# the CPU, bounds cross-node transfers. Ranks on one node share /dev/shm, as on a real node.
#
# The ranks meet through MTXCOMM_STORE=tcp:<node 0>:29500 (rank 0 serves it inside node 0's
# namespace, so no port of the machine is taken) with MTXCOMM_TCP_HOST set to the node's
# address; the bench runs under mpirun, each rank entering its node through tests/cluster/
# node_exec.sh (PMIx is told to accept connections on the bridge). Names carry a random tag (so
# parallel runs do not collide) and everything is removed on exit, also on failure.
#
# Where namespaces cannot be made (not root, no `ip`, no permission, no tbf), it prints why and
# exits 77, which ctest reports as skipped.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../common/lib.sh
source "$here/../common/lib.sh"

SKIP=77
skip() {
  echo "SKIPPED: $*"
  exit $SKIP
}

mode=${1:-}
build=${2:-}
[[ -n $mode && -d $build ]] || {
  echo "usage: $0 correctness|fault|bench BUILD_DIR [...]"
  exit 2
}
build=$(cd "$build" && pwd)

# ---- Preconditions ---------------------------------------------------------------------------
[[ $(id -u) == 0 ]] || skip "network namespaces need root (running as uid $(id -u))"
for tool in ip tc unshare; do
  command -v $tool >/dev/null || skip "'$tool' is not installed"
done

RATE=${CLUSTER_RATE:-250mbit}
BURST=${CLUSTER_BURST:-128kb}
tag=$(printf '%04x%02x' $(($$ % 65536)) $((RANDOM % 256)))
bridge=mtxb$tag
nodes=()   # namespace of each node
addrs=()   # address of each node
subnet=""

rank_timeout_default=30
driver_init mtxcomm_cluster
cluster_cleanup() {
  cleanup
  for ns in "${nodes[@]}"; do ip netns del "$ns" 2>/dev/null; done
  ip link del "$bridge" 2>/dev/null
}
trap cluster_cleanup EXIT
trap 'exit 130' INT TERM

# A /24 no interface of the machine uses yet.
pick_subnet() {
  for _ in $(seq 50); do
    local s="10.$((RANDOM % 200 + 30)).$((RANDOM % 250 + 1))"
    if ! ip -4 addr show | grep -q " $s\."; then
      subnet=$s
      return 0
    fi
  done
  return 1
}

# cluster_up N: nodes 0..N-1 on a bridge, each uplink shaped.
cluster_up() {
  local n=$1 err
  pick_subnet || skip "no free 10.x.y.0/24 subnet"
  err=$(ip link add "$bridge" type bridge 2>&1) || skip "cannot create a bridge: $err"
  ip addr add "$subnet.254/24" dev "$bridge" && ip link set "$bridge" up || die "bridge setup"
  for ((i = 0; i < n; ++i)); do
    local ns=mtxc$tag-n$i
    err=$(ip netns add "$ns" 2>&1) || skip "cannot create a network namespace: $err"
    nodes+=("$ns")
    addrs+=("$subnet.$((i + 1))")
    ip link add "mtn$tag$i" type veth peer name "mtr$tag$i" || die "veth for node $i"
    ip link set "mtn$tag$i" netns "$ns" || die "veth into $ns"
    ip link set "mtr$tag$i" master "$bridge" && ip link set "mtr$tag$i" up || die "bridge port"
    ip -n "$ns" addr add "${addrs[i]}/24" dev "mtn$tag$i" || die "address of node $i"
    ip -n "$ns" link set lo up && ip -n "$ns" link set "mtn$tag$i" up || die "links of node $i"
    err=$(ip netns exec "$ns" tc qdisc add dev "mtn$tag$i" root tbf rate "$RATE" \
      burst "$BURST" latency 50ms 2>&1) || skip "cannot shape the link with tc tbf: $err"
  done
  echo "cluster $tag: $n nodes on $subnet.0/24 (bridge $bridge), each uplink tbf $RATE burst $BURST"
}

# on_node I CMD...: runs CMD in node I (its network namespace, host name node<I>).
on_node() {
  local i=$1
  shift
  ip netns exec "${nodes[i]}" unshare --uts -- sh -c 'hostname "$1"; shift; exec "$@"' sh \
    "node$i" "$@"
}

# layout_nodes "2 2" -> the node of each rank in $rank_node[]
layout_nodes() {
  rank_node=()
  local i=0
  for k in $1; do
    for ((j = 0; j < k; ++j)); do rank_node+=("$i"); done
    i=$((i + 1))
  done
}

# start_cluster_ranks LAYOUT EXE ARGS...: one process per rank over the store bootstrap, rank r's
# output in $workdir/out<r>.log.
start_cluster_ranks() {
  layout_nodes "$1"
  shift
  local n=${#rank_node[@]}
  pids=()
  for ((r = 0; r < n; ++r)); do
    local i=${rank_node[r]}
    MTXCOMM_RANK=$r MTXCOMM_SIZE=$n MTXCOMM_STORE=tcp:${addrs[0]}:29500 \
      MTXCOMM_TCP_HOST=${addrs[i]} MTXCOMM_LOG_LEVEL=INFO \
      MTXCOMM_TIMEOUT=${RANK_TIMEOUT:-$rank_timeout_default} \
      on_node "$i" "$@" >"$workdir/out$r.log" 2>&1 &
    pids+=($!)
  done
}

# The transport the library is expected to choose between nodes.
expected_p2p() {
  if grep -q '^  UCX: ON' <("$build/mtxcomm_info" 2>/dev/null); then echo ucx; else echo tcp; fi
}

# check_routes N LAYOUT: every rank logged that it found its node-local and remote peers itself.
check_routes() {
  local n=$1 p2p bad=0
  p2p=$(expected_p2p)
  layout_nodes "$2"
  for ((r = 0; r < n; ++r)); do
    local local_peers=-1
    for x in "${rank_node[@]}"; do ((x == rank_node[r])) && local_peers=$((local_peers + 1)); done
    local want="routes: $local_peers node-local and $((n - 1 - local_peers)) remote peers; point-to-point over $p2p"
    if ! grep -q "$want" "$workdir/out$r.log"; then
      echo "FAIL: rank $r did not log '$want'"
      bad=1
    fi
  done
  return $bad
}

case $mode in
  correctness)
    exe=$build/tests/mp/mp_tcp_subset
    cluster_up 2
    for layout in "2 2" "3 1"; do
      echo "=== layout $layout (ranks per node): $exe"
      start=$SECONDS
      start_cluster_ranks "$layout" "$exe"
      wait_ranks 400
      n=${#rank_node[@]}
      bad=0
      for ((r = 0; r < n; ++r)); do
        echo "--- rank $r (node ${rank_node[r]}) exited with ${codes[r]}:"
        grep -v ' INFO ' "$workdir/out$r.log" | tail -n 20
        ((codes[r] == 0)) || bad=1
      done
      ((bad == 0)) || die "layout $layout: a rank failed"
      check_routes "$n" "$layout" || die "layout $layout: the nodes were not found"
      echo "PASS: layout $layout in $((SECONDS - start)) s"
    done
    ;;
  fault)
    exe=$build/tests/mp/mp_kill
    limit=3         # MTXCOMM_TIMEOUT of the ranks
    max_elapsed=7   # seconds from the link going down to each rank's error
    cluster_up 2
    out=$workdir/fault
    mkdir -p "$out"
    layout="2 2"
    RANK_TIMEOUT=$limit start_cluster_ranks "$layout" "$exe" "$out" linkdown
    n=${#rank_node[@]}
    for ((w = 0; w < 600; ++w)); do
      ready=0
      for ((r = 0; r < n; ++r)); do [[ -f $out/started$r ]] && ready=$((ready + 1)); done
      ((ready == n)) && break
      sleep 0.1
    done
    ((ready == n)) || {
      wait_ranks 1
      show_ranks "$n"
      die "only $ready of $n ranks started their allreduces"
    }
    sleep 0.2
    ip -n "${nodes[1]}" link set "mtn${tag}1" down || die "cannot take node 1's link down"
    date +%s.%N >"$out/kill_time"
    echo "node 1's link is down (MTXCOMM_TIMEOUT=$limit)"
    wait_ranks 60
    show_ranks "$n"
    bad=0
    for ((r = 0; r < n; ++r)); do
      f=$out/rank$r.txt
      if [[ ! -f $f ]]; then
        echo "FAIL: rank $r wrote no outcome (exit code ${codes[r]}; 124: it hung)"
        bad=1
        continue
      fi
      echo "--- rank $r (node ${rank_node[r]}):"
      cat "$f"
      # The peer it names must be one it cannot reach: a rank on the other node.
      other=()
      for ((q = 0; q < n; ++q)); do ((rank_node[q] != rank_node[r])) && other+=("$q"); done
      victims=$(
        IFS='|'
        echo "${other[*]}"
      )
      check_kill_outcome "$f" "$r" "($victims)" "$max_elapsed" '^(4|5)$' \
        '4 (MTXCOMM_REMOTE_ERROR) or 5 (MTXCOMM_TIMEOUT)' || bad=1
      [[ $(sed -n 's/^after //p' "$f") == 2 ]] || {
        echo "FAIL: rank $r: the poisoned communicator did not answer MTXCOMM_INVALID_USAGE"
        bad=1
      }
      grep -q '^abort_ok$' "$f" || {
        echo "FAIL: rank $r: mtxcomm_comm_abort did not return"
        bad=1
      }
    done
    ((bad == 0)) || exit 1
    echo "PASS: every rank failed within $max_elapsed s naming a rank across the downed link"
    ;;
  bench)
    layout=$3
    shift 3
    [[ ${1:-} == -- ]] && shift
    layout_nodes "$layout"
    n=${#rank_node[@]}
    cluster_up $((${rank_node[n - 1]} + 1))
    rank_ns="" rank_host=""
    for ((r = 0; r < n; ++r)); do
      rank_ns+="${nodes[rank_node[r]]} "
      rank_host+="node${rank_node[r]} "
    done
    # PMIx listens on loopback only unless told otherwise; the nodes reach it over the bridge.
    # shellcheck disable=SC2086 # CLUSTER_BENCH_ENV is a list of NAME=value words
    env ${CLUSTER_BENCH_ENV:-} \
      PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$bridge \
      "CLUSTER_RANK_NS=$rank_ns" "CLUSTER_RANK_HOST=$rank_host" \
      timeout 1800 mpirun -np "$n" --oversubscribe --mca btl self,vader \
      -x CLUSTER_RANK_NS -x CLUSTER_RANK_HOST "$here/node_exec.sh" \
      "$build/bench/mtxcomm_bench" "$@"
    rc=$?
    # What each uplink's shaper saw (bytes sent, packets dropped at the token bucket).
    for ((i = 0; i < ${#nodes[@]}; ++i)); do
      echo "# uplink of node$i: $(ip netns exec "${nodes[i]}" tc -s qdisc show dev "mtn$tag$i" |
        tr -s ' \n' ' ')"
    done
    exit $rc
    ;;
  *)
    die "unknown mode $mode"
    ;;
esac
