// mtxcomm_bench --floor (bench_floor.h).
#include "bench/bench_floor.h"

#include <algorithm>
#include <cstring>
#include <limits>

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

  const size_t seg = std::max<size_t>(sourceBytes, 64);
  MPI_Win_allocate_shared(static_cast<MPI_Aint>(seg), 1, MPI_INFO_NULL, node_, &mine_, &win_);
  std::memset(mine_, nodeRank_ + 1, seg);  // touched by its owner: its pages are its own
  peers_.resize(nodeSize_);
  for (int q = 0; q < nodeSize_; ++q) {
    MPI_Aint size = 0;
    int disp = 0;
    void* base = nullptr;
    MPI_Win_shared_query(win_, q, &size, &disp, &base);
    peers_[q] = static_cast<unsigned char*>(base);
  }
  recv_.assign(std::max<size_t>(recvBytes, 64), 0);
  src_.assign(seg, static_cast<unsigned char>(nodeRank_ + 1));
  MPI_Barrier(MPI_COMM_WORLD);
}

FloorProbe::~FloorProbe() {
  if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

// One exchange on the node, repeated: every rank publishes `publish` bytes (copies them from
// its private buffer into its segment, where its peers read them; and `local` bytes of them
// into a private buffer, after each piece's publishing) and pulls `recv` bytes (fromRoot:
// all from node rank root; else evenly from the other ranks of the node, each peer's share from its
// segment), all at once after a barrier. Returns the best over reps of the slowest rank's seconds.
double FloorProbe::nodeExchange(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                                int reps) {
  const size_t seg = std::max<size_t>(sourceBytes_, 64);
  publish = std::min(publish, seg);
  // The exchange in pieces of `piece` bytes, each published then pulled while it is in cache
  // (as a pipelined collective moves its chunks); the floor is the best piece size.
  double best = std::numeric_limits<double>::infinity();
  // The largest exchange of the node decides which piece sizes differ: every rank runs the
  // same repetitions (each ends in a collective), whatever its own bytes.
  local = std::min({local, publish, recv_.size()});
  unsigned long long mine = std::max(publish, recv), largest = 0;
  MPI_Allreduce(&mine, &largest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, node_);
  for (const size_t piece : {size_t{16} << 10, size_t{128} << 10, size_t{1} << 30}) {
    for (int k = 0; k < reps; ++k) {
      MPI_Barrier(node_);
      const double t0 = MPI_Wtime();
      exchangePieces(publish, local, recv, root, fromRoot, piece, seg);
      double mine = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, node_);
      best = std::min(best, slowest);
    }
    if (piece >= largest) break;  // larger pieces are the same exchange
  }
  return best;
}

// One exchange: this rank publishes `publish` bytes into its segment and pulls `recv` bytes
// (from the root, or evenly from every peer), `piece` bytes of each at a time, alternating.
void FloorProbe::exchangePieces(size_t publish, size_t local, size_t recv, int root, bool fromRoot,
                                size_t piece, size_t seg) {
  const size_t peers = static_cast<size_t>(std::max(1, nodeSize_ - 1));
  const size_t share = fromRoot ? recv : recv / peers;
  // The pieces go through a window of two pieces of the segment (double buffering, as the
  // collective's two sets of slots), so they stay in cache however large the message.
  const size_t window = std::min(seg, 2 * piece);
  const size_t offset = fromRoot ? 0 : (share * static_cast<size_t>(nodeRank_)) % window;
  size_t published = 0, pulled = 0;
  // Pull position: peer j (1-based, round robin over the pieces), byte `got` of its share.
  while (published < publish || pulled < recv) {
    if (published < publish) {
      const size_t at = published % window;
      const size_t n = std::min({piece, publish - published, window - at});
      copyBytes(mine_ + at, src_.data() + published, n);
      if (published < local) {
        copyBytes(recv_.data() + published, src_.data() + published,
                  std::min(n, local - published));
      }
      published += n;
    }
    if (pulled < recv) {
      size_t n = std::min(piece, recv - pulled);
      int q = root;
      size_t within = pulled;
      if (!fromRoot) {
        const size_t j = std::min(pulled / std::max<size_t>(share, 1), peers - 1);
        q = (nodeRank_ + static_cast<int>(j) + 1) % nodeSize_;
        within = pulled - j * share;
        const size_t left = j == peers - 1 ? recv - pulled : share - within;
        n = std::min(n, left);
      }
      const size_t from = (offset + within) % window;
      n = std::min(n, window - from);
      copyBytes(recv_.data() + pulled, peers_[q] + from, n);
      pulled += n;
    }
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
    for (int k = 0; k < reps; ++k) {
      MPI_Barrier(leaders_);
      const double t0 = MPI_Wtime();
      for (size_t done = 0; done < cross; done += chunk) {
        const int n = static_cast<int>(std::min(chunk, cross - done));
        MPI_Sendrecv(linkSend_.data() + done, n, MPI_BYTE, next, 7, linkRecv_.data() + done, n,
                     MPI_BYTE, prev, 7, leaders_, MPI_STATUS_IGNORE);
      }
      double mine = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, leaders_);
      best = std::min(best, slowest);
    }
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
  double node = nodeExchange(publish, local, recv, from, rooted, reps);
  const double link = linkExchange(floorCrossBytes(desc, bytes, nodes_, nodeSize_), reps);
  double seconds = std::max(node, link), slowest = 0;
  MPI_Allreduce(&seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest * 1e6;
}

}  // namespace bench
}  // namespace mtxcomm
