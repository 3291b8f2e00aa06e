#!/usr/bin/env bash
# Started by mpirun for each rank of `cluster.sh bench`: enters the rank's node (network
# namespace and host name) and runs the program. CLUSTER_RANK_NS and CLUSTER_RANK_HOST list the
# namespace and host name of each rank, space-separated, in rank order.
set -eu
r=${OMPI_COMM_WORLD_RANK:?not started by Open MPI\'s mpirun}
read -r -a ns <<<"$CLUSTER_RANK_NS"
read -r -a host <<<"$CLUSTER_RANK_HOST"
exec ip netns exec "${ns[r]}" unshare --uts -- sh -c 'hostname "$1"; shift; exec "$@"' sh \
  "${host[r]}" "$@"
