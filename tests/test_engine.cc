// The binding engine's pure parts, without a communicator: the negotiation table and its wire
// format (response cache, second exchange, join stand-ins, stall verdicts), the timeline file,
// and the placement decision. The engine's multi-rank behaviour (stalls, join, fusion inside
// tf.function, timeline after SIGKILL) is tested end to end in tests/python/test_engine_jobs.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bindings/common/negotiation.h"
#include "bindings/common/timeline.h"
#include "common/test_util.h"
#include "lib/comm/placement.h"

namespace mtxcomm::binding {
namespace {

using testutil::contains;

Request allreduce(const std::string& name, std::vector<int64_t> shape,
                  mtxcomm_datatype_t dt = MTXCOMM_FLOAT32) {
  Request r;
  r.kind = Kind::kAllreduce;
  r.name = name;
  r.op = MTXCOMM_SUM;
  r.tensors.push_back({dt, std::move(shape)});
  return r;
}

Request kind(Kind k, const std::string& name, std::vector<int64_t> shape) {
  Request r = allreduce(name, std::move(shape));
  r.kind = k;
  return r;
}

// n ranks, each with its own Negotiation, exchanging their slots in memory as the engine's
// allgathers would.
struct Ranks {
  explicit Ranks(int n, int cache = 16) {
    for (int r = 0; r < n; ++r) neg.emplace_back(r, n, cache);
  }
  // One cycle: msgs[r] is rank r's message; returns every rank's ready operations.
  std::vector<std::vector<Agreed>> cycle(const std::vector<CycleMessage>& msgs,
                                         std::vector<std::vector<Cancelled>>* cancelled = nullptr,
                                         bool* second = nullptr) {
    const int n = static_cast<int>(neg.size());
    const size_t slot = neg[0].slotBytes();
    std::vector<char> all(slot * n);
    std::vector<std::vector<char>> extras(n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(neg[r].slotBytes(), slot);
      extras[r] = neg[r].encode(msgs[r], all.data() + r * slot);
    }
    size_t longest = 0;
    const bool two = neg[0].needsSecondExchange(all, &longest);
    if (second) *second = two;
    size_t stride = 0;
    std::vector<char> allExtras;
    if (two) {
      stride = (longest + 7) / 8 * 8;
      allExtras.assign(stride * n, 0);
      for (int r = 0; r < n; ++r) {
        std::copy(extras[r].begin(), extras[r].end(), allExtras.begin() + r * stride);
      }
    }
    std::vector<std::vector<Agreed>> ready(n);
    for (int r = 0; r < n; ++r) {
      std::vector<Cancelled> c;
      neg[r].ingest(all, allExtras, stride, &c);
      if (cancelled) cancelled->push_back(c);
      ready[r] = neg[r].takeReady();
      for (Agreed& a : ready[r]) {
        if (neg[r].check(a).ok()) neg[r].remember(a);
      }
    }
    return ready;
  }
  std::vector<Negotiation> neg;
};

CycleMessage full(std::vector<Request> reqs) {
  CycleMessage m;
  m.requests = std::move(reqs);
  return m;
}

TEST(Negotiation, ANameRunsOnceEveryRankSubmittedItInTheAgreedOrder) {
  Ranks ranks(3);
  auto ready = ranks.cycle(
      {full({allreduce("a", {4}), allreduce("b", {2})}), full({allreduce("b", {2})}), full({})});
  for (auto& r : ready) EXPECT_TRUE(r.empty());
  ready = ranks.cycle(
      {full({}), full({allreduce("a", {4})}), full({allreduce("b", {2}), allreduce("a", {4})})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 2u) << "rank " << r;
    // "b" was completed (by rank 2) before "a": the order every rank agrees on.
    EXPECT_EQ(ready[r][0].name, "b");
    EXPECT_EQ(ready[r][1].name, "a");
  }
}

TEST(Negotiation, ARequestSeenBeforeTravelsAsOneCacheBit) {
  Ranks ranks(2);
  const Request a = allreduce("grad/0", {1024, 1024}), b = allreduce("grad/1", {10});
  ranks.cycle({full({a, b}), full({b, a})});
  for (auto& n : ranks.neg) EXPECT_EQ(n.cacheSize(), 2);
  const int ida = ranks.neg[0].cachedId(a), idb = ranks.neg[0].cachedId(b);
  ASSERT_GE(ida, 0);
  ASSERT_GE(idb, 0);
  EXPECT_EQ(ranks.neg[1].cachedId(a), ida) << "the caches must be identical on every rank";
  // The steady state: no request in full, only bits; the slot is header + one word + inline.
  CycleMessage m;
  m.cached = {static_cast<uint32_t>(std::min(ida, idb)), static_cast<uint32_t>(std::max(ida, idb))};
  EXPECT_EQ(ranks.neg[0].slotBytes(), Negotiation::kHeaderBytes + 8 + Negotiation::kInlineBytes);
  bool second = true;
  auto ready = ranks.cycle({m, m}, nullptr, &second);
  EXPECT_FALSE(second);
  for (auto& r : ready) {
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].requests[0], r[0].name == "grad/0" ? a : b);
  }
  // A changed shape is a new request: no cache hit.
  EXPECT_EQ(ranks.neg[0].cachedId(allreduce("grad/0", {1024, 1023})), -1);
}

