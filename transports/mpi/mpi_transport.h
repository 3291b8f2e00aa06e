// MPI point-to-point transport: MPI_Isend/MPI_Irecv of bytes on a private duplicate of the
// user's communicator (so mtxcomm's traffic never matches the application's). Messages larger
// than 1 GiB go as several messages with the same tag (MPI counts are int). Waits poll
// MPI_Test with polite backoff, watch the deadline and the liveness of node-local peers.
#ifndef MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_

#include <mpi.h>

#include <memory>

#include "transports/transport.h"

namespace mtxcomm {

// Collective over comm. Duplicates comm; errors on the duplicate return instead of aborting.
std::unique_ptr<Transport> makeMpiTransport(MPI_Comm comm);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_
