// A shared-memory group: the ranks of one communicator that all live on one node share one
// POSIX shared-memory segment holding, per rank, a control line (arrival counter, pid, abort
// flag and reason) and two sets of data slots. The shm collective algorithms
// (algos/<collective>_shm.cc) move data through the slots and synchronise with arrival
// counters: a rank stores its counter (release) after writing its slot and loads its peers'
// counters (acquire) before reading theirs.
//
// Lifetime and security: rank 0 creates the segment under an unguessable name
// (/dev/shm/mtxcomm-<128 random bits>), mode 0600, reserves its pages up front (so a full
// /dev/shm is an init error naming the size needed, never a SIGBUS later), every rank maps it,
// and rank 0 unlinks it as soon as all have mapped it — a job killed at any later point leaves
// nothing in /dev/shm.
//
// Waiting: spin briefly, then sleep on the peer's progress word (a futex, woken when it advances
// a counter); every 50 ms of waiting, check the deadline, the peers' abort flags and whether
// their processes still exist, so a SIGKILLed peer becomes MTXCOMM_REMOTE_ERROR naming it
// within ~0.1 s.
//
// One class, one unit per subject: shm_group.cc (the data path: chunk sets, barrier, pieces, the
// small ring), shm_segment.{h,cc} (the segment: layout, Control, making and mapping it),
// shm_calls.cc (call signatures and deferred checks), shm_notify.cc (notifications, idle,
// cycles), shm_wait.{h,cc} (waits and the publication that ends them, inline; abort and
// liveness) and shm_lines.cc (the line exchange). shm_segment.h and shm_wait.h are for those
// units only.
#ifndef MTXCOMM_TRANSPORTS_SHM_SHM_GROUP_H_
#define MTXCOMM_TRANSPORTS_SHM_SHM_GROUP_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/base/call.h"
#include "lib/base/cancel.h"
#include "transports/transport.h"

namespace mtxcomm {

class ShmGroup {
 public:
  // Collective over the ranks of transport (which must all be on this node). Uses tag for its
  // setup messages. Throws MTXCOMM_SYSTEM_ERROR (on every rank) if the segment cannot be made,
  // naming the size needed and what /dev/shm has.
  static std::unique_ptr<ShmGroup> create(Transport& transport, int tag, size_t slotBytes,
                                          double timeoutSeconds);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }
  // The chunk of the reductions (allreduce, reduce_scatter): at most the slot; the slot unless
  // set (shmReductionChunkBytes, lib/comm/config.h). The same on every rank.
  size_t reductionChunkBytes() const { return reductionChunkBytes_; }
  void setReductionChunkBytes(size_t bytes) {
    reductionChunkBytes_ =
        std::clamp<size_t>(bytes, std::min<size_t>(4096, slotBytes_), slotBytes_);
  }
  // Bytes of the whole segment for n ranks and the given slot size.
  static size_t segmentBytes(int n, size_t slotBytes);
  // A digest of the segment's layout (its blocks' sizes and counts): ranks of builds whose
  // digests differ must not share a segment (Comm::agreeConfig compares it at init).
  static uint32_t layoutDigest();

