// CancelToken: how another thread ends a blocked call ("abort from a watchdog", as NCCL's
// ncclCommAbort does). mtxcomm_comm_abort and mtxcomm_comm_destroy, called on a communicator
// while another thread is inside one of its collectives, cancel the communicator's token; every
// wait loop (each transport's waitAll, the shared-memory waits) checks it at least every 50 ms
// and throws, so the blocked collective returns with an error promptly. Thread-safe.
#ifndef MTXCOMM_LIB_BASE_CANCEL_H_
#define MTXCOMM_LIB_BASE_CANCEL_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "lib/base/error.h"

namespace mtxcomm {

class CancelToken {
 public:
  void cancel(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_.load(std::memory_order_relaxed)) return;
      reason_ = reason;
    }
    cancelled_.store(true, std::memory_order_release);
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Throws MTXCOMM_INVALID_USAGE naming the reason once cancelled.
  void check() const {
    if (!cancelled()) return;
    std::lock_guard<std::mutex> lock(mu_);
    fail(MTXCOMM_INVALID_USAGE, reason_);
  }

 private:
  mutable std::mutex mu_;
  std::atomic<bool> cancelled_{false};
  std::string reason_;
};

using CancelTokenPtr = std::shared_ptr<CancelToken>;

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_CANCEL_H_