TEST(Negotiation, ManyNewRequestsGoInASecondExchange) {
  Ranks ranks(2);
  std::vector<Request> many;
  for (int i = 0; i < 40; ++i) many.push_back(allreduce("t" + std::to_string(i), {i + 1}));
  bool second = false;
  auto ready = ranks.cycle({full(many), full(many)}, nullptr, &second);
  EXPECT_TRUE(second);
  EXPECT_EQ(ready[0].size(), 40u);
  EXPECT_EQ(ready[1].size(), 40u);
}

TEST(Negotiation, DisagreementIsOneErrorNamingTensorAndRanks) {
  Ranks ranks(3);
  auto ready = ranks.cycle(
      {full({allreduce("w", {4})}), full({allreduce("w", {4})}), full({allreduce("w", {5})})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 1u);
    const Status st = ranks.neg[r].check(ready[r][0]);
    EXPECT_EQ(st.code, MTXCOMM_INVALID_USAGE) << "ranks that disagree misuse the API together";
    EXPECT_TRUE(contains(st.message, "'w'")) << st.message;
    EXPECT_TRUE(contains(st.message, "rank 2 has allreduce(sum) of float32[5]")) << st.message;
    EXPECT_EQ(ranks.neg[r].cacheSize(), 0) << "a failed check is not remembered";
  }
}

Request alltoall(const std::string& name, std::vector<int64_t> shape, std::vector<int64_t> splits) {
  Request r = kind(Kind::kAlltoall, name, std::move(shape));
  r.splits = std::move(splits);
  return r;
}

TEST(Negotiation, AlltoallSplitsTravelAndAreCheckedOnEveryRank) {
  Ranks ranks(3);
  // Dimension 0 and the splits differ between ranks; the other dimensions may not.
  const Request a = alltoall("x", {6, 2}, {1, 2, 3}), b = alltoall("x", {3, 2}, {}),
                c = alltoall("x", {0, 2}, {0, 0, 0});
  auto ready = ranks.cycle({full({a}), full({b}), full({c})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 1u);
    EXPECT_EQ(ready[r][0].requests[0].splits, (std::vector<int64_t>{1, 2, 3}));
    EXPECT_TRUE(ready[r][0].requests[1].splits.empty());
    EXPECT_TRUE(ranks.neg[r].check(ready[r][0]).ok()) << ranks.neg[r].check(ready[r][0]).message;
  }
  // The same request again travels as its cache bit, splits included; other splits do not.
  for (int r = 0; r < 3; ++r) ranks.neg[r].remember(ready[r][0]);
  EXPECT_GE(ranks.neg[0].cachedId(a), 0);
  EXPECT_EQ(ranks.neg[0].cachedId(alltoall("x", {6, 2}, {3, 2, 1})), -1);

  struct Bad {
    Request req;
    mtxcomm_result_t code;
    const char* says;
  };
  const Bad bad[] = {
      {alltoall("y", {6, 2}, {1, 2}), MTXCOMM_INVALID_ARGUMENT, "rank 1 passed 2 splits for 3"},
      {alltoall("y", {6, 2}, {1, 2, 2}), MTXCOMM_INVALID_ARGUMENT, "summing to 5"},
      {alltoall("y", {6, 2}, {-1, 4, 3}), MTXCOMM_INVALID_ARGUMENT, "negative split"},
      {alltoall("y", {4, 2}, {}), MTXCOMM_INVALID_ARGUMENT, "not a multiple of the number"},
      {alltoall("y", {3, 5}, {}), MTXCOMM_INVALID_USAGE, "disagree on the shape after the first"},
      {alltoall("y", {}, {}), MTXCOMM_INVALID_ARGUMENT, "at least one dimension"},
  };
  for (const Bad& x : bad) {
    const Request ok = x.req.tensors[0].shape.empty() ? x.req : alltoall("y", {3, 2}, {});
    ready = ranks.cycle({full({ok}), full({x.req}), full({ok})});
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(ready[r].size(), 1u);
      const Status st = ranks.neg[r].check(ready[r][0]);
      EXPECT_EQ(st.code, x.code) << x.says << ": " << st.message;
      EXPECT_TRUE(contains(st.message, x.says)) << st.message;
    }
  }
}

