// The shared-memory segment of a ShmGroup (shm_group.h): its layout — a header, one control
// block per rank (ShmGroup::Control), the two chunk sets of data slots, the small-message ring
// and the line boxes — and the address arithmetic every unit of the group uses. For
// transports/shm/*.cc only: the algorithms see ShmGroup's interface alone. Making, mapping and
// sharing the segment: shm_segment.cc.
#ifndef MTXCOMM_TRANSPORTS_SHM_SHM_SEGMENT_H_
#define MTXCOMM_TRANSPORTS_SHM_SHM_SEGMENT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "lib/base/call.h"
#include "lib/base/clock.h"
#include "transports/shm/shm_group.h"

namespace mtxcomm {
namespace shm {

constexpr uint64_t kMagic = 0x6d7478636f6d6d31ull;  // "mtxcomm1"
constexpr size_t kHeaderBytes = 128;
// Bumped when a field of the segment changes meaning without changing a size (layoutDigest).
constexpr uint64_t kLayoutRevision = 2;
constexpr size_t kAlign = 64;

inline size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// h mixed with w (splitmix64's finaliser): layoutDigest and the digests of a rank's calls.
inline uint64_t mixWord(uint64_t h, uint64_t w) {
  h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

// A call signature in the segment: written by its rank before the release store of a counter,
// read by a peer after the acquire load that saw the counter.
struct SharedSignature {
  std::atomic<uint64_t> kind, count, seq;
  void store(const CallSignature& s) {
    kind.store(s.kind, std::memory_order_relaxed);
    count.store(s.count, std::memory_order_relaxed);
    seq.store(s.seq, std::memory_order_relaxed);
  }
  CallSignature load() const {
    CallSignature s;
    s.kind = kind.load(std::memory_order_relaxed);
    s.count = count.load(std::memory_order_relaxed);
    s.seq = seq.load(std::memory_order_relaxed);
    return s;
  }
};

// Collective over t's ranks (all on this node): rank 0 makes a segment of bytes under an
// unguessable name (mode 0600, its pages reserved), every rank maps it, rank 0 unlinks the name
// once all have, and every rank learns the outcome. Returns the mapping (munmap(base, bytes)
// releases it), zero-filled. Throws MTXCOMM_SYSTEM_ERROR on every rank when a rank could not
// make or map it, naming that rank, the size and what /dev/shm has; what the transport throws
// for a peer gone or the deadline. tag: the setup messages'.
char* shareSegment(Transport& t, int tag, size_t bytes, Clock::time_point deadline);

}  // namespace shm

// Each group of fields starts a cache line of its own, grouped by when they are written: a
// barrier's arrival and call, the chunk counters, the small-message ring, the futex word that
// every publication bumps, the engine's notifications, the call history, and the cold rest. A
// peer polling one group then never pulls a line that this rank is rewriting for another step
// of the call (false sharing cost a cross-core transfer per publication).
struct alignas(128) ShmGroup::Control {
  alignas(64) std::atomic<uint64_t> arrived;   // barriers this rank has arrived at
  shm::SharedSignature call[2];                // the call of barrier k, at k % 2
  alignas(64) std::atomic<uint64_t> consumed;  // chunks this rank has finished
  std::atomic<uint64_t> posted;                // pieces of chunks published (postPieces)
  shm::SharedSignature postCall[2];            // the call of posted chunk g, at g % 2
  alignas(64) std::atomic<uint64_t> smallPosted, smallConsumed;
  std::atomic<uint64_t> linesRead;  // line exchanges whose peers' lines this rank has read
  shm::SharedSignature smallCall[ShmGroup::kSmallSlots];  // the call of small message i
  alignas(64) std::atomic<uint32_t> progress;  // futex word: bumped whenever a counter advances
  std::atomic<uint32_t> sleepers;  // peers asleep on progress (the waker skips the system call
                                   // when there are none)
  alignas(64) std::atomic<uint32_t> wakeSeq;  // futex word: bumped to wake this rank's notify
                                              // waiter
  std::atomic<uint32_t> notifyWaiters;        // threads asleep on wakeSeq (0: no system call)
  std::atomic<uint64_t> notifyCycle;          // the highest cycle a peer asked this rank to join
  std::atomic<uint32_t> notifyIdle;    // nothing of its own waits for a peer: a notify may wake it
                                       // late (ShmGroup::setIdle)
  std::atomic<uint64_t> enteredCycle;  // the highest cycle this rank entered (enterCycle)
  // The calls this rank entered (ShmGroup::enterCall): the latest one's sequence number, and
  // the last kHistory signatures (call s at s % kHistory), each with whether this rank
  // rejected it; written before the release store of callSeq.
  alignas(64) std::atomic<uint64_t> callSeq;
  shm::SharedSignature history[kHistory];
  std::atomic<uint64_t> rejected[kHistory];
  // The digest of this rank's calls 1..s (callDigest), at s % kHistory: a deferred check
  // compares one word for all the calls it covers (ShmGroup::checkDeferred).
  std::atomic<uint64_t> digest[kHistory];
  alignas(64) std::atomic<int64_t> pid;
  std::atomic<int> aborted;
  std::atomic<int> abortCode;       // the mtxcomm_result_t it failed with, written before aborted
  std::atomic<int> left;            // destroyed its communicator (the process may live on)
  std::atomic<int> membarrier;      // its process registered membarrier's global expedited barrier
  std::atomic<int> dumpsOnSigusr1;  // its process dumps its flight recorder on SIGUSR1
  char rejectReason[256];
  char reason[1024];
};

namespace shm {

// The line boxes: per rank kLineSlots boxes of kLinesPerBox lines, past the small ring. A box
// holds the call's signature (24 bytes) and up to kLineBytes of data, 56 bytes per line.
constexpr size_t kLineData = 56;
constexpr size_t kLineHeader = 3 * sizeof(uint64_t);
constexpr size_t kLinesPerBox = (kLineHeader + ShmGroup::kLineBytes + kLineData - 1) / kLineData;

}  // namespace shm

struct alignas(64) ShmGroup::Line {
  std::atomic<uint64_t> tag;  // the exchange this line's data belongs to (0: none yet)
  unsigned char data[shm::kLineData];
};

inline ShmGroup::Control& ShmGroup::control(int r) const {
  return reinterpret_cast<Control*>(base_ + shm::kHeaderBytes)[r];
}

inline char* ShmGroup::slotStart(int set, int r) const {
  char* data = base_ + shm::kHeaderBytes + shm::roundUp(sizeof(Control) * size_, shm::kAlign);
  return data + (static_cast<size_t>(set) * size_ + r) * shm::roundUp(slotBytes_, shm::kAlign);
}

}  // namespace mtxcomm

#endif  // MTXCOMM_TRANSPORTS_SHM_SHM_SEGMENT_H_
