// A short correctness subset over the MTXCOMM_RANK/MTXCOMM_SIZE/MTXCOMM_STORE bootstrap (TCP
// transport), one process per rank, started by mp_driver.sh: allreduce with every algorithm,
// broadcast with every algorithm, alltoall and alltoallv with every algorithm, allgather,
// barrier. Exits 0 when every check passed.
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

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

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

  auto runWith = [&](Collective coll, const char* algo, const std::vector<Case>& cases) {
    forceAlgorithm(coll, algo);
    if (store.rfind("file:", 0) == 0) {
      setenv("MTXCOMM_STORE", (store + "/c" + std::to_string(builds)).c_str(), 1);
    }
    ++builds;
    mtxcomm_comm_t comm = nullptr;
    mtxcomm_result_t rc = mtxcomm_comm_init_from_env(&comm);
    if (rc != MTXCOMM_SUCCESS) {
      std::printf("FAIL rank %d: init_from_env (%s %s): %s: %s\n", rank, collectiveName(coll), algo,
                  mtxcomm_get_error_string(rc), mtxcomm_get_last_error(nullptr));
      return false;
    }
    int r = -1, s = -1;
    mtxcomm_comm_rank(comm, &r);
    mtxcomm_comm_size(comm, &s);
    if (r != rank || s != n) {
      std::printf("FAIL rank %d: communicator says rank %d of %d\n", rank, r, s);
      ++failed;
    }
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