TEST(Negotiation, GroupedRequestsAreCheckedTensorByTensor) {
  Ranks ranks(2);
  Request g0 = kind(Kind::kAllgather, "g", {2, 3}), g1 = kind(Kind::kAllgather, "g", {5, 3});
  g0.tensors.push_back({MTXCOMM_INT32, {1}});
  g1.tensors.push_back({MTXCOMM_INT32, {4}});
  auto ready = ranks.cycle({full({g0}), full({g1})});
  EXPECT_TRUE(ranks.neg[0].check(ready[0][0]).ok());
  g1.tensors[1].shape = {};  // a scalar in the group cannot be gathered
  g0.tensors[1].shape = {};
  ready = ranks.cycle({full({g0}), full({g1})});
  EXPECT_EQ(ranks.neg[0].check(ready[0][0]).code, MTXCOMM_INVALID_ARGUMENT);
  g0.tensors[1] = {MTXCOMM_INT64, {1}};
  g1.tensors[1] = {MTXCOMM_INT32, {1}};
  ready = ranks.cycle({full({g0}), full({g1})});
  const Status st = ranks.neg[1].check(ready[1][0]);
  EXPECT_EQ(st.code, MTXCOMM_INVALID_USAGE);
  EXPECT_TRUE(contains(st.message, "dtypes")) << st.message;
}

TEST(Negotiation, JoinedRanksStandInUntilEveryRankJoined) {
  Ranks ranks(3);
  // Rank 2 runs out of data and joins; ranks 0 and 1 go on.
  ranks.cycle({full({}), full({}), full({kind(Kind::kJoin, "mtxcomm.join", {})})});
  auto ready =
      ranks.cycle({full({allreduce("g", {3}), kind(Kind::kAllgather, "rows", {5, 2})}),
                   full({allreduce("g", {3}), kind(Kind::kAllgather, "rows", {4, 2})}), full({})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 2u) << "rank " << r;
    const Agreed& g = ready[r][0];
    EXPECT_TRUE(g.joined[2]);
    EXPECT_FALSE(g.joined[0]);
    EXPECT_EQ(g.requests[2], allreduce("g", {3})) << "the stand-in has the agreed shape";
    const Agreed& rows = ready[r][1];
    EXPECT_EQ(rows.requests[2].tensors[0].shape, (std::vector<int64_t>{0, 2}))
        << "a joined rank gathers no rows";
    EXPECT_TRUE(ranks.neg[r].check(rows).ok());
  }
  // A broadcast from a joined root cannot run.
  Request bc = kind(Kind::kBroadcast, "bc", {2});
  bc.root = 2;
  ready = ranks.cycle({full({bc}), full({bc}), full({})});
  const Status st = ranks.neg[0].check(ready[0][0]);
  EXPECT_EQ(st.code, MTXCOMM_INVALID_USAGE);
  EXPECT_TRUE(contains(st.message, "has joined")) << st.message;
  // An alltoall needs every rank.
  ready =
      ranks.cycle({full({alltoall("a2a", {2}, {})}), full({alltoall("a2a", {2}, {})}), full({})});
  const Status a2a = ranks.neg[1].check(ready[1][0]);
  EXPECT_EQ(a2a.code, MTXCOMM_INVALID_USAGE);
  EXPECT_TRUE(contains(a2a.message, "rank 2 called join()")) << a2a.message;
  // The join completes when the last rank joins, naming it; then nobody is joined.
  ranks.cycle({full({kind(Kind::kJoin, "mtxcomm.join", {})}), full({}), full({})});
  ready = ranks.cycle({full({}), full({kind(Kind::kJoin, "mtxcomm.join", {})}), full({})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 1u);
    EXPECT_EQ(ready[r][0].lastJoined, 1);
    EXPECT_FALSE(ranks.neg[r].joined(2));
  }
}

