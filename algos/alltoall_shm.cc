// alltoall / shm: through shared-memory slots, for ranks that all live on one node; also
// alltoallv, whose counts the ranks compare first.
//
// Accepts: a communicator whose ranks share a segment, with MTXCOMM_SHM_SLOT_BYTES / n of at
//   least 64 bytes (each rank's slot is cut into n sub-slots, one per destination); any count,
//   alltoall and alltoallv.
// Steps: (alltoallv only) every rank writes its sendcounts and recvcounts into its slot;
//   barrier; every rank checks sendcounts_i[j] == recvcounts_j[i] for every pair i, j (all
//   ranks read the same table, so all fail alike with MTXCOMM_INVALID_USAGE naming the first
//   pair that disagrees) and takes the largest count. Then, per chunk of at most
//   sub = slot / n bytes of every block: every rank copies chunk t of its block for q into
//   sub-slot q of its slot; barrier; every rank copies sub-slot `me` of each peer's slot into
//   its recvbuf block of that peer. The own block is copied straight from sendbuf.
// Bytes moved per rank: each block once in and once out (2 (n-1) blocks), in
//   ceil(largest block / sub) chunks of one barrier each.
// Example, n = 3, one chunk: r0 writes 01 02 into sub-slots 1, 2 of slot 0, r1 writes 10 12,
//   r2 writes 20 21; barrier; r0 reads 10 from slot 1 sub-slot 0 and 20 from slot 2 sub-slot 0.
// Source: the copy-in/copy-out scheme of the shared-memory collectives of Open MPI coll/sm and
//   MPICH (which have no shm alltoall themselves); cutting the slot into one sub-slot per
//   destination is this library's adaptation of it to alltoall.
#include <algorithm>
#include <vector>

#include "algos/registry.h"
#include "algos/shm_chunks.h"
#include "lib/base/error.h"

namespace mtxcomm {

size_t alltoallShmSubSlotBytes(size_t slotBytes, int n) {
  return n <= 0 ? 0 : slotBytes / static_cast<size_t>(n) / 64 * 64;
}

namespace {

// Alltoallv: exchanges every rank's counts through the slots, fails on a pair that disagrees,
// and returns the largest count of any pair (the same on every rank).
size_t agreeAlltoallvCounts(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const int set = g.nextSet();
  auto* mine = reinterpret_cast<size_t*>(g.slot(set, me));
  copyBytes(mine, a.sendcounts, n * sizeof(size_t));
  copyBytes(mine + n, a.recvcounts, n * sizeof(size_t));
  g.barrier("alltoallv counts (shm)");
  size_t largest = 0;
  for (int i = 0; i < n; ++i) {
    const auto* sends = reinterpret_cast<const size_t*>(g.slot(set, i));
    for (int j = 0; j < n; ++j) {
      const size_t expected = reinterpret_cast<const size_t*>(g.slot(set, j))[n + i];
      if (sends[j] != expected) {
        fail(MTXCOMM_INVALID_USAGE, "alltoallv counts disagree: rank ", i, " sends ", sends[j],
             " elements to rank ", j, " (its sendcounts[", j, "]) but rank ", j, " expects ",
             expected, " (its recvcounts[", i, "]); every pair must agree");
      }
      largest = std::max(largest, sends[j]);
    }
  }
  g.finishChunk();
  return largest;
}

}  // namespace

void runAlltoallShm(const CollArgs& a, ShmGroup& g) {
  const int n = g.size(), me = g.rank();
  const size_t es = a.elemSize;
  const size_t sub = alltoallShmSubSlotBytes(g.slotBytes(), n);
  const size_t chunk = sub / es;
  if (chunk == 0) {
    fail(MTXCOMM_INTERNAL_ERROR, "alltoall (shm): a slot of ", g.slotBytes(),
         " bytes has no room for ", n, " sub-slots");
  }
  const bool v = a.isAlltoallv();
  const char* send = static_cast<const char*>(a.sendbuf);
  char* recv = static_cast<char*>(a.recvbuf);
  auto sendAt = [&](int j) { return v ? a.sdispls[j] : j * a.count; };
  auto sendCount = [&](int j) { return v ? a.sendcounts[j] : a.count; };
  auto recvAt = [&](int j) { return v ? a.rdispls[j] : j * a.count; };
  auto recvCount = [&](int j) { return v ? a.recvcounts[j] : a.count; };
  const size_t largest = v ? agreeAlltoallvCounts(a, g) : a.count;
  if (sendCount(me) > 0) {
    copyBytes(recv + recvAt(me) * es, send + sendAt(me) * es, sendCount(me) * es);
  }
  for (size_t off = 0; off < largest; off += chunk) {
    const int set = g.nextSet();
    char* mine = g.slot(set, me);
    for (int q = 0; q < n; ++q) {
      if (q == me || sendCount(q) <= off) continue;
      const size_t len = std::min(chunk, sendCount(q) - off);
      copyBytes(mine + q * sub, send + (sendAt(q) + off) * es, len * es);
    }
    g.barrier(v ? "alltoallv (shm)" : "alltoall (shm)");
    for (int q = 0; q < n; ++q) {
      if (q == me || recvCount(q) <= off) continue;
      const size_t len = std::min(chunk, recvCount(q) - off);
      copyBytes(recv + (recvAt(q) + off) * es, g.slot(set, q) + me * sub, len * es);
    }
    g.finishChunk();
  }
}

}  // namespace mtxcomm
