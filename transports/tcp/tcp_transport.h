// TCP point-to-point transport ("tcp"): a full mesh of sockets between the ranks of a job,
// bootstrapped through a Store. Implements the Transport contract of transports/transport.h.
//
// Bootstrap: every rank listens on an ephemeral port and publishes "HOST:PORT" under the store
// key "tcp/addr/<rank>" and its PeerLiveness::selfIdentity() under "tcp/id/<rank>"; rank 0
// publishes a random job id under "tcp/job". Each rank connects to every lower rank and accepts
// from every higher one; the handshake carries the job id and both ranks, so a stray connection
// (another job, a port scanner) is dropped, not taken for a peer.
//
// Environment (read in one place, tcp_bootstrap.cc readTcpEnv()):
//   MTXCOMM_TCP_IFADDR  IPv4 address to listen on (default 0.0.0.0, every interface).
//   MTXCOMM_TCP_HOST    host name or IPv4 address the other ranks use to reach this rank
//                       (default: MTXCOMM_TCP_IFADDR when set, else 127.0.0.1 — one node).
//
// Wire format: per message a header {u64 context_id, i32 tag, u64 bytes} (20 bytes, host byte
// order, packed) followed by the payload. Control frames use negative tags: ABORT (tag -1,
// context id of the aborting view, payload the reason, at most 4 KiB) and BYE (tag -2, no
// payload), sent when the last view of a rank that has not failed goes away. A receive matches the
// oldest unmatched message from that peer with the same (context_id, tag); messages that arrive
// before their receive is posted are copied to the heap (the unexpected queue). Progress is made in
// waitAll with non-blocking sockets and poll(2): while a send waits for room in a socket buffer,
// incoming data from every peer keeps being read, so two ranks sending large messages to each other
// cannot deadlock. testAll makes one such round without blocking (only its writing half while a
// thread of another view sleeps in poll(2), which reads for everyone when it wakes).
//
// Views and threads: split() returns a view sharing the sockets and the matching state (one
// mutex guards it), with its own rank translation and context id; the root transport uses
// context id 0, and a context id already used by a live view on this rank is refused. Distinct
// views may be used from distinct threads. The sockets close when the last view (and the last
// request) is gone.
//
// Errors: a peer whose connection closes makes a waitAll that involves that peer throw
// MTXCOMM_REMOTE_ERROR at once (a peer that closes while nothing is expected from it is not an
// error: it may simply have finished). abort(reason) sends every connected peer an ABORT frame
// with non-blocking writes (first finishing the message already on the wire, so the frame lands
// on a message boundary; a peer whose socket buffer is full is given up on: it sees only the
// closed connection), then shuts the sockets down. A waitAll on a view that has the aborting rank
// as a member then throws MTXCOMM_REMOTE_ERROR "peer rank P aborted: <reason>" (P in that view's
// numbering), whichever peer it waits on. Liveness: in the slow path of waitAll (after the first
// poll), a node-local member whose process is gone without a BYE (killed, crashed) makes it throw
// MTXCOMM_REMOTE_ERROR "peer rank D (on this node) has exited ..." within about 100 ms, also when
// this rank waits on another peer. After any error thrown by waitAll, or after abort(),
// the shared state is failed: every view's later calls throw MTXCOMM_INVALID_USAGE naming the
// first error, and no buffer of an abandoned request is touched again (a message abandoned while
// on the wire is finished from a copy).
#ifndef MTXCOMM_TRANSPORTS_TCP_TCP_TRANSPORT_H_
#define MTXCOMM_TRANSPORTS_TCP_TCP_TRANSPORT_H_

#include <chrono>
#include <memory>

#include "lib/base/store.h"
#include "transports/transport.h"

namespace mtxcomm {

// Collective over ranks 0..size-1 of the job (each passes its own rank). Throws
// MTXCOMM_TIMEOUT when a peer does not show up within timeout, MTXCOMM_SYSTEM_ERROR when a
// socket cannot be made.
std::unique_ptr<Transport> makeTcpTransport(Store& store, int rank, int size,
                                            std::chrono::milliseconds timeout);

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_TCP_TCP_TRANSPORT_H_
