#include "transports/shm/shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/liveness.h"
#include "lib/base/membarrier.h"
#include "lib/base/spin.h"

namespace mtxcomm {

namespace {
constexpr uint64_t kMagic = 0x6d7478636f6d6d31ull;  // "mtxcomm1"
constexpr size_t kHeaderBytes = 128;
// Bumped when a field of the segment changes meaning without changing a size (layoutDigest).
constexpr uint64_t kLayoutRevision = 2;
constexpr size_t kMsgBytes = 512;  // setup messages: a segment name or an error
constexpr size_t kAlign = 64;
constexpr int kOversubscribedYields = 20000;  // see waitFor
// The spin of a wait before it sleeps (waitUntil) is kSpinMicros (lib/base/spin.h), a time: a
// rank's TensorFlow thread shares its core with the waiting engine thread, and the MLP's step at
// np=2 took 2% longer with a 60 us spin and 4% with 110 us (bench/RESULTS.md), while a wait
// that ends within the spin needs no futex wake. With more ranks than cores, this:
constexpr double kOversubscribedSpinMicros = 0.5;

size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

std::string randomName() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t r = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (r < 0 && errno != EINTR) fail(MTXCOMM_SYSTEM_ERROR, "getrandom: ", std::strerror(errno));
    if (r > 0) got += static_cast<size_t>(r);
  }
  std::string name = "/mtxcomm-";
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    name += hex;
  }
  return name;
}

// Maps fd read-write and shared; returns "" or why not.
std::string mapShared(int fd, size_t bytes, char** base) {
  // MAP_POPULATE: map every page now, so no collective pays a first-touch fault later.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return strCat("mmap of ", bytes, " bytes: ", std::strerror(errno));
  *base = static_cast<char*>(p);
  return "";
}

// Creates, sizes and maps the segment; returns "" and the mapping, or an error message.
std::string createSegment(const std::string& name, size_t bytes, char** base) {
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) {
    const unsigned long long avail = static_cast<unsigned long long>(vfs.f_bavail) *
                                     static_cast<unsigned long long>(vfs.f_frsize);
    if (avail < bytes) {
      return strCat("/dev/shm has ", avail, " bytes free but the shared-memory segment needs ",
                    bytes, " bytes (enlarge /dev/shm, e.g. docker --shm-size, or lower ",
                    "MTXCOMM_SHM_SLOT_BYTES, or set MTXCOMM_SHM=off)");
    }
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return strCat("shm_open(", name, "): ", std::strerror(errno));
  std::string err;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    err = strCat("ftruncate of the shared-memory segment to ", bytes,
                 " bytes: ", std::strerror(errno));
  } else if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    err = strCat("/dev/shm cannot hold the shared-memory segment of ", bytes,
                 " bytes (posix_fallocate: ", std::strerror(rc),
                 "); enlarge /dev/shm, lower MTXCOMM_SHM_SLOT_BYTES or set MTXCOMM_SHM=off");
  } else {
    err = mapShared(fd, bytes, base);
  }
  close(fd);
  if (!err.empty()) shm_unlink(name.c_str());
  return err;
}

std::string attachSegment(const std::string& name, size_t bytes, char** base) {
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return strCat("shm_open(", name, ") to attach: ", std::strerror(errno));
  struct stat st {};
  std::string err;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    err =
        strCat("the shared-memory segment ", name, " has ", st.st_size, " bytes, expected ", bytes);
  } else {
    err = mapShared(fd, bytes, base);
  }
  close(fd);
  return err;
}

// Setup messages over the point-to-point transport.
void sendMsg(Transport& t, int peer, int tag, const std::string& s, Clock::time_point deadline) {
  std::vector<char> buf(kMsgBytes, 0);
  std::memcpy(buf.data(), s.data(), std::min(s.size(), kMsgBytes - 1));
  std::vector<RequestPtr> reqs;
  reqs.push_back(t.isend(peer, tag, buf.data(), kMsgBytes));
  t.waitAll(reqs, deadline);
}

std::string recvMsg(Transport& t, int peer, int tag, Clock::time_point deadline) {
  std::vector<char> buf(kMsgBytes, 0);
  std::vector<RequestPtr> reqs;
  reqs.push_back(t.irecv(peer, tag, buf.data(), kMsgBytes));
  t.waitAll(reqs, deadline);
  buf[kMsgBytes - 1] = 0;
  return std::string(buf.data());
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

}  // namespace

