// What each rank sees of its node, through hwloc (lib/comm/topology_probe.h).
#include "lib/comm/topology_probe.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#ifdef MTXCOMM_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace mtxcomm {

namespace {

#ifdef MTXCOMM_HAVE_HWLOC
// What hwloc reports for this node (the hardware does not change while the process runs, so it
// is loaded once per process; a topology load with I/O devices costs some milliseconds).
struct HwlocView {
  int numa = 0, packages = 0, cores = 0, pus = 0, gpus = 0, nics = 0, boundNuma = -1, l2KiB = 0;
  std::vector<std::vector<int>> coreCpus;
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
  v.numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  v.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  v.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  v.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  // One core's share of its L2 (a unified or data cache): each L2's size over the cores under
  // it, the smallest over the node's L2s (hybrid CPUs have L2s of several sizes and sharings).
  for (hwloc_obj_t l2 = nullptr; (l2 = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_L2CACHE, l2));) {
    const int sharing =
        std::max(1, hwloc_get_nbobjs_inside_cpuset_by_type(topo, l2->cpuset, HWLOC_OBJ_CORE));
    const int kib =
        static_cast<int>(std::min<hwloc_uint64_t>((l2->attr->cache.size >> 10) / sharing, 1 << 30));
    if (kib > 0 && (v.l2KiB == 0 || kib < v.l2KiB)) v.l2KiB = kib;
  }
  for (int k = 0; k < v.cores; ++k) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(k));
    std::vector<int> cpus;
    if (core && core->cpuset) {
      for (int c = hwloc_bitmap_first(core->cpuset); c >= 0;
           c = hwloc_bitmap_next(core->cpuset, c)) {
        cpus.push_back(c);
      }
    }
    if (!cpus.empty()) v.coreCpus.push_back(std::move(cpus));
  }
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

}  // namespace

int32_t localShmFreeMiB() {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) != 0) return -1;
  const unsigned long long mib = static_cast<unsigned long long>(vfs.f_bavail) *
                                     static_cast<unsigned long long>(vfs.f_frsize) >>
                                 20;
  return static_cast<int32_t>(std::min<unsigned long long>(mib, 1u << 30));
}

RankSummary localRankSummary() {
  RankSummary s;
  setNodeId(s, localNodeIdentity());
  s.shmFreeMiB = localShmFreeMiB();
#ifdef MTXCOMM_HAVE_HWLOC
  const HwlocView& v = hwlocView();
  s.numaNodes = v.numa;
  s.packages = v.packages;
  s.cores = v.cores;
  s.pus = v.pus;
  s.gpus = v.gpus;
  s.nics = v.nics;
  s.boundNuma = v.boundNuma;
  s.l2KiB = v.l2KiB;
#endif
  return s;
}

namespace {

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}.
std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> cpus;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(i, end - i);
    const size_t dash = part.find('-');
    const int lo = std::atoi(part.c_str());
    const int hi = dash == std::string::npos ? lo : std::atoi(part.c_str() + dash + 1);
    for (int c = lo; c <= hi && c - lo < 65536; ++c) cpus.push_back(c);
    i = end + 1;
  }
  return cpus;
}

}  // namespace

std::vector<std::vector<int>> localCoreCpus() {
  std::vector<std::vector<int>> cores;
#ifdef MTXCOMM_HAVE_HWLOC
  cores = hwlocView().coreCpus;
#endif
  if (!cores.empty()) return cores;
  if (FILE* f = std::fopen("/sys/devices/system/cpu/online", "r")) {
    char buf[4096] = {0};
    if (std::fgets(buf, sizeof(buf) - 1, f)) {
      std::string text(buf);
      while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
      for (int c : parseCpuList(text)) cores.push_back({c});
    }
    std::fclose(f);
  }
  return cores;
}

}  // namespace mtxcomm
