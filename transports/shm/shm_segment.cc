// The segment of a ShmGroup: made by rank 0 under an unguessable name, mapped by every rank,
// unlinked as soon as all have mapped it (shm_group.h, "Lifetime and security"); its size and
// the digest of its layout; the group's construction and destruction. The layout:
// shm_segment.h.
#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/membarrier.h"
#include "lib/base/spin.h"
#include "transports/shm/shm_group.h"
#include "transports/shm/shm_wait.h"

namespace mtxcomm {

namespace {

constexpr size_t kMsgBytes = 512;  // setup messages: a segment name or an error
// The spin of a wait before it sleeps (waitUntil) is kSpinMicros (lib/base/spin.h), a time: a
// rank's TensorFlow thread shares its core with the waiting engine thread, and the MLP's step at
// np=2 took 2% longer with a 60 us spin and 4% with 110 us (bench/RESULTS.md), while a wait
// that ends within the spin needs no futex wake. With more ranks than cores, this:
constexpr double kOversubscribedSpinMicros = 0.5;

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

}  // namespace

using shm::kAlign;
using shm::kHeaderBytes;
using shm::kLayoutRevision;
using shm::kLinesPerBox;
using shm::kMagic;
using shm::mixWord;
using shm::roundUp;

size_t ShmGroup::segmentBytes(int n, size_t slotBytes) {
  return kHeaderBytes + roundUp(sizeof(Control) * n, kAlign) +
         2 * static_cast<size_t>(n) * roundUp(slotBytes, kAlign) +
         static_cast<size_t>(n) * kSmallSlots * kSmallBytes +
         static_cast<size_t>(n) * kLineSlots * kLinesPerBox * sizeof(Line);
}

char* shm::shareSegment(Transport& t, int tag, size_t bytes, Clock::time_point deadline) {
  const int n = t.size(), me = t.rank();
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
  return base;
}

std::unique_ptr<ShmGroup> ShmGroup::create(Transport& t, int tag, size_t slotBytes,
                                           double timeoutSeconds) {
  const int n = t.size(), me = t.rank();
  const size_t bytes = segmentBytes(n, slotBytes);
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeoutSeconds));
  char* base = shm::shareSegment(t, tag, bytes, deadline);
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

}  // namespace mtxcomm
