// broadcast / hierarchical: the root's node first, then the node leaders, then every other
// node. A composition of whole broadcasts on the two levels of the agreed topology (Levels),
// each with its own selection: shm inside a node, the point-to-point algorithms across nodes.
//
// Accepts: ranks on at least two nodes (declines on one node), any count, any root (a root that
//   is not its node's leader needs no extra hop: step 1 reaches the leader too); uneven node
//   sizes.
// Steps (root on node R):
//   1. node-local broadcast on node R from the root: every rank of node R, its leader included,
//      holds the data;
//   2. cross-node broadcast among the node leaders (the cross-node sub-communicator of local
//      index 0, whose rank k is node k's leader) from node R's leader;
//   3. node-local broadcast on every other node from its leader.
// Bytes across nodes: what the cross-node broadcast moves among N leaders (binomial: count *
//   elemSize on each of ceil(log2 N) rounds), against a flat broadcast whose tree edges may
//   cross nodes many times. Every rank takes part in two of the three steps.
// Example, nodes {0,1,2} and {3,4}, root 1: step 1 ranks 0,1,2 (local root 1); step 2 ranks 0
//   and 3 (cross root 0); step 3 ranks 3,4 (local root 0).
// Source: Open MPI coll/han (ompi/mca/coll/han/coll_han_bcast.c: low/up level broadcasts);
//   MPICH's SMP-aware MPIR_Bcast_intra_smp.
#include "algos/registry.h"
#include "lib/base/topology.h"

namespace mtxcomm {

void composeBroadcastHierarchical(const CollArgs& args, const Topology& topo, int rank,
                                  Levels& levels) {
  const int rootNode = topo.nodeOf(args.root);
  const int myNode = topo.nodeOf(rank);
  const bool leader = topo.localRank(rank) == 0;
  CollArgs b = args;
  if (myNode == rootNode) {
    b.root = topo.localRank(args.root);
    levels.runLocal(b);
  }
  if (leader) {
    b.root = rootNode;
    b.sendbuf = myNode == rootNode ? args.recvbuf : nullptr;
    levels.runCross(b);
  }
  if (myNode != rootNode) {
    b.root = 0;
    b.sendbuf = leader ? args.recvbuf : nullptr;
    levels.runLocal(b);
  }
}

}  // namespace mtxcomm
