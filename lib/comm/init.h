// Bootstrap: builds the world communicator from the environment (mpirun/srun, or the
// MTXCOMM_RANK/MTXCOMM_SIZE/MTXCOMM_STORE rendezvous, or a single rank).
#ifndef MTXCOMM_LIB_INIT_H_
#define MTXCOMM_LIB_INIT_H_

#include <memory>

#include "lib/comm/comm.h"

namespace mtxcomm {

// True when this process was started by an MPI launcher (Open MPI's mpirun, a PMI/PMIx srun).
bool launchedByMpi();
// Reads and validates the configuration, applies the log level, warns about unknown MTXCOMM_*
// variables and echoes the configuration at INFO. Throws MTXCOMM_INVALID_USAGE on a bad value.
Config loadConfig();
// mtxcomm_comm_init_from_env.
std::unique_ptr<Comm> initFromEnv();
// mtxcomm_exiting_on_error: the exit then skips the MPI_Finalize of an MPI that mtxcomm started.
void markExitingOnError();
#ifdef MTXCOMM_HAVE_MPI
// mtxcomm_comm_init_mpi; comm is an MPI_Comm (kept out of this header's types).
std::unique_ptr<Comm> initFromMpiComm(void* mpiComm);
#endif

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_INIT_H_
