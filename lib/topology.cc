#include "lib/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "lib/error.h"

#ifdef MTXCOMM_HAVE_HWLOC
#include <hwloc.h>
#endif

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

#ifdef MTXCOMM_HAVE_HWLOC
// What hwloc reports for this node (the hardware does not change while the process runs, so it
// is loaded once per process; a topology load with I/O devices costs some milliseconds).
struct HwlocView {
  std::string host;
  int numa = 0, packages = 0, cores = 0, pus = 0, gpus = 0, nics = 0, boundNuma = -1;
};

HwlocView loadHwloc() {
  HwlocView v;
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return v;
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(topo) != 0) {
    hwloc_topology_destroy(topo);
    return v;
  }
  hwloc_obj_t root = hwloc_get_root_obj(topo);
  if (const char* h = hwloc_obj_get_info_by_name(root, "HostName")) v.host = h;
  v.numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  v.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  v.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  v.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  // PCI devices by class: display controllers and processing accelerators are GPUs, network
  // controllers (Ethernet, InfiniBand ...) are NICs. Counting PCI functions, not OS devices,
  // counts a GPU once although it shows up as several OS devices (cuda0, nvml0, card0).
  for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, nullptr); o;
       o = hwloc_get_next_pcidev(topo, o)) {
    const unsigned cls = o->attr->pcidev.class_id >> 8;
    if (cls == 0x03 || cls == 0x12) ++v.gpus;
    if (cls == 0x02) ++v.nics;
  }
  hwloc_bitmap_t bound = hwloc_bitmap_alloc();
  if (bound && hwloc_get_cpubind(topo, bound, HWLOC_CPUBIND_PROCESS) == 0) {
    hwloc_obj_t numa = nullptr;
    int within = 0, index = -1;
    while ((numa = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, numa)) != nullptr) {
      if (hwloc_bitmap_isincluded(bound, numa->cpuset)) {
        ++within;
        index = static_cast<int>(numa->logical_index);
      }
    }
    // Bound inside exactly one domain of several: report it; otherwise the rank spans them.
    if (within == 1 && v.numa > 1) v.boundNuma = index;
  }
  if (bound) hwloc_bitmap_free(bound);
  hwloc_topology_destroy(topo);
  return v;
}

const HwlocView& hwlocView() {
  static std::once_flag once;
  static HwlocView view;
  std::call_once(once, [] { view = loadHwloc(); });
  return view;
}
#endif

void setNodeId(RankSummary& s, const std::string& id) {
  std::memset(s.nodeId, 0, sizeof(s.nodeId));
  std::memcpy(s.nodeId, id.data(), std::min(id.size(), sizeof(s.nodeId) - 1));
}

}  // namespace

std::string localNodeIdentity() {
  std::string host;
#ifdef MTXCOMM_HAVE_HWLOC
  host = hwlocView().host;
#endif
  if (host.empty()) host = hostName();
  // Keep the namespace part whole when the summary's field truncates a long host name.
  std::string ns =
      "|net:" + namespaceInode("/proc/self/ns/net") + "|pid:" + namespaceInode("/proc/self/ns/pid");
  const size_t room = RankSummary::kNodeIdBytes - 1 - ns.size();
  if (host.size() > room) host.resize(room);
  return host + ns;
}

RankSummary localRankSummary() {
  RankSummary s;
  setNodeId(s, localNodeIdentity());
#ifdef MTXCOMM_HAVE_HWLOC
  const HwlocView& v = hwlocView();
  s.numaNodes = v.numa;
  s.packages = v.packages;
  s.cores = v.cores;
  s.pus = v.pus;
  s.gpus = v.gpus;
  s.nics = v.nics;
  s.boundNuma = v.boundNuma;
#endif
  return s;
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
                " NUMA domain(s), ", s.cores, " core(s), ", s.pus, " hardware thread(s), ", s.gpus,
                " GPU(s), ", s.nics, " NIC(s); this rank is ",
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