  // Data slot of rank r in set s (0 or 1) for the current chunk, 64-byte aligned: the slot's
  // start, or, for a chunk started with nextSet(bytes), the position within it that the chunk
  // uses (at least `bytes` to the slot's end).
  char* slot(int set, int r) const;
  // Starts the next chunk and returns the set it uses (sets alternate). Waits, usually not at
  // all, until every rank has finished the chunk before the previous one — the last one that
  // used this set — so no slot is rewritten while a peer may still read it. Every algorithm
  // calls finishChunk() once it has read all it needs of the chunk.
  // With bytes (the most any rank writes into its slot for this chunk, the same on every rank),
  // successive chunks of a set move through the slot's positions (bytes rounded up to 4 KiB,
  // slotBytes() / that many of them, when there are at least minPositions and 2), so a slot's
  // lines are rewritten only after the set's other positions were used: a writer that rewrites
  // the lines a reader has just read must take each back from the reader's cache, and that made
  // a 32-64 KiB broadcast's root copy at half the rate of a 128 KiB one. Measured at np = 2 with
  // 1 MiB slots (bench/RESULTS.md): broadcast 8-64 KiB 0.51-0.70x the time of one position,
  // 256-512 KiB (2-4 positions) about 0.85x; allreduce 4-32 KiB 0.66-0.81x, but 512 KiB with 2
  // positions about 1.07x (its ranks write and read every slot: kExchangePositions); allgather
  // and reduce_scatter 4-32 KiB about 0.5-0.8x. The
  // positions depend only on the chunk's number and bytes, so every rank finds the same.
  int nextSet(size_t bytes = 0, size_t minPositions = 2);
  // The fewest positions for a chunk that every rank writes into its slot and every rank reads
  // from the others' (allreduce, allgather, reduce_scatter).
  static constexpr size_t kExchangePositions = 8;
  void finishChunk();
  // One-to-all chunks without a barrier (broadcast), published in pieces so that the readers
  // copy a piece out while the root writes the next: the root publishes the first `pieces`
  // pieces of the chunk it is writing (postPieces, 1 <= pieces <= kMaxPieces, increasing within
  // a chunk), the others wait for them (waitPieces; the first piece's wait also checks the
  // root's call) — the root never waits for the readers except through nextSet two chunks
  // later.
  static constexpr int kMaxPieces = 255;
  void postPieces(int pieces);
  void waitPieces(int root, int pieces, const char* what);

  // A ring of kSmallSlots small slots per rank for one-to-all messages of at most kSmallBytes
  // (small broadcasts): the root may run kSmallSlots messages ahead of the slowest reader, so
  // with more ranks than cores a broadcast rarely waits for a descheduled peer. Separate memory
  // and counters from the chunk sets above.
  static constexpr int kSmallSlots = 16;
  static constexpr size_t kSmallBytes = 4096;
  // Starts the next small message; the writer first waits until every rank has read the one
  // kSmallSlots back. Returns this rank's slot (smallSlot(r) gives another rank's).
  // writer: this rank writes its slot (the root); readers pass false and never wait here.
  char* beginSmall(bool writer);
  char* smallSlot(int r) const;
  void postSmall();
  void waitSmall(int root, const char* what);
  void finishSmall();

  // Line-tagged exchange of at most kLineBytes bytes per rank (the LL protocol of NCCL, on
  // shared memory): every rank writes its bytes, with the call's signature, into 64-byte lines
  // of its own that each carry the exchange's number in their first 8 bytes (written after the
  // line's data), then reads every peer's lines as their tags arrive. One cross-core transfer
  // per line and no barrier, where a barrier-based small allreduce pays one for the arrival,
  // one for the data and one for the slot's release. Lines rotate over kLineSlots (64) exchanges; a
  // rank rewrites one only after every peer has read it (counted, rarely waited for). On return all
  // + r * bytes holds rank r's bytes for every r (this rank's from mine). Fails with
  // MTXCOMM_INVALID_USAGE, naming both calls, when a peer is in another call; waits as
  // barrier() does (deadline, dead or aborted peers).
  static constexpr size_t kLineBytes = 256;
  static constexpr size_t kLineSlots = 64;
  void exchangeLines(const void* mine, size_t bytes, char* all, const char* what);
  // One-to-all through the same line boxes: the root writes buf's bytes (at most kLineBytes)
  // into its lines and returns (it waits only to reuse a box kLineSlots exchanges back: a root
  // runs up to 64 broadcasts ahead of its slowest reader, so that with more ranks than cores
  // a descheduled reader costs one hand-off per many calls, not per call); every
  // other rank waits for the root's lines, checks the root's call and copies them into buf.
  // One cross-core transfer per 64-byte line, no counter or slot to read besides.
  void broadcastLines(int root, void* buf, size_t bytes, const char* what);
  // All-to-one through the same line boxes (a small reduce): every rank but the root writes
  // mine's bytes (at most kLineBytes) into its lines and returns (waiting only to reuse a box
  // kLineSlots exchanges back); the root waits for each peer's lines, checks its call and
  // copies them to all + q * bytes (its own bytes from mine). all is read on the root only.
  void gatherLines(int root, const void* mine, size_t bytes, char* all, const char* what);

