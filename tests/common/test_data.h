// The closed-form test data of the collective correctness checks, shared by the threaded matrix
// (tests/test_collectives.cc, GoogleTest) and the multi-process checks (tests/mp/mp_check.h,
// public C API only): every rank fills its input from a formula and checks its own output
// against the formula's reduction, bitwise. Also the parts of one checked call that do not
// depend on how a failure is reported: the buffers, the call itself and the expected output.
#ifndef MTXCOMM_TESTS_COMMON_TEST_DATA_H_
#define MTXCOMM_TESTS_COMMON_TEST_DATA_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "lib/base/call.h"
#include "lib/base/dtype.h"
#include "lib/base/error.h"
#include "lib/base/reduce.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace testdata {

constexpr size_t kPrimeCount = 1000003;

inline const mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX,
                                    MTXCOMM_AVG};
inline const Collective kColls[] = {Collective::kAllreduce,     Collective::kBroadcast,
                                    Collective::kReduce,        Collective::kAllgather,
                                    Collective::kReduceScatter, Collective::kBarrier,
                                    Collective::kAlltoall};

// Alltoall and alltoallv have no in place (include/mtxcomm/mtxcomm.h).
inline bool hasInPlace(Collective c) { return c != Collective::kAlltoall; }

// The alltoallv layout of a case with count c on rank `rank` of n, in closed form: rank s
// sends alltoallvCount(c, s, d) elements to rank d (0 for some pairs, up to c + 1). The send
// blocks lie in reverse rank order with one element between them, the receive blocks in rank
// order with two: both sides are non-contiguous and the send side is not sorted.
inline size_t alltoallvCount(size_t c, int src, int dst) {
  return c == 0 ? 0 : (c + 3 * static_cast<size_t>(src) + static_cast<size_t>(dst)) % (c + 2);
}
struct AlltoallvLayout {
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
  size_t sendExtent = 0, recvExtent = 0;  // elements of each buffer, gaps included
  AlltoallvLayout(size_t c, int rank, int n)
      : sendcounts(n), sdispls(n), recvcounts(n), rdispls(n) {
    for (int j = n - 1; j >= 0; --j) {
      sendcounts[j] = alltoallvCount(c, rank, j);
      sdispls[j] = sendExtent;
      sendExtent += sendcounts[j] + 1;
    }
    for (int i = 0; i < n; ++i) {
      recvcounts[i] = alltoallvCount(c, i, rank);
      rdispls[i] = recvExtent;
      recvExtent += recvcounts[i] + 2;
    }
  }
};

inline bool isSigned(mtxcomm_datatype_t dt) {
  return dt == MTXCOMM_INT8 || dt == MTXCOMM_INT16 || dt == MTXCOMM_INT32 || dt == MTXCOMM_INT64 ||
         isFloatingType(dt);
}

// Whether a case of op on dt is a valid call (AVG on bool is refused: tested on its own).
inline bool opApplies(mtxcomm_datatype_t dt, mtxcomm_op_t op) {
  return opDeclinesDatatype(op, dt) == nullptr;
}

// bool: the byte of rank r at element i, the same for every op. Elements with i % 4 == 0 are
// true on every rank, i % 4 == 1 false on every rank, the others mixed over the ranks; the trues
// are 1 and the non-canonical 0x02, 0x80 and 0xff.
inline double boolInput(int r, long ii) {
  static constexpr int kTrue[4] = {1, 0x02, 0xff, 0x80};
  const int t = kTrue[(r + ii) % 4];
  switch (ii % 4) {
    case 0:
      return t;
    case 1:
      return 0;
    default:
      return (r * 3 + ii) % 3 == 0 ? 0 : t;
  }
}

// The input of rank r at element i for op, as an exact small integer (bool: a byte).
inline double inputValue(mtxcomm_datatype_t dt, mtxcomm_op_t op, int r, size_t i) {
  const bool sgn = isSigned(dt);
  const long ii = static_cast<long>(i % 1000);
  if (isBoolType(dt)) return boolInput(r, ii);
  switch (op) {
    case MTXCOMM_SUM:
    case MTXCOMM_AVG:
      return static_cast<double>((r * 3 + ii * 7 + 1) % 11 - (sgn ? 5 : 0));
    case MTXCOMM_PROD: {
      double v = ((r + ii) % 5 == 0) ? 2 : 1;
      if (sgn && (r * 7 + ii) % 3 == 0) v = -v;
      return v;
    }
    default:
      return static_cast<double>((r * 13 + ii * 5) % 17 - (sgn ? 8 : 0));
  }
}

