// The threaded correctness matrix: communicator sizes 1-9, 12 and 16; every collective x
// algorithm x datatype x op; counts 0, 1, size-1, size, size+1 (and a prime above 10^6 for
// every collective x algorithm x datatype); in place and out of place. Each rank fills its input
// from a closed-form formula and checks its own output against the formula's reduction,
// bitwise, and checks that an out-of-place call left its send buffer untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "harness.h"
#include "lib/dtype.h"
#include "lib/reduce.h"

namespace mtxcomm {
namespace {

using testing::runRanks;

constexpr size_t kPrimeCount = 1000003;

bool isSigned(mtxcomm_datatype_t dt) {
  return dt == MTXCOMM_INT8 || dt == MTXCOMM_INT32 || dt == MTXCOMM_INT64 || isFloatingType(dt);
}

// The input of rank r at element i for op, as an exact small number.
double inputValue(mtxcomm_datatype_t dt, mtxcomm_op_t op, int r, size_t i) {
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

// Writes value (an exact integer-valued double, possibly a wrapped integer) as element i.
void storeValue(mtxcomm_datatype_t dt, void* buf, size_t i, double v) {
  switch (dt) {
    case MTXCOMM_INT8:
      static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case MTXCOMM_UINT8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case MTXCOMM_INT32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case MTXCOMM_UINT32:
      static_cast<uint32_t*>(buf)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case MTXCOMM_INT64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case MTXCOMM_UINT64:
      static_cast<uint64_t*>(buf)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
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

// The expected reduction over n ranks at element i, stored into out[i] with the library's
// semantics: integer wrap, AVG = wrapped sum / n truncated (integers) or sum / n in the
// accumulation type (float32 for the 16-bit types).
void storeExpected(mtxcomm_datatype_t dt, mtxcomm_op_t op, int n, size_t i, void* out) {
  const size_t es = datatypeSize(dt);
  if (!isFloatingType(dt)) {
    // Two's complement arithmetic modulo 2^(8*es), in uint64.
    uint64_t acc = static_cast<uint64_t>(static_cast<int64_t>(inputValue(dt, op, 0, i)));
    int64_t mn = static_cast<int64_t>(inputValue(dt, op, 0, i)), mx = mn;
    for (int r = 1; r < n; ++r) {
      int64_t v = static_cast<int64_t>(inputValue(dt, op, r, i));
      if (op == MTXCOMM_PROD)
        acc *= static_cast<uint64_t>(v);
      else
        acc += static_cast<uint64_t>(v);
      mn = std::min(mn, v);
      mx = std::max(mx, v);
    }
    if (op == MTXCOMM_MIN || op == MTXCOMM_MAX) {
      storeValue(dt, out, i, static_cast<double>(op == MTXCOMM_MIN ? mn : mx));
      return;
    }
    // Truncate to the type, then (AVG) divide in the type.
    char tmp[8] = {0};
    std::memcpy(tmp, &acc, es);  // little-endian truncation
    std::memcpy(static_cast<char*>(out) + i * es, tmp, es);
    if (op == MTXCOMM_AVG) {
      switch (dt) {
        case MTXCOMM_INT8:
          static_cast<int8_t*>(out)[i] = static_cast<int8_t>(static_cast<int8_t*>(out)[i] / n);
          break;
        case MTXCOMM_UINT8:
          static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(static_cast<uint8_t*>(out)[i] / n);
          break;
        case MTXCOMM_INT32:
          static_cast<int32_t*>(out)[i] /= n;
          break;
        case MTXCOMM_UINT32:
          static_cast<uint32_t*>(out)[i] /= static_cast<uint32_t>(n);
          break;
        case MTXCOMM_INT64:
          static_cast<int64_t*>(out)[i] /= n;
          break;
        case MTXCOMM_UINT64:
          static_cast<uint64_t*>(out)[i] /= static_cast<uint64_t>(n);
          break;
        default:
          break;
      }
    }
    return;
  }
  // Floating: inputs are small integers, every partial result is exact.
  double acc = inputValue(dt, op, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = inputValue(dt, op, r, i);
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
    if (dt == MTXCOMM_FLOAT64) {
      acc = acc / n;
    } else {
      acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(n));
    }
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

// Runs one case on one rank and checks it. Returns false (after reporting) on a mismatch.
void runCase(mtxcomm_comm_t comm, int rank, int n, const Case& c) {
  Comm* impl = unwrapComm(comm);
  impl->mutableConfig().algo[static_cast<int>(c.coll)] = c.algo;
  const size_t es = datatypeSize(c.dt);
  // Element counts of the input (per rank) and output buffers.
  size_t inCount = c.count, outCount = c.count;
  if (c.coll == Collective::kAllgather) outCount = c.count * n;
  if (c.coll == Collective::kReduceScatter) inCount = c.count * n;
  const size_t bufCount = std::max(inCount, outCount);
  std::vector<char> sendStore(inCount * es + 1), recvStore(bufCount * es + 1);
  char* send = sendStore.data();
  char* recv = recvStore.data();
  const mtxcomm_op_t dataOp =
      c.coll == Collective::kBroadcast || c.coll == Collective::kAllgather ? MTXCOMM_SUM : c.op;
  // Fill the input. Data-movement collectives use the SUM formula as plain data.
  auto fill = [&](char* dst, size_t first, size_t num) {
    for (size_t i = 0; i < num; ++i)
      storeValue(c.dt, dst, i, inputValue(c.dt, dataOp, rank, first + i));
  };
  const char* sendArg = send;
  char* recvArg = recv;
  if (c.inPlace) {
    switch (c.coll) {
      case Collective::kAllgather:
        fill(recv + rank * c.count * es, 0, c.count);
        sendArg = recv + rank * c.count * es;
        break;
      case Collective::kReduceScatter:
        fill(recv, 0, inCount);
        sendArg = recv;
        recvArg = recv + rank * c.count * es;
        break;
      default:
        fill(recv, 0, inCount);
        sendArg = recv;
    }
  } else {
    fill(send, 0, inCount);
    std::memset(recv, 0x5a, bufCount * es);
  }
  std::vector<char> sendCopy(sendStore);

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
  ASSERT_EQ(rc, MTXCOMM_SUCCESS) << c.describe(n) << ": " << mtxcomm_get_last_error(comm);
  if (!c.inPlace) {
    ASSERT_EQ(0, std::memcmp(sendCopy.data(), send, inCount * es))
        << c.describe(n) << ": the send buffer was written";
  }

  // Expected output of this rank.
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
      for (size_t i = 0; i < c.count; ++i)
        storeValue(c.dt, expect.data(), i, inputValue(c.dt, MTXCOMM_SUM, c.root, i));
      break;
    case Collective::kAllgather:
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < c.count; ++i)
          storeValue(c.dt, expect.data(), r * c.count + i, inputValue(c.dt, MTXCOMM_SUM, r, i));
      break;
    case Collective::kBarrier:
      checkCount = 0;
      break;
  }
  if (checkCount && std::memcmp(expect.data(), recvArg, checkCount * es) != 0) {
    size_t bad = 0;
    while (bad < checkCount && std::memcmp(expect.data() + bad * es, recvArg + bad * es, es) == 0)
      ++bad;
    FAIL() << c.describe(n) << ": first wrong element " << bad << " of " << checkCount;
  }
}

std::vector<size_t> smallCounts(int n) {
  std::vector<size_t> v = {0, 1, static_cast<size_t>(n) + 1, static_cast<size_t>(n)};
  if (n > 1) v.push_back(static_cast<size_t>(n) - 1);
  return v;
}

const mtxcomm_op_t kOps[] = {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MIN, MTXCOMM_MAX, MTXCOMM_AVG};
const Collective kColls[] = {Collective::kAllreduce,     Collective::kBroadcast,
                             Collective::kReduce,        Collective::kAllgather,
                             Collective::kReduceScatter, Collective::kBarrier};

// Every case for size n with counts from countsFor.
std::vector<Case> matrix(int n, const std::vector<size_t>& counts,
                         const std::vector<mtxcomm_datatype_t>& dtypes, bool allOps) {
  std::vector<Case> cases;
  for (Collective coll : kColls) {
    for (const char* algo : algorithmNames(coll)) {
      if (coll == Collective::kBarrier) {
        cases.push_back({coll, algo, MTXCOMM_INT8, MTXCOMM_SUM, 0, false, 0});
        continue;
      }
      const bool reduces = collectiveReduces(coll);
      const bool rooted = coll == Collective::kBroadcast || coll == Collective::kReduce;
      for (mtxcomm_datatype_t dt : dtypes) {
        for (mtxcomm_op_t op : kOps) {
          if (!reduces && op != MTXCOMM_SUM) continue;
          if (!allOps && op != MTXCOMM_SUM && op != MTXCOMM_AVG) continue;
          for (size_t count : counts) {
            for (bool inPlace : {false, true}) {
              for (int root : {0, n - 1}) {
                if (!rooted && root != 0) continue;
                if (rooted && root == 0 && n > 1 && !inPlace && count != counts.front()) {
                  // root 0 and root n-1 both run for every count; keep both.
                }
                cases.push_back({coll, algo, dt, op, count, inPlace, root});
                if (!rooted || n == 1) break;
              }
            }
          }
        }
      }
    }
  }
  return cases;
}

std::vector<mtxcomm_datatype_t> allDatatypes() {
  std::vector<mtxcomm_datatype_t> v;
  for (int d = 0; d < MTXCOMM_NUM_DATATYPES; ++d) v.push_back(static_cast<mtxcomm_datatype_t>(d));
  return v;
}

class CollectiveMatrix : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveMatrix, SmallCountsEveryAlgorithmDatatypeOp) {
  const int n = GetParam();
  const auto cases = matrix(n, smallCounts(n), allDatatypes(), /*allOps=*/true);
  ASSERT_GT(cases.size(), 100u);
  runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    for (const Case& c : cases) {
      runCase(comm, rank, n, c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

// A prime count above 10^6: every collective x algorithm x datatype (SUM and AVG), at the
// sizes where it is affordable on a 2-core CI machine (1-5 and 8; the other sizes run the
// small-count and multi-segment suites).
class PrimeCountMatrix : public ::testing::TestWithParam<int> {};

TEST_P(PrimeCountMatrix, EveryAlgorithmDatatype) {
  const int n = GetParam();
  auto cases = matrix(n, {kPrimeCount}, allDatatypes(), /*allOps=*/false);
  // Allgather and reduce_scatter scale their buffers by n: keep one count per rank of 10^6/n.
  for (Case& c : cases) {
    if (c.coll == Collective::kAllgather || c.coll == Collective::kReduceScatter) {
      c.count = kPrimeCount / n;
    }
  }
  runRanks(n, [&](mtxcomm_comm_t comm, int rank) {
    for (const Case& c : cases) {
      if (c.inPlace && c.dt != MTXCOMM_FLOAT32 && c.dt != MTXCOMM_BFLOAT16) continue;
      runCase(comm, rank, n, c);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
}

// Many segments at small sizes: a 4 KiB segment with counts that do not divide.
TEST_P(CollectiveMatrix, SmallSegmentsAllOpsFloat32AndInt32) {
  const int n = GetParam();
  Config cfg;
  cfg.segmentBytes = 4096;
  cfg.shmSlotBytes = 4096;  // many shm chunks too
  const size_t count = 10007;
  auto cases = matrix(n, {count}, {MTXCOMM_FLOAT32, MTXCOMM_INT32, MTXCOMM_FLOAT16}, true);
  runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        for (const Case& c : cases) {
          runCase(comm, rank, n, c);
          if (::testing::Test::HasFatalFailure()) return;
        }
      },
      cfg);
}

INSTANTIATE_TEST_SUITE_P(Sizes, PrimeCountMatrix, ::testing::Values(1, 2, 3, 4, 5, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });
INSTANTIATE_TEST_SUITE_P(Sizes, CollectiveMatrix,
                         ::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace mtxcomm
