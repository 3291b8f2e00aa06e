// An abort over the MPI transport reaches the peers: run under mpirun -np 2 with every byte on
// the MPI transport (MTXCOMM_TRANSPORT=mpi, MTXCOMM_SHM=off) and MTXCOMM_TIMEOUT=60, rank 1 waits
// inside a 1 MiB allreduce that rank 0 never enters, and rank 0, 0.5 s later,
//   1. calls mtxcomm_comm_abort;
//   2. (a new communicator) has its own call, a barrier, cancelled by mtxcomm_comm_destroy from
//      another thread: its failed call aborts the communicator (a poisoned communicator tells
//      its peers).
// Each time rank 1's allreduce must fail with MTXCOMM_REMOTE_ERROR naming rank 0 and what it
// did, within 3 s of rank 0's abort (it used to wait for MTXCOMM_TIMEOUT: 60 s). Rank 0 sends the
// time of its abort over MPI_COMM_WORLD (the two ranks share a node, hence a clock). The program
// ends with an MPI_Allreduce over MPI_COMM_WORLD and MPI_Finalize: what was still in flight on
// the failed communicators (an ABORT, rank 1's unmatched 512 KiB send) must not disturb them (an
// ABORT that reached rank 0 after it had freed its failed communicator hung that MPI_Allreduce
// once the second communicator had reused the context: a failed one is no longer freed).
// Rank 1 prints "PASS ..." or "FAIL ..." per case; the exit code is non-zero on a failure.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace {

double wallSeconds() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

mtxcomm_comm_t initOrDie(int rank) {
  mtxcomm_comm_t comm = nullptr;
  const mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    std::printf("FAIL rank %d: init: %s\n", rank, mtxcomm_get_last_error(nullptr));
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return comm;
}

// Rank 1: an allreduce rank 0 never enters; true when it failed as it should. expected: the
// words of rank 0's abort the message must carry.
bool waitForTheAbort(mtxcomm_comm_t comm, const char* name, const std::string& expected) {
  std::vector<float> in(1 << 18, 1.0f), out(in.size());
  const mtxcomm_result_t rc = mtxcomm_allreduce(in.data(), out.data(), in.size(), MTXCOMM_FLOAT32,
                                                MTXCOMM_SUM, comm, nullptr);
  const double failedAt = wallSeconds();
  const std::string message = rc == MTXCOMM_SUCCESS ? "" : mtxcomm_get_last_error(comm);
  double abortedAt = 0;
  MPI_Recv(&abortedAt, 1, MPI_DOUBLE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  const double elapsed = failedAt - abortedAt;
  const bool ok = rc == MTXCOMM_REMOTE_ERROR && elapsed < 3.0 &&
                  contains(message, "peer rank 0 aborted: " + expected);
  std::printf("%s rank 1: %s: code %d, %.3f s after rank 0's abort: %s\n", ok ? "PASS" : "FAIL",
              name, static_cast<int>(rc), elapsed, message.c_str());
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::printf("FAIL: run with mpirun -np 2\n");
    MPI_Finalize();
    return 2;
  }
  setenv("MTXCOMM_TRANSPORT", "mpi", 1);
  setenv("MTXCOMM_SHM", "off", 1);
  setenv("MTXCOMM_TIMEOUT", "60", 1);
  bool ok = true;

  // 1. mtxcomm_comm_abort.
  mtxcomm_comm_t comm = initOrDie(rank);
  if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 1 is in its allreduce
    const double at = wallSeconds();
    ok = mtxcomm_comm_abort(comm) == MTXCOMM_SUCCESS;
    MPI_Send(&at, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD);
  } else {
    ok = waitForTheAbort(comm, "mtxcomm_comm_abort", "the application aborted the communicator");
    mtxcomm_comm_destroy(comm);
  }

  // 2. A call that fails (cancelled by a destroy from another thread) aborts the communicator.
  comm = initOrDie(rank);
  if (rank == 0) {
    double at = 0;
    std::thread watchdog([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      at = wallSeconds();
      mtxcomm_comm_destroy(comm);
    });
    const mtxcomm_result_t rc = mtxcomm_barrier(comm);  // rank 1 never enters it
    watchdog.join();
    ok = ok && rc != MTXCOMM_SUCCESS;
    MPI_Send(&at, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD);
  } else {
    ok =
        waitForTheAbort(comm, "a call cancelled by mtxcomm_comm_destroy", "rank 0 of 2: barrier") &&
        ok;
    mtxcomm_comm_destroy(comm);
  }

  int allOk = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &allOk, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return allOk ? 0 : 1;
}
