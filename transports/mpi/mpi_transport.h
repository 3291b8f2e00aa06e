// MPI point-to-point transport: MPI_Isend/MPI_Irecv of bytes on a private duplicate of the
// user's communicator (so mtxcomm's traffic never matches the application's). Messages larger
// than 1 GiB go as several messages with the same tag (MPI counts are int). Waits poll
// MPI_Test with polite backoff, watch the deadline and the liveness of node-local peers.
// abort(reason) sends every peer an ABORT on a reserved tag (above Transport::kMaxTag), where
// each transport keeps a receive posted: a peer's wait on that communicator then throws
// MTXCOMM_REMOTE_ERROR "peer rank P aborted: <reason>" within milliseconds (in its slow path),
// where it used to time out. Views (split) are communicators of their own: an abort reaches
// the waits on the aborted one (the communicator layer aborts its levels too). A transport that
// failed (an error, an abort) keeps its MPI communicator when destroyed: its peers may still
// send to it.
#ifndef MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_

#include <mpi.h>

#include <memory>

#include "transports/transport.h"

namespace mtxcomm {

// Collective over comm. Duplicates comm; errors on the duplicate return instead of aborting.
// The setup (the duplicate, then an allgather of the ranks' identities) uses MPI's
// non-blocking calls and waits at most timeoutSeconds for every rank of comm to take part:
// past it, MTXCOMM_TIMEOUT naming the step (a rank that has not called init, or has exited or
// shut down; a blocking MPI_Comm_dup would wait for it forever).
std::unique_ptr<Transport> makeMpiTransport(MPI_Comm comm, double timeoutSeconds);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_MPI_MPI_TRANSPORT_H_
