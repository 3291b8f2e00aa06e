#include "lib/base/call.h"

#include "lib/base/dtype.h"
#include "lib/base/error.h"

namespace mtxcomm {

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kAlltoall:
      return "alltoall";
  }
  return "?";
}

const char* collectiveAlgoVar(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "MTXCOMM_ALLREDUCE_ALGO";
    case Collective::kBroadcast:
      return "MTXCOMM_BROADCAST_ALGO";
    case Collective::kReduce:
      return "MTXCOMM_REDUCE_ALGO";
    case Collective::kAllgather:
      return "MTXCOMM_ALLGATHER_ALGO";
    case Collective::kReduceScatter:
      return "MTXCOMM_REDUCE_SCATTER_ALGO";
    case Collective::kBarrier:
      return "MTXCOMM_BARRIER_ALGO";
    case Collective::kAlltoall:
      return "MTXCOMM_ALLTOALL_ALGO";
  }
  return "?";
}

bool collectiveReduces(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}

CallSignature callSignature(const CollArgs& u, uint64_t seq) {
  CallSignature s;
  s.kind = static_cast<uint64_t>(u.coll) | static_cast<uint64_t>(u.dtype) << 8 |
           static_cast<uint64_t>(u.op) << 16 | static_cast<uint64_t>(u.isAlltoallv()) << 24 |
           static_cast<uint64_t>(static_cast<uint32_t>(u.root)) << 32;
  s.count = u.count;
  s.seq = seq;
  return s;
}

int messageTag(const CallSignature& s, int maxTag) {
  // splitmix64's finaliser (Steele, Lea, Flood: "Fast splittable pseudorandom number
  // generators", OOPSLA 2014) over the signature's two words.
  uint64_t h = s.kind * 0x9e3779b97f4a7c15ull ^ s.count;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  const uint64_t range = static_cast<uint64_t>(maxTag) + 1;
  return static_cast<int>((s.seq + h) % range);
}

std::string describeCall(const CallSignature& s) {
  const auto coll = static_cast<Collective>(s.kind & 0xff);
  const auto dt = static_cast<mtxcomm_datatype_t>((s.kind >> 8) & 0xff);
  const auto op = static_cast<mtxcomm_op_t>((s.kind >> 16) & 0xff);
  const int root = static_cast<int>(static_cast<uint32_t>(s.kind >> 32));
  const bool v = (s.kind >> 24) & 1;
  std::string out = v ? strCat(collectiveName(coll), "v(", datatypeName(dt))
                      : strCat(collectiveName(coll), "(count ", s.count, ", ", datatypeName(dt));
  if (collectiveReduces(coll)) out += strCat(", ", opName(op));
  if (collectiveRooted(coll)) out += strCat(", root ", root);
  return out + strCat(") as call #", s.seq);
}

}  // namespace mtxcomm
