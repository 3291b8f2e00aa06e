// A rank dies in the middle of an allreduce; the survivors must fail fast with
// MTXCOMM_REMOTE_ERROR (or MTXCOMM_TIMEOUT) naming it. Used under mpirun (MPI transport) and
// with the MTXCOMM_STORE bootstrap (TCP transport); mp_driver.sh checks the outcome files.
//
//   mp_kill OUTDIR            the last rank kills itself
//   mp_kill OUTDIR linkdown   nobody dies: tests/cluster/cluster.sh takes a network link down
//                             (and writes OUTDIR/kill_time) once every rank has written
//                             OUTDIR/started<R>; every rank is then a survivor
//
// Every rank runs 1 MiB float32 allreduces in a loop. The last rank starts a helper thread in
// its fourth iteration which, after a random delay of a few milliseconds (the main thread is then
// almost surely inside mtxcomm_allreduce), writes OUTDIR/kill_time and raises SIGKILL. Each
// survivor writes OUTDIR/rank<R>.txt (then waits until every survivor has written its own, so
// that none reports another survivor's abort):
//   code <the failing call's result code>
//   elapsed <seconds from the kill to the error>
//   message <mtxcomm_get_last_error>
//   after <result of one more allreduce on the poisoned communicator>
//   abort_ok                     (once mtxcomm_comm_abort has returned)
// and leaves with _exit(0) (no MPI_Finalize: a peer is gone).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/kill_outcome.h"
#include "mtxcomm/mtxcomm.h"

using namespace mtxcomm::testkill;  // NOLINT: the shared kill and outcome helpers

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "linkdown")) {
    std::fprintf(stderr, "usage: %s OUTDIR [linkdown]\n", argv[0]);
    return 2;
  }
  const std::string outdir = argv[1];
  const bool linkDown = argc == 3;
  mtxcomm_comm_t comm = nullptr;
  mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    std::fprintf(stderr, "init failed: %s\n", mtxcomm_get_last_error(nullptr));
    return 3;
  }
  int rank = 0, size = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &size);
  const int victim = linkDown ? size : size - 1;  // ranks below it are survivors
  const size_t count = (1 << 20) / sizeof(float);
  std::vector<float> send(count, static_cast<float>(rank + 1)), recv(count);
  const float expect = static_cast<float>(size * (size + 1) / 2);

  const double deadline = wallSeconds() + 60;
  for (int iter = 0; wallSeconds() < deadline; ++iter) {
    if (rank == victim && iter == 3) {
      startSelfKill(outdir);
    }
    if (linkDown && iter == 3) writeFile(outdir + "/started" + std::to_string(rank), "");
    rc = mtxcomm_allreduce(send.data(), recv.data(), count, MTXCOMM_FLOAT32, MTXCOMM_SUM, comm,
                           nullptr);
    if (rc != MTXCOMM_SUCCESS) break;
    if (recv[0] != expect || recv[count - 1] != expect) {
      std::fprintf(stderr, "rank %d: wrong allreduce result %g (expected %g)\n", rank, recv[0],
                   expect);
      return 4;
    }
  }
  std::string text = survivorOutcome(rc, comm, outdir);
  const std::string path = outcomePath(outdir, rank);
  writeFile(path, text);
  std::fprintf(stderr, "rank %d: %s", rank, text.c_str());

  // Each survivor must detect the loss on its own: wait (up to 10 s) until every survivor has
  // written its outcome before closing anything, so that a survivor's abort cannot be what the
  // others report.
  waitForSurvivors(outdir, victim);
  const mtxcomm_result_t after = mtxcomm_allreduce(send.data(), recv.data(), count, MTXCOMM_FLOAT32,
                                                   MTXCOMM_SUM, comm, nullptr);
  text += "after " + std::to_string(static_cast<int>(after)) + "\n";
  writeFile(path, text);
  mtxcomm_comm_abort(comm);
  text += "abort_ok\n";
  writeFile(path, text);
  _exit(rc == MTXCOMM_SUCCESS ? 1 : 0);
}
