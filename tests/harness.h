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

// Makes n communicators over one in-process world; config applies to all.
inline std::vector<mtxcomm_comm_t> makeInprocComms(int n, const Config& config = Config()) {
  auto transports = makeInprocTransports(n);
  std::vector<mtxcomm_comm_t> comms;
  for (auto& t : transports)
    comms.push_back(wrapComm(std::make_unique<Comm>(std::move(t), config, 0)));
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
