// Test harness: N ranks as threads of one process over the in-process transport, each holding
// a real mtxcomm_comm_t, so tests go through the public C API.
#ifndef MTXCOMM_TESTS_HARNESS_H_
#define MTXCOMM_TESTS_HARNESS_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lib/base/topology.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "transports/inproc/inproc_transport.h"

namespace mtxcomm {
namespace testing {

// The shared-memory chunkings a machine can pick (lib/comm/config.h: defaultShmSlotBytes and
// shmReductionChunkBytes from its L2): 256 KiB slots (an L2 of 256 KiB or less, or unknown),
// 512 KiB slots (512 KiB, AMD Zen 3), 1 MiB slots in whole chunks (1 MiB, AMD Zen 4) and 1 MiB
// slots whose reductions go in 512 KiB chunks (2 MiB, Intel Sapphire Rapids). A test whose
// outcome depends on the chunking runs each, whatever this CPU picks.
struct ShmChunking {
  const char* name;
  size_t slotBytes, chunkBytes;
};
inline const std::vector<ShmChunking>& shmChunkings() {
  static const std::vector<ShmChunking> kAll = {{"256K slots", 256 << 10, 256 << 10},
                                                {"512K slots", 512 << 10, 512 << 10},
                                                {"1M slots", 1 << 20, 1 << 20},
                                                {"1M slots, 512K chunks", 1 << 20, 512 << 10}};
  return kAll;
}
inline Config withChunking(Config config, const ShmChunking& chunking) {
  config.shmSlotBytes = chunking.slotBytes;
  config.shmReductionChunkBytes = chunking.chunkBytes;
  return config;
}

// config, with the chunking MTXCOMM_SHM_SLOT_BYTES and MTXCOMM_SHM_CHUNK_BYTES force where the
// test leaves it to the machine: scripts/test.sh runs the trust and shm suites once more under
// each chunking that way (tests/run_chunkings.sh).
inline Config withChunkingFromEnvironment(Config config) {
  const Config env = Config::fromEnvironment();
  if (!config.shmSlotBytes) config.shmSlotBytes = env.shmSlotBytes;
  if (!config.shmReductionChunkBytes) config.shmReductionChunkBytes = env.shmReductionChunkBytes;
  return config;
}

// Makes n communicators over one in-process world; config applies to all.
inline std::vector<mtxcomm_comm_t> makeInprocComms(int n, const Config& config = Config()) {
  auto transports = makeInprocTransports(n);
  const Config forced = withChunkingFromEnvironment(config);
  std::vector<mtxcomm_comm_t> comms;
  for (auto& t : transports)
    comms.push_back(wrapComm(std::make_unique<Comm>(std::move(t), forced, 0)));
  return comms;
}

// Runs fn(comm, rank) on n threads, one per rank, and destroys the communicators.
// GoogleTest assertions are thread-safe on Linux; failures are reported with the rank.
// nodeOf, when given (one entry per rank), emulates several nodes: the communicators are set up
// with Topology::forTest(nodeOf) instead of agreeing on the real one (all threads share this
// host), so the hierarchical algorithms and the per-node shared-memory segments run in one
// process.
inline void runRanks(int n, const std::function<void(mtxcomm_comm_t, int)>& fn,
                     const Config& config = Config(), const std::vector<int>& nodeOf = {}) {
  auto comms = makeInprocComms(n, config);
  const Topology emulated = Topology::forTest(nodeOf);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      SCOPED_TRACE("rank " + std::to_string(r));
      // Collective, as init_from_env does: the topology, and a shared-memory group unless
      // MTXCOMM_SHM is off or the ranks span several nodes.
      unwrapComm(comms[r])->setup(nodeOf.empty() ? nullptr : &emulated);
      fn(comms[r], r);
    });
  }
  for (auto& t : threads) t.join();
  for (auto c : comms) mtxcomm_comm_destroy(c);
}

}  // namespace testing
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_HARNESS_H_
