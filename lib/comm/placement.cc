#include "lib/comm/placement.h"

#include <dirent.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "lib/base/error.h"
#include "lib/base/log.h"
#include "lib/comm/topology_probe.h"

namespace mtxcomm {

namespace {

std::string cpuList(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size(); ++i) {
    // Ranges: 0-3,8
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j;
  }
  return s;
}

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

// Binds every thread of this process (sched_setaffinity applies to one thread; threads started
// later inherit their creator's mask).
bool bindProcess(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  bool ok = sched_setaffinity(0, sizeof(set), &set) == 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      const int tid = std::atoi(e->d_name);
      if (tid > 0) ok = sched_setaffinity(tid, sizeof(set), &set) == 0 && ok;
    }
    closedir(d);
  }
  return ok;
}

}  // namespace

Placement decidePlacement(const std::vector<std::vector<int>>& coreCpusIn,
                          const std::vector<int>& allowed, int localRank, int localSize,
                          const std::string& mode) {
  Placement p;
  // The node's CPUs: every CPU of every core (without a core map, each CPU is a core).
  std::vector<std::vector<int>> coreCpus = coreCpusIn;
  if (coreCpus.empty()) {
    for (int c : allowed) coreCpus.push_back({c});
  }
  std::vector<int> nodeCpus;
  for (const auto& core : coreCpus) nodeCpus.insert(nodeCpus.end(), core.begin(), core.end());
  std::sort(nodeCpus.begin(), nodeCpus.end());
  const int cores = static_cast<int>(coreCpus.size());
  const int ranks = std::max(1, localSize);
  // The launcher bound this process when it may use fewer CPUs than the node has.
  bool strictSubset = allowed.size() < nodeCpus.size();
  for (int c : allowed) {
    if (!std::binary_search(nodeCpus.begin(), nodeCpus.end(), c)) strictSubset = false;
  }
  if (strictSubset && !allowed.empty()) {
    int boundCores = 0;
    for (const auto& core : coreCpus) {
      bool in = false;
      for (int c : core) in = in || std::find(allowed.begin(), allowed.end(), c) != allowed.end();
      boundCores += in ? 1 : 0;
    }
    p.share = std::max(1, boundCores);
    p.boundByLauncher = true;
    p.cpus = allowed;
    p.why = strCat("bound by the launcher to CPUs ", cpuList(allowed), " (", p.share,
                   " core(s)): kept");
    return p;
  }
  if (ranks > cores) {
    p.share = 1;
    p.oversubscribed = true;
    p.why = strCat(ranks, " ranks on a node of ", cores,
                   " cores: the ranks share the cores (not bound), 1 thread each");
    return p;
  }
  p.share = std::max(1, cores / ranks);
  if (mode == "off") {
    p.why = strCat("MTXCOMM_PLACEMENT=off: not bound; share ", p.share, " of ", cores,
                   " cores for ", ranks, " rank(s)");
    return p;
  }
  if (ranks == 1) {
    p.why = strCat("the only rank on a node of ", cores, " cores: every core, not bound");
    return p;
  }
  for (int k = localRank * p.share; k < (localRank + 1) * p.share && k < cores; ++k) {
    p.cpus.insert(p.cpus.end(), coreCpus[k].begin(), coreCpus[k].end());
  }
  std::sort(p.cpus.begin(), p.cpus.end());
  p.boundHere = true;
  p.why = strCat("local rank ", localRank, " of ", ranks, " on a node of ", cores,
                 " cores: bound to CPUs ", cpuList(p.cpus), " (", p.share, " core(s))");
  return p;
}

Placement applyPlacement(const Topology& topo, int rank, const std::string& mode) {
  const int localRank = topo.empty() ? 0 : topo.localRank(rank);
  const int localSize = topo.empty() ? 1 : topo.localSize(rank);
  Placement p = decidePlacement(localCoreCpus(), allowedCpus(), localRank, localSize, mode);
  if (p.boundHere && !bindProcess(p.cpus)) {
    p.boundHere = false;
    p.why += " - sched_setaffinity failed, left unbound";
  }
  MTXCOMM_LOG(kInfo, rank, "placement: ", p.why, "; thread share ", p.share);
  if (p.oversubscribed && localRank == 0) {  // one warning per node
    static std::once_flag once;
    std::call_once(once, [&] { MTXCOMM_LOG(kWarn, rank, "placement: ", p.why); });
  }
  return p;
}

}  // namespace mtxcomm