  // Arrives at the next barrier and waits until every rank has arrived (what names the
  // operation for error messages). Throws MTXCOMM_TIMEOUT / MTXCOMM_REMOTE_ERROR naming the
  // peer.
  void barrier(const char* what);
  // The call the next barriers belong to (lib/base/call.h; all zeros for none). A barrier fails
  // with MTXCOMM_INVALID_USAGE when a peer arrives with a different call — the ranks disagree on
  // the collective, count, datatype, op or root — naming both.
  void setCall(const CallSignature& call) { call_ = call; }
  // Every call on the communicator, before anything else (also one this rank rejects, with
  // the reason): publishes its signature, so that a peer waiting in a different call — another
  // collective, another root, a call this rank rejected — fails at once with
  // MTXCOMM_INVALID_USAGE naming both calls instead of waiting for the timeout.
  void enterCall(const CallSignature& call, const std::string& rejectedBecause = "");
  // Waits until every peer has entered this call and checks that it is the same one (a call
  // that moves nothing, count 0). Throws as barrier() does.
  void awaitArrivals(const char* what);
  // Defers the check of this call against its peers, for a call that returns before they
  // have entered it (a broadcast's root waits for nobody, a reader only for its root, a small
  // reduce's non-root for nobody);
  // `checked` names a peer this rank has compared already (a reader, its root's post; -1:
  // none): when it is the only peer, there is nothing to defer. The
  // deferred checks run, without waiting, when this rank enters a call that is not a broadcast,
  // and, waiting for the peer behind the oldest, when that one is kMaxDeferred calls old (or
  // kMaxDeferred are pending); a disagreement found then fails
  // that later call (MTXCOMM_INVALID_USAGE naming both calls) before it moves a byte.
  void deferCheck(int checked);
  static constexpr size_t kMaxDeferred = 64;
  // At destroy: runs the deferred checks still pending, waiting (up to the timeout) for each
  // peer to enter the calls they cover, so that a disagreement the next call would have found
  // is not lost when there is no next call. Throws as that call would have, the message saying
  // it was found at destroy; MTXCOMM_REMOTE_ERROR when a peer left or died before those calls.
  void checkDeferredAtDestroy();
  // Signatures each rank keeps of its last calls: more than the deferred checks plus the
  // furthest a peer can run ahead of this rank (the line boxes' 64 exchanges, the small ring's
  // kSmallSlots messages and two chunks), so a deferred check always finds the peer's entry.
  static constexpr size_t kHistory = 256;
  // Notifications, for event-driven engines over the group (lib/comm, the C API's
  // mtxcomm_comm_notify): notify(cycle) asks every other rank to join cycle `cycle` (the
  // highest asked is kept) and wakes its waiter; wakeup() wakes this rank's waiter (any thread
  // of this process). waitNotify sleeps on a futex until the state differs from seen (taken
  // with notifyState() before the caller checked its own work, so no wakeup is lost) or the
  // deadline, and returns the new state; it throws MTXCOMM_REMOTE_ERROR when, after its first
  // 200 ms of sleep, a peer is found aborted or its process gone without having destroyed its
  // communicator (the next collective names it). notify and waitNotify: the thread that uses
  // the group; notifyState and wakeup: any thread.
  struct NotifyState {
    uint64_t token = 0;  // changes with every wakeup or notification
    uint64_t cycle = 0;  // the highest cycle a peer asked this rank to join
  };
  void notify(uint64_t cycle);
  // idle: nothing of this rank's own waits for a peer (its next collective comes from its own
  // submission, which wakes it through wakeup()). A peer's notify then wakes this rank's waiter
  // only when the notifier's next collective has waited kOwedWakeDelay for it, not when this
  // rank enters that collective first: woken at once, it would find nothing to do and take the
  // core from the framework thread about to submit. The thread that uses the group.
  void setIdle(bool idle);
  // Wakes now the idle peers the last notify left asleep: for a collective that will not wait
  // through this group's waits (an algorithm over the transport), which would never pay them.
  void payOwedWakes();
  NotifyState notifyState() const;
  NotifyState waitNotify(const NotifyState& seen, Clock::time_point deadline);
  void wakeup();
  // enterCycle(cycle): this rank is entering cycle `cycle` (notify implies it); no peer is
  // woken. peersInCycle(cycle): how many other ranks have entered cycle `cycle` or a later one,
  // each of them in (or about to start) that cycle's first collective; with spin, after waiting
  // for all of them up to the waits' spin (kSpinMicros, never sleeping). The thread that uses
  // the group, and any thread.
  void enterCycle(uint64_t cycle);
  int peersInCycle(uint64_t cycle, bool spin) const;

