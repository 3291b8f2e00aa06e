// The shared state of the TCP transport (transports/tcp/tcp_transport.h has the design): the
// sockets of the full mesh, the per-peer send queues and receive state machines, the matching
// queues keyed by (context id, tag), progress and the failed state, under one mutex. Every view
// of the transport (tcp_transport.cc) and the bootstrap (tcp_bootstrap.cc) work on one
// TcpShared.
//
// Wire format: per message a header {u64 context_id, i32 tag, u64 bytes} (kHeaderBytes, host
// byte order, packed) followed by the payload; control frames use negative tags.
#ifndef MTXCOMM_TRANSPORTS_TCP_TCP_MESH_H_
#define MTXCOMM_TRANSPORTS_TCP_TCP_MESH_H_

#include <poll.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/liveness.h"
#include "mtxcomm/mtxcomm.h"
#include "transports/transport.h"

namespace mtxcomm {
namespace tcp {

using Ms = std::chrono::milliseconds;

constexpr size_t kHeaderBytes = 20;       // u64 context_id, i32 tag, u64 bytes
constexpr size_t kStageBytes = 64 << 10;  // small messages and headers are read through this
constexpr size_t kReadBudget = 16 << 20;  // bytes read from one peer before serving the others
constexpr int kMaxPollMs = 100;           // longest single poll(2) / condition wait
constexpr uint64_t kMagic = 0x316d6d6f6378746dull;  // "mtxcomm1"
// Control frames: a header with a negative tag (never a message tag) and a small payload.
constexpr int32_t kAbortTag = -1;          // payload: the reason; context: the aborting view
constexpr int32_t kByeTag = -2;            // no payload: the sender closes in good order
constexpr size_t kMaxControlBytes = 4096;  // longer abort reasons are cut
constexpr size_t kMaxMessageBytes = size_t{1} << 40;       // a longer frame header is corrupt
constexpr size_t kUnexpectedFirstBytes = size_t{4} << 20;  // first buffer of an unexpected message

using MatchKey = std::pair<uint64_t, int>;  // (context id, tag)

struct SendOp {
  char header[kHeaderBytes];
  const char* data = nullptr;
  size_t bytes = 0;
  size_t sent = 0;  // of header + payload
  bool done = false;
  bool abandoned = false;  // the request went away before it completed
  std::vector<char> copy;  // the payload, once the request went away mid-message
};

struct Unexpected;

struct RecvOp {
  char* buf = nullptr;
  size_t bytes = 0;
  bool done = false;
  bool abandoned = false;
  std::shared_ptr<Unexpected> source;  // matched to a message that is still arriving
};

// A message that arrived before its receive was posted.
// A message that arrived before its receive was posted. Its buffer grows with the bytes that
// actually arrive (doubling, from at most kUnexpectedFirstBytes): a header's length alone never
// allocates more than that.
struct Unexpected {
  std::unique_ptr<char[]> data;
  size_t capacity = 0;
  size_t bytes = 0;
  bool complete = false;
  std::shared_ptr<RecvOp> waiter;  // matched receive, copied into once complete
};

struct MatchQueue {
  std::deque<std::shared_ptr<RecvOp>> posted;
  std::deque<std::shared_ptr<Unexpected>> unexpected;
};

struct Peer {
  int fd = -1;
  bool closed = false;
  std::string closed_reason;
  bool said_bye = false;  // a BYE frame came: the peer closed in good order
  bool aborted = false;   // an ABORT frame came
  std::string abort_reason;
  uint64_t abort_ctx = 0;  // context id of the view the peer aborted
  std::deque<std::shared_ptr<SendOp>> sends;
  std::map<MatchKey, MatchQueue> queues;
  // Receive state machine: a header, then its payload into target_recv or target_unexpected.
  char header[kHeaderBytes];
  size_t header_got = 0;
  bool in_payload = false;
  MatchKey payload_key{0, 0};
  size_t payload_bytes = 0;
  size_t payload_got = 0;
  std::shared_ptr<RecvOp> target_recv;
  std::shared_ptr<Unexpected> target_unexpected;
  int32_t control_tag = 0;  // != 0: the payload is that of a control frame, into control_payload
  std::string control_payload;
  std::unique_ptr<char[]> stage;
  size_t stage_begin = 0, stage_end = 0;
};

class TcpShared {
 public:
  TcpShared(int rank, int size);
  ~TcpShared();

