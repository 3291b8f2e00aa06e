// One rank of a shared-memory test job (tests/shm/shm_driver.sh runs it under mpirun or over the
// MTXCOMM_STORE bootstrap). Through the public C API only.
//
//   shm_job MODE OUTDIR [ARGS...]
//
// Every mode first initialises the world communicator. On failure the rank prints
//   rank R init code C message M
// (R from MTXCOMM_RANK or OMPI_COMM_WORLD_RANK) and writes the same into OUTDIR/init<R>.txt,
// then exits 0 (the driver judges). On success it looks up its own mapping of the segment in
// /proc/self/maps ("/dev/shm/mtxcomm-<hex> (deleted)"), stats it through
// /proc/self/map_files/<range> (the inode's mode survives the unlink) and prints and writes
// into OUTDIR/seg<R>.txt:
//   segment /dev/shm/mtxcomm-<hex> mode 0600
// ("segment none" when it has none, e.g. MTXCOMM_SHM=off). Then, by MODE:
//   init                     destroys the communicator ("ok").
//   collectives ITERS        allreduce (1 MiB float32), broadcast, allgather, barrier, checked.
//   abort                    1 MiB allreduces; the last rank calls mtxcomm_comm_abort in
//                            iteration 5 and leaves; every other rank must get an error (code
//                            and message into OUTDIR/rank<R>.txt).
//   loop                     writes OUTDIR/ready<R> and runs allreduces until killed (120 s cap).
//   kill MIB                 MIB MiB float32 allreduces; the last rank SIGKILLs itself a few ms
//                            into its fourth iteration (writing OUTDIR/kill_time first); the
//                            survivors write code, elapsed seconds since the kill and the
//                            message into OUTDIR/rank<R>.txt.
//   idle-kill                after a barrier, the last rank SIGKILLs itself 300 ms later while
//                            the others sleep in mtxcomm_comm_wait_notify (60 s timeout), as an
//                            idle framework engine does; that wait must end with an error, and
//                            the survivors' next allreduce too (OUTDIR/rank<R>.txt: the wait's
//                            code, elapsed and message, then "next <code> <message>").
//   perf ITERS FLOATS        ITERS checked allreduces of FLOATS float32; rank 0 prints the time.
//   splits K                 K splits of the world (every one kept, each with its own segment),
//                            then checked collectives on each (as collectives, 2 iterations).
// Exit code: 0 when this rank saw what its mode expects, 1 otherwise (with a "FAIL" line).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/kill_outcome.h"
#include "mtxcomm/mtxcomm.h"
#include "mtxcomm/mtxcomm_engine.h"

namespace {

using namespace mtxcomm::testkill;  // NOLINT: the shared kill and outcome helpers

int envRank() {
  for (const char* v : {"MTXCOMM_RANK", "OMPI_COMM_WORLD_RANK"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

// "segment /dev/shm/mtxcomm-... mode 0NNN" for this process's mapping, or "segment none".
std::string segmentLine() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find("/dev/shm/mtxcomm-");
    if (at == std::string::npos) continue;
    std::string name = line.substr(at);
    const size_t sp = name.find(' ');
    if (sp != std::string::npos) name.resize(sp);
    const std::string range = line.substr(0, line.find(' '));
    struct stat st {};
    char mode[32] = "unknown";
    if (stat(("/proc/self/map_files/" + range).c_str(), &st) == 0) {
      std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    }
    return "segment " + name + " mode " + mode;
  }
  return "segment none";
}

int failed(int rank, const std::string& what) {
  std::printf("FAIL: rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  return 1;
}

mtxcomm_result_t allreduce(std::vector<float>& send, std::vector<float>& recv,
                           mtxcomm_comm_t comm) {
  return mtxcomm_allreduce(send.data(), recv.data(), send.size(), MTXCOMM_FLOAT32, MTXCOMM_SUM,
                           comm, nullptr);
}

// Inputs: rank r, element i -> (r + 1) * (i % 7 + 1); the sum over n ranks is
// n (n + 1) / 2 * (i % 7 + 1), exact in float32.
void fillInput(std::vector<float>& v, int rank) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
}

bool checkSum(const std::vector<float>& v, int n) {
  const float tri = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != tri * static_cast<float>(i % 7 + 1)) return false;
  }
  return true;
}

