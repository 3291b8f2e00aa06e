// Shared by the multi-process tests: one collective call per Case, with inputs from a
// closed-form formula so every rank checks its own output bitwise (the approach of
// tests/test_collectives.cc, but through the public C API only and without GoogleTest, since
// these programs run as separate processes under mpirun or the MTXCOMM_STORE bootstrap).
#ifndef MTXCOMM_TESTS_MP_MP_CHECK_H_
#define MTXCOMM_TESTS_MP_MP_CHECK_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "lib/dtype.h"
#include "lib/error.h"
#include "lib/reduce.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace mp {

constexpr size_t kPrimeCount = 1000003;

inline const mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX,
                                    MTXCOMM_AVG};
inline const Collective kColls[] = {Collective::kAllreduce,     Collective::kBroadcast,
                                    Collective::kReduce,        Collective::kAllgather,
                                    Collective::kReduceScatter, Collective::kBarrier};

inline bool isSigned(mtxcomm_datatype_t dt) {
  return dt == MTXCOMM_INT8 || dt == MTXCOMM_INT32 || dt == MTXCOMM_INT64 || isFloatingType(dt);
}

// The input of rank r at element i for op, as an exact small integer.
inline double inputValue(mtxcomm_datatype_t dt, mtxcomm_op_t op, int r, size_t i) {
  const bool sgn = isSigned(dt);
  const long ii = static_cast<long>(i % 1000);
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
  const int64_t w = static_cast<int64_t>(v);
  switch (dt) {
    case MTXCOMM_INT8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(w);
      break;
    case MTXCOMM_UINT8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(w);
      break;
    case MTXCOMM_INT32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(w);
      break;
    case MTXCOMM_UINT32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(w);
      break;
    case MTXCOMM_INT64:
      static_cast<int64_t*>(buf)[i] = w;
      break;
    case MTXCOMM_UINT64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(w);
      break;
    case MTXCOMM_FLOAT16:
      static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v));
      break;
    case MTXCOMM_BFLOAT16:
      static_cast<uint16_t*>(buf)[i] = floatToBfloat16(static_cast<float>(v));
      break;
    case MTXCOMM_FLOAT32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case MTXCOMM_FLOAT64:
      static_cast<double*>(buf)[i] = v;
      break;
    default:
      break;
  }
}

