// Busy-wait pauses measured in time, not in instructions. x86's PAUSE took about 10 cycles
// before Skylake and up to 140 since (Intel 64 and IA-32 Architectures Optimization Reference
// Manual, "Pause Latency in Skylake Microarchitecture"), and other vendors' differ again: 2000
// pauses spun 22 us on one of the project's guests and about 60 us on another.
#ifndef MTXCOMM_LIB_BASE_SPIN_H_
#define MTXCOMM_LIB_BASE_SPIN_H_

namespace mtxcomm {

// One CPU pause (x86 PAUSE, AArch64 YIELD; a compiler barrier elsewhere).
inline void cpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

// The spin of a wait before it sleeps or yields (the shm waits, Backoff): 22 us, what 2000
// pauses took on the guest where it was tuned (bench/RESULTS.md: a longer spin takes the core
// from the framework's thread that shares it).
constexpr double kSpinMicros = 22.0;

// Polls done() between pauses, at most `pauses` times; whether it became true.
template <class Done>
bool spinUntil(int pauses, const Done& done) {
  for (int k = 0; k < pauses; ++k) {
    if (done()) return true;
    cpuPause();
  }
  return false;
}

// How many cpuPause() calls (each beside one load of a shared word) last about `micros`
// microseconds on this CPU, at least 1. Measured once per process, at the first call: the
// fastest of several timings of a short run of pauses (under 0.5 ms in all), so that a
// preempted timing does not shorten every later spin. Thread-safe.
int pausesFor(double micros);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_BASE_SPIN_H_
