// Schedules as data: a ring allreduce prints its steps, and ring schedules never send a message
// larger than one segment.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algos/registry.h"
#include "algos/schedule.h"
#include "common/test_util.h"
#include "lib/base/call.h"

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

}  // namespace
}  // namespace mtxcomm
