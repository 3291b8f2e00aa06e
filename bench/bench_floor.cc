// mtxcomm_bench --floor (bench_floor.h).
#include "bench/bench_floor.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "bench/bench_run.h"
#include "lib/base/reduce.h"

namespace mtxcomm {
namespace bench {

size_t floorBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root) {
  const size_t p = static_cast<size_t>(nranks);
  if (p <= 1) return 0;
  const size_t part = bytes / p * (p - 1);  // (p-1)/p S
  switch (desc.coll) {
    case Collective::kAllreduce:
      return 2 * part;
    case Collective::kReduce:
      return rank == root ? 2 * part : part;
    case Collective::kBroadcast:
      return rank == root ? 0 : bytes;
    case Collective::kAllgather:
      return (p - 1) * bytes;
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return part;
    default:
      return 0;
  }
}

size_t floorPublishBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root) {
  const size_t p = static_cast<size_t>(nranks);
  if (p <= 1) return 0;
  switch (desc.coll) {
    case Collective::kAllreduce:
    case Collective::kAllgather:
      return bytes;
    case Collective::kReduce:
      return rank == root ? bytes / p : bytes;
    case Collective::kBroadcast:
      return rank == root ? bytes : 0;
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return bytes / p * (p - 1);
    default:
      return 0;
  }
}

size_t floorLocalBytes(const CollDescriptor& desc, size_t bytes, int rank, int nranks, int root,
                       bool inPlace) {
  if (nranks <= 1 || inPlace) return 0;
  return desc.coll == Collective::kBroadcast && rank == root ? bytes : 0;
}

size_t floorCrossBytes(const CollDescriptor& desc, size_t bytes, int nodes, int localSize) {
  const size_t n = static_cast<size_t>(nodes);
  const size_t l = static_cast<size_t>(localSize);
  if (n <= 1) return 0;
  switch (desc.coll) {
    case Collective::kAllreduce:
      return 2 * (bytes / n * (n - 1));
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
      return bytes / n * (n - 1) * l;
    case Collective::kAllgather:
      return (n - 1) * bytes * l;
    case Collective::kBroadcast:
    case Collective::kReduce:
      return bytes;
    default:
      return 0;
  }
}

FloorProbe::FloorProbe(size_t sourceBytes, size_t recvBytes) : sourceBytes_(sourceBytes) {
  MPI_Comm_rank(MPI_COMM_WORLD, &worldRank_);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, worldRank_, MPI_INFO_NULL, &node_);
  MPI_Comm_rank(node_, &nodeRank_);
  MPI_Comm_size(node_, &nodeSize_);
  MPI_Comm_split(MPI_COMM_WORLD, nodeRank_ == 0 ? 0 : MPI_UNDEFINED, worldRank_, &leaders_);
  int isLeader = nodeRank_ == 0 ? 1 : 0;
  MPI_Allreduce(&isLeader, &nodes_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  worldOfNode_.resize(nodeSize_);
  MPI_Allgather(&worldRank_, 1, MPI_INT, worldOfNode_.data(), 1, MPI_INT, node_);

  // Per rank: a flag line, then the slots of the published bytes (with room for rounding up:
  // a byte per step).
  const size_t seg = kFlagBytes + std::max<size_t>(sourceBytes, 64) + (64 << 10);
  unsigned char* base = nullptr;
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(seg), 1, MPI_INFO_NULL, node_, &base, &win_);
  std::memset(base, nodeRank_ + 1, seg);  // touched by its owner: its pages are its own
  new (base) std::atomic<uint64_t>[2] {
    {0}, { 0 }
  };
  mine_ = base + kFlagBytes;
  peers_.resize(nodeSize_);
  flags_.resize(nodeSize_);
  for (int q = 0; q < nodeSize_; ++q) {
    MPI_Aint size = 0;
    int disp = 0;
    void* b = nullptr;
    MPI_Win_shared_query(win_, q, &size, &disp, &b);
    peers_[q] = static_cast<unsigned char*>(b) + kFlagBytes;
    flags_[q] = static_cast<std::atomic<uint64_t>*>(b);  // [kPublished], [kConsumed]
  }
  // Private buffers page-aligned, as the segment's data (past its flag page): every copy's
  // source and destination at the same offset in their pages. Copies whose destination lies a
  // few bytes past the source modulo 4 KiB stall on false store-to-load dependencies (4K
  // aliasing), which would make the floor slower than the collective.
  recvBytes_ = std::max<size_t>(recvBytes, 64);
  recvBuf_.assign(recvBytes_ + kPage, 0);
  srcBuf_.assign(seg + kPage, static_cast<unsigned char>(nodeRank_ + 1));
  recv_ = pageAligned(recvBuf_.data());
  src_ = pageAligned(srcBuf_.data());
  MPI_Barrier(MPI_COMM_WORLD);
}

