// UCX transports in one process: each rank is a thread with its own UCX worker, bootstrapped over
// the in-process transport by the same route (transports/route) init_from_env uses, forced to
// UCX. Only for programs built with UCX (MTXCOMM_HAVE_UCX).
#ifndef MTXCOMM_TESTS_COMMON_UCX_TRANSPORTS_H_
#define MTXCOMM_TESTS_COMMON_UCX_TRANSPORTS_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "transports/inproc/inproc_transport.h"
#include "transports/route/route.h"

namespace mtxcomm {
namespace testutil {

// n UCX transports (with their route tables), made collectively on n threads.
inline std::vector<RoutedTransport> makeUcxTransports(int n) {
  auto inproc = makeInprocTransports(n);
  std::vector<RoutedTransport> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back(
        [&, r] { out[r] = routeTransport(std::move(inproc[r]), "ucx", 30.0, size_t{4} << 20); });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace testutil
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_UCX_TRANSPORTS_H_