// A rank that joined early waits while the others still run collectives (uneven data): its
// join's stall clock starts at the last agreed operation, not at the join; a stall only once
// nothing has been agreed for MTXCOMM_STALL_TIMEOUT.
TEST(Negotiation, AJoinIsNotStalledWhileTheOthersWork) {
  Ranks ranks(2);
  ranks.cycle({full({kind(Kind::kJoin, "mtxcomm.join", {})}), full({})});
  Negotiation::Clock::time_point next;
  for (int step = 0; step < 4; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    auto ready = ranks.cycle({full({}), full({allreduce("g", {3})})});
    ASSERT_EQ(ready[0].size(), 1u);  // rank 0 stands in
    EXPECT_TRUE(ranks.neg[0].stallVerdicts(0.1, &next).empty())
        << "step " << step << ": the join is 30 ms older than the last allreduce, not "
        << 30 * (step + 1) << " ms";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  EXPECT_EQ(ranks.neg[0].stallVerdicts(0.1, &next), std::vector<std::string>{"mtxcomm.join"});
}

TEST(Negotiation, RankZerosStallVerdictFailsTheRequestOnEveryRankThatSubmittedIt) {
  Ranks ranks(3);
  ranks.cycle({full({allreduce("lonely", {1})}), full({allreduce("lonely", {1})}), full({})});
  Negotiation::Clock::time_point next;
  EXPECT_TRUE(ranks.neg[0].stallVerdicts(3600, &next).empty());
  EXPECT_NE(next, Negotiation::Clock::time_point::max());
  const auto names = ranks.neg[0].stallVerdicts(0.000001, &next);
  ASSERT_EQ(names, std::vector<std::string>{"lonely"});
  CycleMessage verdict;
  verdict.cancelled = names;
  std::vector<std::vector<Cancelled>> cancelled;
  ranks.cycle({verdict, full({}), full({})}, &cancelled);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(cancelled[r].size(), 1u) << "rank " << r;
    EXPECT_EQ(cancelled[r][0].ranks, (std::vector<int>{0, 1}));
    EXPECT_TRUE(contains(cancelled[r][0].message, "lonely")) << cancelled[r][0].message;
    EXPECT_TRUE(contains(cancelled[r][0].message, "but not by rank 2")) << cancelled[r][0].message;
    EXPECT_FALSE(ranks.neg[r].pending());
  }
  // A verdict only rank 0 may give: the same names from another rank are ignored.
  ranks.cycle({full({allreduce("x", {1})}), full({}), full({})});
  CycleMessage fromOne;
  fromOne.cancelled = {"x"};
  cancelled.clear();
  ranks.cycle({full({}), fromOne, full({})}, &cancelled);
  EXPECT_TRUE(cancelled[0].empty());
  EXPECT_TRUE(ranks.neg[0].pending());
}

Request onDevice(Request r, int32_t device) {
  r.device = device;
  return r;
}

