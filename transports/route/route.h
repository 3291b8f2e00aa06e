// Per-peer connection choice: which transport carries the point-to-point messages to each peer.
//
// The ranks first meet over a bootstrap transport that connects every pair (MPI under mpirun,
// TCP after the MTXCOMM_STORE rendezvous). Over it they allgather, for every rank, its node
// identity (PeerLiveness::nodeIdentity: host name and pid namespace) and its liveness identity;
// where UCX is wanted, a second round allgathers each rank's UCX worker address (or why it has
// none). Every rank then holds the same table and computes the same choice for each pair, in
// priority order:
//   1. shm   peers on this node: the communicator's shared-memory segment carries the node-local
//            collectives (Comm::setup when the whole communicator is on one node; the
//            node-local communicators of hierarchical algorithms otherwise);
//   2. ucx   peers on other nodes, when every rank has UCX (built with it and a working worker);
//            point-to-point messages to node-local peers then also go through UCX, which moves
//            them through its own shared-memory and CMA transports;
//   3. mpi   the bootstrap transport under mpirun;
//   4. tcp   the bootstrap transport after the MTXCOMM_STORE rendezvous.
// The point-to-point transport is one for the whole communicator (a schedule waits on several
// peers at once, and one transport must progress all of them), so ucx is chosen when it reaches
// every peer, else the bootstrap transport for all — a mixed table is logged at WARN naming the
// ranks without UCX. MTXCOMM_TRANSPORT=ucx forces UCX (an error when a rank has none); =mpi or
// =tcp keep the bootstrap transport. The table is logged per peer at DEBUG, summarised at INFO,
// and printed by `mtxcomm_info --init`.
#ifndef MTXCOMM_TRANSPORTS_ROUTE_ROUTE_H_
#define MTXCOMM_TRANSPORTS_ROUTE_ROUTE_H_

#include <memory>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace mtxcomm {

struct RoutedTransport {
  std::unique_ptr<Transport> transport;
  // One line per peer: its node, the candidates in priority order, the choice.
  std::vector<std::string> routes;
};

// Collective over the ranks of base. choice: MTXCOMM_TRANSPORT ("auto", "ucx", "mpi", "tcp");
// ucxEagerLimit: MTXCOMM_UCX_EAGER_LIMIT (see openUcxWorker); shmCollectives: whether the
// node's ranks may run their collectives over a shared-memory segment (MTXCOMM_SHM is not off),
// which the route lines say. Throws MTXCOMM_UNSUPPORTED when ucx is forced and a rank has no
// UCX, MTXCOMM_TIMEOUT / MTXCOMM_REMOTE_ERROR from the exchange.
RoutedTransport routeTransport(std::unique_ptr<Transport> base, const std::string& choice,
                               double timeoutSeconds, size_t ucxEagerLimit,
                               bool shmCollectives = true);

// Every rank's blob, in rank order (blobs[rank()] == mine), exchanged over t with tags
// kMaxTag - 1 and kMaxTag. Collective over t's ranks.
std::vector<std::string> allgatherBlobs(Transport& t, const std::string& mine,
                                        Clock::time_point deadline);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_ROUTE_ROUTE_H_
