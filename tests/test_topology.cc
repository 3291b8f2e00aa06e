// Topology (the hwloc summary, node identity, the agreed node map, sub-communicator subsets),
// the cost model (predictions, selection across nodes, tuning files) and the agreement of both
// at setup.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "lib/base/liveness.h"
#include "lib/comm/cost_model.h"
#include "lib/comm/select.h"
#include "lib/comm/topology_probe.h"

namespace mtxcomm {
namespace {

TEST(Topology, LocalSummaryNamesTheNodeAndItsNamespaces) {
  const RankSummary s = localRankSummary();
  const std::string id = s.nodeId;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  EXPECT_EQ(id.rfind(std::string(host).substr(0, 16), 0), 0u) << id;
  EXPECT_NE(id.find("|net:"), std::string::npos) << id;
  EXPECT_NE(id.find("|pid:"), std::string::npos) << id;
  EXPECT_EQ(id, localNodeIdentity());
  // Liveness decides "same node" with the same identity.
  EXPECT_EQ(PeerLiveness::nodeIdentity(), localNodeIdentity());
  if (s.pus == 0) {
    GTEST_SKIP() << "built without hwloc: no hardware counts to check";
  }
  EXPECT_GE(s.pus, s.cores);
  EXPECT_GE(s.cores, 1);
  EXPECT_GE(s.packages, 1);
  EXPECT_GE(s.numaNodes, 1);
  EXPECT_NE(describeSummary(s).find("core(s)"), std::string::npos);
  if (access("/dev/shm", W_OK) == 0) {
    EXPECT_GE(s.shmFreeMiB, 0);
  }
  // The L2 of one core, as the kernel reports cpu0's (sysfs "1024K").
  for (int i = 0; i < 8; ++i) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(base + "level"), size(base + "size");
    int lv = 0;
    std::string text;
    if (!(level >> lv) || lv != 2 || !(size >> text)) continue;
    const long kib = std::stol(text) * (text.back() == 'M' ? 1024 : 1);
    // One core's share: the whole cache where no other core shares it, less where one does.
    EXPECT_GT(s.l2KiB, 0) << "sysfs " << base << "size reads " << text;
    EXPECT_LE(s.l2KiB, kib) << "sysfs " << base << "size reads " << text;
    if (s.l2KiB != kib) continue;
    EXPECT_NE(describeSummary(s).find(std::to_string(kib) + " KiB L2 per core"), std::string::npos)
        << describeSummary(s);
  }
}

TEST(Topology, TheSmallestL2OfTheRanksAndZeroWhereOneIsUnknown) {
  std::vector<RankSummary> s(3);
  for (auto& r : s) setNodeId(r, "n");
  s[0].l2KiB = 2048;
  s[1].l2KiB = 512;
  s[2].l2KiB = 1024;
  EXPECT_EQ(Topology(s).minL2Bytes(), size_t{512} << 10);
  s[2].l2KiB = 0;
  EXPECT_EQ(Topology(s).minL2Bytes(), 0u);
  EXPECT_EQ(Topology::forTest({0, 1}).minL2Bytes(), 0u);
  s[0].shmFreeMiB = 100;
  s[1].shmFreeMiB = 60;
  s[2].shmFreeMiB = 70;
  EXPECT_EQ(Topology(s).minShmFreeBytes(), size_t{60} << 20);
  s[1].shmFreeMiB = -1;
  EXPECT_EQ(Topology(s).minShmFreeBytes(), SIZE_MAX);
}

TEST(Topology, NodeMapOfAnUnevenLayout) {
  const Topology t = Topology::forTest({0, 0, 1, 1, 2, 0});
  ASSERT_EQ(t.size(), 6);
  EXPECT_EQ(t.numNodes(), 3);
  EXPECT_EQ(t.nodeRanks(0), (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(t.nodeRanks(1), (std::vector<int>{2, 3}));
  EXPECT_EQ(t.nodeRanks(2), (std::vector<int>{4}));
  EXPECT_EQ(t.localRank(5), 2);
  EXPECT_EQ(t.localRank(3), 1);
  EXPECT_EQ(t.localSize(4), 1);
  EXPECT_EQ(t.maxLocalSize(), 3);
  EXPECT_FALSE(t.uniformNodes());
  EXPECT_TRUE(t.sameNode(0, 5));
  EXPECT_FALSE(t.sameNode(1, 2));
  // Ring edges leaving a node: 1->2 and 5->0? (5 and 0 share node 0): node 0 has 1->2,
  // node 1 has 3->4, node 2 has 4->5.
  EXPECT_EQ(t.ringCrossEdgesPerNode(), 1);
  EXPECT_EQ(Topology::forTest({0, 1, 0, 1}).ringCrossEdgesPerNode(), 2);
  EXPECT_EQ(Topology::forTest({0, 0, 1, 1}).ringCrossEdgesPerNode(), 1);
  EXPECT_TRUE(Topology::forTest({0, 0, 1, 1}).uniformNodes());
  // A sub-communicator's topology renumbers nodes by its own lowest ranks.
  const Topology sub = t.subset({4, 2, 3});
  EXPECT_EQ(sub.numNodes(), 2);
  EXPECT_EQ(sub.nodeOf(0), 0);
  EXPECT_EQ(sub.nodeOf(1), 1);
  EXPECT_EQ(sub.localRank(2), 1);
  const std::string map = t.describeNodes();
  EXPECT_NE(map.find("node 0 (test-node-0): ranks 0,1,5"), std::string::npos) << map;
  EXPECT_NE(map.find("node 2 (test-node-2): ranks 4"), std::string::npos) << map;
}

TEST(Topology, SetupAgreesOnSummariesAndRankZerosCostParameters) {
  const int n = 3;
  auto comms = testing::makeInprocComms(n);
  for (int r = 0; r < n; ++r) {
    unwrapComm(comms[r])->mutableConfig().cost.inter.alpha = 1e-3 * (r + 1);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { unwrapComm(comms[r])->setup(); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    const Comm* c = unwrapComm(comms[r]);
    EXPECT_EQ(c->config().cost.inter.alpha, 1e-3) << "rank " << r;
    ASSERT_EQ(c->topology().size(), n);
    EXPECT_EQ(c->topology().numNodes(), 1);  // threads of one process: one node
    EXPECT_STREQ(c->topology().summary(2).nodeId, localNodeIdentity().c_str());
    EXPECT_TRUE(c->hasShm());
    // MTXCOMM_SHM_SLOT_BYTES unset: the slot follows the agreed L2 (the same on every rank).
    EXPECT_EQ(c->shmSlotBytes(),
              defaultShmSlotBytes(c->topology().minL2Bytes(), n, c->topology().minShmFreeBytes()))
        << "rank " << r;
  }
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

// A split inherits the agreed topology restricted to its members (no second allgather), and
// its ranks on one emulated node share a segment while the whole communicator does not.
TEST(Topology, SplitInheritsTheTopology) {
  testing::runRanks(4,
                    [](mtxcomm_comm_t comm, int rank) {
                      Comm* c = unwrapComm(comm);
                      EXPECT_FALSE(c->hasShm());
                      std::unique_ptr<Comm> half = c->split(rank % 2, rank);
                      ASSERT_EQ(half->topology().size(), 2);
                      EXPECT_EQ(half->topology().numNodes(), 2);  // ranks {0,2} on nodes 0 and 1
                      std::unique_ptr<Comm> node = c->split(rank / 2, rank);
                      EXPECT_EQ(node->topology().numNodes(), 1);
                      EXPECT_TRUE(node->hasShm());
                    },
                    Config(), {0, 0, 1, 1});
}

CommInfo infoFor(const Topology& t) {
  CommInfo info;
  info.nranks = t.size();
  info.topo = &t;
  return info;
}

TEST(CostModel, HierarchicalWinsLargeAllreducesAcrossNodes) {
  const Topology t = Topology::forTest({0, 0, 1, 1});
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.count = 16 << 20;  // 64 MiB of float32
  EXPECT_STREQ(defaultAlgorithm(a, infoFor(t))->name, "hierarchical");
  a.coll = Collective::kBroadcast;
  EXPECT_STREQ(defaultAlgorithm(a, infoFor(t))->name, "hierarchical");
  // Small: fewer network messages (one cross-node exchange instead of log2(4) rounds).
  a.coll = Collective::kAllreduce;
  a.count = 4;
  EXPECT_STREQ(defaultAlgorithm(a, infoFor(t))->name, "hierarchical");
  // With one rank per node there is nothing to compose: latency-bound recursive doubling for
  // small messages, the ring for large ones.
  const Topology spread = Topology::forTest({0, 1, 2, 3});
  EXPECT_STREQ(defaultAlgorithm(a, infoFor(spread))->name, "recursive_doubling");
  a.count = 16 << 20;
  EXPECT_STREQ(defaultAlgorithm(a, infoFor(spread))->name, "ring");
  // Predictions grow with the message and with a slower network.
  const Algorithm* h = findAlgorithm(Collective::kAllreduce, "hierarchical");
  const Algorithm* ring = findAlgorithm(Collective::kAllreduce, "ring");
  CommInfo info = infoFor(t);
  const double t64 = predictSeconds(*h, a, info);
  a.count = 1 << 20;
  EXPECT_LT(predictSeconds(*h, a, info), t64);
  CostParams slow;
  slow.inter.beta *= 10;
  info.cost = &slow;
  EXPECT_GT(predictSeconds(*ring, a, info), predictSeconds(*ring, a, infoFor(t)));
  // Ring across 2 nodes x 2 ranks: 2(p-1)/p = 1.5 x the bytes cross the link per edge, against
  // 2(N-1)/N = 1 x for the composition: at 1 GiB the link dominates and the ratio shows it.
  CostParams netOnly;
  netOnly.inter = {0, 1e-9, 0};
  netOnly.intra = {0, 0, 0};
  info.cost = &netOnly;
  a.count = 1 << 28;
  EXPECT_NEAR(predictSeconds(*ring, a, info) / predictSeconds(*h, a, info), 1.5, 1e-9);
}

TEST(CostModel, OneNodeKeepsShm) {
  CollArgs a;
  a.coll = Collective::kAllreduce;
  a.count = 1000;
  CommInfo info;
  info.nranks = 2;
  info.shm = reinterpret_cast<ShmGroup*>(&info);  // only compared with null
  EXPECT_STREQ(defaultAlgorithm(a, info)->name, "shm");
}

std::string writeFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TuningFile, RoundTripsAndRejectsBadKeysNamingFileAndKey) {
  CostParams p;
  p.intra = {2e-6, 3e-10, 4e-10};
  p.inter = {5e-5, 1e-9, 4e-10};
  const std::string good = writeFile("tune_good.json", tuningFileJson(p, R"({"sizes": [1, 2]})"));
  EXPECT_TRUE(loadTuningFile(good) == p);

  auto expectError = [](const std::string& path, const std::string& needle) {
    try {
      loadTuningFile(path);
      ADD_FAILURE() << path << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), MTXCOMM_INVALID_USAGE);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("MTXCOMM_TUNING_FILE=" + path), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expectError(writeFile("tune_neg.json", R"({"inter_node": {"beta": -1}})"), "\"inter_node.beta\"");
  expectError(writeFile("tune_str.json", R"({"intra_node": {"alpha": "fast"}})"),
              "\"intra_node.alpha\"");
  expectError(writeFile("tune_typo.json", R"({"inter_node": {"latency": 1e-6}})"),
              "\"inter_node.latency\"");
  expectError(writeFile("tune_top.json", R"({"internode": {}})"), "\"internode\"");
  expectError(writeFile("tune_json.json", "{ not json"), "not valid JSON");
  expectError(::testing::TempDir() + "no_such_tuning_file.json", "cannot be opened");
  expectError(::testing::TempDir(), "not a regular file");  // a directory
  // A level given in part keeps the defaults for the rest.
  const CostParams partial =
      loadTuningFile(writeFile("tune_part.json", R"({"inter_node": {"alpha": 0.001}})"));
  EXPECT_EQ(partial.inter.alpha, 0.001);
  EXPECT_EQ(partial.inter.beta, CostParams().inter.beta);
  EXPECT_TRUE(partial.intra == CostParams().intra);
}

}  // namespace
}  // namespace mtxcomm

namespace mtxcomm {
namespace {

// A peer that died but was not reaped yet (a zombie: kill(pid, 0) still succeeds on it) is
// dead: a launcher that reaps its children late must not hide a killed rank until the timeout.
TEST(Liveness, AnUnreapedDeadPeerIsDead) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  const std::string node = PeerLiveness::nodeIdentity();
  // Rank 0 is this process, rank 1 the child (same node).
  PeerLiveness live({PeerLiveness::selfIdentity(), node + "|" + std::to_string(child)}, 0);
  int dead = -1;
  for (int i = 0; i < 100 && dead < 0; ++i) {  // the child exits within milliseconds
    std::this_thread::sleep_for(std::chrono::milliseconds(110));
    dead = live.findDeadPeer();
  }
  EXPECT_EQ(dead, 1);
  EXPECT_EQ(kill(child, 0), 0) << "the child should still be an unreaped zombie here";
  int status = 0;
  waitpid(child, &status, 0);
}

TEST(Liveness, ALivePeerIsAlive) {
  const std::string node = PeerLiveness::nodeIdentity();
  PeerLiveness live({PeerLiveness::selfIdentity(), node + "|" + std::to_string(getppid())}, 0);
  EXPECT_EQ(live.findDeadPeer(), -1);
}

}  // namespace
}  // namespace mtxcomm
