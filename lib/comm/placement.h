// Placement: each rank uses only its share of its node's cores, so that ranks on one node do
// not fight over them ("fast by default", ../../docs/architecture.md).
//
// At init of the world communicator (mtxcomm_comm_init_from_env), from the agreed topology:
//   share = cores of the node / ranks on the node, rounded down, at least 1
// (cores: physical cores as hwloc counts them, else the CPUs this process may use). Then
//   - when the launcher already bound this process (its CPU affinity is a strict subset of the
//     node's CPUs: mpirun's --bind-to, srun's --cpu-bind, taskset), nothing is changed and the
//     share is the number of cores in that binding: the launcher's choice wins;
//   - otherwise, with MTXCOMM_PLACEMENT=auto (the default) and several ranks on the node, the
//     process (every thread it has, and those it starts later) is bound with sched_setaffinity
//     to cores [local_rank * share, (local_rank + 1) * share) in hwloc's order, with their
//     hardware threads;
//   - more ranks than cores: nothing is bound, the share is 1 and one warning says the ranks
//     share the cores.
// Frameworks size their thread pools to the share (mtxcomm_comm_cpu_share: the TensorFlow
// binding sets its intra-op and inter-op pools from it unless the user set them). What was
// decided and why is logged at INFO.
#ifndef MTXCOMM_LIB_COMM_PLACEMENT_H_
#define MTXCOMM_LIB_COMM_PLACEMENT_H_

#include <string>
#include <vector>

#include "lib/base/topology.h"

namespace mtxcomm {

struct Placement {
  int share = 1;  // cores this rank should use
  bool boundByLauncher = false;
  bool boundHere = false;  // sched_setaffinity was applied by mtxcomm
  bool oversubscribed = false;
  std::vector<int> cpus;  // the CPUs this rank is bound to (empty: not bound)
  std::string why;        // one line for the log and mtxcomm_info
};

// The decision alone, from values the caller measured (pure, unit-tested):
//   coreCpus: the node's cores in hwloc order, each with its CPUs (hardware threads);
//   allowed: the CPUs this process may run on now; localRank/localSize: from the topology;
//   mode: MTXCOMM_PLACEMENT ("auto" or "off").
Placement decidePlacement(const std::vector<std::vector<int>>& coreCpus,
                          const std::vector<int>& allowed, int localRank, int localSize,
                          const std::string& mode);

// Decides for this rank of topo and applies it (binds every thread of the process when the
// decision says so); logs the decision at INFO and warns once when oversubscribed.
Placement applyPlacement(const Topology& topo, int rank, const std::string& mode);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_PLACEMENT_H_