// Each group of fields starts a cache line of its own, grouped by when they are written: a
// barrier's arrival and call, the chunk counters, the small-message ring, the futex word that
// every publication bumps, the engine's notifications, the call history, and the cold rest. A
// peer polling one group then never pulls a line that this rank is rewriting for another step
// of the call (false sharing cost a cross-core transfer per publication).
struct alignas(128) ShmGroup::Control {
  alignas(64) std::atomic<uint64_t> arrived;   // barriers this rank has arrived at
  SharedSignature call[2];                     // the call of barrier k, at k % 2
  alignas(64) std::atomic<uint64_t> consumed;  // chunks this rank has finished
  std::atomic<uint64_t> posted;                // pieces of chunks published (postPieces)
  SharedSignature postCall[2];                 // the call of posted chunk g, at g % 2
  alignas(64) std::atomic<uint64_t> smallPosted, smallConsumed;
  std::atomic<uint64_t> linesRead;  // line exchanges whose peers' lines this rank has read
  SharedSignature smallCall[ShmGroup::kSmallSlots];  // the call of small message i
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
  SharedSignature history[kHistory];
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

// The line boxes: per rank kLineSlots boxes of kLinesPerBox lines, past the small ring. A box
// holds the call's signature (24 bytes) and up to kLineBytes of data, 56 bytes per line.
constexpr size_t kLineData = 56;
constexpr size_t kLineHeader = 3 * sizeof(uint64_t);
constexpr size_t kLinesPerBox = (kLineHeader + ShmGroup::kLineBytes + kLineData - 1) / kLineData;

struct alignas(64) ShmGroup::Line {
  std::atomic<uint64_t> tag;  // the exchange this line's data belongs to (0: none yet)
  unsigned char data[kLineData];
};

size_t ShmGroup::segmentBytes(int n, size_t slotBytes) {
  return kHeaderBytes + roundUp(sizeof(Control) * n, kAlign) +
         2 * static_cast<size_t>(n) * roundUp(slotBytes, kAlign) +
         static_cast<size_t>(n) * kSmallSlots * kSmallBytes +
         static_cast<size_t>(n) * kLineSlots * kLinesPerBox * sizeof(Line);
}

std::unique_ptr<ShmGroup> ShmGroup::create(Transport& t, int tag, size_t slotBytes,
                                           double timeoutSeconds) {
  const int n = t.size(), me = t.rank();
  const size_t bytes = segmentBytes(n, slotBytes);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeoutSeconds));
  char* base = nullptr;
  std::string name, err;
  // Whatever happens below (a peer that dies or times out during setup), the name never
  // outlives this call and the mapping is released.
  struct Cleanup {
    const std::string& name;
    char*& base;
    size_t bytes;
    bool owner, done = false;
    ~Cleanup() {
      if (done) return;
      if (owner && !name.empty()) shm_unlink(name.c_str());
      if (base) munmap(base, bytes);
    }
  } cleanup{name, base, bytes, me == 0};
  if (me == 0) {
    name = randomName();
    err = createSegment(name, bytes, &base);
    for (int p = 1; p < n; ++p) sendMsg(t, p, tag, err.empty() ? name : "!" + err, deadline);
  } else {
    std::string msg = recvMsg(t, 0, tag, deadline);
    if (!msg.empty() && msg[0] == '!') {
      err = msg.substr(1);
    } else {
      name = msg;
      err = attachSegment(name, bytes, &base);
    }
  }
  // Rank 0 learns every rank's outcome, unlinks the name (everyone who will map it has), and
  // tells all the verdict, so that every rank fails or succeeds together.
  std::string verdict;
  if (me == 0) {
    verdict = err;
    for (int p = 1; p < n; ++p) {
      std::string e = recvMsg(t, p, tag, deadline);
      if (verdict.empty() && !e.empty()) verdict = strCat("rank ", p, ": ", e);
    }
    if (!name.empty() && err.empty()) shm_unlink(name.c_str());
    for (int p = 1; p < n; ++p) sendMsg(t, p, tag, verdict, deadline);
  } else {
    sendMsg(t, 0, tag, err, deadline);
    verdict = recvMsg(t, 0, tag, deadline);
  }
  if (!verdict.empty()) fail(MTXCOMM_SYSTEM_ERROR, "shared-memory setup failed: ", verdict);
  cleanup.done = true;
  auto group =
      std::unique_ptr<ShmGroup>(new ShmGroup(base, bytes, me, n, slotBytes, timeoutSeconds));
  if (me == 0) {
    auto* h = reinterpret_cast<uint64_t*>(base);
    h[0] = kMagic;
    h[1] = static_cast<uint64_t>(n);
  }
  group->control(me).pid.store(getpid(), std::memory_order_relaxed);
  group->control(me).membarrier.store(registerGlobalMembarrier() ? 1 : 0,
                                      std::memory_order_relaxed);
  // The first barrier publishes every pid before any wait could look at it (and, fenced, the
  // membarrier flags: every rank then agrees whether publications may go without a fence).
  group->barrier("shared-memory setup");
  group->asymmetric_ = true;
  for (int q = 0; q < n; ++q) {
    if (!group->control(q).membarrier.load(std::memory_order_relaxed)) group->asymmetric_ = false;
  }
  return group;
}

ShmGroup::ShmGroup(char* base, size_t bytes, int rank, int size, size_t slotBytes, double timeout)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      slotBytes_(slotBytes),
      reductionChunkBytes_(slotBytes),
      timeoutSeconds_(timeout) {
  const unsigned cores = std::thread::hardware_concurrency();
  oversubscribed_ = cores > 0 && static_cast<unsigned>(size) > cores;
  spinPauses_ = pausesFor(oversubscribed_ ? kOversubscribedSpinMicros : kSpinMicros);
}

ShmGroup::~ShmGroup() {
  if (!base_) return;
  // Peers still waiting for this rank in a later call fail at once instead of at the timeout.
  Control& mine = control(rank_);
  mine.left.store(1, std::memory_order_release);
  publishedFenced(mine);
  munmap(base_, bytes_);
}

namespace {

// The digest of a rank's calls up to this one: the previous digest mixed with the call's
// signature and whether the rank rejected it (splitmix64's finaliser, twice). Equal digests
// at call s mean equal calls 1..s but with a chance of 2^-64.
uint64_t mixWord(uint64_t h, uint64_t w) {
  h ^= w + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}
uint64_t callDigest(uint64_t previous, const CallSignature& call, bool rejected) {
  const uint64_t count = (call.count << 17) | (call.count >> 47);  // apart from kind's bits
  return mixWord(mixWord(previous, call.kind ^ count), call.seq * 2 + (rejected ? 1 : 0));
}

}  // namespace

