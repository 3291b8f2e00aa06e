// allreduce / hierarchical: reduce inside each node, cross the network once per node (or once
// per local rank), spread the result inside the node. A composition of whole collectives on the
// two levels of the agreed topology (Levels: the node-local and cross-node sub-communicators),
// each with its own selection: shm inside a node, the point-to-point algorithms across nodes.
//
// Accepts: ranks on at least two nodes (declines on one node), any count, every op; uneven
//   node sizes.
// Steps, N nodes of L ranks each (every node the same size, L > 1):
//   1. node-local reduce-scatter: local rank i ends with block i (ceil(count/L) elements; the
//      vector is zero-padded in a scratch copy when L does not divide count: the padding only
//      ever reduces with padding and is never copied out);
//   2. cross-node allreduce of block i among the N ranks with local index i (L independent
//      allreduces, one per local index, sharing the node's network link);
//   3. node-local allgather of the blocks.
// Steps, uneven node sizes (3+1, 2+2+1) or one rank per node:
//   1. node-local reduce to the node leader (local rank 0);
//   2. cross-node allreduce of the whole vector among the leaders;
//   3. node-local broadcast from the leader.
// Bytes across nodes per node: 2(N-1)/N * count * elemSize with a ring on the cross level —
//   against 2(p-1)/p * count * elemSize per ring edge for a flat ring over p = N*L ranks, where
//   p-1 steps each wait for the inter-node edge. Inside a node: the shm collectives' copies.
// Example, 2 nodes x 2 ranks, count 4, rank r holds x_r:
//   1. node 0 (ranks 0,1): rank 0 holds (x0+x1)[0:2], rank 1 holds (x0+x1)[2:4]; node 1 alike;
//   2. ranks 0 and 2 allreduce [0:2], ranks 1 and 3 allreduce [2:4]: sum of all four ranks;
//   3. each node allgathers: every rank holds the full sum.
// Source: Open MPI coll/han (ompi/mca/coll/han/coll_han_allreduce.c: reduce, leader
//   allreduce, bcast); UCC cl/hier (src/components/cl/hier/allreduce/allreduce_rab.c:
//   node reduce-scatter, leader allreduce, node allgather); NCCL's tree/ring split of intra-
//   and inter-node phases (Sanders et al., "Two-tree algorithms", Parallel Computing 2009).
#include <cstring>
#include <vector>

#include "algos/registry.h"
#include "lib/base/topology.h"

namespace mtxcomm {

namespace {
// One step of the composition: coll over count elements from send into recv, with the call's
// datatype and op.
CollArgs step(const CollArgs& call, Collective coll, const void* send, void* recv, size_t count,
              int root = 0) {
  CollArgs a = call;
  a.coll = coll;
  a.sendbuf = send;
  a.recvbuf = recv;
  a.count = count;
  a.root = root;
  return a;
}
}  // namespace

void composeAllreduceHierarchical(const CollArgs& args, const Topology& topo, int rank,
                                  Levels& levels) {
  const int localSize = topo.localSize(rank), localRank = topo.localRank(rank);
  const size_t es = args.elemSize;
  char* recv = static_cast<char*>(args.recvbuf);

  if (topo.uniformNodes() && localSize > 1) {
    const size_t block = (args.count + localSize - 1) / localSize;
    const bool padded = block * localSize != args.count;
    std::vector<char> scratch;
    char* work = recv;
    const void* src = args.sendbuf;
    if (padded) {
      scratch.assign(block * localSize * es, 0);
      std::memcpy(scratch.data(), args.sendbuf, args.count * es);
      work = scratch.data();
      src = work;
    }
    char* mine = work + static_cast<size_t>(localRank) * block * es;
    levels.runLocal(step(args, Collective::kReduceScatter, src, mine, block));
    levels.runCross(step(args, Collective::kAllreduce, mine, mine, block));
    levels.runLocal(step(args, Collective::kAllgather, mine, work, block));
    if (padded) std::memcpy(recv, work, args.count * es);
    return;
  }

  const bool leader = localRank == 0;
  levels.runLocal(
      step(args, Collective::kReduce, args.sendbuf, leader ? recv : nullptr, args.count));
  if (leader) levels.runCross(step(args, Collective::kAllreduce, recv, recv, args.count));
  levels.runLocal(step(args, Collective::kBroadcast, leader ? recv : nullptr, recv, args.count));
}

}  // namespace mtxcomm