  // Marks this rank aborted with a reason and the error it failed with, for the peers' waits.
  // A peer whose wait finds this rank aborted with MTXCOMM_INVALID_USAGE (a disagreement only
  // some ranks could see, e.g. alltoallv's per-pair counts) fails with MTXCOMM_INVALID_USAGE and
  // this reason too; any other code makes it MTXCOMM_REMOTE_ERROR.
  void abort(const std::string& reason, mtxcomm_result_t code = MTXCOMM_REMOTE_ERROR);
  // The token every wait checks (lib/base/cancel.h): a cancelled communicator's blocked call
  // ends within 50 ms.
  void setCancelToken(CancelTokenPtr token) { cancel_ = std::move(token); }
  // Sets the deadline budget per wait.
  void setTimeout(double seconds) { timeoutSeconds_ = seconds; }
  // The flight recorder's word for the peer the call in progress waits on (lib/comm/
  // flight_recorder.h): a wait that stops spinning stores the peer there. Null: none.
  void setWaitRecord(WaitRecord* record) { waitRecord_ = record; }
  // Whether this rank's process dumps its flight recorder on SIGUSR1 (published to the peers),
  // and a request to the peers' processes that do (another process than this one, still
  // there): after a fault, every rank of the node leaves its record.
  void setDumpsOnSigusr1(bool yes);
  void askPeersToDump() const;