  std::mutex mu;  // guards everything below; public so views and requests lock it
  // One waiting thread at a time polls the sockets (without the lock); waiters on other views
  // sleep on progress_cv, which the poller signals after every poll(2) return.
  bool poller_active = false;
  std::condition_variable progress_cv;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  void setFd(int peer, int fd) { peers_[peer].fd = fd; }

  // Context registry, also used to name peers in the numbering of the view that owns a message.
  void registerContext(uint64_t ctx, const std::vector<int>& members);
  void unregisterContext(uint64_t ctx) { contexts_.erase(ctx); }

  void checkFailed() const;
  bool failed() const { return failed_; }

  // Records the first error, fails the shared state and throws.
  [[noreturn]] void failWith(mtxcomm_result_t code, const std::string& msg);

  // Fails the state, sends every open peer an ABORT frame with reason and the context id ctx of
  // the aborting view (best effort, without blocking), then shuts the sockets down.
  void abort(const std::string& reason, uint64_t ctx);

  const Peer& peer(int gpeer) const { return peers_[gpeer]; }

  void postSend(int gpeer, const std::shared_ptr<SendOp>& op);

  // Matches against the unexpected queue or queues the receive. view_peer names the peer in
  // errors.
  void postRecv(int gpeer, int view_peer, MatchKey key, const std::shared_ptr<RecvOp>& op);

  // Called by a request that goes away before it completed.
  void abandonSend(SendOp& op);
  void abandonRecv(RecvOp& op);

  // One non-blocking round over every open peer: write what the sockets take, read what they
  // have. Throws (failing the state) on a size mismatch.
  void progress();
  // The writing half of progress(): what another thread's poll(2) cannot miss (a read here
  // would take the data that is to wake it).
  void progressWrites();

  // The poll(2) set for the next wait: every open peer for reading, those with queued sends for
  // writing.
  void pollSet(std::vector<pollfd>& pfds) const;

 private:
  [[noreturn]] void sizeMismatch(int view_peer, MatchKey key, size_t recv_bytes, size_t msg_bytes);

  int viewRank(uint64_t ctx, int gpeer) const;

  static void eraseIfEmpty(Peer& p, std::map<MatchKey, MatchQueue>::iterator it);

  // Copies every message already partly on the wire (while the caller's buffer is still valid:
  // once waitAll has thrown it may be gone), so that abort() can finish it and put its ABORT
  // frame on a message boundary.
  void keepWireMessages();

  void closePeer(int gpeer, const std::string& reason);

  void writePeer(int gpeer);

  // Sends a control frame to gpeer without blocking, if the connection is open: drops the queued
  // messages not started yet, finishes the one on the wire (the frame must start on a message
  // boundary) and writes the frame; gives up on the peer when its socket buffer is full.
  void sendControl(int gpeer, int32_t tag, uint64_t ctx, const std::string& payload);

  // Writes what the socket takes of op. True once the whole message is written; false when the
  // socket is full, or broken (the peer is then closed).
  bool writeOp(int gpeer, SendOp& op);

  // Where the next payload byte goes; null when it is to be dropped (abandoned receive).
  // Where the next n payload bytes go (nullptr: dropped, the receive went away); grows an
  // unexpected message's buffer to hold them, or closes the peer when memory runs out.
  char* payloadDst(int gpeer, size_t n);

  void readPeer(int gpeer);

  void consumeStage(int gpeer);

  void onHeader(int gpeer);

  void advancePayload(Peer& p, size_t n);

  const int rank_;
  std::vector<Peer> peers_;
  std::map<uint64_t, std::vector<int>> contexts_;
  bool failed_ = false;
  bool abort_sent_ = false;
  std::string first_error_;
};

// A view over shared: members[i] is the mesh rank of rank i of the view, rank this rank's index
// in it, ctx its context id; liveness covers the ranks of the view.
std::unique_ptr<Transport> makeView(std::shared_ptr<TcpShared> shared, std::vector<int> members,
                                    int rank, uint64_t ctx, PeerLiveness liveness);

}  // namespace tcp
}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_TCP_TCP_MESH_H_
