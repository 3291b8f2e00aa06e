// Point-to-point in the C API as real processes: the shared cases (tests/common/p2p_cases.h)
// under mpirun (MPI transport) and over the MTXCOMM_STORE bootstrap (TCP transport), and a peer
// that exits during a receive.
//
//   mp_p2p                       every case; prints "FAIL: ..." per failure, exit 1 on any
//   P2P_TEST_MODE=any_left mp_p2p  the last rank destroys its communicator, then rank 0
//                                receives rank 1's message from any source (shared memory)
//   P2P_TEST_MODE=kill mp_p2p    the last rank exits (no goodbye: _exit) while the others wait
//                                in a receive from it: each must fail with MTXCOMM_REMOTE_ERROR
//                                naming it within 8 s (TCP only: mpirun ends a job whose rank
//                                exits without MPI_Finalize)
// Rank 0 also prints what making the point-to-point view cost at init.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/p2p_cases.h"
#include "lib/comm/c_api.h"
#include "lib/comm/comm.h"
#include "mtxcomm/mtxcomm.h"

namespace {

int killedPeer(mtxcomm_comm_t comm, int rank, int size) {
  const int victim = size - 1;
  if (mtxcomm_barrier(comm) != MTXCOMM_SUCCESS) {
    std::printf("FAIL: rank %d: barrier: %s\n", rank, mtxcomm_get_last_error(comm));
    return 1;
  }
  if (rank == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::fflush(stdout);
    _exit(0);
  }
  double v = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const mtxcomm_result_t rc = mtxcomm_recv(&v, 1, MTXCOMM_FLOAT64, victim, 0, comm);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string msg = mtxcomm_get_last_error(comm);
  const std::string named = "peer rank " + std::to_string(victim);
  const bool ok = rc == MTXCOMM_REMOTE_ERROR && s < 8 && msg.find(named) != std::string::npos &&
                  msg.find("rank " + std::to_string(rank) + ": receive from") != std::string::npos;
  std::printf("%s: rank %d: result %d after %.2f s: %s\n", ok ? "PASS" : "FAIL", rank, rc, s,
              msg.c_str());
  std::fflush(stdout);
  mtxcomm_comm_abort(comm);
  _exit(ok ? 0 : 1);  // a peer is gone: no MPI_Finalize, no goodbyes
}

// The last rank destroys its communicator (its process lives on) while rank 1 sends rank 0 a
// message on a fresh tag, which rank 0 receives from any source, then one more by name: both
// must arrive (over shared memory a rank that has left is no candidate of a receive from any
// source; it failed the whole channel before).
int peerLeftBeforeAnySource(mtxcomm_comm_t comm, int rank, int size) {
  const int leaver = size - 1;
  if (mtxcomm_barrier(comm) != MTXCOMM_SUCCESS) {
    std::printf("FAIL: rank %d: barrier: %s\n", rank, mtxcomm_get_last_error(comm));
    return 1;
  }
  if (rank == leaver) {
    mtxcomm_comm_destroy(comm);
    std::this_thread::sleep_for(std::chrono::seconds(2));  // alive, but gone from comm
    return 0;
  }
  int ok = 1;
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // after the leaver has left
    const int a = 1100, b = 1200;
    ok = mtxcomm_send(&a, 1, MTXCOMM_INT32, 0, 11, comm) == MTXCOMM_SUCCESS &&
         mtxcomm_send(&b, 1, MTXCOMM_INT32, 0, 12, comm) == MTXCOMM_SUCCESS;
    if (!ok) std::printf("FAIL: rank 1: send: %s\n", mtxcomm_get_last_error(comm));
  } else if (rank == 0) {
    int a = 0, b = 0, source = -1;
    mtxcomm_request_t req = nullptr;
    const bool any = mtxcomm_irecv(&a, 1, MTXCOMM_INT32, MTXCOMM_ANY_SOURCE, 11, comm, &req) ==
                         MTXCOMM_SUCCESS &&
                     mtxcomm_wait(req, 10.0) == MTXCOMM_SUCCESS &&
                     mtxcomm_request_source(req, &source) == MTXCOMM_SUCCESS;
    if (req) mtxcomm_request_free(req);
    const bool named = any && mtxcomm_recv(&b, 1, MTXCOMM_INT32, 1, 12, comm) == MTXCOMM_SUCCESS;
    ok = any && named && a == 1100 && b == 1200 && source == 1;
    std::printf("%s: any-source receive after a peer left: got %d from %d, then %d by name%s%s\n",
                ok ? "PASS" : "FAIL", a, source, b, ok ? "" : ": ",
                ok ? "" : mtxcomm_get_last_error(comm));
  }
  // Rank 0 and 1 only: the leaver has destroyed its communicator.
  mtxcomm_comm_destroy(comm);
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  mtxcomm_comm_t comm = nullptr;
  if (mtxcomm_comm_init_from_env(&comm) != MTXCOMM_SUCCESS) {
    std::printf("FAIL: init: %s\n", mtxcomm_get_last_error(nullptr));
    return 2;
  }
  int rank = 0, size = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &size);
  if (rank == 0) {
    const mtxcomm::Comm* c = mtxcomm::unwrapComm(comm);
    std::printf("np %d, transport %s: point-to-point view made in %.1f us\n", size,
                c->transportName(), c->p2pSetupSeconds() * 1e6);
  }
  const char* mode = std::getenv("P2P_TEST_MODE");
  if (mode && std::string(mode) == "kill") return killedPeer(comm, rank, size);
  if (mode && std::string(mode) == "any_left") return peerLeftBeforeAnySource(comm, rank, size);

  mtxcomm::p2pcases::P2pCheck ck(rank);
  mtxcomm::p2pcases::allCases(comm, ck);
  for (const std::string& f : ck.failures()) std::printf("FAIL: %s\n", f.c_str());
  mtxcomm_barrier(comm);
  if (rank == 0 && ck.failures().empty()) std::printf("PASS: np %d\n", size);
  mtxcomm_comm_destroy(comm);
  return ck.failures().empty() ? 0 : 1;
}