int runCollectives(mtxcomm_comm_t comm, int rank, int n, int iters) {
  std::vector<float> send(1 << 18), recv(send.size());
  fillInput(send, rank);
  for (int it = 0; it < iters; ++it) {
    std::fill(recv.begin(), recv.end(), -1.f);
    if (allreduce(send, recv, comm) != MTXCOMM_SUCCESS) {
      return failed(rank, std::string("allreduce: ") + mtxcomm_get_last_error(comm));
    }
    if (!checkSum(recv, n)) return failed(rank, "allreduce: wrong result");
    std::vector<int32_t> b(1000, rank == it % n ? it : -1);
    if (mtxcomm_broadcast(b.data(), b.data(), b.size(), MTXCOMM_INT32, it % n, comm, nullptr) !=
        MTXCOMM_SUCCESS) {
      return failed(rank, std::string("broadcast: ") + mtxcomm_get_last_error(comm));
    }
    for (int32_t x : b) {
      if (x != it) return failed(rank, "broadcast: wrong result");
    }
    std::vector<int32_t> mine(300, rank * 1000 + it), all(300 * n);
    if (mtxcomm_allgather(mine.data(), all.data(), mine.size(), MTXCOMM_INT32, comm, nullptr) !=
        MTXCOMM_SUCCESS) {
      return failed(rank, std::string("allgather: ") + mtxcomm_get_last_error(comm));
    }
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i] != static_cast<int32_t>(i / 300) * 1000 + it) {
        return failed(rank, "allgather: wrong result");
      }
    }
    if (mtxcomm_barrier(comm) != MTXCOMM_SUCCESS) {
      return failed(rank, std::string("barrier: ") + mtxcomm_get_last_error(comm));
    }
  }
  mtxcomm_comm_destroy(comm);
  std::printf("rank %d: %d rounds of collectives ok\n", rank, iters);
  return 0;
}

int runAbort(mtxcomm_comm_t comm, int rank, int n, const std::string& outdir) {
  std::vector<float> send(1 << 18), recv(send.size());
  fillInput(send, rank);
  const int victim = n - 1;
  mtxcomm_result_t rc = MTXCOMM_SUCCESS;
  const double deadline = wallSeconds() + 60;
  for (int it = 0; wallSeconds() < deadline; ++it) {
    if (rank == victim && it == 5) {
      rc = mtxcomm_comm_abort(comm);
      std::printf("rank %d: aborted the communicator (result %d)\n", rank, static_cast<int>(rc));
      return rc == MTXCOMM_SUCCESS ? 0 : failed(rank, "mtxcomm_comm_abort failed");
    }
    rc = allreduce(send, recv, comm);
    if (rc != MTXCOMM_SUCCESS) break;
    if (!checkSum(recv, n)) return failed(rank, "allreduce: wrong result");
  }
  const std::string message = mtxcomm_get_last_error(comm);
  std::ostringstream text;
  text << "code " << static_cast<int>(rc) << "\nmessage " << message << "\n";
  writeFile(outdir + "/rank" + std::to_string(rank) + ".txt", text.str());
  std::printf("rank %d: %s", rank, text.str().c_str());
  waitForSurvivors(outdir, victim);
  mtxcomm_comm_abort(comm);
  if (rc == MTXCOMM_SUCCESS) return failed(rank, "no error within 60 s of the peer's abort");
  return 0;
}

int runLoop(mtxcomm_comm_t comm, int rank, int n, const std::string& outdir) {
  std::vector<float> send(1 << 18), recv(send.size());
  fillInput(send, rank);
  writeFile(outdir + "/ready" + std::to_string(rank), "ready\n");
  const double deadline = wallSeconds() + 120;
  while (wallSeconds() < deadline) {
    if (allreduce(send, recv, comm) != MTXCOMM_SUCCESS) {
      return failed(rank, std::string("allreduce: ") + mtxcomm_get_last_error(comm));
    }
  }
  return failed(rank, "not killed within 120 s");
}

int runKill(mtxcomm_comm_t comm, int rank, int n, const std::string& outdir, int mib) {
  std::vector<float> send(static_cast<size_t>(mib) << 18), recv(send.size());
  fillInput(send, rank);
  const int victim = n - 1;
  mtxcomm_result_t rc = MTXCOMM_SUCCESS;
  const double deadline = wallSeconds() + 60;
  for (int it = 0; wallSeconds() < deadline; ++it) {
    if (rank == victim && it == 3) {
      startSelfKill(outdir);
    }
    rc = allreduce(send, recv, comm);
    if (rc != MTXCOMM_SUCCESS) break;
    if (it < 3 && !checkSum(recv, n)) return failed(rank, "allreduce: wrong result");
  }
  const std::string text = survivorOutcome(rc, comm, outdir);
  writeFile(outcomePath(outdir, rank), text);
  std::printf("rank %d: %s", rank, text.c_str());
  std::fflush(stdout);
  waitForSurvivors(outdir, victim);
  mtxcomm_comm_abort(comm);
  _exit(0);  // no MPI_Finalize: a peer is gone
}

