// Shared by the multi-process tests: one collective call per Case, with inputs from a
// closed-form formula (tests/common/test_data.h) so every rank checks its own output bitwise
// (the approach of tests/test_collectives.cc, but through the public C API only and without
// GoogleTest, since these programs run as separate processes under mpirun or the MTXCOMM_STORE
// bootstrap).
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
#include "common/test_data.h"
#include "lib/base/dtype.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace mp {

using namespace ::mtxcomm::testdata;  // NOLINT: the shared data, Case and helpers

enum class Outcome { kPass, kWrong, kCallFailed };

// Runs one case on this rank and checks this rank's output (and, out of place, that the send
// buffer is untouched). On a failure prints one line naming the case and returns why.
inline Outcome runCase(mtxcomm_comm_t comm, int rank, int n, const Case& c) {
  CaseBuffers b(c, rank, n, /*poisonInPlaceAllgather=*/true);
  const mtxcomm_result_t rc = callCollective(c, comm, rank, b.sendArg, b.recvArg);
  if (rc != MTXCOMM_SUCCESS) {
    std::printf("FAIL rank %d: %s: returned %d (%s): %s\n", rank, c.describe(n).c_str(),
                static_cast<int>(rc), mtxcomm_get_error_string(rc), mtxcomm_get_last_error(comm));
    return Outcome::kCallFailed;
  }
  if (!c.inPlace && std::memcmp(b.sendCopy.data(), b.sendStore.data(), b.inCount * b.es) != 0) {
    std::printf("FAIL rank %d: %s: the send buffer was written\n", rank, c.describe(n).c_str());
    return Outcome::kWrong;
  }
  const OutputCheck chk = checkOutput(b, c, rank, n);
  if (!chk.ok()) {
    std::printf("FAIL rank %d: %s: first wrong element %zu of %zu\n", rank, c.describe(n).c_str(),
                chk.firstWrong, chk.checkCount);
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
      if (reduces && !opApplies(dt, op)) continue;  // bool AVG is refused (test_api_args)
      for (size_t count : counts) {
        if (!hasInPlace(coll)) {
          cases.push_back({coll, algo, dt, op, count, false, 0});
          cases.push_back({coll, algo, dt, op, count, false, 0, /*vcounts=*/true});
          continue;
        }
        for (bool inPlace : {false, true}) {
          for (int root : roots) cases.push_back({coll, algo, dt, op, count, inPlace, root});
        }
      }
    }
  }
}

// Sets MTXCOMM_<COLL>_ALGO=algo (init_from_env reads it) and clears the others.
inline void forceAlgorithm(Collective coll, const char* algo) {
  for (Collective c : kColls) unsetenv(collectiveAlgoVar(c));
  if (algo) setenv(collectiveAlgoVar(coll), algo, 1);
}

}  // namespace mp
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_MP_MP_CHECK_H_
