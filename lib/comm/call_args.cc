#include "lib/comm/call_args.h"

#include <algorithm>
#include <cstdlib>

#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/reduce.h"

namespace mtxcomm {

namespace {

struct ByteRange {
  const char* p;
  size_t n;
};

bool overlaps(ByteRange a, ByteRange b) {
  if (!a.p || !b.p || a.n == 0 || b.n == 0) return false;
  return a.p < b.p + b.n && b.p < a.p + a.n;
}

// elements * elemSize * factor, or throws naming the quantity when it overflows size_t.
size_t checkedBytes(const char* what, size_t count, size_t elemSize, size_t factor) {
  size_t bytes;
  if (__builtin_mul_overflow(count, elemSize, &bytes) ||
      __builtin_mul_overflow(bytes, factor, &bytes)) {
    fail(MTXCOMM_INVALID_ARGUMENT, what, " = ", count, " elements x ", elemSize, " bytes",
         factor > 1 ? strCat(" x ", factor, " ranks") : std::string(), " overflows size_t");
  }
  return bytes;
}

// Elements an alltoallv side spans: max over j of displs[j] + counts[j] (0 when all counts are
// 0), or throws when a sum overflows.
size_t alltoallvExtent(const char* side, const size_t* counts, const size_t* displs, int n) {
  size_t extent = 0;
  for (int j = 0; j < n; ++j) {
    if (counts[j] == 0) continue;
    size_t end;
    if (__builtin_add_overflow(displs[j], counts[j], &end)) {
      fail(MTXCOMM_INVALID_ARGUMENT, side, "displs[", j, "] + ", side, "counts[", j,
           "] overflows size_t");
    }
    extent = std::max(extent, end);
  }
  return extent;
}

void checkAlltoallv(const CollArgs& a, int rank, int n, size_t es) {
  if (!a.sendcounts || !a.sdispls || !a.recvcounts || !a.rdispls) {
    fail(MTXCOMM_INVALID_ARGUMENT,
         !a.sendcounts   ? "sendcounts"
         : !a.sdispls    ? "sdispls"
         : !a.recvcounts ? "recvcounts"
                         : "rdispls",
         " is NULL (alltoallv needs all four arrays, size entries each)");
  }
  if (a.sendcounts[rank] != a.recvcounts[rank]) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendcounts[", rank, "] = ", a.sendcounts[rank],
         " but recvcounts[", rank, "] = ", a.recvcounts[rank], " on rank ", rank,
         " (the block a rank sends itself must fit what it receives)");
  }
  const size_t sendExt = alltoallvExtent("s", a.sendcounts, a.sdispls, n);
  const size_t recvExt = alltoallvExtent("r", a.recvcounts, a.rdispls, n);
  const size_t sendBytes = checkedBytes("send extent", sendExt, es, 1);
  const size_t recvBytes = checkedBytes("receive extent", recvExt, es, 1);
  if (sendBytes && !a.sendbuf) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendbuf is NULL with a send extent of ", sendExt, " elements");
  }
  if (recvBytes && !a.recvbuf) {
    fail(MTXCOMM_INVALID_ARGUMENT, "recvbuf is NULL with a receive extent of ", recvExt,
         " elements");
  }
  if (overlaps({static_cast<const char*>(a.sendbuf), sendBytes},
               {static_cast<const char*>(a.recvbuf), recvBytes})) {
    fail(MTXCOMM_INVALID_ARGUMENT,
         "sendbuf and recvbuf overlap (alltoallv has no in place: pass disjoint buffers)");
  }
}

}  // namespace

