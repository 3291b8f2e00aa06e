/*
 * mtxcomm over an existing MPI communicator. Include after <mpi.h>; link the same MPI
 * library mtxcomm was built against (see `mtxcomm_info`).
 */
#ifndef MTXCOMM_MTXCOMM_MPI_H_
#define MTXCOMM_MTXCOMM_MPI_H_

#include <mpi.h>

#include "mtxcomm/mtxcomm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over the ranks of mpi_comm (same rank numbering). mtxcomm duplicates mpi_comm,
 * so the caller's traffic on mpi_comm never mixes with mtxcomm's; the caller keeps ownership
 * of mpi_comm. MPI must be initialised. Collective over mpi_comm. Returns MTXCOMM_UNSUPPORTED
 * if the library was built without MPI. */
MTXCOMM_API mtxcomm_result_t mtxcomm_comm_init_mpi(MPI_Comm mpi_comm, mtxcomm_comm_t* comm);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MTXCOMM_MTXCOMM_MPI_H_ */
