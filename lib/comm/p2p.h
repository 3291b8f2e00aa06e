// The user's point-to-point messages of one communicator (mtxcomm_isend, mtxcomm_irecv and
// friends in the C API).
//
// Isolation. A communicator's user messages travel over a transport of their own, made at
// setup while every rank is present (MPI_Comm_create_group is collective), so they never match
// the messages of the collective algorithms, whatever the tags: where the communicator has a
// shared-memory segment (every rank on this node), rings of a segment of their own
// (transports/shm/shm_p2p.h, whose doorbell the progress thread sleeps on); else a view of its
// transport (Transport::split over every rank, with a context id derived from the
// communicator's).
//
// Protocol. Each user message is a fixed-size header message (kHeaderBytes: the byte count,
// and the payload itself when it fits in kInlineBytes) and, for larger messages, the payload as
// a second message on the same transport tag. The receiver keeps one inbox per (peer, tag) with
// at most one header receive posted into it while a receive wants that peer's messages (a
// receive named for it, or one from any source with that tag). An arrived header goes to the
// oldest of those receives (in the order they were posted, MPI's rule); with none waiting (the
// any-source receive it was posted for took another peer's message) it is held in the inbox
// for the next one. Once a header is matched the receiver compares the sizes. Equal: the payload
// receive is posted straight into the user's buffer, before the inbox's next header receive.
// Different: the receive fails with MTXCOMM_INVALID_USAGE naming both byte counts, the peer and
// the tag; the payload is drained into a scratch buffer and the user's buffer is never written
// (the send completes normally: only the receiver learns of the mismatch, as in MPI). Matching
// is MPI's: per (peer, tag), in the order the operations were posted (the transports keep that
// order for messages of one tag); across senders a receive from any source takes whichever
// message is matched first.
//
// A header receive that no receive wants any more (one posted for an any-source receive that
// another peer's message satisfied) is parked: kept posted but neither polled nor counted as
// work, so an idle channel sleeps and a peer that finishes and closes its connection fails
// nothing. It is polled again once a receive wants that peer and tag.
//
// Progress. One thread per communicator, started by the first point-to-point call, and the
// callers themselves: whoever holds the channel's progress lock posts the queued operations
// and polls the view (Transport::testAll). A post first tries that lock and starts its operation
// at once (a send that fits the view's buffers, the shared-memory rings, completes right there);
// a caller waiting for an operation polls the channel itself for about 100 us (5 us with more ranks
// than cores) before it sleeps (a condition variable), so a round trip between two waiting ranks
// needs no thread hand-over. The thread makes progress for everyone else: with operations in flight
// it spins briefly, then yields, then sleeps in steps of up to 1 ms (on the view's doorbell where
// it has one, ActivityWaiter in transport.h: the shm rings' futex, TCP's sockets in poll(2); so
// an arrival wakes it at once); with nothing in
// flight it sleeps until a post. A caller never waits for the lock (it tries it), so a thread that
// posts a receive never waits for an earlier operation, and any thread may post, test or wait, also
// while another thread runs a collective on the communicator.
//
// Self. A message to this rank itself is matched by the progress thread within the process: a
// send with no receive posted is copied aside and completes at once.
//
// Errors. The first failure fails the communicator's point-to-point channel (not its
// collectives, unless the transport itself failed): every pending operation completes with it,
// its message naming this rank, the peer, send or receive, tag and bytes; later posts are
// MTXCOMM_INVALID_USAGE quoting it. Failures: the transport's (a peer gone or aborted:
// MTXCOMM_REMOTE_ERROR), a wait past its timeout (MTXCOMM_TIMEOUT), the communicator destroyed
// or aborted on this rank (MTXCOMM_INVALID_USAGE). An abort here, or a collective that fails,
// also aborts the view, so that peers waiting on this rank fail at once.
#ifndef MTXCOMM_LIB_COMM_P2P_H_
#define MTXCOMM_LIB_COMM_P2P_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mtxcomm/mtxcomm.h"
#include "transports/transport.h"

namespace mtxcomm {

class P2pHub;

// One user send or receive. The fields up to bytes are fixed at post; the result is written
// once, by the progress thread (or the channel, for one never posted), before done is set.
struct P2pOp {
  static constexpr int kAnySource = MTXCOMM_ANY_SOURCE;  // a receive's peer: whichever sends
  P2pOp(std::shared_ptr<P2pHub> hub, bool isSend, int peer, int tag, void* buf, size_t bytes)
      : hub(std::move(hub)), isSend(isSend), peer(peer), tag(tag), buf(buf), bytes(bytes) {}
  const std::shared_ptr<P2pHub> hub;
  const bool isSend;
  const int peer, tag;
  void* const buf;
  const size_t bytes;

  std::atomic<bool> done{false};
  mtxcomm_result_t code = MTXCOMM_SUCCESS;
  // A receive's sender, once matched (the peer for a named one; kAnySource until then).
  int source = kAnySource;
  std::string message;  // the error, naming rank, peer, direction, tag and bytes

