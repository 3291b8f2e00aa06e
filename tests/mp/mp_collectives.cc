// The correctness matrix over real processes and the MPI transport, started by mpirun:
// every collective x algorithm (forced through MTXCOMM_<COLL>_ALGO, one communicator from
// mtxcomm_comm_init_from_env per algorithm) x datatype x op x count {0, 1, n-1, n, n+1, and a
// prime above 10^6 for float32 and bfloat16 SUM} x in place / out of place x root {0, n-1}.
// Then mtxcomm_comm_split and a communicator from mtxcomm_comm_init_mpi(MPI_COMM_WORLD) next to
// the program's own MPI traffic on MPI_COMM_WORLD. Every rank checks its own output bitwise; the
// outcomes are combined over MPI and rank 0 prints "N passed, M failed".
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mp_check.h"
#include "mtxcomm/mtxcomm_mpi.h"

namespace mtxcomm {
namespace mp {
namespace {

int g_rank = 0;
int g_size = 1;
// One entry per check, in the same order on every rank; 1 = failed on this rank.
std::vector<char> g_failed;
std::vector<std::string> g_names;

void record(const std::string& name, bool ok) {
  g_names.push_back(name);
  g_failed.push_back(ok ? 0 : 1);
}

// A call that failed leaves the ranks out of step (or the communicator poisoned): stop the job
// rather than hang in the next collective.
[[noreturn]] void abortJob(const std::string& why) {
  std::printf("FATAL rank %d: %s\n", g_rank, why.c_str());
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();  // not reached
}

void runChecked(mtxcomm_comm_t comm, int rank, int n, const Case& c, const std::string& prefix) {
  const Outcome o = runCase(comm, rank, n, c);
  if (o == Outcome::kCallFailed) abortJob(prefix + c.describe(n) + " failed");
  record(prefix + c.describe(n), o == Outcome::kPass);
}

mtxcomm_comm_t initFromEnvOrDie() {
  mtxcomm_comm_t comm = nullptr;
  mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
  if (rc != MTXCOMM_SUCCESS) {
    abortJob(strCat("mtxcomm_comm_init_from_env: ", mtxcomm_get_error_string(rc), ": ",
                    mtxcomm_get_last_error(nullptr)));
  }
  int r = -1, s = -1;
  mtxcomm_comm_rank(comm, &r);
  mtxcomm_comm_size(comm, &s);
  record("init_from_env rank/size match MPI_COMM_WORLD", r == g_rank && s == g_size);
  return comm;
}

void runMatrix() {
  const int n = g_size;
  std::vector<size_t> small = {0, 1, static_cast<size_t>(n), static_cast<size_t>(n) + 1};
  if (n > 1) small.push_back(static_cast<size_t>(n) - 1);
  const std::vector<mtxcomm_op_t> allOps(std::begin(kOps), std::end(kOps));
  for (Collective coll : kColls) {
    for (const char* algo : algorithmNames(coll)) {
      // adasum takes op adasum only (the other ops would fall back to the automatic choice, run
      // here anyway); it has tests/test_adasum.cc and mp_tcp_subset.
      if (std::string(algo) == "adasum") continue;
      forceAlgorithm(coll, algo);
      mtxcomm_comm_t comm = initFromEnvOrDie();
      std::vector<Case> cases;
      appendCases(cases, coll, algo, n, allDatatypes(), allOps, small);
      // The prime count for float32 and one 16-bit type, SUM only (time). Allgather and
      // reduce-scatter scale their buffers by n: there the per-rank count is the prime / n.
      const bool scaled = coll == Collective::kAllgather || coll == Collective::kReduceScatter ||
                          coll == Collective::kAlltoall;
      if (coll != Collective::kBarrier) {
        appendCases(cases, coll, algo, n, {MTXCOMM_FLOAT32, MTXCOMM_BFLOAT16}, {MTXCOMM_SUM},
                    {scaled ? kPrimeCount / n : kPrimeCount});
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (const Case& c : cases) runChecked(comm, g_rank, n, c, "");
      mtxcomm_comm_destroy(comm);
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (g_rank == 0) {
        std::printf("%s/%s: %zu cases in %.2f s\n", collectiveName(coll), algo, cases.size(), secs);
        std::fflush(stdout);
      }
    }
  }
  forceAlgorithm(Collective::kAllreduce, nullptr);
}

// color = rank % 2, key = -rank: each new communicator holds the world ranks of one parity,
// highest world rank first.
void runSplit() {
  mtxcomm_comm_t world = initFromEnvOrDie();
  const int color = g_rank % 2;
  std::vector<int> members;
  for (int r = g_size - 1; r >= 0; --r) {
    if (r % 2 == color) members.push_back(r);
  }
  const int expectSize = static_cast<int>(members.size());
  int expectRank = 0;
  while (members[expectRank] != g_rank) ++expectRank;

  mtxcomm_comm_t sub = nullptr;
  mtxcomm_result_t rc = mtxcomm_comm_split(world, color, -g_rank, &sub);
  if (rc != MTXCOMM_SUCCESS || !sub) {
    abortJob(strCat("mtxcomm_comm_split: ", mtxcomm_get_error_string(rc), ": ",
                    mtxcomm_get_last_error(world)));
  }
  int r = -1, s = -1;
  mtxcomm_comm_rank(sub, &r);
  mtxcomm_comm_size(sub, &s);
  record("split rank/size (color rank%2, key -rank)", r == expectRank && s == expectSize);
  if (r != expectRank || s != expectSize) {
    std::printf("FAIL rank %d: split gave rank %d of %d, expected %d of %d\n", g_rank, r, s,
                expectRank, expectSize);
    abortJob("split numbering is wrong");
  }

  // The world ranks, gathered in sub-communicator order, must be the members list.
  int32_t mine = g_rank;
  std::vector<int32_t> got(expectSize, -1);
  rc = mtxcomm_allgather(&mine, got.data(), 1, MTXCOMM_INT32, sub, nullptr);
  if (rc != MTXCOMM_SUCCESS) abortJob(strCat("allgather on split: ", mtxcomm_get_last_error(sub)));
  record("split allgather of world ranks gives key order",
         std::equal(got.begin(), got.end(), members.begin()));

  std::vector<Case> cases;
  for (Collective coll : kColls) {
    appendCases(cases, coll, "auto", expectSize, {MTXCOMM_FLOAT32, MTXCOMM_INT64, MTXCOMM_FLOAT16},
                {MTXCOMM_SUM, MTXCOMM_AVG}, {1, 1001});
  }
  // The case list depends on the sub-communicator's size: one check for all of it.
  bool allOk = true;
  for (const Case& c : cases) {
    const Outcome o = runCase(sub, expectRank, expectSize, c);
    if (o == Outcome::kCallFailed) abortJob("split: " + c.describe(expectSize) + " failed");
    allOk = allOk && o == Outcome::kPass;
  }
  record("split: every collective on the sub-communicator", allOk);
  mtxcomm_comm_destroy(sub);

  // MTXCOMM_UNDEFINED on rank 0: it gets NULL, the others one communicator of n-1.
  sub = nullptr;
  rc = mtxcomm_comm_split(world, g_rank == 0 ? MTXCOMM_UNDEFINED : 7, 0, &sub);
  if (rc != MTXCOMM_SUCCESS) abortJob(strCat("split(UNDEFINED): ", mtxcomm_get_last_error(world)));
  // One check on every rank, so that all ranks record the same list.
  bool ok = true;
  if (g_rank == 0) {
    ok = sub == nullptr;
  } else {
    s = -1;
    r = -1;
    mtxcomm_comm_size(sub, &s);
    mtxcomm_comm_rank(sub, &r);
    ok = s == g_size - 1 && r == g_rank - 1;
    Case c{Collective::kAllreduce, "auto", MTXCOMM_FLOAT32, MTXCOMM_SUM, 4099, false, 0};
    const Outcome o = runCase(sub, g_rank - 1, g_size - 1, c);
    if (o == Outcome::kCallFailed) abortJob("allreduce on the split without rank 0 failed");
    ok = ok && o == Outcome::kPass;
    mtxcomm_comm_destroy(sub);
  }
  record("split with MTXCOMM_UNDEFINED on rank 0 (NULL there, n-1 ranks elsewhere)", ok);
  // The parent is still usable after the splits.
  Case c{Collective::kAllreduce, "auto", MTXCOMM_INT32, MTXCOMM_MAX, 33, true, 0};
  runChecked(world, g_rank, g_size, c, "parent after split: ");
  mtxcomm_comm_destroy(world);
}

// mtxcomm over MPI_COMM_WORLD next to the program's own MPI_COMM_WORLD traffic: a wildcard
// receive posted on MPI_COMM_WORLD must not catch any of mtxcomm's messages.
void runInitMpi() {
  mtxcomm_comm_t comm = nullptr;
  mtxcomm_result_t rc = mtxcomm_comm_init_mpi(MPI_COMM_WORLD, &comm);
  if (rc != MTXCOMM_SUCCESS) {
    abortJob(strCat("mtxcomm_comm_init_mpi: ", mtxcomm_get_last_error(nullptr)));
  }
  int r = -1, s = -1;
  mtxcomm_comm_rank(comm, &r);
  mtxcomm_comm_size(comm, &s);
  record("init_mpi rank/size", r == g_rank && s == g_size);

  int probe = -1;
  MPI_Request req;
  MPI_Irecv(&probe, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &req);
  bool mpiOk = true;
  for (int iter = 0; iter < 8; ++iter) {
    int x = g_rank + iter, sum = -1;
    MPI_Allreduce(&x, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    mpiOk = mpiOk && sum == g_size * (g_size - 1) / 2 + g_size * iter;
    Case c{Collective::kAllreduce,
           "auto",
           MTXCOMM_FLOAT32,
           MTXCOMM_SUM,
           iter % 2 ? size_t{4099} : size_t{300007},
           iter % 3 == 0,
           0};
    runChecked(comm, g_rank, g_size, c, "init_mpi: ");
    Case b{Collective::kBroadcast, "auto", MTXCOMM_INT64, MTXCOMM_SUM, 129, false, iter % g_size};
    runChecked(comm, g_rank, g_size, b, "init_mpi: ");
    if (mtxcomm_barrier(comm) != MTXCOMM_SUCCESS) abortJob("init_mpi: barrier failed");
  }
  record("init_mpi: the application's MPI_Allreduce on MPI_COMM_WORLD is right", mpiOk);
  int caught = 0;
  MPI_Test(&req, &caught, MPI_STATUS_IGNORE);
  record("init_mpi: no mtxcomm message reached a wildcard receive on MPI_COMM_WORLD", !caught);
  if (caught) {
    std::printf("FAIL rank %d: a wildcard MPI_Irecv on MPI_COMM_WORLD caught a message\n", g_rank);
    abortJob("mtxcomm traffic mixed with MPI_COMM_WORLD");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  int token = 1000 + g_rank;
  MPI_Request sreq;
  MPI_Isend(&token, 1, MPI_INT, (g_rank + 1) % g_size, 7, MPI_COMM_WORLD, &sreq);
  MPI_Status st;
  MPI_Wait(&req, &st);
  MPI_Wait(&sreq, MPI_STATUS_IGNORE);
  record("init_mpi: the application's own message arrives intact",
         probe == 1000 + (g_rank + g_size - 1) % g_size && st.MPI_TAG == 7);
  mtxcomm_comm_destroy(comm);
}

int run() {
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  for (const char* v : {"MTXCOMM_STORE", "MTXCOMM_RANK", "MTXCOMM_SIZE"}) unsetenv(v);

  const auto t0 = std::chrono::steady_clock::now();
  runMatrix();
  runSplit();
  runInitMpi();

  // A check fails if it failed on any rank.
  const size_t numChecks = g_failed.size();
  unsigned long sizes[2] = {numChecks, numChecks}, range[2] = {0, 0};
  sizes[1] = ~sizes[1];
  MPI_Allreduce(sizes, range, 2, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (range[0] != numChecks || ~range[1] != numChecks) abortJob("ranks ran different checks");
  std::vector<char> any(numChecks);
  MPI_Allreduce(g_failed.data(), any.data(), static_cast<int>(numChecks), MPI_CHAR, MPI_MAX,
                MPI_COMM_WORLD);
  size_t failed = 0;
  for (size_t i = 0; i < numChecks; ++i) {
    if (!any[i]) continue;
    ++failed;
    if (g_rank == 0 && failed <= 20) std::printf("failed: %s\n", g_names[i].c_str());
  }
  if (g_rank == 0) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("np=%d: %.1f s\n%zu passed, %zu failed\n", g_size, secs, numChecks - failed,
                failed);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace mp
}  // namespace mtxcomm

int main() { return mtxcomm::mp::run(); }