uint32_t ShmGroup::layoutDigest() {
  uint64_t h = 0;
  for (uint64_t w :
       {uint64_t{sizeof(Control)}, uint64_t{alignof(Control)}, uint64_t{sizeof(Line)},
        uint64_t{kHeaderBytes}, uint64_t{kSmallSlots}, uint64_t{kSmallBytes}, uint64_t{kLineSlots},
        uint64_t{kLinesPerBox}, uint64_t{kHistory}, uint64_t{kLayoutRevision}}) {
    h = mixWord(h, w);
  }
  return static_cast<uint32_t>(h ^ (h >> 32));
}

void ShmGroup::enterCall(const CallSignature& call, const std::string& rejectedBecause) {
  call_ = call;
  // The owed wakes belong to the first collective after the notify; once a later one starts,
  // every peer has entered that one: none sleeps on it any more.
  if (!owed_.empty()) {
    if (owedCall_ == 0) {
      owedCall_ = call.seq;
    } else if (call.seq != owedCall_) {
      owed_.clear();
    }
  }
  Control& mine = control(rank_);
  const size_t h = call.seq % kHistory;
  mine.history[h].store(call);
  if (!rejectedBecause.empty()) {
    std::snprintf(mine.rejectReason, sizeof(mine.rejectReason), "%s", rejectedBecause.c_str());
  }
  mine.rejected[h].store(rejectedBecause.empty() ? 0 : 1, std::memory_order_relaxed);
  digest_ = callDigest(digest_, call, !rejectedBecause.empty());
  mine.digest[h].store(digest_, std::memory_order_relaxed);
  mine.callSeq.store(call.seq, std::memory_order_release);
  if (!rejectedBecause.empty()) {
    published(mine);  // a waiter on this rank learns it at once
    return;           // the call fails anyway: its own reason is the one to give
  }
  // A broadcast runs the deferred checks only when the oldest is kMaxDeferred calls old (with
  // this rank a reader of its only peer in between, fewer than kMaxDeferred are pending then),
  // so a loop of broadcasts touches a peer's lines at most once per kMaxDeferred calls; any
  // other call (a small reduce too, whose non-roots defer theirs: ranks that each named another
  // root hear of it at their next reduce) checks what it can, waiting for none.
  if (deferredCount_ == 0) return;
  const bool broadcast = static_cast<Collective>(call.kind & 0xff) == Collective::kBroadcast;
  if (!broadcast || deferredOverdue()) {
    checkDeferred(broadcast ? DeferredWait::kOverdue : DeferredWait::kNone);
  }
}

void ShmGroup::checkDeferredAtDestroy() {
  if (deferredCount_ == 0) return;
  destroying_ = true;
  checkDeferred(DeferredWait::kAll);
  destroying_ = false;
}

std::string ShmGroup::foundWhere() const {
  return destroying_ ? std::string(" (found when this rank destroyed the communicator")
                     : strCat(" (found when this rank entered call #", call_.seq);
}

void ShmGroup::deferCheck(int checked) {
  // Nothing to defer when the only peer was compared already (a reader of two ranks).
  if (size_ == 1 || (size_ == 2 && checked >= 0 && checked != rank_)) return;
  if (verified_.empty()) verified_.assign(static_cast<size_t>(size_), 0);
  deferred_[(deferredFirst_ + deferredCount_) % kMaxDeferred] = Deferred{call_, digest_};
  ++deferredCount_;
}

bool ShmGroup::deferredOverdue() const {
  return deferredCount_ > 0 && (deferredCount_ >= kMaxDeferred ||
                                call_.seq - deferred_[deferredFirst_].call.seq >= kMaxDeferred);
}

void ShmGroup::checkDeferred(DeferredWait wait) {
  while (deferredCount_ > 0) {
    auto at = [this](size_t i) -> const Deferred& {
      return deferred_[(deferredFirst_ + i) % kMaxDeferred];
    };
    uint64_t least = UINT64_MAX;  // every peer's calls agree with this rank's up to here
    int lagging = -1;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const Control& c = control(p);
      const uint64_t theirs = c.callSeq.load(std::memory_order_acquire);
      // The newest deferred call p has entered and that is not yet checked against it.
      size_t i = deferredCount_;
      while (i > 0 && at(i - 1).call.seq > theirs) --i;
      if (i > 0 && at(i - 1).call.seq > verified_[p]) {
        const Deferred& d = at(i - 1);
        const uint64_t digest = c.digest[d.call.seq % kHistory].load(std::memory_order_relaxed);
        // The entry is d's only if p has not moved kHistory calls on meanwhile (never: a peer
        // runs at most a ring of small messages ahead).
        const bool current = c.callSeq.load(std::memory_order_acquire) - d.call.seq < kHistory;
        if (current && digest != d.digest) {
          // Some call up to d differs: name the first deferred one that does.
          for (size_t j = 0; j < i; ++j) {
            if (at(j).call.seq > verified_[p]) checkPeerCall(p, at(j).call);
          }
          fail(MTXCOMM_INVALID_USAGE, "the ranks disagree on a call up to call #", d.call.seq, " (",
               describeCall(d.call), "): peer rank ", p, "'s calls differ from this rank's",
               foundWhere(), ")");
        }
        verified_[p] = d.call.seq;
      }
      if (verified_[p] < least) {
        least = verified_[p];
        lagging = p;
      }
    }
    while (deferredCount_ > 0 && at(0).call.seq <= least) {
      deferredFirst_ = (deferredFirst_ + 1) % kMaxDeferred;
      --deferredCount_;
    }
    if (deferredCount_ == 0 || wait == DeferredWait::kNone ||
        (wait == DeferredWait::kOverdue && !deferredOverdue())) {
      return;
    }
    // Wait for the peer that has not entered the oldest deferred call yet.
    waitFor(lagging, Counter::kCall, at(0).call.seq,
            destroying_ ? "destroy's check of an earlier call" : "a call's deferred check", -1);
  }
}