  // The progress thread's.
  static constexpr size_t kHeaderBytes = 256;
  static constexpr size_t kInlineBytes = kHeaderBytes - 16;  // after u64 bytes, u64 reserved
  alignas(8) unsigned char header[kHeaderBytes] = {};
  int partsLeft = 0;  // a send's transport messages still in flight
  uint64_t seq = 0;   // post order (the progress thread's count)
};
using P2pOpPtr = std::shared_ptr<P2pOp>;

// "send to peer rank 1 (tag 3, 8 bytes)", "receive from any peer rank (tag 3, 8 bytes)"
std::string describeP2pOp(const P2pOp& op);

// Waits until op completes and returns its result (*message: its error). timeoutSeconds > 0:
// past it the channel fails with MTXCOMM_TIMEOUT naming op (and the wait then returns once the
// progress thread has completed op). Progresses the channel itself for about 100 us
// (progressOnCaller), then sleeps. Any thread.
mtxcomm_result_t waitP2pOp(P2pOp& op, double timeoutSeconds, std::string* message);
// One round of progress of hub's channel on the calling thread, unless another thread is making
// one or the channel has stopped; whether anything moved. Any thread.
bool progressOnCaller(P2pHub& hub);

class P2p {
 public:
  // view: the communicator's point-to-point view (its own context); rank: the communicator's.
  P2p(std::unique_ptr<Transport> view, int rank);
  // Fails what is pending ("the communicator was destroyed") and stops the thread.
  ~P2p();
  P2p(const P2p&) = delete;
  P2p& operator=(const P2p&) = delete;

  // One round of progress on the calling thread (the queued operations started, the view
  // polled once) if no other thread is making one; whether anything moved. Any thread.
  bool tryProgress();

  // The name of the transport the messages go over ("shm", "tcp", "mpi", "ucx", "inproc").
  const char* transportName() const { return view_->name(); }

  // Queues a send (buf read-only) or a receive; peer and tag are checked by the caller. Throws
  // MTXCOMM_INVALID_USAGE when the channel has failed, MTXCOMM_SYSTEM_ERROR when the thread
  // cannot start. Any thread.
  P2pOpPtr post(bool isSend, int peer, int tag, void* buf, size_t bytes);

  // Fails the channel with code and reason (the first failure wins); with tellPeers the view
  // is aborted too (Transport::abort), so peers waiting on this rank fail at once. Returns at
  // once; the thread completes what is pending. Any thread.
  void failChannel(mtxcomm_result_t code, const std::string& reason, bool tellPeers);
  // failChannel(), then waits for the thread to end (every operation completed). Not from the
  // thread.
  void stop(mtxcomm_result_t code, const std::string& reason, bool tellPeers);

 private:
  enum class Part { kSend, kHeader, kPayload, kDrain };
  using Key = std::pair<int, int>;  // (peer, tag)
  struct Slot {
    P2pOpPtr op;  // null for kHeader (the inbox's) and kDrain
    Part part;
    std::unique_ptr<char[]> scratch;  // kDrain: where a mismatched payload goes
    Key key{-1, -1};                  // kHeader: the inbox
  };
  // One (peer, tag): its named receives and its header receive.
  struct Inbox {
    std::deque<P2pOpPtr> recvs;  // named receives waiting, oldest first
    bool posted = false;         // a header receive is in flight into header (maybe parked)
    RequestPtr parked;           // that receive, while no receive wants it
    bool arrived = false;        // header holds a message that no receive has taken yet
    alignas(8) unsigned char header[P2pOp::kHeaderBytes] = {};
  };

  void run();
  // One round: starts the queued operations, polls once; a failure fails the channel. Under
  // progressMu_.
  bool round();
  void start(const P2pOpPtr& op);
  void startSelf(const P2pOpPtr& op);
  void startAny(const P2pOpPtr& op);
  // Posts key's header receive (or polls its parked one again) unless one is in flight or a
  // message waits there.
  void postHeader(const Key& key, Inbox& box);
  // Whether a receive waits for key's next message: a named one, or one from any source.
  bool wanted(const Key& key, const Inbox& box) const;
  // The oldest receive that key's message goes to (taken out of its queue), or null.
  P2pOpPtr takeReceiver(const Key& key, Inbox& box);
  // The oldest receive from any source of tag, taken out; parks the header receives that no
  // receive wants any more.
  P2pOpPtr takeAny(int tag);
  void parkUnwanted(int tag);
  // Drops from reqs_/slots_ (keeping the order of the rest) each index takeOut(i) takes.
  void compact(const std::function<bool(size_t)>& takeOut);
  // Gives the message held in key's inbox to recv, then re-posts or drops the inbox.
  void deliver(const Key& key, const P2pOpPtr& recv);
  void add(RequestPtr req, P2pOpPtr op, Part part, std::unique_ptr<char[]> scratch = nullptr,
           Key key = Key(-1, -1));
  // One testAll; handles what completed. Whether anything did.
  bool poll();
  void onDone(Slot& slot);
  void onHeader(const Key& key);
  void complete(P2pOp& op, mtxcomm_result_t code, std::string message);
  void mismatch(P2pOp& recv, size_t sentBytes);
  // The thread's end: every operation it holds completes with the failure; the view is
  // aborted when asked.
  void failAll();
  // view_->abort once, where asked (hub's lock not held).
  void abortViewOnce();

  std::unique_ptr<Transport> view_;
  ActivityWaiter* const waiter_;  // view_'s, where it has one (shared memory); else null
  const int rank_;
  std::shared_ptr<P2pHub> hub_;
  std::thread thread_;
  // Held by whoever makes progress (the thread, or a caller): guards the view and the state
  // below.
  std::mutex progressMu_;
  std::vector<RequestPtr> reqs_;
  std::vector<Slot> slots_;                       // parallel to reqs_
  std::map<Key, Inbox> inboxes_;                  // node-stable: headers land there
  std::map<int, std::deque<P2pOpPtr>> anyRecvs_;  // per tag, from any source
  uint64_t nextSeq_ = 0;
  std::map<int, std::deque<P2pOpPtr>> selfRecvs_;          // per tag, no message yet
  std::map<int, std::deque<std::vector<char>>> selfMsgs_;  // per tag, no receive yet
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_P2P_H_
