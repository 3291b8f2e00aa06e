// Polite waiting: spin briefly, then yield, then sleep in growing steps (capped), so that more
// ranks than cores still make progress and an idle wait does not burn a core.
#ifndef MTXCOMM_LIB_BACKOFF_H_
#define MTXCOMM_LIB_BACKOFF_H_

#include <sched.h>

#include <chrono>
#include <thread>

#include "lib/base/spin.h"

namespace mtxcomm {

class Backoff {
 public:
  // spins: busy polls before the first yield (by default kSpinMicros of them); yields:
  // sched_yield polls before sleeping.
  explicit Backoff(int spins = pausesFor(kSpinMicros), int yields = 200)
      : spins_(spins), yields_(yields) {}

  // Call once per unsuccessful poll.
  void pause() {
    if (iter_ < spins_) {
      ++iter_;
      cpuPause();
      return;
    }
    if (iter_ < spins_ + yields_) {
      ++iter_;
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (sleep_us_ < kMaxSleepUs) sleep_us_ *= 2;
  }
  // True once the waiter has left the spinning phase (a good time for slow checks).
  bool sleeping() const { return iter_ >= spins_ + yields_; }
  void reset() {
    iter_ = 0;
    sleep_us_ = 1;
  }

 private:
  static constexpr int kMaxSleepUs = 1000;
  int spins_, yields_;
  int iter_ = 0;
  int sleep_us_ = 1;
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BACKOFF_H_