// Request::device travels with the request, is part of its identity (the response cache) and of
// its description; ranks that disagree on host memory against a GPU get one error naming each.
TEST(Negotiation, TheTensorsDeviceTravelsAndRanksThatDisagreeAreNamed) {
  Ranks ranks(3);
  const Request gpu = onDevice(allreduce("w", {4}), 1);
  EXPECT_EQ(describeRequest(gpu), "allreduce(sum) of float32[4] on cuda:1");
  auto ready = ranks.cycle({full({gpu}), full({gpu}), full({gpu})});
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(ready[r].size(), 1u);
    EXPECT_EQ(ready[r][0].requests[2].device, 1) << "the device came through the wire format";
    EXPECT_TRUE(ranks.neg[r].check(ready[r][0]).ok()) << ranks.neg[r].check(ready[r][0]).message;
  }
  EXPECT_GE(ranks.neg[0].cachedId(gpu), 0);
  EXPECT_EQ(ranks.neg[0].cachedId(allreduce("w", {4})), -1) << "host memory is another request";
  ready = ranks.cycle({full({onDevice(allreduce("x", {4}), 0)}), full({allreduce("x", {4})}),
                       full({onDevice(allreduce("x", {4}), 0)})});
  for (int r = 0; r < 3; ++r) {
    const Status st = ranks.neg[r].check(ready[r][0]);
    EXPECT_EQ(st.code, MTXCOMM_INVALID_USAGE);
    EXPECT_TRUE(contains(st.message,
                         "disagree on where the tensors live: rank 0 has cuda:0, "
                         "rank 1 has host memory"))
        << st.message;
    EXPECT_EQ(ranks.neg[r].cachedId(onDevice(allreduce("x", {4}), 0)), -1);
  }
  // Different GPUs on different ranks are fine (each rank's own device).
  ready = ranks.cycle({full({onDevice(allreduce("y", {4}), 0)}),
                       full({onDevice(allreduce("y", {4}), 1)}),
                       full({onDevice(allreduce("y", {4}), 2)})});
  EXPECT_TRUE(ranks.neg[0].check(ready[0][0]).ok()) << ranks.neg[0].check(ready[0][0]).message;
}

// What the executor cannot run on device buffers as they are is refused on every rank alike:
// alltoall, uneven allgather and reduce-scatter blocks, a joined rank's stand-in.
TEST(Negotiation, GpuTensorsTheExecutorCannotRunAsTheyAreAreRefusedOnEveryRank) {
  Ranks ranks(2);
  auto verdict = [&](const Request& a, const Request& b) {
    auto ready = ranks.cycle({full({a}), full({b})});
    const Status s0 = ranks.neg[0].check(ready[0][0]), s1 = ranks.neg[1].check(ready[1][0]);
    EXPECT_EQ(s0.code, s1.code);
    EXPECT_EQ(s0.message, s1.message);
    return s0;
  };
  Status st = verdict(onDevice(alltoall("a2a", {4}, {}), 0), onDevice(alltoall("a2a", {4}, {}), 0));
  EXPECT_EQ(st.code, MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(st.message, "alltoall 'a2a' on GPU tensors: alltoall takes host"))
      << st.message;
  st = verdict(onDevice(kind(Kind::kAllgather, "ag", {3, 2}), 0),
               onDevice(kind(Kind::kAllgather, "ag", {2, 2}), 0));
  EXPECT_EQ(st.code, MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(st.message, "first dimensions differ (tensor 0)")) << st.message;
  EXPECT_TRUE(verdict(onDevice(kind(Kind::kAllgather, "ag2", {3, 2}), 0),
                      onDevice(kind(Kind::kAllgather, "ag2", {3, 2}), 0))
                  .ok());
  st = verdict(onDevice(kind(Kind::kReduceScatter, "rs", {3}), 0),
               onDevice(kind(Kind::kReduceScatter, "rs", {3}), 0));
  EXPECT_EQ(st.code, MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(st.message, "not a multiple of the ranks")) << st.message;
  EXPECT_TRUE(verdict(onDevice(kind(Kind::kReduceScatter, "rs2", {4}), 0),
                      onDevice(kind(Kind::kReduceScatter, "rs2", {4}), 0))
                  .ok());
  // Rank 1 joins; rank 0's GPU allreduce would need a stand-in on the GPU.
  ranks.cycle({full({}), full({kind(Kind::kJoin, "mtxcomm.join", {})})});
  auto ready = ranks.cycle({full({onDevice(allreduce("g", {3}), 0)}), full({})});
  st = ranks.neg[0].check(ready[0][0]);
  EXPECT_EQ(st.code, MTXCOMM_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(st.message, "rank 1 has joined")) << st.message;
}

