// In-process transport: the ranks are threads of one process (tests, and frameworks that run
// one rank per thread). Messages are matched in the destination rank's mailbox and copied once,
// straight from the send buffer into the receive buffer (rendezvous: a send completes when its
// receive has copied it). Waiting spins briefly, then yields, then sleeps.
#ifndef MTXCOMM_TRANSPORTS_INPROC_INPROC_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_INPROC_INPROC_TRANSPORT_H_

#include <memory>
#include <vector>

#include "transports/transport.h"

namespace mtxcomm {

// n transports, one per rank, sharing one in-process world. Transport i is rank i; hand each
// to its own thread.
std::vector<std::unique_ptr<Transport>> makeInprocTransports(int n);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_INPROC_INPROC_TRANSPORT_H_