bool ShmGroup::checkPeerCall(int p, const CallSignature& call) {
  if (call.seq == 0) return true;
  Control& c = control(p);
  const uint64_t theirs = c.callSeq.load(std::memory_order_acquire);
  if (theirs < call.seq) return false;             // not there yet
  if (theirs - call.seq >= kHistory) return true;  // too far on (never, for a deferred check)
  const size_t h = call.seq % kHistory;
  const CallSignature sig = c.history[h].load();
  const bool rejected = c.rejected[h].load(std::memory_order_relaxed) != 0;
  // Re-read: the entry is ours only if the peer has not moved kHistory calls on meanwhile.
  if (c.callSeq.load(std::memory_order_acquire) - call.seq >= kHistory || sig.seq != call.seq) {
    return true;
  }
  if (rejected) {
    fail(MTXCOMM_INVALID_USAGE, "peer rank ", p, " rejected ",
         call.seq == call_.seq ? std::string("this call") : strCat("call #", call.seq), " (",
         describeCall(sig),
         "): ", std::string(c.rejectReason, strnlen(c.rejectReason, sizeof(c.rejectReason))));
  }
  checkSameCall(p, call, sig);
  return true;
}

void ShmGroup::awaitArrivals(const char* what) {
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    waitFor(q, Counter::kCall, call_.seq, what, -1);
    checkPeerCall(q);
  }
}

ShmGroup::Control& ShmGroup::control(int r) const {
  return reinterpret_cast<Control*>(base_ + kHeaderBytes)[r];
}

char* ShmGroup::slotStart(int set, int r) const {
  char* data = base_ + kHeaderBytes + roundUp(sizeof(Control) * size_, kAlign);
  return data + (static_cast<size_t>(set) * size_ + r) * roundUp(slotBytes_, kAlign);
}

char* ShmGroup::slot(int set, int r) const { return slotStart(set, r) + slotShift_; }

namespace {

// The futex word is in memory shared between processes: no FUTEX_PRIVATE_FLAG.
void futexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, Clock::duration left) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

}  // namespace

void ShmGroup::published(Control& c) {
  if (!asymmetric_) {
    publishedFenced(c);
    return;
  }
  // No fence: the sleeper's membarrier (waitUntil) orders this rank's stores before its load
  // of sleepers. A locked instruction here made every publication wait until the lines just
  // written had left this core (their readers' copies invalidated): one cross-core round trip
  // per call, 35-130 ns on the Zen 4 guest, where the stores otherwise drain while the caller
  // goes on. Only the thread running this rank's calls publishes here (abort and destroy use
  // publishedFenced), so the increment needs no atomic read-modify-write.
  c.progress.store(c.progress.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_relaxed) > 0) futexWake(&c.progress);
}

void ShmGroup::publishedFenced(Control& c) {
  // seq_cst with the sleeper's increment of sleepers and its load of progress (waitFor): either
  // this sees the sleeper, or the sleeper sees the new progress value and does not sleep.
  c.progress.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) > 0) futexWake(&c.progress);
}

void ShmGroup::notify(uint64_t cycle) {
  owed_.clear();
  enterCycle(cycle);  // first: a peer that sees the request also sees this rank in the cycle
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Control& c = control(q);
    uint64_t old = c.notifyCycle.load(std::memory_order_relaxed);
    while (old < cycle &&
           !c.notifyCycle.compare_exchange_weak(old, cycle, std::memory_order_seq_cst)) {
    }
    // seq_cst with the peer's store of notifyIdle and its load of notifyCycle (setIdle, then
    // notifyState): either this sees it no longer idle, or it sees the new cycle and does not
    // sleep. A wrong guess costs only time: the owed wake is paid once this rank's next wait
    // has slept kOwedWakeDelay.
    if (c.notifyIdle.load(std::memory_order_seq_cst) != 0) {
      owed_.push_back(q);
      continue;
    }
    wake(c);
  }
  owedCall_ = 0;  // the next collective entered (the engine's exchange)
}

void ShmGroup::wake(Control& c) {
  // seq_cst with the waiter's increment of notifyWaiters and the futex's compare of wakeSeq
  // (waitNotify): either this sees the waiter, or the waiter sees the new token and does not
  // sleep. A busy peer (in its cycle) costs no system call.
  c.wakeSeq.fetch_add(1, std::memory_order_seq_cst);
  if (c.notifyWaiters.load(std::memory_order_seq_cst) > 0) futexWake(&c.wakeSeq);
}

void ShmGroup::payOwedWakes() {
  for (int q : owed_) wake(control(q));
  owed_.clear();
}

