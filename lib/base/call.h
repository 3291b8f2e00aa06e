// The vocabulary of one collective call, shared by every layer: which collective, its buffers,
// count, datatype, op and root (CollArgs), and the call's signature — the words ranks compare to
// make sure they are in the same call.
#ifndef MTXCOMM_LIB_BASE_CALL_H_
#define MTXCOMM_LIB_BASE_CALL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

enum class Collective {
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kBarrier,
  kAlltoall
};
constexpr int kNumCollectives = 7;
// "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "barrier", "alltoall".
const char* collectiveName(Collective c);
// "MTXCOMM_ALLREDUCE_ALGO", ...
const char* collectiveAlgoVar(Collective c);
bool collectiveReduces(Collective c);
// Broadcast and reduce: the call names a root.
inline bool collectiveRooted(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce;
}

// One call. As the public API gives it (AVG allowed, 16-bit floats as they are), or as an
// algorithm sees it after argument checks (AVG arrives as SUM and 16-bit floats arrive widened
// to float32).
struct CollArgs {
  Collective coll = Collective::kAllreduce;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  // Elements: allreduce, broadcast, reduce: the whole buffer; allgather: per-rank sendcount;
  // reduce_scatter: per-rank recvcount; alltoall: per rank pair; alltoallv and barrier: 0.
  size_t count = 0;
  mtxcomm_datatype_t dtype = MTXCOMM_FLOAT32;
  mtxcomm_op_t op = MTXCOMM_SUM;
  int root = 0;
  size_t elemSize = 4;
  // The cudaStream_t of a call on device buffers (nullptr: the legacy default stream); always
  // nullptr for host buffers. Only gpu/ looks at it.
  void* stream = nullptr;
  // Alltoallv: coll kAlltoall with vcounts set, and nranks counts and displacements in each
  // array, in elements (checkArgs rejects a NULL array).
  bool vcounts = false;
  const size_t* sendcounts = nullptr;
  const size_t* sdispls = nullptr;
  const size_t* recvcounts = nullptr;
  const size_t* rdispls = nullptr;
  bool isAlltoallv() const { return coll == Collective::kAlltoall && vcounts; }
  // MTXCOMM_AVG, which reaches algorithms as MTXCOMM_SUM: the number of ranks to divide the
  // sums by (0 for every other op). An algorithm whose registry entry says `averages` divides
  // each result element once, where it computes it (lib/comm/call_args.h); the others leave it
  // to AlgorithmCall::finish.
  int avgDivisor = 0;
  // Bytes one rank contributes, the quantity selection rules use.
  size_t bytes() const { return count * elemSize; }
};

// A call's signature as three words: (collective, datatype, op, root), the count (0 for
// alltoallv: its counts differ per rank, the shm algorithm compares them itself), and the
// call's sequence number on its communicator. Ranks that exchange signatures (the shared-memory
// barriers) fail with MTXCOMM_INVALID_USAGE naming both calls when theirs differ.
struct CallSignature {
  uint64_t kind = 0;  // collective | dtype << 8 | op << 16 | alltoallv << 24 | root << 32
  uint64_t count = 0;
  uint64_t seq = 0;
  bool operator==(const CallSignature& o) const {
    return kind == o.kind && count == o.count && seq == o.seq;
  }
  bool operator!=(const CallSignature& o) const { return !(*this == o); }
};
// The name of a call in messages: collectiveName, or "alltoallv" for the alltoallv form.
inline const char* callName(const CollArgs& a) {
  return a.isAlltoallv() ? "alltoallv" : collectiveName(a.coll);
}
// The signature of the user-level call args as call number seq.
CallSignature callSignature(const CollArgs& args, uint64_t seq);
// "allreduce(count 4, float32, sum) as call #7".
std::string describeCall(const CallSignature& s);
// The tag of a call's point-to-point messages, in [0, maxTag]: its sequence number plus a hash
// of its collective, datatype, op, root and count. Ranks that disagree on a call in a way that
// keeps every message's size (counts whose segments line up: 1M floats on one rank, 512K on
// the other, with 1 MiB segments) post receives that never match the other's sends, so the
// call fails (MTXCOMM_TIMEOUT) instead of returning a wrong result; a disagreement slips through
// only when the two hashes collide (1 in maxTag + 1). Consecutive calls of one signature have
// consecutive tags.
int messageTag(const CallSignature& s, int maxTag);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_CALL_H_
