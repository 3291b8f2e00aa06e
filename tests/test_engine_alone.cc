// The binding engine in a world of one rank (a process started without a launcher): a small
// request whose submitter may run the cycle (Entry::mayRunInline, as TensorFlow's kernels and
// the array API submit) completes inside enqueue on the submitting thread while the engine's
// thread sleeps; a large one, one that may not, and one submitted from inside a completion go to
// the engine's thread. Every test waits for its requests' done before their buffers go. The
// engine at two ranks: test_engine_pair.cc; its jobs: tests/python/test_engine_jobs.py.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "bindings/common/engine.h"
#include "common/engine_outcome.h"

namespace mtxcomm::binding {
namespace {

using testing::Outcome;
using testing::request;

class EngineAlone : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MTXCOMM_PLACEMENT", "off", 1);  // do not bind the test process
    Status st = init();
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(size(), 1);
  }
  void TearDown() override { shutdown(); }
};

TEST_F(EngineAlone, ASmallRequestCompletesInsideEnqueueOnTheSubmittersThread) {
  const std::vector<float> in = {1.5f, -2.0f, 3.0f, 4.0f};
  // The submitter runs the cycle when the engine's thread is not running one: after a pause
  // the engine's thread sleeps (a spurious wake-up of it may still take a request: hence 4 of
  // 5, not 5 of 5). The first call, then calls the response cache knows.
  int inside = 0;
  for (int k = 0; k < 5; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Outcome o;
    enqueue(request(Kind::kAllreduce, "small", in, &o, /*mayRunInline=*/true));
    bool doneInside;
    {
      std::lock_guard<std::mutex> lk(o.mu);
      doneInside = o.done && o.thread == std::this_thread::get_id();
    }
    inside += doneInside ? 1 : 0;
    ASSERT_TRUE(o.wait());
    EXPECT_TRUE(o.status.ok()) << o.status.message;
    EXPECT_EQ(o.out, in);
  }
  EXPECT_GE(inside, 4) << "calls whose done ran inside enqueue on the submitting thread";
}

TEST_F(EngineAlone, OthersGoToTheEnginesThread) {
  const std::vector<float> small = {1.0f, 2.0f};
  Outcome a;
  enqueue(request(Kind::kAllreduce, "handed", small, &a, /*mayRunInline=*/false));
  ASSERT_TRUE(a.wait());
  EXPECT_TRUE(a.status.ok()) << a.status.message;
  EXPECT_NE(a.thread, std::this_thread::get_id());
  EXPECT_EQ(a.out, small);

  // 64 Ki floats (256 KiB): over what a submitter runs itself.
  std::vector<float> large(64 << 10);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<float>(i % 1000);
  Outcome b;
  enqueue(request(Kind::kAllreduce, "large", large, &b, /*mayRunInline=*/true));
  ASSERT_TRUE(b.wait());
  EXPECT_TRUE(b.status.ok()) << b.status.message;
  EXPECT_NE(b.thread, std::this_thread::get_id());
  EXPECT_EQ(b.out, large);
}

TEST_F(EngineAlone, ARequestSubmittedFromACompletionRunsOnTheEnginesThread) {
  const std::vector<float> in = {7.0f};
  Outcome first, second;
  Entry e = request(Kind::kAllreduce, "first", in, &first, /*mayRunInline=*/true);
  auto done = e.done;
  e.done = [&, done](const Status& st) {
    // Inside the first cycle: the second request must not run a cycle of its own here.
    enqueue(request(Kind::kAllreduce, "second", in, &second, /*mayRunInline=*/true));
    done(st);
  };
  enqueue(std::move(e));
  ASSERT_TRUE(first.wait());
  ASSERT_TRUE(second.wait());
  EXPECT_TRUE(second.status.ok()) << second.status.message;
  EXPECT_NE(second.thread, std::this_thread::get_id());
  EXPECT_EQ(second.out, in);
}

TEST_F(EngineAlone, AnInvalidRequestFailsInsideEnqueueAndTheEngineGoesOn) {
  const std::vector<float> in = {1.0f, 2.0f};
  Outcome bad;
  enqueue(request(Kind::kBroadcast, "bad_root", in, &bad, /*mayRunInline=*/true, /*root=*/3));
  ASSERT_TRUE(bad.wait());
  EXPECT_EQ(bad.status.code, MTXCOMM_INVALID_ARGUMENT) << bad.status.message;
  EXPECT_NE(bad.status.message.find("bad_root"), std::string::npos) << bad.status.message;
  Outcome good;
  enqueue(request(Kind::kBroadcast, "good_root", in, &good, /*mayRunInline=*/true));
  ASSERT_TRUE(good.wait());
  EXPECT_TRUE(good.status.ok()) << good.status.message;
  EXPECT_EQ(good.out, in);
}

}  // namespace
}  // namespace mtxcomm::binding
