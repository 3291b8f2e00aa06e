#include "lib/base/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "lib/base/error.h"

namespace mtxcomm {

namespace {

// The inode of a namespace handle, or "?" when it cannot be read (then the identity is still
// the same for every process of this host that cannot read it either).
std::string namespaceInode(const char* path) {
  struct stat st {};
  return stat(path, &st) == 0 ? std::to_string(static_cast<unsigned long>(st.st_ino)) : "?";
}

std::string hostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

void setNodeId(RankSummary& s, const std::string& id) {
  std::memset(s.nodeId, 0, sizeof(s.nodeId));
  std::memcpy(s.nodeId, id.data(), std::min(id.size(), sizeof(s.nodeId) - 1));
}

std::string localNodeIdentity() {
  std::string host = hostName();
  // Keep the namespace part whole when the summary's field truncates a long host name.
  std::string ns =
      "|net:" + namespaceInode("/proc/self/ns/net") + "|pid:" + namespaceInode("/proc/self/ns/pid");
  const size_t room = RankSummary::kNodeIdBytes - 1 - ns.size();
  if (host.size() > room) host.resize(room);
  return host + ns;
}

Topology::Topology(std::vector<RankSummary> summaries) : ranks_(std::move(summaries)) {
  const int n = size();
  nodeOf_.assign(n, -1);
  localRank_.assign(n, 0);
  for (int r = 0; r < n; ++r) {
    ranks_[r].nodeId[RankSummary::kNodeIdBytes - 1] = '\0';
    for (int k = 0; k < numNodes(); ++k) {
      if (std::strcmp(ranks_[nodeRanks_[k][0]].nodeId, ranks_[r].nodeId) == 0) {
        nodeOf_[r] = k;
        break;
      }
    }
    if (nodeOf_[r] < 0) {
      nodeOf_[r] = numNodes();
      nodeRanks_.emplace_back();
    }
    localRank_[r] = static_cast<int>(nodeRanks_[nodeOf_[r]].size());
    nodeRanks_[nodeOf_[r]].push_back(r);
  }
}

Topology Topology::forTest(const std::vector<int>& nodeOf) {
  std::vector<RankSummary> s(nodeOf.size());
  for (size_t r = 0; r < nodeOf.size(); ++r) {
    setNodeId(s[r], strCat("test-node-", nodeOf[r]));
    s[r].numaNodes = s[r].packages = 1;
    s[r].cores = s[r].pus = 1;
  }
  return Topology(std::move(s));
}

size_t Topology::minL2Bytes() const {
  size_t least = 0;
  for (const RankSummary& s : ranks_) {
    if (s.l2KiB <= 0) return 0;
    const size_t bytes = static_cast<size_t>(s.l2KiB) << 10;
    if (least == 0 || bytes < least) least = bytes;
  }
  return least;
}

size_t Topology::minShmFreeBytes() const {
  size_t least = SIZE_MAX;
  for (const RankSummary& s : ranks_) {
    if (s.shmFreeMiB < 0) return SIZE_MAX;
    least = std::min(least, static_cast<size_t>(s.shmFreeMiB) << 20);
  }
  return least;
}

int Topology::maxLocalSize() const {
  size_t m = 0;
  for (const auto& v : nodeRanks_) m = std::max(m, v.size());
  return static_cast<int>(m);
}

bool Topology::uniformNodes() const {
  for (const auto& v : nodeRanks_) {
    if (v.size() != nodeRanks_[0].size()) return false;
  }
  return true;
}

int Topology::ringCrossEdgesPerNode() const {
  std::vector<int> out(numNodes(), 0);
  for (int r = 0; r < size(); ++r) {
    const int next = (r + 1) % size();
    if (nodeOf_[r] != nodeOf_[next]) ++out[nodeOf_[r]];
  }
  return out.empty() ? 0 : *std::max_element(out.begin(), out.end());
}

Topology Topology::subset(const std::vector<int>& members) const {
  std::vector<RankSummary> s;
  s.reserve(members.size());
  for (int m : members) s.push_back(ranks_[m]);
  return Topology(std::move(s));
}

std::string describeSummary(const RankSummary& s) {
  return strCat("node ", s.nodeId, ": ", s.packages, " package(s), ", s.numaNodes,
                " NUMA domain(s), ", s.cores, " core(s), ", s.pus, " hardware thread(s), ",
                s.l2KiB > 0 ? strCat(s.l2KiB, " KiB L2 per core, ") : std::string("L2 unknown, "),
                s.gpus, " GPU(s), ", s.nics, " NIC(s); this rank is ",
                s.boundNuma >= 0 ? strCat("bound to NUMA domain ", s.boundNuma)
                                 : std::string("not bound to one NUMA domain"));
}

std::string Topology::describeNodes() const {
  std::string out;
  for (int k = 0; k < numNodes(); ++k) {
    const RankSummary& s = ranks_[nodeRanks_[k][0]];
    std::string ranks;
    for (int r : nodeRanks_[k]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    out += strCat("node ", k, " (", s.nodeId, "): ranks ", ranks, "; ", s.packages, " package(s), ",
                  s.numaNodes, " NUMA, ", s.cores, " cores, ", s.pus, " threads, ", s.gpus,
                  " GPU(s), ", s.nics, " NIC(s)\n");
  }
  return out;
}

}  // namespace mtxcomm
