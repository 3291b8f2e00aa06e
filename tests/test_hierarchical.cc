// The hierarchical algorithms on emulated nodes: the threaded harness gives each communicator
// a test topology (Topology::forTest), so node-local levels get their own shared-memory
// segments and the cross-node levels run over the in-process transport. Layouts: uneven (3+1,
// 2+2+1), one rank per node (1+1), uniform (2+2, 3+3: the reduce-scatter variant, with and
// without padding), and nodes that do not hold consecutive ranks. Every datatype and op, roots
// on and off node leaders, in place and out of place, checked bitwise against the closed-form
// expected values (tests/common/test_data.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "harness.h"
#include "lib/comm/select.h"

namespace mtxcomm {
namespace {

using namespace testdata;  // NOLINT: the shared data, Case and helpers
using testing::runRanks;

std::string layoutName(const std::vector<int>& nodeOf) {
  std::string s;
  for (int k : nodeOf) s += std::to_string(k);
  return s;
}

void checkCase(mtxcomm_comm_t comm, int rank, int n, const Case& c) {
  Comm* impl = unwrapComm(comm);
  impl->mutableConfig().algo[static_cast<int>(c.coll)] = c.algo;
  CaseBuffers b(c, rank, n, /*poisonInPlaceAllgather=*/false);
  ASSERT_EQ(callCollective(c, comm, rank, b.sendArg, b.recvArg), MTXCOMM_SUCCESS)
      << c.describe(n) << ": " << mtxcomm_get_last_error(comm);
  if (c.count > 0) {
    ASSERT_EQ(impl->lastAlgorithm(), c.algo) << c.describe(n) << ": fell back";
  }
  if (!c.inPlace) {
    ASSERT_EQ(0, std::memcmp(b.sendCopy.data(), b.sendStore.data(), b.inCount * b.es))
        << c.describe(n) << ": the send buffer was written";
  }
  const OutputCheck chk = checkOutput(b, c, rank, n);
  ASSERT_TRUE(chk.ok()) << c.describe(n) << ": first wrong element " << chk.firstWrong << " of "
                        << chk.checkCount;
}

class HierarchicalLayouts : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(HierarchicalLayouts, AllreduceEveryDatatypeOpAndBroadcastEveryRoot) {
  const std::vector<int> nodeOf = GetParam();
  const int n = static_cast<int>(nodeOf.size());
  std::vector<Case> cases;
  const std::vector<size_t> counts = {
      0, 1, static_cast<size_t>(n) - 1, static_cast<size_t>(n) + 1, 1001, 70001};
  for (mtxcomm_datatype_t dt : allDatatypes()) {
    for (mtxcomm_op_t op : kOps) {
      if (!opApplies(dt, op)) continue;  // bool AVG is refused (test_api_args)
      for (size_t count : counts) {
        // The multi-chunk counts for the float types (the widened path) and one integer type.
        const bool big = dt == MTXCOMM_FLOAT32 || dt == MTXCOMM_FLOAT16 || dt == MTXCOMM_INT64;
        if (count > 2000 && (!big || (op != MTXCOMM_SUM && op != MTXCOMM_AVG))) continue;
        for (bool inPlace : {false, true}) {
          cases.push_back({Collective::kAllreduce, "hierarchical", dt, op, count, inPlace, 0});
        }
      }
    }
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t{1}, size_t{70001}}) {
        if (count > 2000 && dt != MTXCOMM_FLOAT32 && dt != MTXCOMM_UINT8) continue;
        cases.push_back(
            {Collective::kBroadcast, "hierarchical", dt, MTXCOMM_SUM, count, root % 2 == 1, root});
      }
    }
  }
  Config cfg;
  cfg.shmSlotBytes = 64 << 10;  // several shm chunks on the node-local level
  cfg.segmentBytes = 64 << 10;  // several ring segments on the cross-node level
  runRanks(
      n,
      [&](mtxcomm_comm_t comm, int rank) {
        for (const Case& c : cases) {
          checkCase(comm, rank, n, c);
          if (::testing::Test::HasFatalFailure()) return;
        }
        // The node-local level of a node with several ranks runs over its own segment.
        const Comm* local = unwrapComm(comm)->localLevel();
        ASSERT_NE(local, nullptr);
        EXPECT_EQ(local->size(), unwrapComm(comm)->topology().localSize(rank));
        EXPECT_EQ(local->hasShm(), local->size() > 1);
        EXPECT_FALSE(unwrapComm(comm)->hasShm()) << "a segment across emulated nodes";
      },
      cfg, nodeOf);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HierarchicalLayouts,
                         ::testing::Values(std::vector<int>{0, 0, 0, 1},
                                           std::vector<int>{0, 0, 1, 1, 2}, std::vector<int>{0, 1},
                                           std::vector<int>{0, 0, 1, 1},
                                           std::vector<int>{0, 0, 0, 1, 1, 1},
                                           std::vector<int>{0, 1, 0, 1}, std::vector<int>{1, 0, 0}),
                         [](const auto& info) { return "nodes_" + layoutName(info.param); });

// The levels of a forced hierarchical call choose their own algorithms: with the flat
// algorithms forced for the whole communicator, the cross-node level uses them too.
TEST(Hierarchical, LevelsKeepOtherForcedAlgorithms) {
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "hierarchical";
  runRanks(4,
           [&](mtxcomm_comm_t comm, int rank) {
             std::vector<float> v(100, 1.0f + rank);
             ASSERT_EQ(mtxcomm_allreduce(v.data(), v.data(), v.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM,
                                         comm, nullptr),
                       MTXCOMM_SUCCESS)
                 << mtxcomm_get_last_error(comm);
             EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), "hierarchical");
             for (float x : v) ASSERT_EQ(x, 10.0f);
           },
           cfg, {0, 0, 1, 1});
}

// On one node hierarchical declines: the call falls back to the automatic choice (shm).
TEST(Hierarchical, DeclinesOnOneNode) {
  Config cfg;
  cfg.algo[static_cast<int>(Collective::kAllreduce)] = "hierarchical";
  cfg.algo[static_cast<int>(Collective::kBroadcast)] = "hierarchical";
  runRanks(3,
           [&](mtxcomm_comm_t comm, int rank) {
             std::vector<int32_t> v(10, rank);
             ASSERT_EQ(mtxcomm_allreduce(v.data(), v.data(), v.size(), MTXCOMM_INT32, MTXCOMM_SUM,
                                         comm, nullptr),
                       MTXCOMM_SUCCESS);
             EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), "shm");
             EXPECT_EQ(v[0], 3);
             ASSERT_EQ(
                 mtxcomm_broadcast(v.data(), v.data(), v.size(), MTXCOMM_INT32, 2, comm, nullptr),
                 MTXCOMM_SUCCESS);
             EXPECT_EQ(unwrapComm(comm)->lastAlgorithm(), "shm");
           },
           cfg, {0, 0, 0});
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.count = 1000;
  const Topology one = Topology::forTest({0, 0, 0});
  CommInfo info;
  info.nranks = 3;
  info.topo = &one;
  Selection s = selectAlgorithm(a, info, "hierarchical", 0);
  EXPECT_NE(std::string(s.algorithm->name), "hierarchical");
  EXPECT_NE(s.why.find("one node"), std::string::npos) << s.why;
}

}  // namespace
}  // namespace mtxcomm
