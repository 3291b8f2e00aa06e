#include "lib/base/spin.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>

#include "lib/base/clock.h"

namespace mtxcomm {
namespace {

// Nanoseconds of one pause and one relaxed load, the body of the shm waits' spin.
double nanosPerPause() {
  constexpr int kPauses = 256, kTimings = 7;
  std::atomic<unsigned> word{0};
  double best = 0;
  for (int t = 0; t < kTimings; ++t) {
    const auto start = Clock::now();
    spinUntil(kPauses, [&] { return word.load(std::memory_order_relaxed) != 0; });
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
    if (t == 0 || ns < best) best = ns;
  }
  return std::max(best / kPauses, 0.1);  // a clock too coarse to see the run: 0.1 ns a pause
}

}  // namespace

int pausesFor(double micros) {
  static const double nanos = nanosPerPause();
  const double n = std::ceil(micros * 1000.0 / nanos);
  return static_cast<int>(std::clamp(n, 1.0, 1e8));
}

}  // namespace mtxcomm