int runIdleKill(mtxcomm_comm_t comm, int rank, int n, const std::string& outdir) {
  const int victim = n - 1;
  if (mtxcomm_barrier(comm) != MTXCOMM_SUCCESS) {
    return failed(rank, std::string("barrier: ") + mtxcomm_get_last_error(comm));
  }
  if (rank == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    startSelfKill(outdir);
    for (;;) pause();
  }
  mtxcomm_result_t rc = MTXCOMM_SUCCESS;
  const double deadline = wallSeconds() + 60;
  while (rc == MTXCOMM_SUCCESS && wallSeconds() < deadline) {
    mtxcomm_notify_state_t seen{}, now{};
    if (mtxcomm_comm_notify_state(comm, &seen) != MTXCOMM_SUCCESS) {
      return failed(rank, std::string("notify_state: ") + mtxcomm_get_last_error(comm));
    }
    rc = mtxcomm_comm_wait_notify(comm, &seen, deadline - wallSeconds(), &now);
  }
  std::string text = survivorOutcome(rc, comm, outdir);
  std::vector<float> send(1024), recv(1024);
  fillInput(send, rank);
  const mtxcomm_result_t next = allreduce(send, recv, comm);
  text +=
      "next " + std::to_string(static_cast<int>(next)) + " " + mtxcomm_get_last_error(comm) + "\n";
  writeFile(outcomePath(outdir, rank), text);
  std::printf("rank %d: %s", rank, text.c_str());
  std::fflush(stdout);
  waitForSurvivors(outdir, victim);
  mtxcomm_comm_abort(comm);
  _exit(0);
}

int runPerf(mtxcomm_comm_t comm, int rank, int n, int iters, size_t floats) {
  std::vector<float> send(floats), recv(floats);
  fillInput(send, rank);
  if (allreduce(send, recv, comm) != MTXCOMM_SUCCESS) {  // warm-up
    return failed(rank, std::string("allreduce: ") + mtxcomm_get_last_error(comm));
  }
  mtxcomm_barrier(comm);
  const double t0 = wallSeconds();
  for (int it = 0; it < iters; ++it) {
    std::fill(recv.begin(), recv.end(), -1.f);
    if (allreduce(send, recv, comm) != MTXCOMM_SUCCESS) {
      return failed(rank, std::string("allreduce: ") + mtxcomm_get_last_error(comm));
    }
    if (!checkSum(recv, n)) return failed(rank, "allreduce: wrong result");
  }
  const double dt = wallSeconds() - t0;
  if (rank == 0) {
    const double bytes = static_cast<double>(floats * sizeof(float));
    std::printf(
        "perf: %d ranks, %d allreduces of %.0f bytes (checked): %.3f s, %.1f us/call, "
        "%.3f ns/byte\n",
        n, iters, bytes, dt, dt / iters * 1e6, dt / iters / bytes * 1e9);
  }
  mtxcomm_comm_destroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s init|collectives|abort|loop|kill|idle-kill|perf|splits OUTDIR [ARGS...]\n",
        argv[0]);
    return 2;
  }
  const std::string mode = argv[1], outdir = argv[2];
  const auto arg = [&](int i, long dflt) { return argc > i ? std::atol(argv[i]) : dflt; };
  mtxcomm_comm_t comm = nullptr;
  const mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    const int r = envRank();
    std::ostringstream text;
    text << "rank " << r << " init code " << static_cast<int>(rc) << " message "
         << mtxcomm_get_last_error(nullptr) << "\n";
    writeFile(outdir + "/init" + std::to_string(r) + ".txt", text.str());
    std::printf("%s", text.str().c_str());
    _exit(0);
  }
  int rank = 0, n = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &n);
  const std::string seg = segmentLine();
  writeFile(outdir + "/seg" + std::to_string(rank) + ".txt", seg + "\n");
  std::printf("rank %d: %s\n", rank, seg.c_str());
  if (mode == "init") {
    mtxcomm_comm_destroy(comm);
    std::printf("rank %d: init ok\n", rank);
    return 0;
  }
  if (mode == "collectives") return runCollectives(comm, rank, n, static_cast<int>(arg(3, 5)));
  if (mode == "abort") return runAbort(comm, rank, n, outdir);
  if (mode == "loop") return runLoop(comm, rank, n, outdir);
  if (mode == "kill") return runKill(comm, rank, n, outdir, static_cast<int>(arg(3, 4)));
  if (mode == "idle-kill") return runIdleKill(comm, rank, n, outdir);
  if (mode == "splits") {
    std::vector<mtxcomm_comm_t> splits;
    for (long k = 0; k < arg(3, 2); ++k) {
      mtxcomm_comm_t child = nullptr;
      if (mtxcomm_comm_split(comm, 0, rank, &child) != MTXCOMM_SUCCESS) {
        return failed(rank, "split " + std::to_string(k) + ": " + mtxcomm_get_last_error(comm));
      }
      splits.push_back(child);
    }
    for (size_t k = 0; k < splits.size(); ++k) {
      if (runCollectives(splits[k], rank, n, 2) != 0)
        return failed(rank, "on split " + std::to_string(k));
    }
    for (mtxcomm_comm_t c : splits) mtxcomm_comm_destroy(c);
    mtxcomm_comm_destroy(comm);
    std::printf("rank %d: splits ok\n", rank);
    return 0;
  }
  if (mode == "perf") {
    return runPerf(comm, rank, n, static_cast<int>(arg(3, 200)),
                   static_cast<size_t>(arg(4, 1 << 18)));
  }
  return failed(rank, "unknown mode " + mode);
}