void checkArgs(const CollArgs& a, int rank, int n) {
  if (a.coll == Collective::kBarrier) return;
  if (!isValidDatatype(a.dtype)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "invalid datatype ", static_cast<int>(a.dtype));
  }
  if (collectiveReduces(a.coll) && !isValidOp(a.op)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "invalid op ", static_cast<int>(a.op));
  }
  if (collectiveReduces(a.coll)) {
    if (a.op == MTXCOMM_ADASUM && a.coll != Collective::kAllreduce) {
      fail(MTXCOMM_INVALID_ARGUMENT, "op adasum is not supported by ", collectiveName(a.coll),
           " (only allreduce takes op adasum)");
    }
    if (const char* why = opDeclinesDatatype(a.op, a.dtype)) fail(MTXCOMM_INVALID_ARGUMENT, why);
  }
  if (collectiveRooted(a.coll) && (a.root < 0 || a.root >= n)) {
    fail(MTXCOMM_INVALID_ARGUMENT, "root ", a.root, " is out of range [0, ", n, ")");
  }
  const size_t es = datatypeSize(a.dtype);
  if (a.isAlltoallv()) {
    checkAlltoallv(a, rank, n, es);
    return;
  }
  const size_t unit = checkedBytes("count", a.count, es, 1);
  size_t sendBytes = unit, recvBytes = unit;
  bool needSend = true, needRecv = true;
  switch (a.coll) {
    case Collective::kBroadcast:
      needSend = rank == a.root;
      break;
    case Collective::kReduce:
      needRecv = rank == a.root;
      break;
    case Collective::kAllgather:
      recvBytes = checkedBytes("sendcount", a.count, es, n);
      break;
    case Collective::kReduceScatter:
      sendBytes = checkedBytes("recvcount", a.count, es, n);
      break;
    case Collective::kAlltoall:
      sendBytes = recvBytes = checkedBytes("count", a.count, es, n);
      break;
    default:
      break;
  }
  if (a.count == 0) return;
  if (needSend && !a.sendbuf) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendbuf is NULL with count ", a.count);
  }
  if (needRecv && !a.recvbuf) {
    fail(MTXCOMM_INVALID_ARGUMENT, "recvbuf is NULL with count ", a.count);
  }
  if (!needSend || !needRecv) {
    // broadcast on a non-root / reduce on a non-root: the other buffer is not used. On the
    // root of a broadcast sendbuf and recvbuf still must not partially overlap.
    if (!(a.coll == Collective::kBroadcast && rank == a.root)) return;
  }
  const char* s = static_cast<const char*>(a.sendbuf);
  const char* r = static_cast<const char*>(a.recvbuf);
  if (a.coll == Collective::kAlltoall && overlaps({s, sendBytes}, {r, recvBytes})) {
    fail(MTXCOMM_INVALID_ARGUMENT, s == r ? "sendbuf == recvbuf" : "sendbuf and recvbuf overlap",
         " (alltoall has no in place: pass disjoint buffers)");
  }
  const char* inPlaceSend = r;  // where sendbuf must be for an in-place call
  if (a.coll == Collective::kAllgather) inPlaceSend = r + static_cast<size_t>(rank) * unit;
  if (a.coll == Collective::kReduceScatter) inPlaceSend = r - static_cast<size_t>(rank) * unit;
  if (s == inPlaceSend) return;
  if (overlaps({s, sendBytes}, {r, recvBytes})) {
    fail(MTXCOMM_INVALID_ARGUMENT, "sendbuf and recvbuf partially overlap (in place is ",
         a.coll == Collective::kAllgather       ? "sendbuf == recvbuf + rank*sendcount"
         : a.coll == Collective::kReduceScatter ? "sendbuf + rank*recvcount == recvbuf"
                                                : "sendbuf == recvbuf",
         ")");
  }
}

size_t resultCount(const CollArgs& a, int rank, int n) {
  switch (a.coll) {
    case Collective::kAllreduce:
      return a.count;
    case Collective::kReduce:
      return rank == a.root ? a.count : 0;
    case Collective::kReduceScatter:
      return a.count;
    default:
      return 0;
  }
}

struct AlgorithmCall::Buffer {
  explicit Buffer(size_t bytes) : p(static_cast<float*>(std::malloc(bytes ? bytes : 1))) {
    if (!p) fail(MTXCOMM_SYSTEM_ERROR, "out of memory allocating ", bytes, " bytes");
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* p;  // the widened float32 copy
};

AlgorithmCall::AlgorithmCall(const CollArgs& user, int rank, int n)
    : user_(user), args_(user), nranks_(n) {
  args_.elemSize = user.coll == Collective::kBarrier ? 1 : datatypeSize(user.dtype);
  avg_ = collectiveReduces(args_.coll) && args_.op == MTXCOMM_AVG;
  if (avg_) args_.op = MTXCOMM_SUM;
  args_.avgDivisor = avg_ ? n : 0;
  outCount_ = resultCount(args_, rank, n);
  // float16/bfloat16 reductions run in float32 and round once at the end. Not adasum: its kernel
  // widens each pair itself and rounds every level's output (the op's definition, mtxcomm.h), so
  // 16-bit vectors travel as 16 bits.
  widen_ = collectiveReduces(args_.coll) && isHalfType(args_.dtype) && args_.op != MTXCOMM_ADASUM;
  if (!widen_) return;
  const size_t inCount = args_.coll == Collective::kReduceScatter ? args_.count * n : args_.count;
  wideIn_ = std::make_unique<Buffer>(inCount * sizeof(float));
  widenToFloat(args_.dtype, static_cast<const uint16_t*>(args_.sendbuf), wideIn_->p, inCount);
  args_.sendbuf = wideIn_->p;
  if (args_.coll == Collective::kAllreduce) {
    args_.recvbuf = wideIn_->p;  // in place on the widened copy
  } else if (outCount_ > 0) {
    wideOut_ = std::make_unique<Buffer>(outCount_ * sizeof(float));
    args_.recvbuf = wideOut_->p;
  } else {
    args_.recvbuf = nullptr;
  }
  args_.dtype = MTXCOMM_FLOAT32;
  args_.elemSize = sizeof(float);
}

AlgorithmCall::~AlgorithmCall() = default;

void AlgorithmCall::finish(bool averaged) {
  if (outCount_ == 0) return;
  if (avg_ && !averaged) divideBuffer(args_.dtype, args_.recvbuf, outCount_, nranks_);
  if (widen_) {
    narrowFromFloat(user_.dtype, static_cast<const float*>(args_.recvbuf),
                    static_cast<uint16_t*>(user_.recvbuf), outCount_);
  }
}

}  // namespace mtxcomm