void ShmGroup::setIdle(bool idle) {
  control(rank_).notifyIdle.store(idle ? 1 : 0, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // before the caller's notifyState
}

ShmGroup::NotifyState ShmGroup::notifyState() const {
  Control& c = control(rank_);
  NotifyState st;
  st.token = c.wakeSeq.load(std::memory_order_acquire);
  st.cycle = c.notifyCycle.load(std::memory_order_acquire);
  return st;
}

ShmGroup::NotifyState ShmGroup::waitNotify(const NotifyState& seen, Clock::time_point deadline) {
  Control& c = control(rank_);
  // A peer that dies or aborts while this rank sleeps here sends no notification: every
  // kIdleCheck of sleep, look for one, so that an engine waiting for a peer's submission (which
  // will never come) runs its next exchange and fails naming that peer, instead of sleeping
  // until its stall timeout. The first slice checks nothing: a busy engine pays no system call.
  constexpr auto kIdleCheck = std::chrono::milliseconds(200);
  for (bool slept = false;; slept = true) {
    if (cancel_) cancel_->check();  // destroy or abort from another thread (Comm::cancel wakes)
    const NotifyState now = notifyState();
    if (now.token != seen.token || now.cycle != seen.cycle) return now;
    if (slept) {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        Control& cq = control(q);
        if (cq.aborted.load(std::memory_order_acquire)) {
          fail(MTXCOMM_REMOTE_ERROR, "peer rank ", q,
               " aborted while this rank was idle: ", cq.reason);
        }
        // A peer that destroyed its communicator first (an orderly exit) is not a dead one.
        if (!cq.left.load(std::memory_order_acquire) && peerProcessGone(q)) {
          fail(MTXCOMM_REMOTE_ERROR, "peer rank ", q, " (pid ", cq.pid.load(),
               ", on this node) has exited while this rank was idle");
        }
      }
    }
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) return now;
    c.notifyWaiters.fetch_add(1, std::memory_order_seq_cst);
    futexWait(&c.wakeSeq, static_cast<uint32_t>(seen.token),
              std::min<Clock::duration>(left, kIdleCheck));
    c.notifyWaiters.fetch_sub(1, std::memory_order_relaxed);
  }
}

void ShmGroup::wakeup() { wake(control(rank_)); }

void ShmGroup::enterCycle(uint64_t cycle) {
  std::atomic<uint64_t>& entered = control(rank_).enteredCycle;
  if (entered.load(std::memory_order_relaxed) < cycle) {
    entered.store(cycle, std::memory_order_release);
  }
}

int ShmGroup::peersInCycle(uint64_t cycle, bool spin) const {
  auto count = [&] {
    int n = 0;
    for (int q = 0; q < size_; ++q) {
      if (q != rank_ && control(q).enteredCycle.load(std::memory_order_acquire) >= cycle) ++n;
    }
    return n;
  };
  int n = count();
  if (spin && n < size_ - 1) spinUntil(spinPauses_, [&] { return (n = count()) == size_ - 1; });
  return n;
}

void ShmGroup::abort(const std::string& reason, mtxcomm_result_t code) {
  Control& c = control(rank_);
  // The first abort's reason stands: a later one (the application aborting after the error it
  // was given) must not hide the root cause from peers that have not read it yet.
  if (c.aborted.load(std::memory_order_acquire)) return;
  // Peers learn the root cause: if this rank failed because another one did, pass that on
  // rather than a message nesting every hop.
  std::snprintf(c.reason, sizeof(c.reason), "%s",
                rootCause_.empty() ? reason.c_str() : rootCause_.c_str());
  c.abortCode.store(rootCause_.empty() ? code : rootCode_, std::memory_order_relaxed);
  c.aborted.store(1, std::memory_order_release);
  publishedFenced(c);  // maybe from another thread than the one running this rank's calls
}

bool ShmGroup::peerProcessGone(int q) const {
  const pid_t pid = static_cast<pid_t>(control(q).pid.load(std::memory_order_relaxed));
  const pid_t self = static_cast<pid_t>(control(rank_).pid.load(std::memory_order_relaxed));
  return pid > 0 && pid != self && processGone(pid);
}

void ShmGroup::failPeer(int peer, const char* what, bool timedOut) {
  if (timedOut) {
    fail(MTXCOMM_TIMEOUT, "timed out after ", timeoutSeconds_, " s in ", what,
         " waiting for peer rank ", peer, " (shared memory)");
  }
  Control& c = control(peer);
  if (c.aborted.load(std::memory_order_acquire)) {
    // A peer that saw a disagreement on this call first aborts; this rank names the
    // disagreement too (MTXCOMM_INVALID_USAGE), not the abort it caused.
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) checkPeerCall(q);
    }
    // A disagreement only the aborting peer could see (alltoallv's per-pair counts are not in
    // the call signature) is this rank's invalid usage too: the code travels with the reason.
    rootCause_ = c.reason;
    rootCode_ = c.abortCode.load(std::memory_order_relaxed) == MTXCOMM_INVALID_USAGE
                    ? MTXCOMM_INVALID_USAGE
                    : MTXCOMM_REMOTE_ERROR;
    fail(rootCode_, "peer rank ", peer, " aborted: ", c.reason, " (while this rank ", "was in ",
         what, ")");
  }
  if (c.left.load(std::memory_order_acquire)) {
    rootCause_ = strCat("rank ", peer, " destroyed its communicator after call #",
                        c.callSeq.load(std::memory_order_acquire));
    fail(MTXCOMM_REMOTE_ERROR, "peer ", rootCause_, " while this rank was in ", what, " (call #",
         call_.seq, ")");
  }
  rootCause_ = strCat("rank ", peer, " (pid ", c.pid.load(), ", on this node) has exited");
  fail(MTXCOMM_REMOTE_ERROR, "peer ", rootCause_, " while this rank was in ", what,
       " (shared memory)");
}

char* ShmGroup::smallSlot(int r) const {
  char* ring = slotStart(2, 0);  // just past the two chunk sets
  const uint64_t i = smalls_ - 1;
  return ring + (static_cast<size_t>(r) * kSmallSlots + i % kSmallSlots) * kSmallBytes;
}

