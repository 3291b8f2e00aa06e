// One rank of a multi-process device-buffer job (tests/gpu/run_ranks.sh starts the ranks
// through MTXCOMM_STORE, with MTXCOMM_CUDA_PATH set to the path under test). Every collective,
// several datatypes and ops, counts that take several chunks of the scratch; inputs written,
// the call made and the result read back on one stream with no synchronisation in between
// (stream ordering). Prints "PASS" or a "FAIL: ..." line per failed check; exits 77 without a
// device, 1 on any failure.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/gpu_case.h"
#include "lib/comm/c_api.h"

using mtxcomm::Collective;
namespace td = mtxcomm::testdata;

namespace {

int failures = 0;

void runOne(mtxcomm_comm_t comm, int rank, int n, Collective coll, mtxcomm_datatype_t dt,
            mtxcomm_op_t op, size_t count, const std::string& wantPath, cudaStream_t stream) {
  const td::Case c{coll, "", dt, op, count, false, n - 1};
  const std::string what = c.describe(n);
  td::CaseBuffers b(c, rank, n, true);
  std::string why;
  const mtxcomm_result_t r = td::runCaseOnDevice(c, b, comm, rank, stream, &why);
  if (r != MTXCOMM_SUCCESS) {
    std::printf("FAIL: rank %d: %s: %s%s\n", rank, what.c_str(), why.c_str(),
                mtxcomm_get_last_error(comm));
    ++failures;
    return;
  }
  const std::string path = mtxcomm::unwrapComm(comm)->lastAlgorithm();
  if (path != wantPath) {
    std::printf("FAIL: rank %d: %s took path %s, not %s\n", rank, what.c_str(), path.c_str(),
                wantPath.c_str());
    ++failures;
  }
  const td::OutputCheck check = td::checkOutput(b, c, rank, n);
  if (!check.ok()) {
    std::printf("FAIL: rank %d: %s: element %zu of %zu is wrong\n", rank, what.c_str(),
                check.firstWrong, check.checkCount);
    ++failures;
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device visible\n");
    return 77;
  }
  mtxcomm_comm_t comm = nullptr;
  if (mtxcomm_comm_init_from_env(&comm) != MTXCOMM_SUCCESS) {
    std::printf("FAIL: init: %s\n", mtxcomm_get_last_error(nullptr));
    return 1;
  }
  int rank = 0, n = 1;
  mtxcomm_comm_rank(comm, &rank);
  mtxcomm_comm_size(comm, &n);
  cudaSetDevice(rank % devices);
  const char* forced = std::getenv("MTXCOMM_CUDA_PATH");
  const std::string path = forced ? forced : "host_staging";
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (Collective c : {Collective::kAllreduce, Collective::kBroadcast, Collective::kReduce,
                       Collective::kAllgather, Collective::kReduceScatter}) {
    // With MTXCOMM_CUDA_IPC_BYTES=1M, 400003 floats take several chunks.
    for (size_t count : {size_t{1}, size_t{1001}, size_t{400003}}) {
      runOne(comm, rank, n, c, MTXCOMM_FLOAT32, MTXCOMM_SUM, count, path, stream);
    }
  }
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_BFLOAT16, MTXCOMM_AVG, 300001, path,
         stream);
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_FLOAT16, MTXCOMM_SUM, 4097, path, stream);
  runOne(comm, rank, n, Collective::kReduceScatter, MTXCOMM_INT32, MTXCOMM_MAX, 70001, path,
         stream);
  runOne(comm, rank, n, Collective::kAllreduce, MTXCOMM_INT64, MTXCOMM_PROD, 999, path, stream);
  runOne(comm, rank, n, Collective::kReduce, MTXCOMM_FLOAT64, MTXCOMM_MIN, 12345, path, stream);
  cudaStreamDestroy(stream);
  mtxcomm_comm_destroy(comm);
  if (failures == 0) std::printf("rank %d: PASS\n", rank);
  return failures ? 1 : 0;
}