// Writes v (an exact integer-valued double, possibly to be wrapped) as element i.
inline void storeValue(mtxcomm_datatype_t dt, void* buf, size_t i, double v) {
  storeElement(dt, buf, i, v);
}

// The expected reduction over n ranks at element i, with the library's documented semantics:
// integers wrap, integer AVG = wrapped sum / n truncated; floating AVG = sum / n in the
// accumulation type (float32 for the 16-bit types); bool: any nonzero byte is true, SUM and MAX
// are OR, PROD and MIN are AND, and the result is 0 or 1 (also on one rank). All float inputs
// are small integers, so every partial result is exact.
inline void storeExpected(mtxcomm_datatype_t dt, mtxcomm_op_t op, int n, size_t i, void* out) {
  const size_t es = datatypeSize(dt);
  if (isBoolType(dt)) {
    const bool all = op == MTXCOMM_PROD || op == MTXCOMM_MIN;  // AND; else OR
    bool acc = all;
    for (int r = 0; r < n; ++r) {
      const bool v = inputValue(dt, op, r, i) != 0;
      acc = all ? (acc && v) : (acc || v);
    }
    static_cast<uint8_t*>(out)[i] = acc ? 1 : 0;
    return;
  }
  if (!isFloatingType(dt)) {
    // Two's complement arithmetic modulo 2^(8*es), in uint64.
    uint64_t acc = static_cast<uint64_t>(static_cast<int64_t>(inputValue(dt, op, 0, i)));
    int64_t mn = static_cast<int64_t>(inputValue(dt, op, 0, i)), mx = mn;
    for (int r = 1; r < n; ++r) {
      const int64_t v = static_cast<int64_t>(inputValue(dt, op, r, i));
      if (op == MTXCOMM_PROD) {
        acc *= static_cast<uint64_t>(v);
      } else {
        acc += static_cast<uint64_t>(v);
      }
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    if (op == MTXCOMM_MIN || op == MTXCOMM_MAX) {
      storeValue(dt, out, i, static_cast<double>(op == MTXCOMM_MIN ? mn : mx));
      return;
    }
    char* dst = static_cast<char*>(out) + i * es;
    std::memcpy(dst, &acc, es);  // little-endian truncation to the type
    if (op == MTXCOMM_AVG) {
      dispatchDatatype(dt, [&](auto tag) {
        using T = typename decltype(tag)::type;
        if constexpr (std::is_integral_v<T>) *reinterpret_cast<T*>(dst) /= static_cast<T>(n);
      });
    }
    return;
  }
  double acc = inputValue(dt, op, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = inputValue(dt, op, r, i);
    switch (op) {
      case MTXCOMM_PROD:
        acc *= v;
        break;
      case MTXCOMM_MIN:
        acc = std::min(acc, v);
        break;
      case MTXCOMM_MAX:
        acc = std::max(acc, v);
        break;
      default:
        acc += v;
    }
  }
  if (op == MTXCOMM_AVG) {
    acc = dt == MTXCOMM_FLOAT64
              ? acc / n
              : static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
  }
  storeValue(dt, out, i, acc);
}

struct Case {
  Collective coll;
  std::string algo;
  mtxcomm_datatype_t dt;
  mtxcomm_op_t op;
  size_t count;
  bool inPlace;
  int root;
  bool vcounts = false;  // alltoall: the alltoallv form with AlltoallvLayout
  std::string describe(int n) const {
    return strCat(collectiveName(coll), vcounts ? "v" : "", "/", algo, " n=", n, " ",
                  datatypeName(dt), " ", opName(op), " count=", count,
                  inPlace ? " in-place" : " out-of-place", " root=", root);
  }
};

inline std::vector<mtxcomm_datatype_t> allDatatypes() {
  std::vector<mtxcomm_datatype_t> v;
  for (int d = 0; d < MTXCOMM_NUM_DATATYPES; ++d) v.push_back(static_cast<mtxcomm_datatype_t>(d));
  return v;
}

// The buffers of one case on one rank, filled with this rank's input: in place the input is in
// recv (at this rank's block for allgather); out of place in send, with recv poisoned (0x5a).
// Data-movement collectives use the SUM formula as plain data. sendCopy is the send buffer as
// filled, to check that an out-of-place call left it untouched.
struct CaseBuffers {
  size_t es, inCount, outCount;
  std::vector<char> sendStore, recvStore, sendCopy;
  const char* sendArg;
  char* recvArg;

  // poisonInPlaceAllgather: also poison recv before an in-place allgather fills its own block
  // (the multi-process checks do; the threaded matrix leaves the other blocks zero).
  CaseBuffers(const Case& c, int rank, int n, bool poisonInPlaceAllgather)
      : es(datatypeSize(c.dt)), inCount(c.count), outCount(c.count) {
    if (c.coll == Collective::kAllgather) outCount = c.count * n;
    if (c.coll == Collective::kReduceScatter) inCount = c.count * n;
    if (c.coll == Collective::kAlltoall) inCount = outCount = c.count * n;
    if (c.vcounts) {
      const AlltoallvLayout l(c.count, rank, n);
      inCount = l.sendExtent;
      outCount = l.recvExtent;
    }
    const size_t bufCount = std::max(inCount, outCount);
    sendStore.resize(inCount * es + 1);
    recvStore.resize(bufCount * es + 1);
    char* send = sendStore.data();
    char* recv = recvStore.data();
    const mtxcomm_op_t dataOp = collectiveReduces(c.coll) ? c.op : MTXCOMM_SUM;
    auto fill = [&](char* dst, size_t num) {
      for (size_t i = 0; i < num; ++i) storeValue(c.dt, dst, i, inputValue(c.dt, dataOp, rank, i));
    };
    sendArg = send;
    recvArg = recv;
    if (c.inPlace) {
      switch (c.coll) {
        case Collective::kAllgather:
          if (poisonInPlaceAllgather) std::memset(recv, 0x5a, bufCount * es);
          fill(recv + rank * c.count * es, c.count);
          sendArg = recv + rank * c.count * es;
          break;
        case Collective::kReduceScatter:
          fill(recv, inCount);
          sendArg = recv;
          recvArg = recv + rank * c.count * es;
          break;
        default:
          fill(recv, inCount);
          sendArg = recv;
      }
    } else {
      fill(send, inCount);
      std::memset(recv, 0x5a, bufCount * es);
    }
    sendCopy = sendStore;
  }
};

// Issues the case's collective through the public C API (stream: for device buffers).
inline mtxcomm_result_t callCollective(const Case& c, mtxcomm_comm_t comm, int rank,
                                       const char* sendArg, char* recvArg, void* stream = nullptr) {
  mtxcomm_result_t rc = MTXCOMM_INTERNAL_ERROR;
  switch (c.coll) {
    case Collective::kAllreduce:
      rc = mtxcomm_allreduce(sendArg, recvArg, c.count, c.dt, c.op, comm, stream);
      break;
    case Collective::kBroadcast:
      rc = mtxcomm_broadcast(rank == c.root ? sendArg : nullptr, recvArg, c.count, c.dt, c.root,
                             comm, stream);
      break;
    case Collective::kReduce:
      rc = mtxcomm_reduce(sendArg, recvArg, c.count, c.dt, c.op, c.root, comm, stream);
      break;
    case Collective::kAllgather:
      rc = mtxcomm_allgather(sendArg, recvArg, c.count, c.dt, comm, stream);
      break;
    case Collective::kReduceScatter:
      rc = mtxcomm_reduce_scatter(sendArg, recvArg, c.count, c.dt, c.op, comm, stream);
      break;
    case Collective::kBarrier:
      rc = mtxcomm_barrier(comm);
      break;
    case Collective::kAlltoall:
      if (c.vcounts) {
        int n = 0;
        mtxcomm_comm_size(comm, &n);
        const AlltoallvLayout l(c.count, rank, n);
        rc = mtxcomm_alltoallv(sendArg, l.sendcounts.data(), l.sdispls.data(), recvArg,
                               l.recvcounts.data(), l.rdispls.data(), c.dt, comm, stream);
      } else {
        rc = mtxcomm_alltoall(sendArg, recvArg, c.count, c.dt, comm, stream);
      }
      break;
  }
  return rc;
}

// Writes this rank's expected output of the case into expect (outCount elements and more) and
// returns how many elements of the output to check (0: none, e.g. a non-root of reduce).
inline size_t storeExpectedOutput(const Case& c, int rank, int n, size_t inCount, size_t outCount,
                                  char* expect) {
  const size_t es = datatypeSize(c.dt);
  size_t checkCount = outCount;
  switch (c.coll) {
    case Collective::kAllreduce:
      for (size_t i = 0; i < c.count; ++i) storeExpected(c.dt, c.op, n, i, expect);
      break;
    case Collective::kReduce:
      if (rank != c.root) checkCount = 0;
      for (size_t i = 0; i < checkCount; ++i) storeExpected(c.dt, c.op, n, i, expect);
      break;
    case Collective::kReduceScatter: {
      std::vector<char> full(inCount * es + 1);
      const size_t first = static_cast<size_t>(rank) * c.count;
      for (size_t i = 0; i < c.count; ++i) storeExpected(c.dt, c.op, n, first + i, full.data());
      std::memcpy(expect, full.data() + first * es, c.count * es);
      break;
    }
    case Collective::kBroadcast:
      for (size_t i = 0; i < c.count; ++i) {
        storeValue(c.dt, expect, i, inputValue(c.dt, MTXCOMM_SUM, c.root, i));
      }
      break;
    case Collective::kAllgather:
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < c.count; ++i) {
          storeValue(c.dt, expect, r * c.count + i, inputValue(c.dt, MTXCOMM_SUM, r, i));
        }
      }
      break;
    case Collective::kBarrier:
      checkCount = 0;
      break;
    case Collective::kAlltoall:
      // Block i came from rank i: the elements rank i's sendbuf holds (its input formula) at
      // its block for this rank. alltoallv: the gaps keep their poison.
      if (!c.vcounts) {
        for (int i = 0; i < n; ++i) {
          for (size_t e = 0; e < c.count; ++e) {
            storeValue(c.dt, expect, i * c.count + e,
                       inputValue(c.dt, MTXCOMM_SUM, i, rank * c.count + e));
          }
        }
        break;
      }
      std::memset(expect, 0x5a, outCount * es);
      {
        const AlltoallvLayout mine(c.count, rank, n);
        for (int i = 0; i < n; ++i) {
          const AlltoallvLayout theirs(c.count, i, n);
          for (size_t e = 0; e < mine.recvcounts[i]; ++e) {
            storeValue(c.dt, expect, mine.rdispls[i] + e,
                       inputValue(c.dt, MTXCOMM_SUM, i, theirs.sdispls[rank] + e));
          }
        }
      }
      break;
  }
  return checkCount;
}

// The check of this rank's output: the first checkCount elements are compared, and
// firstWrong is the index of the first that differs (checkCount when none does).
struct OutputCheck {
  size_t firstWrong, checkCount;
  bool ok() const { return firstWrong == checkCount; }
};

inline OutputCheck checkOutput(const CaseBuffers& b, const Case& c, int rank, int n) {
  std::vector<char> expect(b.outCount * b.es + 1);
  const size_t checkCount = storeExpectedOutput(c, rank, n, b.inCount, b.outCount, expect.data());
  if (checkCount == 0 || std::memcmp(expect.data(), b.recvArg, checkCount * b.es) == 0) {
    return {checkCount, checkCount};
  }
  size_t bad = 0;
  while (bad < checkCount &&
         std::memcmp(expect.data() + bad * b.es, b.recvArg + bad * b.es, b.es) == 0) {
    ++bad;
  }
  return {bad, checkCount};
}

}  // namespace testdata
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_TEST_DATA_H_