char* ShmGroup::beginSmall(bool writer) {
  const uint64_t i = smalls_++;
  // Only the writer rewrites a slot, so only it must know that every reader is done with the
  // message kSmallSlots back. It remembers how far all readers had got when it last looked,
  // so most calls touch no peer's cache line at all.
  if (writer && i >= kSmallSlots && i - kSmallSlots + 1 > smallReadByAll_) {
    uint64_t least = UINT64_MAX;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      waitFor(q, Counter::kSmallConsumed, i - kSmallSlots + 1, "reusing a small slot", -1);
      least = std::min(least, control(q).smallConsumed.load(std::memory_order_acquire));
    }
    smallReadByAll_ = least;
  }
  return smallSlot(rank_);
}

void ShmGroup::postSmall() {
  Control& mine = control(rank_);
  const uint64_t i = smalls_ - 1;
  mine.smallCall[i % kSmallSlots].store(call_);
  mine.smallPosted.store(smalls_, std::memory_order_release);
  published(mine);
}

void ShmGroup::waitSmall(int root, const char* what) {
  waitFor(root, Counter::kSmallPosted, smalls_, what, -1);
  checkSameCall(root, control(root).smallCall[(smalls_ - 1) % kSmallSlots].load());
}

void ShmGroup::finishSmall() {
  control(rank_).smallConsumed.store(smalls_, std::memory_order_release);
  published(control(rank_));
}

ShmGroup::Line* ShmGroup::line(int r, uint64_t x, size_t j) const {
  static_assert(sizeof(Line) == 64, "a line is one cache line");
  char* boxes = slotStart(2, 0) + static_cast<size_t>(size_) * kSmallSlots * kSmallBytes;
  const size_t box = static_cast<size_t>(r) * kLineSlots + (x - 1) % kLineSlots;
  return reinterpret_cast<Line*>(boxes) + box * kLinesPerBox + j;
}

void ShmGroup::awaitLineBox(uint64_t x) {
  // This rank's box for exchange x was last used by x - kLineSlots: every peer must have read
  // it.
  if (x <= kLineSlots || x - kLineSlots <= linesReadByAll_) return;
  uint64_t least = UINT64_MAX;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    waitFor(q, Counter::kLinesRead, x - kLineSlots, "reusing a line box", -1);
    least = std::min(least, control(q).linesRead.load(std::memory_order_acquire));
  }
  linesReadByAll_ = least;
}

void ShmGroup::writeLines(uint64_t x, const void* data, size_t bytes) {
  unsigned char stream[kLinesPerBox * kLineData];
  const uint64_t header[3] = {call_.kind, call_.count, call_.seq};
  std::memcpy(stream, header, kLineHeader);
  std::memcpy(stream + kLineHeader, data, bytes);
  const size_t lines = (kLineHeader + bytes + kLineData - 1) / kLineData;
  std::memset(stream + kLineHeader + bytes, 0, lines * kLineData - kLineHeader - bytes);
  for (size_t j = 0; j < lines; ++j) {
    Line* l = line(rank_, x, j);
    std::memcpy(l->data, stream + j * kLineData, kLineData);
    l->tag.store(x, std::memory_order_release);
  }
}

void ShmGroup::readLines(int q, uint64_t x, void* out, size_t bytes, const char* what) {
  unsigned char stream[kLinesPerBox * kLineData];
  const size_t lines = (kLineHeader + bytes + kLineData - 1) / kLineData;
  for (size_t j = 0; j < lines; ++j) {
    auto tag = [this, x, j](int r) { return line(r, x, j)->tag.load(std::memory_order_acquire); };
    waitUntil(q, tag, x, what);
    std::memcpy(stream + j * kLineData, line(q, x, j)->data, kLineData);
    if (j == 0) {
      uint64_t theirs[3];
      std::memcpy(theirs, stream, kLineHeader);
      CallSignature sig;
      sig.kind = theirs[0];
      sig.count = theirs[1];
      sig.seq = theirs[2];
      checkSameCall(q, sig);
    }
  }
  std::memcpy(out, stream + kLineHeader, bytes);
}

void ShmGroup::exchangeLines(const void* mine, size_t bytes, char* all, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "exchangeLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  awaitLineBox(x);
  writeLines(x, mine, bytes);
  published(control(rank_));
  char* own = all + static_cast<size_t>(rank_) * bytes;
  if (own != mine) std::memcpy(own, mine, bytes);  // in place: already there
  for (int i = 1; i < size_; ++i) {
    const int q = (rank_ + i) % size_;
    readLines(q, x, all + static_cast<size_t>(q) * bytes, bytes, what);
  }
  control(rank_).linesRead.store(x, std::memory_order_release);
  published(control(rank_));
}

void ShmGroup::broadcastLines(int root, void* buf, size_t bytes, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "broadcastLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  Control& mine = control(rank_);
  if (rank_ == root) {
    awaitLineBox(x);
    mine.linesRead.store(x, std::memory_order_release);  // nothing of x to read
    writeLines(x, buf, bytes);
  } else {
    readLines(root, x, buf, bytes, what);
    mine.linesRead.store(x, std::memory_order_release);
  }
  published(mine);
}

