// mtxcomm_bench --floor: the time of the least data movement a collective needs on this job's
// layout, measured on this machine, as a floor to compare each collective with.
//
// On one node, the floor is a shared-memory exchange of the bytes each rank must send and
// receive, every rank publishing its bytes and pulling the others' at the same time (both
// directions at once, as the collective does): all ranks start after a barrier, each copies
// the bytes it sends from its private buffer into its segment of an MPI-3 shared window
// (MPI_Win_allocate_shared) and copies its share of every peer's segment into its own buffer;
// the exchange lasts until the slowest rank is done, and the floor is the best of the
// repetitions. The bytes go in steps of a piece, each published then pulled while in cache,
// through a ring of slots of the segment, as a pipelined collective moves its chunks through
// its slots. A piece is pulled only after its writer posted it (a flag per rank, release and
// acquire: without one a pull may read the line before its writer rewrote it, a hit in the
// puller's own cache that moves nothing), and a slot is rewritten only after every peer
// consumed it (a second flag), so a writer runs at most a ring ahead. Shapes tried, the best
// counting: pieces of 16 KiB through 32 KiB and 512 KiB of slots, 128 KiB through 256 KiB and
// 1 MiB, and all at once. The private buffers are page-aligned like the segment's data (no 4K
// aliasing between a copy's source and destination). The floor is the least data movement
// with the least synchronisation, not a bound no algorithm can beat: an access pattern kinder
// to the caches than these shapes (a collective that reads some of its bytes where they lie)
// can come in below it, a ratio under 1. With more ranks than cores a waiting rank yields
// its core, and the floor includes the scheduler's hand-offs. The bytes rank r must receive, with p
// ranks and Size S (what Size means per collective: the header of each run):
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

#include <atomic>
#include <cstddef>
#include <cstdint>
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
  void exchangeSteps(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                     size_t steps, size_t ring, size_t publishMax);
  static void awaitFlag(const std::atomic<uint64_t>& flag, uint64_t value);
  double linkExchange(size_t cross, int reps);

  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Comm leaders_ = MPI_COMM_NULL;  // local rank 0 of each node (MPI_COMM_NULL elsewhere)
  MPI_Win win_ = MPI_WIN_NULL;
  // A segment's first page: its rank's flags, the last step it published and consumed (a
  // page, so the data that follows is page-aligned as the private buffers are).
  static constexpr size_t kFlagBytes = 4096;
  static constexpr int kPublished = 0, kConsumed = 1;
  unsigned char* mine_ = nullptr;
  std::vector<unsigned char*> peers_;  // each node rank's segment (past its flag), by node rank
  std::vector<std::atomic<uint64_t>*> flags_;  // each node rank's two flags
  uint64_t step_ = 0;                          // steps taken, the same on every node rank
  size_t sourceBytes_ = 0;
  static constexpr size_t kPage = 4096;
  static unsigned char* pageAligned(unsigned char* p);
  std::vector<unsigned char> recvBuf_, srcBuf_;  // the storage of recv_ and src_
  size_t recvBytes_ = 0;
  unsigned char* recv_ = nullptr;  // what this rank pulls into (page-aligned)
  unsigned char* src_ = nullptr;   // what this rank publishes, copied into its segment
  std::vector<unsigned char> linkSend_, linkRecv_;
  int nodeRank_ = 0, nodeSize_ = 1, nodes_ = 1, worldRank_ = 0;
  std::vector<int> worldOfNode_;  // world rank of each node rank
};

}  // namespace bench
}  // namespace mtxcomm

#endif  // MTXCOMM_BENCH_BENCH_FLOOR_H_
