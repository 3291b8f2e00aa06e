// Schedules as data: a ring allreduce prints its steps, and ring schedules never send a message
// larger than one segment; adasum's fold and tree.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "algos/schedule.h"
#include "common/test_util.h"
#include "lib/base/call.h"
#include "lib/base/error.h"

namespace mtxcomm {
namespace {

using testutil::contains;

TEST(Schedule, PrintsItsSteps) {
  CollArgs a;
  a.count = 8;
  a.elemSize = 4;
  float in[8] = {0}, out[8] = {0};
  a.sendbuf = in;
  a.recvbuf = out;
  Schedule s(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
  AlgoParams p;
  buildAllreduceRing(a, 0, 4, p, s);
  // 3 reduce-scatter steps and 3 allgather steps of 2 elements (8 bytes) each.
  EXPECT_EQ(s.steps().size(), 6u);
  std::string text = s.toString();
  EXPECT_TRUE(contains(text, "send 8 B -> rank 1")) << text;
  EXPECT_TRUE(contains(text, "recv 8 B <- rank 3")) << text;
  EXPECT_TRUE(contains(text, "reduce 2 elements")) << text;
}

// Pairwise alltoall on rank 1 of 4: a local copy, then 3 steps of one send to 1+k and one
// receive from 1-k; alltoallv posts every message, also an empty one (so that a count two ranks
// disagree on is a size mismatch, not a hang).
TEST(Schedule, PairwiseAlltoallExchangesWithEveryPeerOnce) {
  float in[8] = {0}, out[8] = {0};
  CollArgs a;
  a.coll = Collective::kAlltoall;
  a.count = 2;
  a.elemSize = 4;
  a.sendbuf = in;
  a.recvbuf = out;
  Schedule s(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
  buildAlltoallPairwise(a, 1, 4, AlgoParams(), s);
  ASSERT_EQ(s.steps().size(), 4u);
  EXPECT_EQ(s.steps()[0].local.size(), 1u);
  for (int k = 1; k <= 3; ++k) {
    const Step& step = s.steps()[k];
    ASSERT_EQ(step.comm.size(), 2u);
    EXPECT_TRUE(step.comm[0].isSend);
    EXPECT_EQ(step.comm[0].peer, (1 + k) % 4);
    EXPECT_EQ(step.comm[0].buf, in + 2 * ((1 + k) % 4));
    EXPECT_FALSE(step.comm[1].isSend);
    EXPECT_EQ(step.comm[1].peer, (1 - k + 4) % 4);
    EXPECT_EQ(step.comm[1].buf, out + 2 * ((1 - k + 4) % 4));
    EXPECT_EQ(step.comm[1].bytes, 8u);
  }
  const size_t counts[4] = {0, 3, 0, 1}, displs[4] = {0, 0, 3, 3};
  a.vcounts = true;
  a.sendcounts = a.recvcounts = counts;
  a.sdispls = a.rdispls = displs;
  Schedule v(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
  buildAlltoallPairwise(a, 1, 4, AlgoParams(), v);
  ASSERT_EQ(v.steps().size(), 4u);
  EXPECT_EQ(v.steps()[2].comm[0].peer, 3);  // k = 2: send 1 element to rank 3
  EXPECT_EQ(v.steps()[2].comm[0].bytes, 4u);
  EXPECT_EQ(v.steps()[1].comm[0].bytes, 0u);  // k = 1: the empty block for rank 2, still posted
}

// Ring allreduce and ring allgather never send a message larger than a segment, in either phase
// (over UCX/TCP every message then stays under the eager limit).
TEST(Schedule, RingMessagesAreAtMostOneSegment) {
  const size_t count = 3 * 1000 + 7, seg = 1024;  // blocks of ~1000 floats: 4 segments each
  std::vector<float> in(count, 1.0f), out(count, 0.0f);
  CollArgs a;
  a.count = count;
  a.elemSize = 4;
  a.sendbuf = in.data();
  a.recvbuf = out.data();
  AlgoParams p;
  p.segmentBytes = seg;
  using Build = void (*)(const CollArgs&, int, int, const AlgoParams&, Schedule&);
  for (Build build : {Build{buildAllreduceRing}, Build{buildAllgatherRing}}) {
    CollArgs args = a;
    if (build == buildAllgatherRing) {
      args.count = count / 3;
      out.assign(count, 0.0f);
    }
    Schedule s(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
    build(args, 1, 3, p, s);
    size_t sent = 0, largest = 0;
    for (const Step& step : s.steps()) {
      for (const CommOp& op : step.comm) {
        largest = std::max(largest, op.bytes);
        if (op.isSend) sent += op.bytes;
      }
    }
    EXPECT_LE(largest, seg) << s.toString();
    EXPECT_GT(sent, 2 * seg) << s.toString();  // several segments were sent
  }
}

// Adasum on 3 ranks (q = 2): rank 2 sends its vector to rank 0 and later receives the result;
// rank 0 combines adasum(own, rank 2's), exchanges with rank 1 and combines with its own vector
// first (the lower rank's is a), then sends the result to rank 2; rank 1 has no fold partner.
TEST(Schedule, AdasumFoldsTheUpperRanksOntoRMinusQ) {
  float in[4] = {0}, out[4] = {0};
  CollArgs a;
  a.count = 4;
  a.elemSize = 4;
  a.dtype = MTXCOMM_FLOAT32;
  a.op = MTXCOMM_ADASUM;
  a.sendbuf = in;
  a.recvbuf = out;
  Schedule r0(MTXCOMM_FLOAT32, 4, MTXCOMM_ADASUM);
  buildAllreduceAdasum(a, 0, 3, AlgoParams(), r0);
  ASSERT_EQ(r0.steps().size(), 3u);
  EXPECT_EQ(r0.toString(),
            "step 0: recv 16 B <- rank 2; adasum 4 elements;\n"
            "step 1: send 16 B -> rank 1; recv 16 B <- rank 1; adasum 4 elements;\n"
            "step 2: send 16 B -> rank 2;\n");
  EXPECT_EQ(r0.steps()[0].local[0].a, in);  // the lower rank's vector first
  EXPECT_EQ(r0.steps()[1].local[0].a, out);
  Schedule r1(MTXCOMM_FLOAT32, 4, MTXCOMM_ADASUM);
  buildAllreduceAdasum(a, 1, 3, AlgoParams(), r1);
  EXPECT_EQ(r1.toString(),
            "step 0: copy 16 B;\n"
            "step 1: send 16 B -> rank 0; recv 16 B <- rank 0; adasum 4 elements;\n");
  EXPECT_EQ(r1.steps()[1].local[0].b, out);  // rank 0's vector is a on rank 1 too
  Schedule r2(MTXCOMM_FLOAT32, 4, MTXCOMM_ADASUM);
  buildAllreduceAdasum(a, 2, 3, AlgoParams(), r2);
  EXPECT_EQ(r2.toString(),
            "step 0: send 16 B -> rank 0;\n"
            "step 1: recv 16 B <- rank 0;\n");
  // Any other op is refused by the builder itself.
  a.op = MTXCOMM_SUM;
  Schedule sum(MTXCOMM_FLOAT32, 4, MTXCOMM_SUM);
  EXPECT_THROW(buildAllreduceAdasum(a, 0, 3, AlgoParams(), sum), Error);
}

}  // namespace
}  // namespace mtxcomm