void ShmGroup::gatherLines(int root, const void* mine, size_t bytes, char* all, const char* what) {
  if (bytes > kLineBytes) fail(MTXCOMM_INTERNAL_ERROR, "gatherLines of ", bytes, " bytes");
  const uint64_t x = ++lines_;
  Control& me = control(rank_);
  if (rank_ != root) {
    awaitLineBox(x);
    me.linesRead.store(x, std::memory_order_release);  // nothing of x to read
    writeLines(x, mine, bytes);
  } else {
    char* own = all + static_cast<size_t>(rank_) * bytes;
    if (own != mine) std::memcpy(own, mine, bytes);
    for (int i = 1; i < size_; ++i) {
      const int q = (rank_ + i) % size_;
      readLines(q, x, all + static_cast<size_t>(q) * bytes, bytes, what);
    }
    me.linesRead.store(x, std::memory_order_release);
  }
  published(me);
}

int ShmGroup::nextSet(size_t bytes, size_t minPositions) {
  const uint64_t g = chunks_++;
  // The set's (g / 2)-th chunk takes position (g / 2) mod positions.
  constexpr size_t kPositionBytes = 4096;
  const size_t span =
      std::max<size_t>(1, (bytes + kPositionBytes - 1) / kPositionBytes) * kPositionBytes;
  const size_t positions = bytes > 0 ? slotBytes_ / span : 0;
  slotShift_ = positions >= std::max<size_t>(2, minPositions)
                   ? static_cast<size_t>((g >> 1) % positions) * span
                   : 0;
  // Usually known without reading a peer's line: a barrier in the previous chunk proved it.
  if (g >= 2 && consumedByAll_ < g - 1) {
    for (int q = 0; q < size_; ++q) {
      if (q != rank_) waitFor(q, Counter::kConsumed, g - 1, "reusing a shared-memory slot", -1);
    }
    consumedByAll_ = g - 1;
  }
  return static_cast<int>(g & 1);
}

void ShmGroup::finishChunk() {
  control(rank_).consumed.store(chunks_, std::memory_order_release);
  published(control(rank_));
}

// The posted word counts pieces: chunk g (0-based) with its first k pieces published reads
// g * (kMaxPieces + 1) + k, which only grows.
void ShmGroup::postPieces(int pieces) {
  Control& mine = control(rank_);
  if (pieces == 1) mine.postCall[(chunks_ - 1) & 1].store(call_);
  mine.posted.store((chunks_ - 1) * (kMaxPieces + 1) + static_cast<uint64_t>(pieces),
                    std::memory_order_release);
  published(mine);
}

void ShmGroup::waitPieces(int root, int pieces, const char* what) {
  waitFor(root, Counter::kPosted, (chunks_ - 1) * (kMaxPieces + 1) + static_cast<uint64_t>(pieces),
          what, pieces == 1 ? static_cast<int>((chunks_ - 1) & 1) : -1);
}

void ShmGroup::barrier(const char* what) {
  const uint64_t target = ++arrivals_;
  Control& mine = control(rank_);
  // Double-buffered by barrier parity: a peer can write barrier k+1's call only after this
  // rank arrived at k+1, so it never overwrites the word this rank is comparing at k.
  mine.call[target & 1].store(call_);
  mine.arrived.store(target, std::memory_order_release);
  published(mine);
  for (int i = 1; i < size_; ++i) {
    waitFor((rank_ + i) % size_, Counter::kArrived, target, what, static_cast<int>(target & 1));
  }
  // Every peer is at this barrier, so it has finished every chunk before the current one
  // (finishChunk's release store precedes its arrival's): nextSet need not ask again.
  if (chunks_ > 0) consumedByAll_ = std::max(consumedByAll_, chunks_ - 1);
}

void ShmGroup::waitFor(int p, Counter counter, uint64_t target, const char* what, int parity) {
  auto value = [this, counter](int r) -> uint64_t {
    Control& c = control(r);
    switch (counter) {
      case Counter::kLinesRead:
        return c.linesRead.load(std::memory_order_acquire);
      case Counter::kArrived:
        return c.arrived.load(std::memory_order_acquire);
      case Counter::kConsumed:
        return c.consumed.load(std::memory_order_acquire);
      case Counter::kSmallPosted:
        return c.smallPosted.load(std::memory_order_acquire);
      case Counter::kSmallConsumed:
        return c.smallConsumed.load(std::memory_order_acquire);
      case Counter::kCall:
        return c.callSeq.load(std::memory_order_acquire);
      case Counter::kPosted:
        break;
    }
    return c.posted.load(std::memory_order_acquire);
  };
  waitUntil(p, value, target, what);
  if (parity < 0) return;
  Control& c = control(p);
  checkSameCall(p, counter == Counter::kPosted ? c.postCall[parity].load() : c.call[parity].load());
}

