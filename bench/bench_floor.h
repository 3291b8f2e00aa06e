// mtxcomm_bench --floor: the time of the least data movement a collective needs on this job's
// layout, measured on this machine, as a floor to compare each collective with.
//
// On one node, the floor is a shared-memory exchange of the bytes each rank must send and
// receive, every rank publishing its bytes and pulling the others' at the same time (both
// directions at once, as the collective does): all ranks start after a barrier, each copies
// the bytes it sends from its private buffer into its segment of an MPI-3 shared window
// (MPI_Win_allocate_shared) and copies its share of every peer's segment into its own buffer;
// the exchange lasts until the slowest rank is done, and the floor is the best of the
// repetitions. The bytes go in pieces, each published then pulled while in cache, through a
// window of two pieces of the segment (double buffering), as a pipelined collective moves its
// chunks through its slots: pieces of 16 KiB, 128 KiB and all at once are tried, and the best
// counts. The bytes rank r must receive, with p ranks and Size S (what Size means per
// collective: the header of each run):
//   allreduce       2 (p-1)/p S   (p-1)/p S of the others' inputs for its part of the sum
//                                 (a reduce-scatter), (p-1)/p S of the others' reduced parts
//   reduce          root 2 (p-1)/p S, others (p-1)/p S (a reduce-scatter, then the root gathers)
//   broadcast       S on every rank but the root, 0 on the root
//   allgather       (p-1) S       (S is what each rank sends)
//   reduce_scatter  (p-1)/p S     (its part of every other rank's input)
//   alltoall        (p-1)/p S     (S is what each rank sends in all)
// spread evenly over the p-1 peers (broadcast: all from the root); the bytes it publishes are
// the distinct bytes its peers read: S for allreduce, allgather and reduce (the root: S/p),
// (p-1)/p S for reduce_scatter and alltoall, S on the root of a broadcast. The root of an
// out-of-place broadcast also writes S into its own receive buffer (its local copy, made beside
// the publishing, piece by piece); in place it does not, nor does any other collective need a
// copy beyond these. No reduction is counted: the floor is data movement only, so a reducing
// collective's ratio includes its arithmetic. The floor copies with the library's copy kernel
// (copyBytes, lib/base/reduce.h), the fastest the library knows on this CPU. barrier has no
// floor.
//
// Across nodes (ranks on several nodes), the floor is the larger of the node's floor above (on
// the ranks of the busiest node) and the time the node's network link needs for the bytes that
// must cross it: node leaders exchange them with their ring neighbours at the same time
// (MPI_Sendrecv both ways). The bytes each node must receive over its link, with N nodes:
// allreduce 2 (N-1)/N S, reduce_scatter and alltoall (N-1)/N S x ranks per node, allgather
// (N-1) S x ranks per node, broadcast and reduce S (the nodes other than the root's).
// The floor is a best of repetitions; --floor times the collective the same way too (calls one
// at a time after a barrier, the slowest rank, the best call: Measurement::bestUs), so that
// best / floor compares like with like where Avg / floor also counts the machine's noise.
#ifndef MTXCOMM_BENCH_BENCH_FLOOR_H_
#define MTXCOMM_BENCH_BENCH_FLOOR_H_

#include <mpi.h>

#include <cstddef>
#include <vector>

#include "bench/bench_descriptors.h"

namespace mtxcomm {
namespace bench {

// Bytes rank `rank` of `nranks` must receive for one call of desc with Size bytes (above).
size_t floorBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root);
// Bytes rank `rank` must publish for its peers to read (above).
size_t floorPublishBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root);
// Bytes rank `rank` must copy within its own memory (the out-of-place broadcast root's copy).
size_t floorLocalBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root,
                       bool inPlace);
// Bytes one node must receive over its link for one call, with nodes nodes of localSize ranks.
size_t floorCrossBytes(const CollDescriptor& desc, size_t bytes, int nodes, int localSize);

class FloorProbe {
 public:
  // Collective over MPI_COMM_WORLD: the node communicators, a shared window of sourceBytes per
  // rank and a private buffer of recvBytes (the largest a size of the run needs).
  FloorProbe(size_t sourceBytes, size_t recvBytes);
  ~FloorProbe();
  FloorProbe(const FloorProbe&) = delete;
  FloorProbe& operator=(const FloorProbe&) = delete;

  // The floor of one call, in microseconds (the same on every rank); 0 when nothing must move.
  // Collective. reps: the repetitions of the exchange (the best is kept).
  double floorUs(const CollDescriptor& desc, const BenchContext& ctx, size_t bytes, int reps);

 private:
  double nodeExchange(size_t publish, size_t local, size_t recv, int root, bool fromRoot, int reps);
  void exchangePieces(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                      size_t piece, size_t seg);
  double linkExchange(size_t cross, int reps);

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Comm leaders_ = MPI_COMM_NULL;  // local rank 0 of each node (MPI_COMM_NULL elsewhere)
  MPI_Win win_ = MPI_WIN_NULL;
  unsigned char* mine_ = nullptr;
  std::vector<unsigned char*> peers_;  // each node rank's segment, by node rank
  size_t sourceBytes_ = 0;
  std::vector<unsigned char> recv_;
  std::vector<unsigned char> src_;  // what this rank publishes, copied into its segment
  std::vector<unsigned char> linkSend_, linkRecv_;
  int nodeRank_ = 0, nodeSize_ = 1, nodes_ = 1, worldRank_ = 0;
  std::vector<int> worldOfNode_;  // world rank of each node rank
};

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_FLOOR_H_
