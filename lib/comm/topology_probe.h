// This rank's view of its node for the agreed topology (lib/base/topology.h): the node
// identity, and through hwloc (when built with it) its NUMA domains, packages, cores, hardware
// threads, GPUs and NICs and the NUMA domain the process is bound to. hwloc is loaded once per
// process (the hardware does not change while it runs; a load with I/O devices costs some
// milliseconds).
#ifndef MTXCOMM_LIB_COMM_TOPOLOGY_PROBE_H_
#define MTXCOMM_LIB_COMM_TOPOLOGY_PROBE_H_

#include <cstdint>
#include <vector>

#include "lib/base/topology.h"

namespace mtxcomm {

// This rank's summary: hwloc when built with it, otherwise only the node identity (and the
// free space of /dev/shm).
RankSummary localRankSummary();

// The free space of /dev/shm now, MiB (at most 2^30), or -1 where statvfs fails.
int32_t localShmFreeMiB();

// The node's cores in hwloc's logical order, each with the OS indexes of its hardware threads
// (CPUs); without hwloc, every online CPU (/sys/devices/system/cpu/online) as one core.
std::vector<std::vector<int>> localCoreCpus();

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_TOPOLOGY_PROBE_H_
