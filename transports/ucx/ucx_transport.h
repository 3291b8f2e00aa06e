// UCX point-to-point transport ("ucx"): UCP tag matching over one UCP worker per process, for
// ranks on different nodes (UCX picks the wire itself: tcp, verbs, or shared memory and CMA
// between processes of one node). Implements the Transport contract of transports/transport.h.
//
// Loading: libmtxcomm does not link UCX; openUcxWorker() loads libucp.so.0 on first use
// (transports/ucx/ucx_api.h), so UCX's process-wide signal handlers exist only in jobs that use
// it.
//
// Bootstrap: openUcxWorker() makes the UCP context and worker (configured by UCX's own UCX_*
// variables, e.g. UCX_TLS, UCX_NET_DEVICES); its worker address is exchanged by the caller
// through a transport that already connects the ranks (MPI under mpirun, TCP after the
// MTXCOMM_STORE rendezvous; see transports/route/route.h), then makeUcxTransport() creates one
// endpoint per peer.
//
// Tags: a UCP tag is 64 bits: context (24 bits, a hash of the view's context id) | source rank
// in the root transport (24 bits) | tag (16 bits). Receives match all 64 bits, so a view's
// messages never match another view's. Control frames use context 0xFFFFFF: ABORT (tag 0xFFFF,
// payload the reason, at most 4 KiB). UCP matches messages from one endpoint with the same tag
// in the order they were sent (MPI's rule), which the contract needs.
//
// Large messages: UCX picks eager or rendezvous by size itself (on a node without an RDMA
// device, so over TCP, its threshold is MTXCOMM_UCX_EAGER_LIMIT; see openUcxWorker); messages
// above 1 GiB are sent
// as several messages of at most 1 GiB with the same tag (the receiver posts the same pieces),
// so no single UCX operation is larger than that.
//
// Progress and waiting: waitAll drives ucp_worker_progress; after a short spin it arms the
// worker's event file descriptor (UCP_FEATURE_WAKEUP) and sleeps in poll(2) for at most 100 ms
// at a time, so a waiting rank does not burn a core. testAll progresses once without blocking
// (not at all while another view's thread sleeps on the armed worker: that one progresses
// for every view when it wakes).
//
// Errors: endpoints to other nodes use UCP_ERR_HANDLING_MODE_PEER; a failed endpoint (closed
// connection, peer gone, unreachable) marks its peer lost, and a waitAll that involves that peer
// throws MTXCOMM_REMOTE_ERROR naming it. A waitAll past its deadline throws MTXCOMM_TIMEOUT naming
// the first peer still awaited (send or receive, bytes, tag). A node-local peer whose process is
// gone is noticed within ~100 ms (PeerLiveness). abort(reason) sends every peer an ABORT frame
// (best effort, progressed for at most 200 ms); a waitAll of any view on a rank that received one
// throws MTXCOMM_REMOTE_ERROR "peer rank P aborted: <reason>". After any error the shared state is
// failed; outstanding receives are cancelled and endpoints force-closed, so abandoned buffers are
// not touched again. Views from split() share the worker under one mutex.
#ifndef MTXCOMM_TRANSPORTS_UCX_UCX_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_UCX_UCX_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace mtxcomm {

class UcxWorker;  // a UCP context and worker of this process

// Opens UCX. Returns nullptr (and why in *whyNot) when UCX cannot be used here. eagerLimit
// (MTXCOMM_UCX_EAGER_LIMIT): when the ranks span nodes (acrossNodes) and UCX lists no RDMA
// device on this node (its ib and ugni components have no memory domain), so that other nodes
// are reached over TCP, UCX's rendezvous threshold is set to it, unless it is 0 or
// UCX_RNDV_THRESH is set.
std::shared_ptr<UcxWorker> openUcxWorker(size_t eagerLimit, bool acrossNodes, std::string* whyNot);
// The worker's address, to be sent to every peer.
std::string ucxWorkerAddress(const UcxWorker& worker);
// How eager and rendezvous are chosen on this node, one line for the log.
std::string ucxProtocolChoice(const UcxWorker& worker);

// Connects rank `rank` of `addresses.size()` ranks: addresses[r] is rank r's worker address,
// liveIds[r] its PeerLiveness::selfIdentity(), sameNode[r] whether it is on this node (its
// endpoint then goes without UCX peer error handling, which UCX's shared-memory transports
// lack; PeerLiveness notices a dead node-local peer instead). keepAlive (may be null) is held as
// long as the transport lives (the bootstrap transport, whose connections must outlive the
// exchange). Throws MTXCOMM_SYSTEM_ERROR naming the peer when an endpoint cannot be made.
std::unique_ptr<Transport> makeUcxTransport(std::shared_ptr<UcxWorker> worker, int rank,
                                            const std::vector<std::string>& addresses,
                                            const std::vector<std::string>& liveIds,
                                            const std::vector<bool>& sameNode,
                                            std::unique_ptr<Transport> keepAlive);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_UCX_UCX_TRANSPORT_H_
