// The soak: 20 000 mixed, checked collectives — every collective (alltoall too), the automatic
// algorithm, float32 / int32 / float64 / bfloat16, sum / max / min, counts 1 to 64 Ki, in place
// and out of place, roots that move — over shared memory (3 ranks) and over TCP (2 ranks,
// MTXCOMM_SHM=off, through a tcp: store), with this process's resident memory and open descriptors
// asserted flat between the end of the warm-up and the end of the run. Ranks are threads of one
// process.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_data.h"
#include "common/test_util.h"
#include "harness.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "lib/comm/stores.h"
#include "transports/tcp/tcp_transport.h"

namespace mtxcomm {
namespace {

using namespace testdata;  // NOLINT: Case, CaseBuffers, callCollective, checkOutput

int openFds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// The i-th case of the run: the same on every rank (a generator seeded by i).
Case caseOf(uint64_t i, int n) {
  std::mt19937_64 g(i * 0x9e3779b97f4a7c15ull + 1);
  static const Collective colls[] = {Collective::kAllreduce,     Collective::kAllreduce,
                                     Collective::kBroadcast,     Collective::kAllgather,
                                     Collective::kReduceScatter, Collective::kReduce,
                                     Collective::kBarrier,       Collective::kAlltoall};
  static const mtxcomm_datatype_t dts[] = {MTXCOMM_FLOAT32, MTXCOMM_INT32, MTXCOMM_FLOAT64,
                                           MTXCOMM_BFLOAT16};
  static const mtxcomm_op_t ops[] = {MTXCOMM_SUM, MTXCOMM_MAX, MTXCOMM_MIN};
  static const size_t counts[] = {1, 7, 255, 1024, 4099, 16384, 65536};
  Case c{
      colls[g() % 8],           "auto", dts[g() % 4], ops[g() % 3], counts[g() % 7], g() % 2 == 0,
      static_cast<int>(g() % n)};
  if (c.coll == Collective::kBarrier) c.count = 0;
  if (c.coll == Collective::kAlltoall) c.inPlace = false;  // no in-place alltoall
  return c;
}

// Runs calls cases on every rank of comms, checking each; returns after the last. fds and rss
// are sampled by rank 0 after warmup calls and at the end.
void soak(const std::vector<mtxcomm_comm_t>& comms, int calls, int warmup) {
  const int n = static_cast<int>(comms.size());
  long rss0 = 0, rss1 = 0;
  int fds0 = 0, fds1 = 0;
  testutil::Barrier barrier(n);
  testutil::runThreads(n, [&](int rank) {
    for (int i = 0; i < calls; ++i) {
      if (i == warmup) {
        barrier.wait();
        if (rank == 0) {
          rss0 = testutil::rssKiB();
          fds0 = openFds();
        }
        barrier.wait();
      }
      const Case c = caseOf(static_cast<uint64_t>(i), n);
      CaseBuffers b(c, rank, n, /*poisonInPlaceAllgather=*/true);
      const mtxcomm_result_t rc = callCollective(c, comms[rank], rank, b.sendArg, b.recvArg);
      ASSERT_EQ(rc, MTXCOMM_SUCCESS)
          << "call " << i << ": " << c.describe(n) << ": " << mtxcomm_get_last_error(comms[rank]);
      const OutputCheck chk = checkOutput(b, c, rank, n);
      ASSERT_TRUE(chk.ok()) << "call " << i << ": " << c.describe(n) << ": element "
                            << chk.firstWrong << " of " << chk.checkCount << " is wrong";
    }
    barrier.wait();
    if (rank == 0) {
      rss1 = testutil::rssKiB();
      fds1 = openFds();
    }
  });
  std::printf("soak: %d ranks, %d calls: RSS %ld -> %ld KiB, fds %d -> %d\n", n, calls, rss0, rss1,
              fds0, fds1);
  EXPECT_EQ(fds1, fds0);
  EXPECT_LT(rss1 - rss0, 16 * 1024) << "RSS grew from " << rss0 << " to " << rss1 << " KiB";
}

TEST(Soak, MixedCheckedCollectivesOverShm) {
  auto comms = testing::makeInprocComms(3);
  testutil::runThreads(3, [&](int rank) { unwrapComm(comms[rank])->setup(); });
  ASSERT_TRUE(unwrapComm(comms[0])->hasShm());
  soak(comms, 12000, 1000);
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

TEST(Soak, MixedCheckedCollectivesOverTcp) {
  const std::string spec = testutil::tcpSpec();
  std::vector<std::unique_ptr<Store>> stores(2);
  std::vector<mtxcomm_comm_t> comms(2);
  const std::chrono::milliseconds timeout(20000);
  testutil::runThreads(2, [&](int rank) {
    stores[rank] = makeStore(spec, rank, 2, timeout, testutil::testSecret());
    Config cfg;
    cfg.shm = "off";
    auto comm = std::make_unique<Comm>(makeTcpTransport(*stores[rank], rank, 2, timeout), cfg, 0);
    comm->setup();
    comms[rank] = wrapComm(std::move(comm));
  });
  ASSERT_FALSE(unwrapComm(comms[0])->hasShm());
  soak(comms, 8000, 1000);
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

}  // namespace
}  // namespace mtxcomm
