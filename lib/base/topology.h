// Topology: the node map every rank agrees on, built from what each rank sees of its machine
// (lib/comm/topology_probe.h, through hwloc).
//
// Each rank describes itself in a fixed-size RankSummary (node identity, NUMA domains,
// packages, cores, hardware threads, GPUs and NICs, the NUMA domain it is bound to); the
// communicator allgathers the summaries once at init and every decision (which ranks share a
// shared-memory segment, which peers are liveness-checked by pid, node-local and cross-node
// sub-communicators, the cost model) uses that agreed Topology only, never a local probe.
//
// Node identity: "<hostname>|net:<inode>|pid:<inode>" — the host name (gethostname, which is
// also hwloc's HostName) plus the inodes of this process's network and pid namespaces (stat of
// /proc/self/ns/net and /proc/self/ns/pid: a namespace handle's identity, nothing is parsed).
// Two processes are on one node when all three match: processes in different network
// namespaces (containers, or emulated nodes made with `unshare --net --uts`) are different
// nodes even on one host, and so are processes in different pid namespaces (a pid seen from
// one means nothing in the other).
#ifndef MTXCOMM_LIB_TOPOLOGY_H_
#define MTXCOMM_LIB_TOPOLOGY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mtxcomm {

// One rank's view of its node, as allgathered (plain bytes, the same layout on every rank).
struct RankSummary {
  static constexpr size_t kNodeIdBytes = 112;
  char nodeId[kNodeIdBytes] = {};  // "<hostname>|net:<inode>|pid:<inode>", NUL-terminated
  int32_t numaNodes = 0;           // NUMA domains of the node
  int32_t packages = 0;            // sockets
  int32_t cores = 0;               // physical cores
  int32_t pus = 0;                 // hardware threads
  int32_t gpus = 0;                // GPU devices hwloc sees (CUDA, OpenCL, DRM ...)
  int32_t nics = 0;                // network devices (Ethernet, InfiniBand ...)
  int32_t boundNuma = -1;          // NUMA domain this rank is bound to, or -1 (unbound, spans)
  int32_t l2KiB = 0;               // L2 data cache of one core, KiB (hwloc; 0 = unknown)
  int32_t shmFreeMiB = -1;         // free space of /dev/shm at init, MiB (-1 = unknown)
  int32_t reserved = 0;            // keeps the size a multiple of 8
};
static_assert(sizeof(RankSummary) == 152, "RankSummary is allgathered as raw bytes");

// The node identity of this process (see the header comment). Also used by PeerLiveness, so
// that "same node" means the same thing for liveness and for topology.
std::string localNodeIdentity();

// Writes id into s.nodeId (truncated, NUL-terminated).
void setNodeId(RankSummary& s, const std::string& id);

// The agreed topology of a communicator's ranks.
class Topology {
 public:
  Topology() = default;
  // summaries[r] is rank r's summary; nodes are numbered in the order of their lowest rank.
  explicit Topology(std::vector<RankSummary> summaries);

  // A topology for tests: rank r is on node nodeOf[r] (node ids "test-node-<k>"), so that the
  // threaded harness can emulate several nodes in one process.
  static Topology forTest(const std::vector<int>& nodeOf);

  bool empty() const { return ranks_.empty(); }
  int size() const { return static_cast<int>(ranks_.size()); }
  int numNodes() const { return static_cast<int>(nodeRanks_.size()); }
  int nodeOf(int rank) const { return nodeOf_[rank]; }
  // Index of rank among the ranks of its node (0 = the node leader, the lowest rank).
  int localRank(int rank) const { return localRank_[rank]; }
  int localSize(int rank) const { return static_cast<int>(nodeRanks_[nodeOf_[rank]].size()); }
  const std::vector<int>& nodeRanks(int node) const { return nodeRanks_[node]; }
  const RankSummary& summary(int rank) const { return ranks_[rank]; }
  bool sameNode(int a, int b) const { return nodeOf_[a] == nodeOf_[b]; }
  // Largest number of ranks on one node.
  int maxLocalSize() const;
  // The smallest L2 cache (bytes) any rank reports for one of its cores; 0 where a rank could
  // not tell (no hwloc, or hwloc saw no L2).
  size_t minL2Bytes() const;
  // The least free space of /dev/shm (bytes) any rank reported at init; SIZE_MAX where a rank
  // could not tell.
  size_t minShmFreeBytes() const;
  // Every node holds the same number of ranks.
  bool uniformNodes() const;
  // The largest number of edges r -> r+1 (mod n) of the rank ring that leave one node: how many
  // flows of a ring algorithm share one node's network link (1 when nodes hold consecutive
  // ranks).
  int ringCrossEdgesPerNode() const;

  // The topology of a sub-communicator: members[i] is the rank, here, of its rank i.
  Topology subset(const std::vector<int>& members) const;

  // Multi-line node map: one line per node with its ranks and hardware.
  std::string describeNodes() const;

 private:
  std::vector<RankSummary> ranks_;
  std::vector<int> nodeOf_;
  std::vector<int> localRank_;
  std::vector<std::vector<int>> nodeRanks_;
};

// Multi-line description of one rank's own view.
std::string describeSummary(const RankSummary& s);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_TOPOLOGY_H_