TEST(Negotiation, MalformedMessagesAreErrorsNotCrashes) {
  Negotiation neg(0, 2, 16);
  const size_t slot = neg.slotBytes();
  std::vector<char> all(2 * slot, 0);
  std::vector<Cancelled> c;
  EXPECT_THROW(neg.ingest(all, {}, 0, &c), std::runtime_error);  // no magic
  CycleMessage m;
  m.requests = {allreduce("a", {1})};
  neg.encode(m, all.data());
  neg.encode(m, all.data() + slot);
  all[slot + Negotiation::kHeaderBytes + 3] = 0x7f;  // an absurd request count (no cache bits)
  EXPECT_THROW(neg.ingest(all, {}, 0, &c), std::runtime_error);
  std::vector<char> truncated(slot, 0);
  EXPECT_THROW(neg.ingest(truncated, {}, 0, &c), std::runtime_error);
}

TEST(Timeline, IsValidJsonAfterEveryFlushAndBounded) {
  char dir[] = "/tmp/mtxcomm-timeline-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string base = std::string(dir) + "/t.json";
  Timeline t;
  std::string err;
  ASSERT_TRUE(t.open(base, 3, 4096, &err)) << err;
  EXPECT_EQ(t.path(), base + ".3");
  auto parse = [&] {
    std::ifstream f(t.path());
    std::stringstream ss;
    ss << f.rdbuf();
    return nlohmann::json::parse(ss.str());
  };
  const auto now = Timeline::Clock::now();
  t.complete("grad \"0\"", "ALLREDUCE", now, now + std::chrono::microseconds(5), "\"bytes\": 16");
  t.flush();
  nlohmann::json doc = parse();
  ASSERT_TRUE(doc.is_array());
  bool found = false;
  for (const auto& e : doc) found = found || (e.value("name", "") == "ALLREDUCE");
  EXPECT_TRUE(found) << doc.dump();
  for (int i = 0; i < 200; ++i) {
    t.complete("x", "QUEUE", now, now);
    t.flush();
  }
  doc = parse();  // still one valid array, cut at the limit with a last event saying so
  EXPECT_FALSE(t.enabled());
  EXPECT_TRUE(contains(doc.back().value("name", ""), "MTXCOMM_TIMELINE_MAX_BYTES"));
  std::remove(t.path().c_str());
  rmdir(dir);
}

TEST(Placement, SharesTheNodeAndKeepsWhatTheLauncherBound) {
  const std::vector<std::vector<int>> cores = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};  // SMT pairs
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  Placement p = decidePlacement(cores, all, 1, 2, "auto");
  EXPECT_EQ(p.share, 2);
  EXPECT_TRUE(p.boundHere);
  EXPECT_EQ(p.cpus, (std::vector<int>{2, 3, 6, 7})) << p.why;
  p = decidePlacement(cores, all, 0, 3, "auto");
  EXPECT_EQ(p.share, 1);
  EXPECT_EQ(p.cpus, (std::vector<int>{0, 4}));
  // Bound already (mpirun --bind-to core): kept, and the share is the binding's cores.
  p = decidePlacement(cores, {1, 5}, 0, 2, "auto");
  EXPECT_TRUE(p.boundByLauncher);
  EXPECT_FALSE(p.boundHere);
  EXPECT_EQ(p.share, 1);
  // More ranks than cores: not bound, one thread each.
  p = decidePlacement(cores, all, 4, 6, "auto");
  EXPECT_TRUE(p.oversubscribed);
  EXPECT_FALSE(p.boundHere);
  EXPECT_EQ(p.share, 1);
  // Off: not bound, the share still reported; one rank: every core, not bound.
  p = decidePlacement(cores, all, 0, 2, "off");
  EXPECT_FALSE(p.boundHere);
  EXPECT_EQ(p.share, 2);
  p = decidePlacement(cores, all, 0, 1, "auto");
  EXPECT_FALSE(p.boundHere);
  EXPECT_EQ(p.share, 4);
}

}  // namespace
}  // namespace mtxcomm::binding
