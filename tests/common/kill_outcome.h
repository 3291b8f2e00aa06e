// The self-kill and outcome recording shared by the kill tests (tests/mp/mp_kill.cc and the kill
// mode of tests/shm/shm_job.cc): the victim rank writes OUTDIR/kill_time and raises SIGKILL from
// a helper thread a few milliseconds into a collective; each survivor writes OUTDIR/rank<R>.txt
//   code <the failing call's result code>
//   elapsed <seconds from the kill to the error, -1 without kill_time>
//   message <mtxcomm_get_last_error>
// and waits until every survivor has written its own. Through the public C API only.
#ifndef MTXCOMM_TESTS_COMMON_KILL_OUTCOME_H_
#define MTXCOMM_TESTS_COMMON_KILL_OUTCOME_H_

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace testkill {

inline double wallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// Writes text to path atomically (a temporary file, fsync, rename).
inline void writeFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;
  std::fputs(text.c_str(), f);
  std::fflush(f);
  fsync(fileno(f));
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

// OUTDIR/rank<rank>.txt, the survivor's outcome file.
inline std::string outcomePath(const std::string& outdir, int rank) {
  return outdir + "/rank" + std::to_string(rank) + ".txt";
}

// Starts a detached thread that, after a random delay of under 5 ms (the caller is then almost
// surely inside its next collective), writes OUTDIR/kill_time and raises SIGKILL.
inline void startSelfKill(const std::string& outdir) {
  std::thread([outdir] {
    std::mt19937 gen(static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(time(nullptr)));
    std::this_thread::sleep_for(std::chrono::microseconds(gen() % 5000));
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6f\n", wallSeconds());
    writeFile(outdir + "/kill_time", buf);
    raise(SIGKILL);
  }).detach();
}

// The survivor's outcome right after its failing call returned rc: "code", "elapsed" (from
// OUTDIR/kill_time) and "message" lines.
inline std::string survivorOutcome(mtxcomm_result_t rc, mtxcomm_comm_t comm,
                                   const std::string& outdir) {
  const double errorTime = wallSeconds();
  const std::string message = mtxcomm_get_last_error(comm);
  double killTime = 0;
  std::ifstream(outdir + "/kill_time") >> killTime;
  char head[128];
  std::snprintf(head, sizeof(head), "code %d\nelapsed %.3f\n", static_cast<int>(rc),
                killTime > 0 ? errorTime - killTime : -1.0);
  return std::string(head) + "message " + message + "\n";
}

// Waits (up to 10 s) until OUTDIR/rank<r>.txt exists for every r < survivors, so that no
// survivor tears its communicator down before every other one has seen the loss by itself.
inline void waitForSurvivors(const std::string& outdir, int survivors) {
  for (int waited = 0; waited < 1000; ++waited) {
    int present = 0;
    for (int r = 0; r < survivors; ++r) {
      present += std::ifstream(outcomePath(outdir, r)).good() ? 1 : 0;
    }
    if (present == survivors) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace testkill
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_KILL_OUTCOME_H_