 private:
  struct Control;
  ShmGroup(char* base, size_t bytes, int rank, int size, size_t slotBytes, double timeout);
  inline Control& control(int r) const;  // shm_segment.h
  enum class Counter {
    kLinesRead,
    kArrived,
    kConsumed,
    kPosted,
    kSmallPosted,
    kSmallConsumed,
    kCall
  };
  // Throws MTXCOMM_INVALID_USAGE when peer p is in this rank's call with another signature, or
  // rejected it; nothing when p is not there yet.
  void checkPeerCall(int p) { checkPeerCall(p, call_); }
  // The same for an earlier call of this rank: false when p has not entered it yet.
  bool checkPeerCall(int p, const CallSignature& call);
  // Runs the deferred checks (deferCheck) against the peers that have entered their calls:
  // one word per peer, the digest of its calls up to the newest deferred call it has entered,
  // against this rank's (a difference is then named call by call); then waits for the peer
  // behind the oldest: kNone never, kOverdue until none is overdue (deferredOverdue), kAll
  // until none is pending.
  enum class DeferredWait { kNone, kOverdue, kAll };
  void checkDeferred(DeferredWait wait);
  // Where a disagreement of an earlier call was found, for its message: " (found when this
  // rank entered call #N" or " (found when this rank destroyed the communicator".
  std::string foundWhere() const;
  bool destroying_ = false;  // checkDeferredAtDestroy is running
  WaitRecord* waitRecord_ = nullptr;
  // The oldest deferred check is kMaxDeferred calls old, or kMaxDeferred are pending.
  bool deferredOverdue() const;
  // Waits until peer p's counter reaches target, watching the deadline, aborts and dead
  // processes; then checks that p is in the same call (its words at parity `parity`).
  inline void waitFor(int p, Counter counter, uint64_t target, const char* what, int parity);
  // The wait of waitFor on any word: until word(p) >= target (word(q) is also read for the
  // other peers, to tell a dead peer that had got there from one that had not).
  template <class Word>
  void waitUntil(int p, const Word& word, uint64_t target, const char* what);
  // Line j of rank r's line box for exchange number x (1-based).
  struct Line;
  Line* line(int r, uint64_t x, size_t j) const;
  // Waits until every peer has read this rank's box of exchange x - kLineSlots (usually known).
  void awaitLineBox(uint64_t x);
  // Writes bytes of data, after the call's signature, into this rank's box of exchange x.
  void writeLines(uint64_t x, const void* data, size_t bytes);
  // Waits for peer q's box of exchange x, checks its call, copies its bytes to out.
  void readLines(int q, uint64_t x, void* out, size_t bytes, const char* what);
  void checkSameCall(int p, const CallSignature& theirs) { checkSameCall(p, call_, theirs); }
  void checkSameCall(int p, const CallSignature& mine, const CallSignature& theirs);
  // Whether peer q's process (by the pid it published) is gone or a zombie; never for a peer
  // that is this process (ranks as threads of one process, in tests).
  bool peerProcessGone(int q) const;
  [[noreturn]] void failPeer(int peer, const char* what, bool timedOut);
  // After this rank advanced a counter of c: wakes the peers asleep on it. published: from the
  // thread running this rank's calls, without a fence when every rank's process registered
  // membarrier(2) (asymmetric_); publishedFenced: from any thread.
  inline void published(Control& c);  // shm_wait.h
  inline void publishedFenced(Control& c);
  // Wakes the notify waiter of the rank whose control block is c (no system call when none
  // sleeps).
  void wake(Control& c);
  // The wakes notify left owed to idle peers (setIdle): paid once a wait of this rank has slept
  // kOwedWakeDelay for a peer (or by payOwedWakes), dropped once the collective after the
  // notify is over (every peer entered it) and another starts.
  static constexpr auto kOwedWakeDelay = std::chrono::milliseconds(1);
  std::vector<int> owed_;
  uint64_t owedCall_ = 0;  // the sequence number of the collective they belong to (0: not yet)

  char* base_;
  size_t bytes_;
  int rank_, size_;
  size_t slotBytes_;
  size_t reductionChunkBytes_;
  double timeoutSeconds_;
  uint64_t arrivals_ = 0;
  uint64_t chunks_ = 0;
  uint64_t consumedByAll_ = 0;  // every peer has finished this many chunks (lower bound)
  size_t slotShift_ = 0;        // the current chunk's position in its slots (nextSet)
  inline char* slotStart(int set, int r) const;  // slot(set, r) without the chunk's position
  uint64_t smalls_ = 0;                          // small messages started
  uint64_t smallReadByAll_ = 0;  // every peer has read this many small messages (lower bound)
  uint64_t lines_ = 0;           // line exchanges started
  uint64_t linesReadByAll_ = 0;  // every peer has read this many line exchanges (lower bound)
  std::string rootCause_;        // why a peer failed, when this rank failed because of it
  mtxcomm_result_t rootCode_ = MTXCOMM_REMOTE_ERROR;  // and the code it failed with
  CallSignature call_;
  uint64_t digest_ = 0;  // of this rank's calls so far (Control::digest)
  struct Deferred {
    CallSignature call;
    uint64_t digest;  // this rank's digest after the call
  };
  Deferred deferred_[kMaxDeferred] = {};  // a ring, oldest first
  size_t deferredFirst_ = 0, deferredCount_ = 0;
  std::vector<uint64_t> verified_;  // per peer: the last deferred call checked against it
  CancelTokenPtr cancel_;
  bool oversubscribed_;
  int spinPauses_ = 1;       // the spin of waitUntil, in pauses (pausesFor)
  bool asymmetric_ = false;  // publications need no fence: sleepers issue membarrier(2)
};

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_SHM_SHM_GROUP_H_
