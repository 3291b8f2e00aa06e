// barrier / shm: every rank bumps its arrival counter in shared memory and waits until all
// counters reach the same value (a centralised counter barrier, one cache line per rank so
// arrivals never contend). Accepts: a communicator whose ranks share a segment.
// Source: the flag-based barriers of Open MPI coll/sm and MPICH's nemesis shm barrier.
#include "algos/registry.h"
#include "algos/shm_chunks.h"

namespace mtxcomm {

void runBarrierShm(const CollArgs&, ShmGroup& g) { g.barrier("barrier (shm)"); }

}  // namespace mtxcomm
