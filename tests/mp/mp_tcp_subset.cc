// A short correctness subset over the MTXCOMM_RANK/MTXCOMM_SIZE/MTXCOMM_STORE bootstrap (TCP
// transport), one process per rank, started by mp_driver.sh: allreduce with every algorithm
// (and with op adasum), broadcast with every algorithm, alltoall and alltoallv with every
// algorithm, allgather, barrier. Exits 0 when every check passed.
//
//   mp_tcp_subset             run the subset (configuration from the environment)
//   mp_tcp_subset --free-port print a TCP port on 127.0.0.1 that is free now
//
// A communicator is built once per algorithm (init_from_env reads MTXCOMM_<COLL>_ALGO). A file
// store keeps its keys, so each build uses its own subdirectory of the MTXCOMM_STORE path; a tcp
// store is served anew by rank 0 each time, on the same port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lib/base/reduce.h"
#include "mp_check.h"

namespace mtxcomm {
namespace mp {
namespace {

int printFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("free port");
    return 1;
  }
  std::printf("%d\n", ntohs(addr.sin_port));
  close(fd);
  return 0;
}

// Allreduce with op adasum (not elementwise: not in the closed-form cases): orthogonal vectors
// (element i non-zero on rank i % n only) give exactly their sum, and vectors with a common
// direction (the dot products far from 0) give the same bits on every rank, compared through an
// allgather of the results. false: a call failed (after a FAIL line).
template <class Build>
bool runAdasum(Build& build, int rank, int n, int& passed, int& failed) {
  mtxcomm_comm_t comm = build(Collective::kAllreduce, nullptr);
  if (!comm) return false;
  auto call = [&](void* buf, size_t count, mtxcomm_datatype_t dt) {
    const mtxcomm_result_t rc =
        mtxcomm_allreduce(buf, buf, count, dt, MTXCOMM_ADASUM, comm, nullptr);
    if (rc != MTXCOMM_SUCCESS) {
      std::printf("FAIL rank %d: allreduce adasum %s x %zu: %s\n", rank, datatypeName(dt), count,
                  mtxcomm_get_last_error(comm));
    }
    return rc == MTXCOMM_SUCCESS;
  };
  const size_t count = 100003;
  std::vector<float> orth(count, 0.0f);
  for (size_t i = static_cast<size_t>(rank); i < count; i += static_cast<size_t>(n)) {
    orth[i] = 1.0f + static_cast<float>(i % 61);
  }
  if (!call(orth.data(), count, MTXCOMM_FLOAT32)) return false;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += orth[i] != 1.0f + static_cast<float>(i % 61);
  if (wrong) std::printf("FAIL rank %d: adasum of orthogonal vectors: %zu wrong\n", rank, wrong);
  (wrong ? failed : passed)++;

  for (mtxcomm_datatype_t dt : {MTXCOMM_FLOAT64, MTXCOMM_BFLOAT16}) {
    const size_t es = datatypeSize(dt), m = 4099;
    std::vector<unsigned char> v(m * es), all(m * es * static_cast<size_t>(n));
    for (size_t i = 0; i < m; ++i) {
      storeElement(dt, v.data(), i, std::sin(0.01 * static_cast<double>(i)) + 0.1 * (rank + 1));
    }
    if (!call(v.data(), m, dt)) return false;
    if (mtxcomm_allgather(v.data(), all.data(), m * es, MTXCOMM_UINT8, comm, nullptr) !=
        MTXCOMM_SUCCESS) {
      std::printf("FAIL rank %d: allgather: %s\n", rank, mtxcomm_get_last_error(comm));
      return false;
    }
    bool same = true;
    for (int r = 0; r < n; ++r)
      same = same && std::memcmp(all.data() + r * m * es, v.data(), m * es) == 0;
    if (!same)
      std::printf("FAIL rank %d: adasum %s: ranks got different bits\n", rank, datatypeName(dt));
    (same ? passed : failed)++;
  }
  mtxcomm_comm_destroy(comm);
  return true;
}

int run() {
  const char* storeEnv = std::getenv("MTXCOMM_STORE");
  const char* sizeEnv = std::getenv("MTXCOMM_SIZE");
  const char* rankEnv = std::getenv("MTXCOMM_RANK");
  if (!storeEnv || !sizeEnv || !rankEnv) {
    std::fprintf(stderr, "set MTXCOMM_RANK, MTXCOMM_SIZE and MTXCOMM_STORE\n");
    return 2;
  }
  const std::string store = storeEnv;
  const int n = std::atoi(sizeEnv);
  const int rank = std::atoi(rankEnv);
  int builds = 0, passed = 0, failed = 0;

  // A communicator with algo forced for coll (nullptr: none forced), or nullptr after a FAIL line.
  auto build = [&](Collective coll, const char* algo) -> mtxcomm_comm_t {
    forceAlgorithm(coll, algo);
    if (store.rfind("file:", 0) == 0) {
      setenv("MTXCOMM_STORE", (store + "/c" + std::to_string(builds)).c_str(), 1);
    }
    ++builds;
    mtxcomm_comm_t comm = nullptr;
    mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
    if (rc != MTXCOMM_SUCCESS) {
      std::printf("FAIL rank %d: init_from_env (%s %s): %s: %s\n", rank, collectiveName(coll),
                  algo ? algo : "auto", mtxcomm_get_error_string(rc),
                  mtxcomm_get_last_error(nullptr));
      return nullptr;
    }
    int r = -1, s = -1;
    mtxcomm_comm_rank(comm, &r);
    mtxcomm_comm_size(comm, &s);
    if (r != rank || s != n) {
      std::printf("FAIL rank %d: communicator says rank %d of %d\n", rank, r, s);
      ++failed;
    }
    return comm;
  };

  auto runWith = [&](Collective coll, const char* algo, const std::vector<Case>& cases) {
    mtxcomm_comm_t comm = build(coll, algo);
    if (!comm) return false;
    for (const Case& c : cases) {
      const Outcome o = runCase(comm, rank, n, c);
      if (o == Outcome::kCallFailed) {
        mtxcomm_comm_abort(comm);
        return false;
      }
      (o == Outcome::kPass ? passed : failed)++;
    }
    mtxcomm_comm_destroy(comm);
    return true;
  };

  const std::vector<mtxcomm_datatype_t> dtypes = {MTXCOMM_INT32,   MTXCOMM_UINT8,
                                                  MTXCOMM_FLOAT16, MTXCOMM_BFLOAT16,
                                                  MTXCOMM_FLOAT32, MTXCOMM_FLOAT64};
  const std::vector<size_t> counts = {0, 1, static_cast<size_t>(n) + 1, 100003};
  for (const char* algo : algorithmNames(Collective::kAllreduce)) {
    if (std::string(algo) == "adasum") continue;  // op adasum only: runAdasum below
    std::vector<Case> cases;
    appendCases(cases, Collective::kAllreduce, algo, n, dtypes,
                {MTXCOMM_SUM, MTXCOMM_PROD, MTXCOMM_MAX, MTXCOMM_AVG}, counts);
    if (!runWith(Collective::kAllreduce, algo, cases)) return 3;
  }
  for (const char* algo : algorithmNames(Collective::kBroadcast)) {
    std::vector<Case> cases;
    appendCases(cases, Collective::kBroadcast, algo, n, dtypes, {MTXCOMM_SUM}, counts);
    if (!runWith(Collective::kBroadcast, algo, cases)) return 3;
  }
  for (const char* algo : algorithmNames(Collective::kAlltoall)) {
    std::vector<Case> cases;  // alltoall and alltoallv
    appendCases(cases, Collective::kAlltoall, algo, n, dtypes, {MTXCOMM_SUM}, counts);
    if (!runWith(Collective::kAlltoall, algo, cases)) return 3;
  }
  if (!runAdasum(build, rank, n, passed, failed)) return 3;
  std::vector<Case> cases;
  appendCases(cases, Collective::kAllgather, "auto", n, dtypes, {MTXCOMM_SUM}, counts);
  appendCases(cases, Collective::kBarrier, "auto", n, {}, {}, {});
  if (!runWith(Collective::kAllgather, nullptr, cases)) return 3;

  std::printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace mp
}  // namespace mtxcomm

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--free-port") return mtxcomm::mp::printFreePort();
  return mtxcomm::mp::run();
}