FloorProbe::~FloorProbe() {
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

// One exchange on the node, repeated: every rank publishes `publish` bytes (copies them from
// its private buffer into its segment, where its peers read them; and `local` bytes of them
// into a private buffer, after each step's publishing) and pulls `recv` bytes (fromRoot: all
// from node rank root; else evenly from the other ranks of the node), in steps after a barrier.
// Returns the best over reps of the slowest rank's seconds.
double FloorProbe::nodeExchange(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                                int reps) {
  publish = std::min(publish, sourceBytes_);
  local = std::min({local, publish, recvBytes_});
  // Every rank takes the same steps (its peers wait for its flags): they follow from the
  // node's largest exchange and the largest publishing (the layout of every segment).
  unsigned long long mine[2] = {std::max(publish, recv), publish}, largest[2] = {0, 0};
  MPI_Allreduce(mine, largest, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, node_);
  // The exchange in steps of `piece` bytes, each published then pulled while it is in cache
  // (as a pipelined collective moves its chunks); the floor is the best piece size.
  double best = std::numeric_limits<double>::infinity();
  // (piece, window): a writer runs up to window / piece steps ahead of its readers, as a
  // collective's writer runs ahead within its slots (two pieces; up to 512 KiB, the size of
  // the library's two sets of default slots).
  const std::pair<size_t, size_t> kShapes[] = {{16 << 10, 32 << 10},
                                               {16 << 10, 512 << 10},
                                               {128 << 10, 256 << 10},
                                               {128 << 10, 1 << 20},
                                               {size_t{1} << 40, size_t{1} << 40}};
  for (const auto& [piece, window] : kShapes) {
    const size_t steps = std::max<size_t>(1, (largest[0] + piece - 1) / piece);
    const size_t ring = std::clamp<size_t>(window / piece, 2, std::max<size_t>(2, steps));
    if (steps == 1 && piece < (size_t{1} << 40)) continue;  // the one-step shape below
    best = std::min(best, bestOfSlowest(node_, reps, [&] {
                      exchangeSteps(publish, local, recv, root, fromRoot, steps, ring, largest[1]);
                    }));
  }
  return best;
}

unsigned char* FloorProbe::pageAligned(unsigned char* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  return p + ((kPage - at % kPage) % kPage);
}

// Waits until flag reaches value (acquire): spins, then yields the core (with more ranks than
// cores the writer may be waiting for this very core).
void FloorProbe::awaitFlag(const std::atomic<uint64_t>& flag, uint64_t value) {
  for (int k = 0; flag.load(std::memory_order_acquire) < value; ++k) {
    if (k >= 1000) {
      sched_yield();
      continue;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// One exchange in `steps` steps, the least synchronisation a pipelined exchange needs. Step i:
// this rank copies its i-th 1/steps of `publish` into slot i % ring of its segment (and of `local`
// into its private buffer) and posts step i (its published flag, release); then, for each
// peer it pulls from, waits for that peer's post of step i (acquire) and copies its i-th
// 1/steps of `recv` from the peer's slot i % ring (from the root, or spread over the peers), and
// marks step i consumed. A piece is pulled only after its writer wrote it: without the posts a
// pull could read the line before its writer rewrote it, a hit in the puller's own cache that
// moves nothing. A writer rewrites a slot `ring` steps later, once every peer has consumed the
// step that last used it, so it runs up to `ring` steps ahead and never waits for a reader
// otherwise (as a broadcast's root does not). publishMax: the node's largest publish, which
// sizes every segment's slots (the ranks a rank pulls from publish that much).
void FloorProbe::exchangeSteps(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                               size_t steps, size_t ring, size_t publishMax) {
  const size_t peers = static_cast<size_t>(std::max(1, nodeSize_ - 1));
  const size_t slot = (publishMax + steps - 1) / steps;  // bytes a publisher posts per step
  const size_t pubStep = (publish + steps - 1) / steps;  // this rank's
  const size_t recvStep = (recv + steps - 1) / steps;    // this rank pulls per step
  const size_t share = fromRoot ? recvStep : (recvStep + peers - 1) / peers;  // per peer
  const uint64_t base = step_;
  step_ += steps;
  size_t published = 0, pulled = 0;
  for (size_t i = 0; i < steps; ++i) {
    const size_t at = (i % ring) * slot;
    const size_t n = std::min(pubStep, publish - published);
    if (n > 0) {
      for (int q = 0; q < nodeSize_ && i >= ring; ++q) {
        if (q != nodeRank_) awaitFlag(flags_[q][kConsumed], base + i - ring + 1);
      }
      copyBytes(mine_ + at, src_ + published, n);
      if (published < local) {
        copyBytes(recv_ + published, src_ + published, std::min(n, local - published));
      }
      published += n;
    }
    flags_[nodeRank_][kPublished].store(base + i + 1, std::memory_order_release);
    for (size_t j = 0; j < (fromRoot ? 1 : peers) && pulled < recv; ++j) {
      const int q = fromRoot ? root : (nodeRank_ + static_cast<int>(j) + 1) % nodeSize_;
      awaitFlag(flags_[q][kPublished], base + i + 1);
      // From peer q's slot: `take` bytes, starting where this rank's share of q's step lies
      // (the ranks spread over q's bytes), wrapping within them.
      size_t take = std::min(share, recv - pulled);
      const size_t avail =
          std::max<size_t>(1, std::min(slot, publishMax - std::min(publishMax, i * slot)));
      size_t from = fromRoot ? 0 : (share * static_cast<size_t>(nodeRank_)) % avail;
      while (take > 0) {
        const size_t m = std::min(take, avail - from);
        copyBytes(recv_ + pulled, peers_[q] + at + from, m);
        pulled += m;
        take -= m;
        from = 0;
      }
    }
    flags_[nodeRank_][kConsumed].store(base + i + 1, std::memory_order_release);
  }
}

// Node leaders exchange `cross` bytes with both ring neighbours at once; best over reps of the
// slowest leader's seconds (0 on one node).
double FloorProbe::linkExchange(size_t cross, int reps) {
  if (nodes_ <= 1 || cross == 0) return 0;
  double best = std::numeric_limits<double>::infinity();
  if (leaders_ != MPI_COMM_NULL) {
    int me = 0;
    MPI_Comm_rank(leaders_, &me);
    const int next = (me + 1) % nodes_, prev = (me + nodes_ - 1) % nodes_;
    if (linkSend_.size() < cross) linkSend_.assign(cross, 1), linkRecv_.assign(cross, 0);
    const size_t chunk = static_cast<size_t>(std::numeric_limits<int>::max() / 2);
    best = bestOfSlowest(leaders_, reps, [&] {
      for (size_t done = 0; done < cross; done += chunk) {
        const int n = static_cast<int>(std::min(chunk, cross - done));
        MPI_Sendrecv(linkSend_.data() + done, n, MPI_BYTE, next, 7, linkRecv_.data() + done, n,
                     MPI_BYTE, prev, 7, leaders_, MPI_STATUS_IGNORE);
      }
    });
  }
  MPI_Bcast(&best, 1, MPI_DOUBLE, worldOfNode_[0], node_);  // the leader's figure, node-wide
  return best;
}

double FloorProbe::floorUs(const CollDescriptor& desc, const BenchContext& ctx, size_t bytes,
                           int reps) {
  if (desc.coll == Collective::kBarrier) return 0;
  reps = std::max(1, reps);
  // The root's node rank, when it is on this node (broadcast: every other rank pulls from it).
  int rootNodeRank = -1;
  for (int q = 0; q < nodeSize_; ++q) {
    if (worldOfNode_[q] == ctx.root) rootNodeRank = q;
  }
  const bool rooted = desc.coll == Collective::kBroadcast;
  // On a node without the root a broadcast's bytes arrive over the link; on the node they are
  // pulled from the root (or, elsewhere, from the node rank that received them first: rank 0).
  const int from = rootNodeRank >= 0 ? rootNodeRank : 0;
  size_t recv = floorBytes(desc, bytes, nodeRank_, nodeSize_, from);
  if (nodes_ > 1 && rooted && nodeRank_ == from && rootNodeRank < 0) recv = 0;
  const size_t publish = floorPublishBytes(desc, bytes, nodeRank_, nodeSize_, from);
  const size_t local =
      rootNodeRank >= 0 ? floorLocalBytes(desc, bytes, nodeRank_, nodeSize_, from, ctx.inPlace) : 0;
  const size_t cross = floorCrossBytes(desc, bytes, nodes_, nodeSize_);
  // Nothing to move on any rank (one rank, or a size of 0): the floor is 0, not the time of an
  // empty exchange's synchronisation, which would make every ratio to it meaningless.
  unsigned long long moves = recv + local + cross, anyMoves = 0;
  MPI_Allreduce(&moves, &anyMoves, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (anyMoves == 0) return 0;
  double node = nodeExchange(publish, local, recv, from, rooted, reps);
  const double link = linkExchange(cross, reps);
  double seconds = std::max(node, link), slowest = 0;
  MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest * 1e6;
}

}  // namespace bench
}  // namespace mtxcomm