// The expected reduction over n ranks at element i, with the library's documented semantics:
// integers wrap, integer AVG = wrapped sum / n truncated; floating AVG = sum / n in the
// accumulation type (float32 for the 16-bit types). All float inputs are small integers, so
// every partial result is exact.
inline void storeExpected(mtxcomm_datatype_t dt, mtxcomm_op_t op, int n, size_t i, void* out) {
  const size_t es = datatypeSize(dt);
  if (!isFloatingType(dt)) {
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
      switch (dt) {
        case MTXCOMM_INT8:
          *reinterpret_cast<int8_t*>(dst) /= n;
          break;
        case MTXCOMM_UINT8:
          *reinterpret_cast<uint8_t*>(dst) /= n;
          break;
        case MTXCOMM_INT32:
          *reinterpret_cast<int32_t*>(dst) /= n;
          break;
        case MTXCOMM_UINT32:
          *reinterpret_cast<uint32_t*>(dst) /= static_cast<uint32_t>(n);
          break;
        case MTXCOMM_INT64:
          *reinterpret_cast<int64_t*>(dst) /= n;
          break;
        case MTXCOMM_UINT64:
          *reinterpret_cast<uint64_t*>(dst) /= static_cast<uint64_t>(n);
          break;
        default:
          break;
      }
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
  std::string describe(int n) const {
    return strCat(collectiveName(coll), "/", algo, " n=", n, " ", datatypeName(dt), " ", opName(op),
                  " count=", count, inPlace ? " in-place" : " out-of-place", " root=", root);
  }
};

enum class Outcome { kPass, kWrong, kCallFailed };

// Runs one case on this rank and checks this rank's output (and, out of place, that the send
// buffer is untouched). On a failure prints one line naming the case and returns why.
inline Outcome runCase(mtxcomm_comm_t comm, int rank, int n, const Case& c) {
  const size_t es = datatypeSize(c.dt);
  size_t inCount = c.count, outCount = c.count;
  if (c.coll == Collective::kAllgather) outCount = c.count * n;
  if (c.coll == Collective::kReduceScatter) inCount = c.count * n;
  const size_t bufCount = std::max(inCount, outCount);
  std::vector<char> sendStore(inCount * es + 1), recvStore(bufCount * es + 1);
  char* send = sendStore.data();
  char* recv = recvStore.data();
  const mtxcomm_op_t dataOp =
      c.coll == Collective::kBroadcast || c.coll == Collective::kAllgather ? MTXCOMM_SUM : c.op;
  auto fill = [&](char* dst, size_t num) {
    for (size_t i = 0; i < num; ++i) storeValue(c.dt, dst, i, inputValue(c.dt, dataOp, rank, i));
  };
  const char* sendArg = send;
  char* recvArg = recv;
  if (c.inPlace) {
    switch (c.coll) {
      case Collective::kAllgather:
        std::memset(recv, 0x5a, bufCount * es);
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
  const std::vector<char> sendCopy(sendStore);

  mtxcomm_result_t rc = MTXCOMM_INTERNAL_ERROR;
  switch (c.coll) {
    case Collective::kAllreduce:
      rc = mtxcomm_allreduce(sendArg, recvArg, c.count, c.dt, c.op, comm, nullptr);
      break;
    case Collective::kBroadcast:
      rc = mtxcomm_broadcast(rank == c.root ? sendArg : nullptr, recvArg, c.count, c.dt, c.root,
                             comm, nullptr);
      break;
    case Collective::kReduce:
      rc = mtxcomm_reduce(sendArg, recvArg, c.count, c.dt, c.op, c.root, comm, nullptr);
      break;
    case Collective::kAllgather:
      rc = mtxcomm_allgather(sendArg, recvArg, c.count, c.dt, comm, nullptr);
      break;
    case Collective::kReduceScatter:
      rc = mtxcomm_reduce_scatter(sendArg, recvArg, c.count, c.dt, c.op, comm, nullptr);
      break;
    case Collective::kBarrier:
      rc = mtxcomm_barrier(comm);
      break;
  }
  if (rc != MTXCOMM_SUCCESS) {
    std::printf("FAIL rank %d: %s: returned %d (%s): %s\n", rank, c.describe(n).c_str(),
                static_cast<int>(rc), mtxcomm_get_error_string(rc), mtxcomm_get_last_error(comm));
    return Outcome::kCallFailed;
  }
  if (!c.inPlace && std::memcmp(sendCopy.data(), send, inCount * es) != 0) {
    std::printf("FAIL rank %d: %s: the send buffer was written\n", rank, c.describe(n).c_str());
    return Outcome::kWrong;
  }

  std::vector<char> expect(outCount * es + 1);
  size_t checkCount = outCount;
  switch (c.coll) {
    case Collective::kAllreduce:
      for (size_t i = 0; i < c.count; ++i) storeExpected(c.dt, c.op, n, i, expect.data());
      break;
    case Collective::kReduce:
      if (rank != c.root) checkCount = 0;
      for (size_t i = 0; i < checkCount; ++i) storeExpected(c.dt, c.op, n, i, expect.data());
      break;
    case Collective::kReduceScatter: {
      std::vector<char> full(inCount * es + 1);
      const size_t first = static_cast<size_t>(rank) * c.count;
      for (size_t i = 0; i < c.count; ++i) storeExpected(c.dt, c.op, n, first + i, full.data());
      std::memcpy(expect.data(), full.data() + first * es, c.count * es);
      break;
    }
    case Collective::kBroadcast:
      for (size_t i = 0; i < c.count; ++i) {
        storeValue(c.dt, expect.data(), i, inputValue(c.dt, MTXCOMM_SUM, c.root, i));
      }
      break;
    case Collective::kAllgather:
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < c.count; ++i) {
          storeValue(c.dt, expect.data(), r * c.count + i, inputValue(c.dt, MTXCOMM_SUM, r, i));
        }
      }
      break;
    case Collective::kBarrier:
      checkCount = 0;
      break;
  }
  if (checkCount && std::memcmp(expect.data(), recvArg, checkCount * es) != 0) {
    size_t bad = 0;
    while (bad < checkCount && std::memcmp(expect.data() + bad * es, recvArg + bad * es, es) == 0) {
      ++bad;
    }
    std::printf("FAIL rank %d: %s: first wrong element %zu of %zu\n", rank, c.describe(n).c_str(),
                bad, checkCount);
    return Outcome::kWrong;
  }
  return Outcome::kPass;
}

// The cases of one collective run with algorithm algo on n ranks, for the given datatypes,
// ops (reducing collectives only) and counts; in place and out of place; roots 0 and n-1.
inline void appendCases(std::vector<Case>& cases, Collective coll, const std::string& algo, int n,
                        const std::vector<mtxcomm_datatype_t>& dtypes,
                        const std::vector<mtxcomm_op_t>& ops, const std::vector<size_t>& counts) {
  if (coll == Collective::kBarrier) {
    cases.push_back({coll, algo, MTXCOMM_INT8, MTXCOMM_SUM, 0, false, 0});
    return;
  }
  const bool reduces = collectiveReduces(coll);
  const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce;
  std::vector<int> roots = {0};
  if (rooted && n > 1) roots.push_back(n - 1);
  for (mtxcomm_datatype_t dt : dtypes) {
    for (mtxcomm_op_t op : ops) {
      if (!reduces && op != MTXCOMM_SUM) continue;
      for (size_t count : counts) {
        for (bool inPlace : {false, true}) {
          for (int root : roots) cases.push_back({coll, algo, dt, op, count, inPlace, root});
        }
      }
    }
  }
}

inline std::vector<mtxcomm_datatype_t> allDatatypes() {
  std::vector<mtxcomm_datatype_t> v;
  for (int d = 0; d < MTXCOMM_NUM_DATATYPES; ++d) v.push_back(static_cast<mtxcomm_datatype_t>(d));
  return v;
}

// Sets MTXCOMM_<COLL>_ALGO=algo (init_from_env reads it) and clears the others.
inline void forceAlgorithm(Collective coll, const char* algo) {
  for (Collective c : kColls) unsetenv(collectiveAlgoVar(c));
  if (algo) setenv(collectiveAlgoVar(coll), algo, 1);
}

}  // namespace mp
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_MP_MP_CHECK_H_