template <class Word>
void ShmGroup::waitUntil(int p, const Word& word, uint64_t target, const char* what) {
  Control& c = control(p);
  if (word(p) < target) {
    // Spin kSpinMicros, then sleep on the peer's progress word (a futex) until it advances a
    // counter: a waiter never holds a core that the peer — or a framework thread of this rank —
    // needs. Yield-polling there kept the core until the scheduler's next tick: a
    // 4 MiB allreduce beside TensorFlow's compute thread on the same core took 20 ms (16 chunk
    // hand-offs of a time slice each), 1.9 ms with the futex. When the group's own ranks
    // outnumber the cores, the peer needs this very core: spin kOversubscribedSpinMicros, then
    // yield it (up to
    // kOversubscribedYields times: a hand-off costs no system call on either side), then sleep
    // (small allreduces at 4 ranks on 2 cores: 9 us with yields, 29 us with the futex alone).
    // The spin reads nothing but the word: most waits end there, and the checks below (the
    // peer's call, the clock, this process's pid) would each cost more than the wait itself
    // (a cross-core line, a vDSO call, a system call).
    if (spinUntil(spinPauses_, [&] { return word(p) >= target; })) return;
    if (waitRecord_) waitRecord_->note(p);  // the flight recorder
    checkPeerCall(p);  // a peer in another call (or one it rejected) never gets there
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(timeoutSeconds_));
    // Peer liveness is checked every 50 ms of waiting, whatever the phase of the backoff (the
    // clock is read every 64 yields: well under a millisecond while yielding).
    Clock::time_point nextCheck = start + std::chrono::milliseconds(50);
    for (int k = 0; oversubscribed_ && k < 1000 && word(p) < target; ++k) {
      sched_yield();
      if ((k & 63) == 63 && Clock::now() >= nextCheck) break;  // liveness below
    }
    // The idle peers a notify left asleep (setIdle) come by themselves with their own work; one
    // still missing after kOwedWakeDelay of this wait is woken (a peer that will not submit: its
    // engine must still take part in the cycle, for the stall verdict that follows).
    const auto owedDue = start + kOwedWakeDelay;
    while (word(p) < target) {
      const auto now = Clock::now();
      if (!owed_.empty() && now >= owedDue) payOwedWakes();
      if (now >= nextCheck) {
        nextCheck = now + std::chrono::milliseconds(50);
        // Dead processes first (the root cause), then peers that aborted because of one.
        for (int q = 0; q < size_; ++q) {
          if (q == rank_) continue;
          Control& cq = control(q);
          // A peer that already got there may have finished and exited normally.
          const bool there = word(q) >= target;
          // A zombie is dead too: a launcher that reaps late (a parent waiting for another
          // rank first) would otherwise hide it until the timeout.
          if (!there && !cq.aborted.load() && peerProcessGone(q)) {
            failPeer(q, what, false);
          }
          // A peer that destroyed its communicator before this call will never join it.
          if (cq.left.load(std::memory_order_acquire) &&
              cq.callSeq.load(std::memory_order_acquire) < call_.seq) {
            failPeer(q, what, false);
          }
          checkPeerCall(q);
        }
        for (int q = 0; q < size_; ++q) {
          if (q != rank_ && control(q).aborted.load(std::memory_order_acquire)) {
            // A peer's abort seen after p got there (p left a barrier and aborted its next
            // call, or q did after meeting p there): this wait is over, the abort is the next
            // wait's. The acquire above makes p's word, stored before that abort, visible.
            if (word(p) >= target) return;
            failPeer(q, what, false);
          }
        }
        if (now > deadline) failPeer(p, what, true);
      }
      c.sleepers.fetch_add(1, std::memory_order_seq_cst);
      // The peer publishes without a fence (published): a barrier on every core running a
      // rank makes its stores before its load of sleepers visible here, or lets it see this
      // sleeper (the asymmetric Dekker of membarrier(2)).
      if (asymmetric_) globalMembarrier();
      const uint32_t seen = c.progress.load(std::memory_order_seq_cst);
      if (word(p) < target) {
        futexWait(&c.progress, seen,
                  std::min<Clock::duration>(
                      (owed_.empty() ? nextCheck : std::min(nextCheck, owedDue)) - Clock::now(),
                      std::chrono::milliseconds(50)));
      }
      c.sleepers.fetch_sub(1, std::memory_order_relaxed);
      if (cancel_) cancel_->check();
      if (c.aborted.load(std::memory_order_acquire) && word(p) < target) failPeer(p, what, false);
      if (word(p) < target) checkPeerCall(p);
    }
  }
}

void ShmGroup::setDumpsOnSigusr1(bool yes) {
  control(rank_).dumpsOnSigusr1.store(yes ? 1 : 0, std::memory_order_release);
}

void ShmGroup::askPeersToDump() const {
  const pid_t self = getpid();
  for (int q = 0; q < size_; ++q) {
    const Control& c = control(q);
    const auto pid = static_cast<pid_t>(c.pid.load(std::memory_order_acquire));
    if (q == rank_ || pid <= 0 || pid == self || c.left.load(std::memory_order_acquire) ||
        !c.dumpsOnSigusr1.load(std::memory_order_acquire)) {
      continue;
    }
    ::kill(pid, SIGUSR1);  // best effort: a peer gone meanwhile is no error
  }
}

void ShmGroup::checkSameCall(int p, const CallSignature& mine, const CallSignature& theirs) {
  if (theirs == mine) return;
  // Calls of different numbers met (a barrier of one call against another's): an earlier call
  // returned before every peer had entered it (a broadcast). Name the pair of calls of the same
  // number where the ranks first differ, when the histories still hold it.
  CallSignature ours = mine;
  if (theirs.seq < mine.seq && mine.seq - theirs.seq < kHistory) {
    const CallSignature own = control(rank_).history[theirs.seq % kHistory].load();
    if (own.seq == theirs.seq && own != theirs) ours = own;
  } else if (theirs.seq > mine.seq) {
    checkPeerCall(p, mine);  // throws naming p's call of this number if it differs
  }
  const std::string found =
      ours.seq == call_.seq && !destroying_
          ? std::string()
          : strCat(foundWhere(), ": a broadcast returns before every peer has entered it)");
  fail(MTXCOMM_INVALID_USAGE, "the ranks disagree on the call: this rank called ",
       describeCall(ours), " but peer rank ", p, " called ", describeCall(theirs),
       " (every rank must pass the same collective, count, datatype, op and root)", found);
}

}  // namespace mtxcomm
