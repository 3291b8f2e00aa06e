// Point-to-point messages between the ranks of one node through shared memory: the transport
// of a communicator's user messages (lib/comm/p2p.h) where its ranks share a segment.
//
// Layout. A segment of its own (shm::shareSegment: unguessable name, mode 0600, unlinked once
// mapped) holds one control block per rank (pid, abort flag and reason, a left flag, and the
// doorbell: a futex word every sender to this rank bumps) and one ring per ordered pair of ranks
// (sender s, receiver r): ringBytes() of data with the bytes written (head, the sender's) and
// the bytes read (tail, the receiver's) on cache lines of their own. A single producer and a
// single consumer per ring, so no locks: the sender stores head with release after the data,
// the receiver loads it with acquire, and tail the other way round.
//
// Protocol. A message is one or more frames in its pair's ring: a 16-byte frame header (tag,
// the frame's bytes, the message's bytes) and the data, padded to 16 bytes. A sender writes its
// queued messages to one peer in the order they were posted, as much of the first as fits, so
// a message larger than the ring streams through it while the receiver drains it; a send
// completes once its last byte is in the ring (eager: the receiver need not have posted). The
// receiver reads each peer's ring in order: a message goes to the oldest receive posted for
// its (peer, tag), else into a buffer of its own until one is posted (the unexpected queue), so
// messages of one (peer, tag) match in posting order (MPI's rule) and other tags never block
// it. A message over 4 KiB with no receive yet is first left in the ring for one round of
// progress (its receive usually comes in that round), so it is copied once. Unequal byte counts of
// a matched pair are MTXCOMM_INTERNAL_ERROR (the contract).
//
// Waiting. waitAll spins briefly, then sleeps on this rank's doorbell (futex) in steps of at
// most 50 ms, checking the deadline, the cancel token, the peers' abort and left flags and
// whether their processes still exist; the user-message thread sleeps on the same doorbell
// (waitActivity), and a sender wakes it only when it sleeps. A peer gone (its process exited,
// it aborted or destroyed its communicator) fails the requests that involve it with
// MTXCOMM_REMOTE_ERROR naming it; what it wrote before is still delivered.
#ifndef MTXCOMM_TRANSPORTS_SHM_SHM_P2P_H_
#define MTXCOMM_TRANSPORTS_SHM_SHM_P2P_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lib/base/clock.h"
#include "transports/transport.h"

namespace mtxcomm {

class ShmP2pTransport : public Transport, public ActivityWaiter {
 public:
  // Collective over t's ranks (all on this node); tag: the setup messages' (on t). The rings'
  // size: ringBytesFor(t.size()). Throws MTXCOMM_SYSTEM_ERROR on every rank when the segment
  // cannot be made (a full /dev/shm), as shm::shareSegment.
  static std::unique_ptr<ShmP2pTransport> create(Transport& t, int tag, double timeoutSeconds);
  // Data bytes of each pair's ring for n ranks: 1 MiB, less for more than 2 ranks (the rings
  // of a segment take about 8 MiB: 512 KiB at 4 ranks, 128 KiB at 8), at least 4 KiB. A
  // message larger than its ring streams through it, one hand-over between the two ranks'
  // threads per ring's worth, so the ring sets the bandwidth of large messages.
  static size_t ringBytesFor(int n);
  static size_t segmentBytes(int n);
  ~ShmP2pTransport() override;

  const char* name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t ringBytes() const { return ringBytes_; }

  RequestPtr isend(int peer, int tag, const void* buf, size_t bytes) override;
  RequestPtr irecv(int peer, int tag, void* buf, size_t bytes) override;
  void waitAll(std::vector<RequestPtr>& reqs, Clock::time_point deadline) override;
  bool testAll(std::vector<RequestPtr>& reqs) override;
  // Not needed by its user (the communicator's user-message thread): MTXCOMM_UNSUPPORTED.
  std::unique_ptr<Transport> split(const std::vector<int>& members, uint64_t context_id) override;
  void abort(const std::string& reason) override;

  // ActivityWaiter (transport.h).
  uint32_t activitySeen() const override;
  void waitActivity(uint32_t seen, Clock::duration atMost) override;
  void wake() override;

  struct Control;
  struct Ring;
  struct Req;

 private:
  ShmP2pTransport(char* base, size_t bytes, int rank, int size);
  Control& control(int r) const;
  Ring& ring(int from, int to) const;
  char* ringData(int from, int to) const;
  void ringDoorbell(int r);
  // One round over every peer: writes what fits of the queued sends, reads what arrived.
  // Whether anything moved.
  bool progress();
  bool pushSends(int peer);
  bool pullFrames(int peer);
  void deliver(Req& r, std::vector<char>& data);
  // A request destroyed before it completed (abandoned after a failure) leaves the queues.
  void forget(Req* r);
  // Throws for a request of reqs whose peer is gone (rate-limited liveness scan).
  void checkPeers(const std::vector<RequestPtr>& reqs);
  [[noreturn]] void failWith(mtxcomm_result_t code, const std::string& msg);

  char* base_;
  size_t bytes_;
  const int rank_, size_;
  size_t ringBytes_;
  std::string failure_;  // once failed: every later call throws it
  mtxcomm_result_t failCode_ = MTXCOMM_SUCCESS;
  // Sends queued per peer, in posting order (the front one may be partly written).
  std::vector<std::deque<Req*>> sends_;
  // Receives posted per (peer, tag) and not yet matched, oldest first.
  std::map<std::pair<int, int>, std::deque<Req*>> recvs_;
  // Per peer, the message being read (its frames so far): its receive, or its own buffer.
  struct Incoming {
    bool active = false;
    int tag = 0;
    size_t total = 0, got = 0;
    Req* recv = nullptr;
    bool direct = false;     // recv was posted first: the data goes straight into its buffer
    bool discard = false;    // its receive was abandoned: the rest is read and dropped
    std::vector<char> held;  // otherwise: the data until it is complete
  };
  std::vector<Incoming> incoming_;
  // Complete messages no receive was posted for yet, per (peer, tag), oldest first; a message
  // still arriving for no receive is incoming_'s.
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> unexpected_;
  // Per peer, the ring position of a large unmatched message left there for a round.
  std::vector<uint64_t> deferredAt_;
  Clock::time_point nextScan_{};
};

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_SHM_SHM_P2P_H_
