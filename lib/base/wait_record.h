// Where a wait notes whom it waits on, for the flight recorder (lib/comm/flight_recorder.h):
// the communicator's recorder owns one, the transports and the shared-memory segment hold a
// pointer to it (null: no recorder). Only the slow path of a wait writes it (once it stops
// spinning), so the calls that complete at once pay nothing, not even a clock read.
#ifndef MTXCOMM_LIB_BASE_WAIT_RECORD_H_
#define MTXCOMM_LIB_BASE_WAIT_RECORD_H_

#include <time.h>

#include <atomic>
#include <cstdint>

namespace mtxcomm {

// Microseconds of CLOCK_MONOTONIC_COARSE (milliseconds of resolution, a few nanoseconds to read
// where it is in cache): enough to tell how long a call has waited.
inline int64_t coarseMicros() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

struct WaitRecord {
  std::atomic<int> peer{-1};        // the rank the call in progress waits on (-1: none yet)
  std::atomic<int64_t> sinceUs{0};  // coarseMicros when its first slow wait began (0: none)
  // A wait of the call in progress that stopped spinning waits on rank p. Any thread's reads.
  void note(int p) {
    if (sinceUs.load(std::memory_order_relaxed) == 0) {
      sinceUs.store(coarseMicros(), std::memory_order_relaxed);
    }
    peer.store(p, std::memory_order_relaxed);
  }
  // A new call: nothing waited on yet.
  void reset() {
    if (sinceUs.load(std::memory_order_relaxed) != 0) sinceUs.store(0, std::memory_order_relaxed);
    if (peer.load(std::memory_order_relaxed) != -1) peer.store(-1, std::memory_order_relaxed);
  }
};

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_WAIT_RECORD_H_
